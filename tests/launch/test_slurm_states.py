"""Slurm's own verdicts on the real local Slurm (tools/local_slurm.py): a job that can never start
is cancelled at once as a launch error, final records come from sacct where it works and from
scontrol where the cluster has no accounting (the local one has none); states the local Slurm
cannot produce (OUT_OF_MEMORY, PREEMPTED, NODE_FAIL, a cancel by someone else) come from a fake
``sacct`` on PATH in front of the real daemons."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import pytest

from tuner.launch import LaunchRequest
from tuner.launch.slurm import SlurmExecutor, SlurmJob
from tuner.launch.slurm_states import NEVER_STARTS, Accounting, never_starts, scheduler_verdict
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.spec.study import SlurmSpec, StudySpec
from tuner.study.record import judge

from .contract import FakeClock
from .slurm import LocalSlurm, local_slurm

__all__ = ["local_slurm"]

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _request(tmp_path: Path, n: int, script: str, nodes: int = 1, **kw: Any) -> LaunchRequest:
    layout = ResultsLayout(tmp_path / "res", "states")
    return LaunchRequest(trial=n, hosts=tuple(f"slurm-{k}" for k in range(nodes)),
                         scripts=(script,) * nodes, paths=layout.trial(n), **kw)  # fmt: skip


def _squeue_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return out.split()


def test_more_nodes_than_the_partition_has_is_a_launch_error_at_once(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    clock = FakeClock()  # the trial's limit can never be what ends it
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.2), clock=clock)
    try:
        job = ex.submit(_request(tmp_path, 0, "sleep 300", nodes=3, timeout_s=3600))
        assert isinstance(job, SlurmJob)
        result = job.wait(timeout=60)
        assert result.scheduler_verdict is not None
        outcome, reason = result.scheduler_verdict
        assert outcome == "launch_error" and "\n" not in reason
        assert "PartitionNodeLimit" in reason or "PartitionConfig" in reason, reason
        assert job.job_id in reason and not result.cancelled and not result.timed_out
        assert job.job_id not in _squeue_ids()
        verdict = judge_result(result)
        assert verdict.outcome == Outcome.LAUNCH_ERROR and verdict.reason == reason
    finally:
        ex.close()


def judge_result(result: Any) -> Any:
    """Slurm's verdicts and node errors are decided before the logs (no spec is read)."""
    return judge(cast(StudySpec, None), cast(Any, None), result)


