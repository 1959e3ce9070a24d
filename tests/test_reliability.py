"""The study loop under faults (issue 11): hung trials, two workers on one study, a worker
killed mid-study, Ctrl-C twice, read-only or full results folders, a storage that fails.

Real parts throughout: the real CLI in its own process, the Megatron stand-in under torchrun as
one process tree per trial, SQLite storage (PostgreSQL where its binaries exist), tmpfs and
read-only bind mounts (skipped where this user cannot mount).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.procs import Proc, live_processes
from tests.test_study import SURFACE, standin_processes, study_data, tune, write_study
from tuner.report.leaderboard import leaderboard
from tuner.spec.file import study_from_mapping

pytestmark = [pytest.mark.slow]


def _standins(tmp: Path) -> list[Proc]:
    needle = f"TUNER_STANDIN_SURFACE={tmp / 'surface.json'}"
    found: list[Proc] = []

    def keep(p: Proc) -> bool:
        if needle in p.environ and "pretrain_gpt.py" in p.cmdline:
            found.append(p)
        return False

    live_processes(keep)
    return found


class NodeWatch:
    """Samples which trials' stand-ins run on which node (a trial's processes run in its trial
    folder, whose config.yaml names its nodes) and remembers every overlap it saw."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.overlaps: list[dict[str, set[int]]] = []
        self.samples = 0
        self.seen_trials: set[int] = set()

    def sample(self) -> None:
        per_node: dict[str, set[int]] = defaultdict(set)
        for p in _standins(self.tmp):
            trial_dir = Path(p.cwd)
            try:
                record = json.loads((trial_dir / "config.yaml").read_text())
            except (OSError, ValueError):
                continue
            for host in record["hosts"]:
                per_node[host].add(int(record["trial"]))
            self.seen_trials.add(int(record["trial"]))
        self.samples += 1
        if any(len(trials) > 1 for trials in per_node.values()):
            self.overlaps.append(dict(per_node))

    def watch(self, *procs: subprocess.Popen[str], timeout: float = 300) -> list[str]:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            self.sample()
            time.sleep(0.05)
        outs = []
        for p in procs:
            if p.poll() is None:
                p.kill()
            outs.append(p.communicate()[0])
        return outs


def _rows(data: dict[str, Any], results: Path, storage: str | None = None) -> Any:
    return leaderboard(study_from_mapping(data), include_all=True, storage=storage,
                       results=str(results))  # fmt: skip


def test_a_hung_trial_is_killed_once_and_never_relaunched(tmp_path: Path) -> None:
    """A trial that logs no iteration before its time limit is killed and recorded as hung (or
    timed out); it counts against the budget, and a second run does not launch it again."""
    data = study_data(tmp_path, SURFACE, n_trials=1, trial_timeout_min=0.05)  # 3 s
    data["cluster"]["num_nodes"] = 1
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "100"  # the first step takes minutes
    path = write_study(tmp_path, data)
    results = tmp_path / "results"
    flags = ["--study", str(path), "--results", str(results), "--quiet"]
    first = tune("run", *flags, cwd=tmp_path)
    out, _ = first.communicate(timeout=180)
    assert first.returncode == 1, out  # nothing was measured
    assert "no trial measured a step time" in out
    rows = _rows(data, results)
    launched = rows[rows.outcome.isin(["hang", "timeout"])]
    assert len(launched) == 1, rows[["trial", "outcome", "reason"]]
    assert len(list((results / "e2e" / "trials").iterdir())) == 1
    again = tune("run", *flags, cwd=tmp_path)
    out, _ = again.communicate(timeout=120)
    assert len(list((results / "e2e" / "trials").iterdir())) == 1, out
    assert standin_processes(tmp_path) == []


