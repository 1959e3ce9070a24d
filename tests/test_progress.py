"""Live progress of ``tune run``: a running trial's phase from its real log, the time it has
left, its Slurm job id, and the budget's ETA."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.logs.conftest import FIXTURES
from tuner.cli.progress import budget_eta, clock_text, running_cells
from tuner.logs.progress import last_iteration, log_iteration
from tuner.spec.file import study_from_mapping

SPEC = study_from_mapping({
    "name": "progress",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron", "train_iters": 20},
    "search": {"trial_timeout_min": 10},
})  # fmt: skip


def test_the_last_iteration_of_real_logs() -> None:
    megatron = FIXTURES / "megatron_iter_NVIDIA-Megatron-LM-756.log"
    if not megatron.exists():
        pytest.skip(f"shared log fixtures not found at {FIXTURES}")
    printed = [int(n) for n in re.findall(r"\] iteration\s+(\d+)/", megatron.read_text())]
    assert len(printed) > 2 and log_iteration(megatron) == max(printed)
    assert last_iteration("tuner-step: iter=3 time_s=0.5\ntuner-step: iter=4 time_s=0.5") == 4
    assert last_iteration("steps: 12 loss: 2.5 iter time (s): 0.9 samples/sec: 11.0") == 12
    assert last_iteration("loading checkpoint ...\n") is None
    # not counts (a ValueError from int() before: over 4,300 digits, a superscript digit)
    huge = "9" * 5000
    assert last_iteration(f" iteration {huge}/ 10 | elapsed time per iteration (ms): 1 |") is None
    assert last_iteration(f"steps: {huge} loss: 2.5 iter time (s): 0.9 samples/sec: 1") is None
    assert last_iteration(f"tuner-step: iter={huge} time_s=0.5\ntuner-step: iter=\u00b2") is None
    assert log_iteration(Path("/nonexistent/node-0.log")) is None


def _loop(now: float) -> SimpleNamespace:
    return SimpleNamespace(spec=SPEC, clock=lambda: now)


def test_a_running_trial_shows_its_phase_time_left_and_job(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    paths = SimpleNamespace(node_log=lambda rank: tmp_path / f"node-{rank}.log")
    queued = SimpleNamespace(job=SimpleNamespace(job_id="4242", state="PENDING",
                                                 pending_reason="Resources", paths=paths),
                             started=0.0)  # fmt: skip
    assert running_cells(_loop(30.0), queued) == ("4242", "queued (Resources)", "")  # type: ignore[arg-type]
    local = SimpleNamespace(job=SimpleNamespace(paths=paths), started=100.0)
    assert running_cells(_loop(130.0), local) == ("", "starting", "9:30")  # type: ignore[arg-type]
    megatron = FIXTURES / "megatron_iter_NVIDIA-Megatron-LM-756.log"
    if megatron.exists():
        shutil.copy(megatron, log)
        k = log_iteration(log)
        assert running_cells(_loop(400.0), local) == ("", f"iteration {k} of 20", "5:00")  # type: ignore[arg-type]


def test_the_budget_eta() -> None:
    assert budget_eta([], 5, [10.0], 1) is None  # nothing finished: nothing to go by
    assert budget_eta([], 5, [10.0], 1, wall_left=600.0) == 600.0
    # 4 more at 100 s, two at a time, after the running one's 40 s left: (40 + 400) / 2
    assert budget_eta([90.0, 110.0], 4, [60.0], 2) == 220.0
    assert budget_eta([100.0], 0, [30.0, 90.0], 2) == 70.0  # the last running one
    assert budget_eta([100.0], 10, [], 1, wall_left=300.0) == 300.0
    assert (
        clock_text(59.4) == "0:59" and clock_text(3723) == "1:02:03" and clock_text(-5) == "0:00"
    )


def _live_loop(
    now: float,
    running: dict[int, SimpleNamespace],
    *,
    n_trials: int,
    launched: int,
    node_hours: float,
) -> SimpleNamespace:
    """What the live display reads of a loop: ``running`` trials at ``now``, beside trial 0
    finished ok at 1.5 s (120 s long, 1.4 s predicted), the best."""
    from optuna.trial import create_trial

    finished = create_trial(value=1.5, user_attrs={"duration_s": 120.0, "predicted_step_s": 1.4})
    finished.number = 0
    return SimpleNamespace(
        spec=SPEC, clock=lambda: now, started=0.0, running=running, n_trials=n_trials,
        trials=lambda: [finished], best=lambda trials: finished,
        summary=SimpleNamespace(outcomes={"ok": 1}), launched_count=lambda trials: launched,
        node_hours=lambda trials: node_hours,
    )  # fmt: skip


def test_the_live_display_shows_phase_eta_and_job(tmp_path: Path) -> None:
    """The live table and status of a loop with one queued Slurm trial and one finished."""
    from rich.console import Console

    from tuner.cli.progress import LiveProgress
    from tuner.config.parallel import ParallelConfig

    paths = SimpleNamespace(node_log=lambda rank: tmp_path / f"node-{rank}.log")
    job = SimpleNamespace(job_id="4242", state="PENDING", pending_reason="Priority", paths=paths)
    config = ParallelConfig(tp=2, dp=4, sequence_parallel=True, global_batch_size=64)
    run = SimpleNamespace(job=job, started=500.0, config=config,
                          group=SimpleNamespace(hosts=("slurm-0",)))  # fmt: skip
    loop = _live_loop(560.0, {1: run}, n_trials=1, launched=2, node_hours=0.05)
    console = Console(record=True, width=120)
    console.print(LiveProgress()._render(loop))  # type: ignore[arg-type]
    text = console.export_text()
    assert "tp2 pp1 dp4 sp mbs1 ga16" in text and "queued (Priority)" in text
    assert "4242" in text and "2/1 run, 0.050 node-hours, 9:20 elapsed" in text
    assert "about 1:00 left" in text  # nothing more to launch: the queued one's 120 - 60 s
    line = LiveProgress()._line(loop)  # type: ignore[arg-type]
    assert line == "running 1 (trial 1 queued (Priority)); ok 1; best 1.500 s (trial 0)"


def test_a_local_trial_at_80_columns_folds_its_config_onto_two_lines(tmp_path: Path) -> None:
    """``make demo``'s live table at 80 columns: an empty "Slurm job" column for a local trial,
    and the config folded onto three lines (``tp1 pp2`` / ``dp1 mbs1`` / ``ga8 zero1``) once the
    phase read ``iteration 1 of 8``. A local study's table has no job column, and the config
    folds onto two lines at most."""
    from rich.console import Console

    from tuner.cli.progress import LiveProgress
    from tuner.config.parallel import ParallelConfig

    log = tmp_path / "node-0.log"
    log.write_text("tuner-step: iter=1 time_s=0.5\n")
    job = SimpleNamespace(paths=SimpleNamespace(node_log=lambda rank: log))
    config = ParallelConfig(pp=2, dp=1, global_batch_size=8, zero_stage=1)
    run = SimpleNamespace(job=job, started=500.0, config=config,
                          group=SimpleNamespace(hosts=("local-0",)))  # fmt: skip
    loop = _live_loop(507.0, {0: run}, n_trials=8, launched=1, node_hours=0.002)
    console = Console(record=True, width=80)
    console.print(LiveProgress()._render(loop))  # type: ignore[arg-type]
    text = console.export_text()
    assert "iteration 1 of 20" in text and "Slurm job" not in text, text
    cells = _column(text, "config", "phase")
    assert " ".join(cells).split() == "tp1 pp2 dp1 mbs1 ga8 zero1".split(), text
    assert len([c for c in cells if c]) <= 2, text


def _column(text: str, header: str, after: str) -> list[str]:
    """The cells of the live table's column ``header`` (up to column ``after``), a line each."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("trial "))
    start, end = lines[head].index(header), lines[head].index(after)
    rows = lines[head + 2 : next(i for i, line in enumerate(lines) if line.startswith("outcomes"))]
    return [line[start:end].strip() for line in rows if not line.startswith("left out")]


