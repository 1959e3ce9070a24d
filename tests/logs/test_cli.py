"""``tune parse-log``: run() called directly through a real argparse parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tuner.cli.parse_log import add_parser, run
from tuner.logs import JSON_KEYS

ITERATION = (
    " [2025-01-02 03:04:05] iteration        {i}/      10 | consumed samples:           {i} |"
    " elapsed time per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): 123.4 |"
    " learning rate: 1.000000E-04 | global batch size:     8 | lm loss: 7.0E+00 |"
    " loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tune")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["parse-log", *argv])
    assert args.func is run
    return args


@pytest.fixture
def ok_log(tmp_path: Path) -> Path:
    path = tmp_path / "node-0.log"
    path.write_text("\n".join(ITERATION.format(i=i, ms=ms) for i, ms in [(1, 900.0), (2, 500.0)]))
    return path


@pytest.fixture
def oom_log(tmp_path: Path) -> Path:
    path = tmp_path / "oom.log"
    path.write_text(
        "Traceback (most recent call last):\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 1.00 GiB is free.\n"
    )
    return path


def test_json_one_file_is_one_object(ok_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args(str(ok_log), "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["logs"] and len(out["logs"]) == 1
    obj = out["logs"][0]
    assert tuple(obj) == JSON_KEYS
    assert obj == {
        "file": str(ok_log),
        "outcome": "ok",
        "iterations": 2,
        "step_time_s": 0.5,
        "peak_memory_gib": None,
        "peak_reserved_gib": None,
        "tflops_per_gpu": 123.4,
        "samples_per_s": 16.0,
        "reason": None,
    }


def test_json_several_files_is_one_object_with_a_list(
    ok_log: Path, oom_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(str(ok_log), str(oom_log), "--format", "json", "--framework", "megatron")
    assert run(args) == 0
    objs = json.loads(capsys.readouterr().out)["logs"]
    assert [o["outcome"] for o in objs] == ["ok", "oom"]
    assert objs[1]["reason"].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert all(tuple(o) == JSON_KEYS for o in objs)


def test_warmup_flag(ok_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args(str(ok_log), "--json", "--warmup", "0")) == 0
    assert json.loads(capsys.readouterr().out)["logs"][0]["step_time_s"] == pytest.approx(0.7)


def test_table(ok_log: Path, oom_log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_args(str(ok_log), str(oom_log))) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "oom" in out and "0.500" in out and "123.4" in out


def test_the_table_fits_80_columns_without_cutting_a_figure(
    ok_log: Path, oom_log: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """At 80 columns the outcome read ``no_metr…`` and the header ``TFLOP/…``: the table goes
    through the fitted renderer (what does not fit is named, never cut) and a failed log's
    reason is printed whole under it."""
    monkeypatch.setenv("COLUMNS", "80")
    assert run(_args(str(ok_log), str(oom_log))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "…" not in "".join(lines) and max(len(line) for line in lines) <= 80
    text = " ".join(lines)
    assert all(word in text for word in ("ok", "oom", "0.500"))
    # the reason whole, on lines of its own under the table (as the terminal wraps them)
    reason = f"{oom_log}: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert "".join(reason.split()) in "".join(text.split())
    assert "GiB of which 1.00 GiB is free." in text


@pytest.mark.parametrize("name", ["missing.log", "."])
def test_unreadable_file_exits_2_with_one_line(
    ok_log: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / name
    assert run(_args(str(ok_log), str(target), "--json")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("tune: error: ") and str(target) in captured.err
    assert "Traceback" not in captured.err


def test_bad_framework_is_an_argparse_error(ok_log: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        _args(str(ok_log), "--framework", "jax")
    assert exc.value.code == 2


def test_a_torchtitan_log_gives_its_reserved_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torchtitan logs the max reserved bytes only: parse-log printed ``-`` for the peak of a
    log whose every step names it (the allocated column), and its JSON had no key for it."""
    from tests.logs.test_torchtitan import REAL

    path = tmp_path / "node-0.log"
    path.write_text(REAL)
    assert run(_args(str(path), "--json", "--framework", "torchtitan")) == 0
    obj = json.loads(capsys.readouterr().out)["logs"][0]
    assert tuple(obj) == JSON_KEYS
    assert obj["peak_reserved_gib"] == 9.46 and obj["peak_memory_gib"] is None
    assert run(_args(str(path), "--framework", "torchtitan")) == 0
    assert "9.46" in capsys.readouterr().out