def _storage_flags(tmp: Path, storage: str, request: pytest.FixtureRequest) -> list[str]:
    if storage == "postgresql":
        server = request.getfixturevalue("postgres")
        return ["--storage", server.create_database(f"rel_{os.getpid()}_{tmp.name[-8:]}")]
    return []


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
def test_two_workers_started_together_never_share_a_node(
    tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> None:
    # every budgeted run launched: the value stop (whose costs are the measured, load-dependent
    # trial durations) left out, so that the budget is what ends both workers
    data = study_data(tmp_path, SURFACE, n_trials=6, heartbeat_s=2, stop_chance=None)
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "0.3"  # ~1-2 s per trial
    path = write_study(tmp_path, data)
    results = tmp_path / "results"
    flags = ["--study", str(path), "--results", str(results), "--quiet"]
    flags += _storage_flags(tmp_path, storage, request)
    workers = [tune("run", *flags, cwd=tmp_path) for _ in range(2)]  # at the same moment
    watch = NodeWatch(tmp_path)
    outs = watch.watch(*workers)
    for w, out in zip(workers, outs, strict=True):
        assert w.returncode == 0, out
    assert watch.overlaps == [], watch.overlaps
    assert len(watch.seen_trials) >= 2, "the watch never saw trials run"
    store = flags[flags.index("--storage") + 1] if "--storage" in flags else None
    rows = _rows(data, results, store)
    # Every budgeted run measured a config. Known limit (see the README): two workers that
    # check the budget at the same moment may each launch the last run, one over n_trials.
    ok = int((rows.outcome == "ok").sum())
    assert 6 <= ok <= 6 + len(workers) - 1, rows[["trial", "outcome", "reason"]]
    assert not (rows.outcome == "running").any()
    assert standin_processes(tmp_path) == []


def test_a_worker_started_right_after_another_was_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the dead worker's trials running on their nodes. The next worker, started
    at once, never puts a second trial on those nodes, does not count the dead worker's trials
    as runs, cleans them up once its leases expire and measures the whole budget."""
    data = study_data(tmp_path, SURFACE, n_trials=4, heartbeat_s=1)  # dead after ~4 s
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "3"  # ~15 s per trial
    path = write_study(tmp_path, data)
    results = tmp_path / "results"
    flags = ["--study", str(path), "--results", str(results), "--quiet"]
    dead = tune("run", *flags, cwd=tmp_path)
    watch = NodeWatch(tmp_path)
    deadline = time.monotonic() + 90
    while len({p.cwd for p in _standins(tmp_path)}) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len({p.cwd for p in _standins(tmp_path)}) == 2, "the first worker never got going"
    dead.kill()
    dead.communicate()
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "0.3"
    write_study(tmp_path, data)
    live = tune("run", *flags, "--force", cwd=tmp_path)
    (out,) = watch.watch(live)
    assert live.returncode == 0, out
    assert watch.overlaps == [], watch.overlaps
    rows = _rows(data, results)
    assert (rows.outcome == "ok").sum() == 4, rows[["trial", "outcome", "reason"]]
    assert not (rows.outcome == "running").any()
    assert standin_processes(tmp_path) == []


def test_ctrl_c_twice_cleans_up_and_loses_nothing(tmp_path: Path) -> None:
    """A terminal sends SIGINT to the whole foreground process group; pressed twice, the
    tuner's own process reaper must survive and every trial be recorded."""
    data = study_data(tmp_path, SURFACE, n_trials=4)
    # paced so that both trials are still training (4 iterations of 1-2.5 s left) when the
    # first iteration is seen and the first Ctrl-C lands
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = "1"
    data["launch"]["env"]["TUNER_STANDIN_IGNORE_SIGTERM"] = "1"  # the reaper waits its grace
    path = write_study(tmp_path, data)
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli.main", "run", "--study", str(path), "--results",
         str(results), "--quiet"], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90

    def training() -> bool:  # past start-up: the ranks now ignore SIGTERM
        logs = list((results / "e2e" / "trials").glob("*/node-0.log"))
        return len(logs) >= 2 and all(" iteration " in p.read_text() for p in logs)

    while not training() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert training(), "no trial started"
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(2.0)  # the second press lands while the reaper waits out its grace period
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    # the second press came during the cleanup; said as the CLI's other lines, not a log record
    still = [line for line in out.splitlines() if "still stopping" in line]
    assert still == ["tune: warning: SIGINT: still stopping; the running trials are being "
                     "cleaned up"], out  # fmt: skip
    assert "reaper" not in out and "Traceback" not in out, out
    assert standin_processes(tmp_path) == []
    rows = _rows(data, results)
    assert (rows.outcome == "interrupted").sum() >= 1, rows[["trial", "outcome"]]