def test_a_16_node_slurm_trial_at_80_columns_keeps_every_figure(tmp_path: Path) -> None:
    """The README's study (16 nodes a trial, on Slurm) at 80 columns: the live table joined the
    16 node names into one cell that took the whole width, and the trial's number, config,
    elapsed and left times and Slurm job id were drawn as empty slivers. The nodes are the
    first and a count, and a column that does not fit is left out and named, never cut."""
    from rich.console import Console

    from tuner.cli.progress import LiveProgress, hosts_text
    from tuner.config.parallel import ParallelConfig

    log = tmp_path / "node-0.log"
    log.write_text("tuner-step: iter=12 time_s=30.5\n")
    config = ParallelConfig(tp=4, pp=8, vp=2, dp=4, global_batch_size=512,
                            sequence_parallel=True, distributed_optimizer=True)  # fmt: skip
    hosts = tuple(f"slurm-{i}" for i in range(16))
    runs = {n: SimpleNamespace(
        job=SimpleNamespace(job_id=f"{1234567 + n}", state="RUNNING",
                            paths=SimpleNamespace(node_log=lambda rank: log)),
        started=500.0 + n, config=config, group=SimpleNamespace(hosts=hosts),
    ) for n in (3, 4)}  # fmt: skip
    loop = _live_loop(1507.0, runs, n_trials=12, launched=5, node_hours=12.5)
    for width, nodes in ((80, False), (120, True)):
        console = Console(record=True, width=width)
        console.print(LiveProgress()._render(loop))  # type: ignore[arg-type]
        text = console.export_text()
        assert all(len(line.rstrip()) <= width for line in text.splitlines()), text
        for figure in ("iteration 12 of 20", "16:44", "16:43", "1234570", "1234571"):
            assert figure in text, (width, text)
        assert _column(text, "trial", "config") == ["3", "", "4", ""] or \
            _column(text, "trial", "config") == ["3", "4"], text  # fmt: skip
        assert " ".join(_column(text, "config", "phase")).split()[:2] == ["tp4", "pp8"], text
        assert ("slurm-0 +15" in text) is nodes, text
        assert ("left out to fit 80 columns: nodes" in text) is not nodes, text
    assert hosts_text(("a",)) == "a" and hosts_text(("a", "b")) == "a, b"


