"""Megatron-DeepSpeed logs: the fork's iteration lines (Megatron style, ``TFLOPs`` counting the
recompute) and DeepSpeed's own memory and timer lines, read together."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tuner.cli.parse_log import add_parser, run
from tuner.logs import parse_log, parse_log_file
from tuner.outcome import Outcome

MB = 1024.0
ARGONNE = "megatron_deepspeed_ds_new_timers_argonne-lcf-deprecated-notes.log"
# The fork's training_log line (megatron/training.py @f4157bea) and DeepSpeed's see_memory_usage
# line (runtime/utils.py), in the formats of the shared interfaces reference §3c / §3d.
ITERATION = (
    " iteration        {i}/      10 | consumed samples:           {s} | consumed tokens:"
    "        {t} | elapsed time per iteration (ms): {ms} | learning rate: 3.000E-04 |"
    " global batch size:     8 | lm loss: 7.000000E+00 | loss scale: 1.0 | grad norm: 1.000 |"
    " actual seqlen:  1024 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    " samples per second: {sps} | tokens per gpu per second (tgs): 1024.000 | TFLOPs: 99.50 |"
)
SEE_MEMORY = "MA 30.5 GB         Max_MA 52.25 GB         CA 55.0 GB         Max_CA 60 GB "
REPORT = (
    "[Rank 0] (after 1 iterations) memory (MB) | allocated: 20000.0 | max allocated: 40960.0 |"
    " reserved: 45056.0 | max reserved: 45056.0"
)


def _log() -> str:
    lines = [ITERATION.format(i=i, s=8 * i, t=8192 * i, ms=ms, sps=8000 / ms)
             for i, ms in [(1, 1500.0), (2, 1000.0), (3, 1100.0)]]  # fmt: skip
    return "\n".join([SEE_MEMORY, lines[0], REPORT, *lines[1:]]) + "\n"


def test_iteration_lines_and_deepspeeds_memory_lines() -> None:
    m = parse_log(_log(), "megatron-deepspeed", warmup=1)
    assert m.outcome is Outcome.OK and m.iterations == 3
    assert m.step_time_s == pytest.approx(1.05)  # median of 1.0 and 1.1 s
    assert m.tflops_per_gpu == pytest.approx(99.5) and m.tflops_includes_recompute is True
    # the largest of DeepSpeed's Max_MA and Megatron's report, as DeepSpeed's engine logs both
    assert m.peak_memory_gib == pytest.approx(52.25)
    assert m.peak_reserved_gib == pytest.approx(60.0)
    megatron = parse_log(_log(), "megatron", warmup=1)
    assert megatron.peak_memory_gib == pytest.approx(40.0)  # Megatron-LM prints no Max_MA


def test_real_argonne_run(fixtures_dir: Path) -> None:
    m = parse_log_file(fixtures_dir / ARGONNE, "megatron-deepspeed")
    assert m.outcome is Outcome.OK and m.iterations == 2
    assert m.step_time_s == pytest.approx(20.2983)  # iteration 1 (25849.1 ms) is warm-up
    assert m.tflops_per_gpu == pytest.approx(49.17) and m.tflops_includes_recompute
    assert m.peak_memory_gib == pytest.approx(41299.50146484375 / MB)


def test_parse_log_cli_takes_the_framework(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node-0.log"
    path.write_text(_log())
    parser = argparse.ArgumentParser(prog="tune")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["parse-log", str(path), "--framework", "megatron-deepspeed",
                              "--json", "--warmup", "1"])  # fmt: skip
    assert run(args) == 0
    out = json.loads(capsys.readouterr().out)["logs"][0]
    assert out["outcome"] == "ok" and out["peak_memory_gib"] == pytest.approx(52.25)