SIGTERM_TAIL = """\
W1207 13:14:54.094000 25143 torch/distributed/elastic/agent/server/api.py:753] Received 15 death \
signal, shutting down workers
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", \
line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 25143 got signal: 15
"""


def test_a_trial_the_tuner_ended_reads_as_the_study_recorded_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial the watch stopped once its step time was known (SIGTERM to torchrun) was
    recorded ``ok``, but ``tune parse-log`` of its log said ``launch_error``: it judged the
    kill's traceback without the executor's account beside the log (``result.json``)."""
    log = tmp_path / "node-0.log"
    steps = "\n".join(ITERATION.format(i=i, ms=500.0) for i in range(1, 6))
    log.write_text(f"{steps}\n{SIGTERM_TAIL}")

    def outcome(account: dict[str, object] | None) -> tuple[str, float | None]:
        if account is not None:
            account = {"logs": [f"/cluster/results/s/trials/0/{log.name}"], "exit_codes": [1],
                       "cancelled": True, **account}  # fmt: skip
            (tmp_path / "result.json").write_text(json.dumps(account))
        assert run(_args(str(log), "--json")) == 0
        (got,) = json.loads(capsys.readouterr().out)["logs"]
        return got["outcome"], got["step_time_s"]

    assert outcome(None) == ("launch_error", 0.5)  # the log alone: a kill from outside
    assert outcome({"timed_out": False, "stopped": "precise"}) == ("ok", 0.5)
    assert outcome({"timed_out": True, "stopped": None}) == ("timeout", 0.5)
    # cancelled because the study stopped: the study recorded it interrupted (record.judge),
    # parse-log said launch_error; one whose processes ended by themselves is judged by its log
    assert outcome({"timed_out": False, "stopped": None})[0] == "interrupted"
    assert outcome({"timed_out": False, "stopped": None, "cancelled": False})[0] == "launch_error"


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_trial_log_reads_its_exit_code_and_says_the_tuner_ended_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune parse-log`` read ``result.json`` only for a trial the tuner stopped: a log whose
    node exited 1 (or lost its node) read ``ok`` although the study recorded ``launch_error``
    (``node_error``); and a trial log did not say its SIGTERM came from the tuner, so copied out
    without its ``result.json`` it read ``launch_error``. The executor now ends such a log with
    a line that says so (``ENDED_MARK``), written by the job itself."""
    import shlex
    import time

    from tuner.launch import LaunchRequest, LocalExecutor
    from tuner.layout import ResultsLayout

    log = tmp_path / "node-0.log"
    steps = "\n".join(ITERATION.format(i=i, ms=500.0) for i in range(1, 6))
    log.write_text(f"{steps}\n")

    def outcome(path: Path) -> str:
        assert run(_args(str(path), "--json")) == 0
        return str(json.loads(capsys.readouterr().out)["logs"][0]["outcome"])

    account = {"logs": [str(log)], "exit_codes": [1], "timed_out": False, "cancelled": False}
    (tmp_path / "result.json").write_text(json.dumps(account))
    assert outcome(log) == "launch_error"  # its node exited 1
    account.update(exit_codes=[None], node_errors=[["n0", "connection lost"]])
    (tmp_path / "result.json").write_text(json.dumps(account))
    assert outcome(log) == "node_error"
    # jobs the tuner ended (the watch's stop, the study's cancel): their logs copied out alone
    ex = LocalExecutor(grace_s=1.0)
    try:
        jobs = []
        for n, end in enumerate(("precise", "cancel")):
            script = (
                f"trap 'cat tail.txt; exit 1' TERM; printf '%s\\n' {shlex.quote(steps)}; "
                "sleep 30 & wait $!"
            )  # torchrun's traceback of the SIGTERM ends it
            paths = ResultsLayout(tmp_path / "r", "s").trial(n)
            request = LaunchRequest(trial=n, hosts=("local-0",), scripts=(script,), paths=paths,
                                    files={"tail.txt": SIGTERM_TAIL})  # fmt: skip
            jobs.append((ex.submit(request), end))
        for job, end in jobs:
            deadline = time.monotonic() + 30
            while "iteration        5/" not in _text(job.paths.node_log(0)):
                assert time.monotonic() < deadline, "the steps never reached the log"
                time.sleep(0.02)
            job.stop(end) if end != "cancel" else job.cancel()
        for (job, _), expected in zip(jobs, ("ok", "interrupted"), strict=True):
            alone = tmp_path / f"copied-{job.request.trial}.log"
            alone.write_bytes(job.paths.node_log(0).read_bytes())
            assert outcome(alone) == expected
            assert outcome(job.paths.node_log(0)) == expected  # beside its result.json
    finally:
        ex.close()