def test_a_queued_trials_reason_folds_and_its_job_id_stays(tmp_path: Path) -> None:
    """A Slurm job held for a long reason (its words up to 30 characters wide) at 80 columns:
    the reason folds onto two lines and the job id, what squeue and scancel take, is kept
    before the elapsed time."""
    from rich.console import Console

    from tuner.cli.progress import LiveProgress
    from tuner.config.parallel import ParallelConfig

    reason = "ReqNodeNotAvail, UnavailableNodes:gpu[001-016]"
    paths = SimpleNamespace(node_log=lambda rank: tmp_path / "none.log")
    job = SimpleNamespace(job_id="12345678", state="PENDING", pending_reason=reason, paths=paths)
    config = ParallelConfig(tp=4, pp=8, vp=2, dp=4, global_batch_size=512,
                            sequence_parallel=True, distributed_optimizer=True)  # fmt: skip
    hosts = tuple(f"slurm-{i}" for i in range(16))
    run = SimpleNamespace(job=job, started=500.0, config=config,
                          group=SimpleNamespace(hosts=hosts))  # fmt: skip
    loop = _live_loop(560.0, {0: run}, n_trials=12, launched=1, node_hours=0.0)
    console = Console(record=True, width=80)
    console.print(LiveProgress()._render(loop))  # type: ignore[arg-type]
    text = console.export_text()
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines()), text
    assert "12345678" in text and "UnavailableNodes:gpu[001-016])" in text, text
    assert "queued (ReqNodeNotAvail," in text, text