def test_a_temporary_reason_waits_until_the_pending_limit(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    clock = FakeClock()
    spec = SlurmSpec(poll_interval_s=0.2, pending_limit_min=10)
    ex = SlurmExecutor(spec, clock=clock)
    hold = subprocess.run(["sbatch", "--parsable", "-N2", "--exclusive", "--output=/dev/null",
                           "--wrap", "sleep 300"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    try:
        job = ex.submit(_request(tmp_path, 1, "true", nodes=2))
        assert isinstance(job, SlurmJob)
        for _ in range(100):  # the nodes are busy: Resources (or Priority), never a verdict
            assert job.poll() is None
            if job.pending_reason in ("Resources", "Priority"):
                break
            time.sleep(0.2)
        assert job.pending_reason in ("Resources", "Priority"), job.pending_reason
        clock.now += 9 * 60
        time.sleep(0.5)
        assert job.poll() is None and job.state == "PENDING"
        clock.now += 2 * 60
        result = job.wait(timeout=60)
        assert result.scheduler_verdict is not None
        assert result.scheduler_verdict[0] == "interrupted"
        assert "pending_limit_min" in result.scheduler_verdict[1]
        assert job.job_id not in _squeue_ids()
    finally:
        subprocess.run(["scancel", hold], check=False)
        ex.close()


def test_no_accounting_falls_back_to_scontrol_and_says_so_once(
    local_slurm: LocalSlurm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.2))
    caplog.set_level(logging.WARNING, logger="tuner.launch.slurm_states")
    try:
        for n in (2, 3):
            result = ex.submit(_request(tmp_path, n, "exit 3")).wait(timeout=60)
            assert result.exit_codes == (3,)
            assert result.accounting["source"] == "scontrol"
            assert result.accounting["State"] == "FAILED"
            assert result.accounting["ExitCode"] == "3:0"
        assert ex.accounting.disabled is not None and "disabled" in ex.accounting.disabled
        said = [r for r in caplog.records if "sacct cannot be used" in r.getMessage()]
        assert len(said) == 1
    finally:
        ex.close()


def _fake_sacct(tmp_path: Path, state: str, exit_code: str = "0:0") -> dict[str, str]:
    """A ``sacct`` on PATH that reports ``state`` for any job (the real daemons do the rest)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sacct"
    script.write_text(
        "#!/bin/bash\n# args: -n -P -j ID -o FIELDS\n"
        f'echo "$4|{state}|{exit_code}|00:00:02|"\n'
        f'echo "$4.batch|{state}|{exit_code}|00:00:02|1.5G"\n'
        f'echo "$4.0|{state}|{exit_code}|00:00:02|2048K"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("state", "outcome", "words"),
    [
        ("OUT_OF_MEMORY", Outcome.OOM, "host memory"),
        ("PREEMPTED", Outcome.INTERRUPTED, "preempted"),
        ("CANCELLED by 1000", Outcome.INTERRUPTED, "by 1000"),
        ("NODE_FAIL", Outcome.NODE_ERROR, "NODE_FAIL"),
    ],
)
def test_sacct_states_become_outcomes(
    local_slurm: LocalSlurm, tmp_path: Path, state: str, outcome: Outcome, words: str
) -> None:
    ex = SlurmExecutor(SlurmSpec(poll_interval_s=0.2), env=_fake_sacct(tmp_path, state, "0:9"))
    try:
        result = ex.submit(_request(tmp_path, 4, "exit 0")).wait(timeout=60)
        assert result.accounting["source"] == "sacct"
        assert result.accounting["State"] == state
        assert result.accounting["MaxRSS"] == str(int(1.5 * (1 << 30)))
        verdict = judge_result(result)
        assert verdict.outcome == outcome and words in (verdict.reason or ""), verdict
    finally:
        ex.close()


def test_never_starts_knows_permanent_and_temporary_reasons() -> None:
    def no_command(argv: Any) -> tuple[int, str, str]:
        raise AssertionError(f"ran {argv}")

    assert never_starts("PartitionNodeLimit", no_command)
    assert never_starts("AssocGrpGRES", no_command) and "QOSMaxGRESPerJob" in NEVER_STARTS
    for reason in ("Resources", "Priority", "Dependency", "BeginTime", "None"):
        assert not never_starts(reason, no_command)

    def nodes(state: str) -> Any:
        return lambda argv: (0, f"NodeName=n3 Arch=x State={state} Partitions=debug\n", "")

    assert never_starts("ReqNodeNotAvail, UnavailableNodes:n3", nodes("DOWN+NOT_RESPONDING"))
    assert not never_starts("ReqNodeNotAvail, UnavailableNodes:n3", nodes("ALLOCATED"))
    assert not never_starts("ReqNodeNotAvail, Reserved for maintenance", no_command)
    assert scheduler_verdict("COMPLETED", "COMPLETED") is None
    assert scheduler_verdict("FAILED", "FAILED") is None  # the logs decide


def test_accounting_reads_sacct_records() -> None:
    out = "7|COMPLETED|0:0|00:01:05|\n7.batch|COMPLETED|0:0|00:01:05|512M\n7.0|COMPLETED|0:0||3G\n"
    acct = Accounting(lambda argv: (0, out, ""))
    record = acct.final("7", None)
    assert record == {"State": "COMPLETED", "ExitCode": "0:0", "Elapsed": "00:01:05",
                      "MaxRSS": str(3 << 30), "source": "sacct"}  # fmt: skip
    empty = Accounting(lambda argv: (0, "", ""))  # not in the database yet
    assert empty.final("7", {"JobState": "FAILED", "ExitCode": "2:0"})["source"] == "scontrol"
    assert empty.disabled is None