def test_sigterm_to_tune_profile_cancels_the_probe_it_started(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) of ``tune profile`` while its probe job runs under torchrun: the job
    is cancelled on the way out, as with Ctrl-C, not left running on the node; one line, exit
    130. (By default SIGTERM ends Python without unwinding: the job ran on to its end.)"""
    results = tmp_path / "results"

    def probe() -> list[str]:
        return live_processes(lambda p: p.cwd.startswith(str(results))
                              and "profile_job.py" in p.cmdline)  # fmt: skip

    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli.main", "profile", "--study", "demo", "--results",
         str(results)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(probe()) < 2 and time.monotonic() < deadline:  # both ranks started
            time.sleep(0.2)
        assert len(probe()) >= 2, "the probe job never started"
        proc.send_signal(signal.SIGTERM)  # the tuner alone, as `kill PID` does
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (out, err)
        assert err.strip().splitlines() == ["tune: interrupted"], err
        deadline = time.monotonic() + 15  # the reaper's grace, then its kill
        while probe() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert probe() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for line in probe():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)


@contextlib.contextmanager
def _mounted(args: list[str], target: Path) -> Iterator[None]:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_a_read_only_results_folder_is_one_line(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE, n_trials=1)
    path = write_study(tmp_path, data)
    source, results = tmp_path / "src", tmp_path / "ro"
    done = _cli("run", "--study", str(path), "--results", str(source), "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with _mounted(["--bind", "-o", "ro", str(source)], results):
        run = _cli("run", "--study", str(path), "--results", str(results), cwd=tmp_path)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1, run.stderr
        assert "not writable" in lines[0] and str(results / "e2e") in lines[0]
        best = _cli("best", "--study", str(path), "--results", str(results), cwd=tmp_path)
        lines = best.stderr.strip().splitlines()
        assert best.returncode == 1 and len(lines) == 1, best.stderr
        assert "Read-only file system" in lines[0]
        board = _cli("leaderboard", "--study", str(path), "--results", str(results),
                     cwd=tmp_path)  # fmt: skip
        assert board.returncode == 0 and "Traceback" not in board.stderr, board.stderr


def test_a_nearly_full_results_folder_is_refused_before_launching(tmp_path: Path) -> None:
    data = study_data(tmp_path, SURFACE, n_trials=1)
    path = write_study(tmp_path, data)
    results = tmp_path / "small"
    with _mounted(["-t", "tmpfs", "-o", "size=2m", "tmpfs"], results):
        done = subprocess.run(
            [sys.executable, "-m", "tuner.cli.main", "run", "--study", str(path), "--results",
             str(results)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert "MiB free" in lines[0]
        assert not (results / "e2e" / "trials").exists()


def test_a_result_the_full_disk_refused_is_recovered_next_time(tmp_path: Path) -> None:
    """The study storage fills up while trials run: ``tune run`` stops with the real cause in
    one line, and the next start records the finished trial from its folder instead of
    running it again."""
    # Slow beats while the disk fills, so that telling the study is the first write to fail;
    # quick ones for the second worker, which then finds the first one's leases expired.
    data = study_data(tmp_path, SURFACE, n_trials=2, heartbeat_s=30)
    # ~5 s per trial; a file the stand-in reads at every sleep: the second run goes unpaced
    (tmp_path / "time_scale").write_text("1")
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = str(tmp_path / "time_scale")
    path = write_study(tmp_path, data)
    results, db_dir = tmp_path / "results", tmp_path / "db"
    with _mounted(["-t", "tmpfs", "-o", "size=4m", "tmpfs"], db_dir):
        flags = ["--study", str(path), "--results", str(results), "--quiet",
                 "--storage", f"sqlite:///{db_dir / 'study.db'}"]  # fmt: skip
        first = tune("run", *flags, cwd=tmp_path)
        deadline = time.monotonic() + 90
        while len({p.cwd for p in _standins(tmp_path)}) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len({p.cwd for p in _standins(tmp_path)}) == 2, "the trials never started"
        filler = db_dir / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True,
                       check=False)  # fmt: skip
        out, _ = first.communicate(timeout=180)
        assert first.returncode == 1, out
        assert "database or disk is full" in out.strip().splitlines()[-1], out
        assert "Traceback" not in out
        # the first trial to finish wrote its metrics; the other one was cancelled
        measured = list(results.glob("e2e/trials/*/metrics.json"))
        assert len(measured) == 1
        filler.unlink()
        data["search"]["heartbeat_s"] = 1
        write_study(tmp_path, data)
        (tmp_path / "time_scale").write_text("0.0001")
        second = tune("run", *flags, cwd=tmp_path)
        out, _ = second.communicate(timeout=180)
        assert second.returncode == 0, out
        rows = _rows(data, results, f"sqlite:///{db_dir / 'study.db'}")
        assert (rows.outcome == "ok").sum() == 2, rows[["trial", "outcome", "reason"]]
        # the measured trial was recovered, not run again; the cancelled one ran once more
        assert len(list((results / "e2e" / "trials").iterdir())) == 3
    assert standin_processes(tmp_path) == []


def test_every_node_quarantined_exits_1_with_the_reason(tmp_path: Path) -> None:
    """Nodes that refuse every connection are retried, quarantined after two node errors each,
    and then the study stops: exit 1, not 0, and no trial counted as a run."""
    data = study_data(tmp_path, SURFACE, n_trials=4)
    closed = _closed_port()
    data["cluster"] = {
        "gpu": "a100-80gb", "gpus_per_node": 2, "nodes": ["127.0.0.2", "127.0.0.3"],
        "executor": "ssh",
        "ssh": {"port": closed, "config_file": str(tmp_path / "ssh_config"),
                "known_hosts": str(tmp_path / "known_hosts"), "connect_timeout_s": 2},
    }  # fmt: skip
    (tmp_path / "ssh_config").write_text("")
    (tmp_path / "known_hosts").write_text("")
    path = write_study(tmp_path, data)
    results = tmp_path / "results"
    done = _cli("run", "--study", str(path), "--results", str(results), "--quiet",
                "--skip-preflight", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "every node is quarantined" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    rows = _rows(data, results)
    assert set(rows.outcome) == {"node_error"}, rows[["trial", "outcome", "reason"]]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def test_a_trials_token_is_recorded_before_its_processes_start(tmp_path: Path) -> None:
    """A worker killed between starting a trial's processes and recording their token left
    processes no other worker could find: the expired lease read as "claimed, never launched",
    and the next worker put a second trial on the node (seen under load in the test above). The
    token is now on the trial and its leases before the executor starts anything."""
    from tuner.launch import LaunchRequest, LocalExecutor
    from tuner.study.build import build_loop

    spec = study_from_mapping(study_data(tmp_path, SURFACE, n_trials=2))
    seen: list[tuple[str | None, list[str | None], Any]] = []

    class Recording(LocalExecutor):
        def submit(self, request: LaunchRequest, token: str | None = None) -> Any:
            trial = loop.study.get_trials(deepcopy=False)[request.trial]
            held = [x.token for x in loop.leases.held()  # the nodes' leases (not the config's)
                    if x.trial == request.trial and x.resource.startswith("host:")]  # fmt: skip
            seen.append((token, held, trial.user_attrs.get("token")))
            return super().submit(request, token)

    loop = build_loop(spec, results=str(tmp_path / "results"), executor=Recording())
    try:
        loop.run()
    finally:
        loop.executor.close()
    assert len(seen) >= 2
    for token, held, recorded in seen:
        assert token is not None and recorded == token and held and set(held) == {token}
    assert standin_processes(tmp_path) == []