TITAN_NEEDS = "give --study NAME (judged as that study judges its trials) or "
"""How ``tune parse-log`` says what a log that needs more than itself needs."""


def test_a_torchtitan_log_is_judged_as_its_study_judged_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torchtitan logs tokens/s per GPU: without the tokens of one step parse-log said a bare
    ``no_metrics`` of a log its study recorded ``ok``. ``--study`` (or the three figures) gives
    them; without, one line says which options would."""
    from tests.logs.test_torchtitan import REAL
    from tuner.logs import parse_log
    from tuner.spec.file import load_study

    study = Path(__file__).resolve().parents[2] / "studies" / "demo-fsdp.yaml"
    spec = load_study(str(study))
    path = tmp_path / "node-0.log"
    path.write_text(REAL)
    tokens = spec.training.global_batch_size * spec.model.seq_length / spec.world_size
    want = parse_log(REAL, "torchtitan", spec.launch.warmup_iters, step_tokens=tokens)
    assert want.outcome == "ok" and want.step_time_s
    figures = ["--global-batch", str(spec.training.global_batch_size), "--seq-len",
               str(spec.model.seq_length), "--gpus", str(spec.world_size)]  # fmt: skip
    for given in (["--study", str(study)], [*figures, "--warmup", str(spec.launch.warmup_iters)]):
        assert run(_args(str(path), "--json", *given)) == 0
        got = json.loads(capsys.readouterr().out)["logs"][0]
        assert got["outcome"] == "ok" and got["step_time_s"] == pytest.approx(want.step_time_s)
    assert run(_args(str(path), "--json", "--framework", "torchtitan")) == 0
    got = json.loads(capsys.readouterr().out)["logs"][0]
    assert got["outcome"] == "no_metrics"
    assert got["reason"].endswith(TITAN_NEEDS + "--global-batch N --seq-len N --gpus N")
    assert "tokens/s per GPU" in got["reason"] and "\n" not in got["reason"]
    assert run(_args(str(path), "--json", "--framework", "torchtitan", *figures[:2])) == 0
    got = json.loads(capsys.readouterr().out)["logs"][0]
    assert got["reason"].endswith(TITAN_NEEDS + "--seq-len N --gpus N")


def test_a_deepspeed_log_of_throughput_alone_says_it_needs_the_global_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ds.log"
    path.write_text("".join(
        f"[INFO] [timer.py:215:stop] epoch=0/micro_step={n}/global_step={n}, "
        f"RunningAvgSamplesPerSec=11.0, CurrSamplesPerSec=12.5, MemAllocated=1.5GB, "
        "MaxMemAllocated=2.25GB\n" for n in range(1, 6)
    ))  # fmt: skip
    assert run(_args(str(path), "--json")) == 0
    got = json.loads(capsys.readouterr().out)["logs"][0]
    assert got["outcome"] == "no_metrics" and got["reason"].endswith(
        TITAN_NEEDS + "--global-batch N"
    )
    assert run(_args(str(path), "--json", "--global-batch", "25")) == 0
    got = json.loads(capsys.readouterr().out)["logs"][0]
    assert got["outcome"] == "ok" and got["step_time_s"] == pytest.approx(2.0)
