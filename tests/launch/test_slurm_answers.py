"""Odd answers from the Slurm commands, through stand-in ``sbatch``, ``squeue``, ``scontrol``,
``scancel`` and ``sacct`` scripts on PATH (no Slurm needed): a trial's job is never watched under
the wrong id, never taken as ended while Slurm still holds it, and never left unwatched."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tuner.errors import LaunchError
from tuner.launch import LaunchRequest
from tuner.launch.slurm import SlurmExecutor, SlurmJob
from tuner.launch.slurm_states import ENDED, submitted_job_id
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.spec.study import SlurmSpec

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct")


class StandIns:
    """A folder of stand-in Slurm commands: each logs its arguments to ``calls`` and prints the
    file ``answers/<command>`` (nothing when there is none), exit 0."""

    def __init__(self, root: Path) -> None:
        self.bin, self.answers, self.calls = root / "bin", root / "answers", root / "calls"
        self.bin.mkdir()
        self.answers.mkdir()
        for name in COMMANDS:
            script = self.bin / name
            script.write_text(
                "#!/bin/sh\n"
                f'echo "{name} $*" >> {shlex.quote(str(self.calls))}\n'
                f"cat {shlex.quote(str(self.answers / name))} 2>/dev/null\n"
                "exit 0\n"
            )
            script.chmod(0o755)

    def answer(self, command: str, text: str) -> None:
        (self.answers / command).write_text(text)

    def behave(self, command: str, body: str) -> None:
        """Replace what the stand-in ``command`` does (after logging its call) by ``body``."""
        script = self.bin / command
        script.write_text(
            f'#!/bin/sh\necho "{command} $*" >> {shlex.quote(str(self.calls))}\n{body}\n'
        )

    def called(self, command: str) -> list[str]:
        lines = self.calls.read_text().splitlines() if self.calls.exists() else []
        return [line for line in lines if line.split()[0] == command]

    def executor(self, **kwargs: float) -> SlurmExecutor:
        return SlurmExecutor(
            SlurmSpec(poll_interval_s=0.01), env={"PATH": f"{self.bin}:/usr/bin:/bin"},
            cancel_timeout_s=0.5, **kwargs,
        )  # fmt: skip

    def queue_one_job(self, then: str) -> None:
        """sbatch queues job 4242 (a file holding its id) and then does ``then``; squeue,
        scontrol and scancel see, show and cancel that one job."""
        queued = shlex.quote(str(self.answers / "queued"))
        self.behave("sbatch", f"echo 4242 > {queued}\n{then}")
        self.behave("squeue", f"cat {queued} 2>/dev/null; exit 0")
        self.behave("scancel", f'[ "$1" = "$(cat {queued} 2>/dev/null)" ] && rm {queued}; exit 0')
        self.behave("scontrol", (
            f"[ -e {queued} ] || {{ echo 'Invalid job id specified' >&2; exit 1; }}\n"
            "echo 'JobId=4242 JobName=tuner-t0-tok JobState=PENDING'"
        ))  # fmt: skip

    def queued(self) -> bool:
        return (self.answers / "queued").exists()


@pytest.fixture
def slurm(tmp_path: Path) -> StandIns:
    return StandIns(tmp_path)


def _request(tmp_path: Path) -> LaunchRequest:
    request = LaunchRequest(trial=0, hosts=("slurm-0",), scripts=("true",),
                            paths=ResultsLayout(tmp_path / "results", "s").trial(0))  # fmt: skip
    request.paths.dir.mkdir(parents=True)
    return request


def test_the_job_id_is_read_past_a_site_wrapper_s_own_lines(
    slurm: StandIns, tmp_path: Path
) -> None:
    """A site's sbatch wrapper printing a line before sbatch's ``4242``: the whole text, both
    lines, was taken as the job id; scontrol knew no such job, so the trial ended at its first
    poll ("vanished") while job 4242 ran on, unwatched and never cancelled."""
    slurm.answer("sbatch", "Note: job routed to partition gpu by site policy\n4242\n")
    slurm.answer("scontrol", "JobId=4242 JobName=tuner-t0-tok JobState=RUNNING NodeList=n1\n")
    job = slurm.executor().submit(_request(tmp_path), token="tok")
    assert isinstance(job, SlurmJob) and job.job_id == "4242"
    assert job.poll() is None and job.state == "RUNNING"
    assert slurm.called("scontrol")[0] == "scontrol show job -o 4242"


@pytest.mark.parametrize(
    ("stdout", "job_id"),
    [("4242\n", "4242"), ("4242;cluster2\n", "4242"), ("Submitted batch job 4242\n", "4242"),
     ("Submitted batch job 4242 on cluster c2\n", "4242"), ("banner\n\n4242 \n\n", "4242"),
     ("", None), ("\n", None), ("sbatch: warning: x\n", None), ("4242 extra\n", None)],
)  # fmt: skip
def test_what_sbatch_printed_is_a_job_id_or_none(stdout: str, job_id: str | None) -> None:
    assert submitted_job_id(stdout) == job_id


def test_sbatch_printing_no_job_id_is_a_launch_error_and_the_job_is_cancelled(
    slurm: StandIns, tmp_path: Path
) -> None:
    """sbatch exiting 0 with nothing on stdout: the job was watched as ``""``, and
    ``scontrol show job -o ""`` lists every job, so the trial followed whichever came first
    (another user's). Now it is a launch error, and a job of the trial's name that sbatch did
    submit is cancelled, not left to run unwatched."""
    slurm.answer("squeue", "5151\n")
    slurm.answer("scontrol", "JobId=5151 JobName=tuner-t0-tok JobState=CANCELLED\n")
    with pytest.raises(LaunchError, match="sbatch printed no job id: 'nothing'$"):
        slurm.executor().submit(_request(tmp_path), token="tok")
    assert slurm.called("squeue") == ["squeue -h --name tuner-t0-tok -o %i"]
    assert slurm.called("scancel") == ["scancel 5151"]
    assert slurm.called("scontrol") == ["scontrol show job -o 5151"]  # waited until it ended


SOCKET_TIMEOUT = (
    "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
)


def test_a_job_queued_by_an_sbatch_that_then_failed_is_cancelled(
    slurm: StandIns, tmp_path: Path
) -> None:
    """sbatch exiting 1 with a socket timeout after a loaded slurmctld had queued the job: the
    trial was a launch error and ran again elsewhere, while its first job ran on unwatched (the
    user paid twice). Now the job of the trial's name is cancelled, and waited for, first."""
    slurm.queue_one_job(f"echo '{SOCKET_TIMEOUT}' >&2; exit 1")
    with pytest.raises(LaunchError) as raised:
        slurm.executor().submit(_request(tmp_path), token="tok")
    assert f"sbatch refused the job: {SOCKET_TIMEOUT}" in str(raised.value)
    assert "may be left" not in str(raised.value)
    assert slurm.called("squeue") == ["squeue -h --name tuner-t0-tok -o %i"]
    assert slurm.called("scancel") == ["scancel 4242"] and not slurm.queued()


def test_a_job_queued_by_an_sbatch_that_then_hung_is_cancelled(
    slurm: StandIns, tmp_path: Path
) -> None:
    """sbatch queuing the job and then hanging, killed at the submit timeout: the same job
    left running unwatched, now cancelled."""
    slurm.queue_one_job("exec sleep 30")
    with pytest.raises(LaunchError, match=r"sbatch: no answer within 0.5 s \(killed\)"):
        slurm.executor(submit_timeout_s=0.5).submit(_request(tmp_path), token="tok")
    assert slurm.called("scancel") == ["scancel 4242"] and not slurm.queued()


def test_a_failed_look_for_the_job_says_how_to_cancel_it(slurm: StandIns, tmp_path: Path) -> None:
    """sbatch failing, and squeue failing too (the controller still down): the error says a
    job of the trial's name may be left, and the command that cancels it."""
    slurm.queue_one_job(f"echo '{SOCKET_TIMEOUT}' >&2; exit 1")
    slurm.behave(
        "squeue", "echo 'squeue: error: Socket timed out on send/recv operation' >&2\nexit 1"
    )
    with pytest.raises(LaunchError) as raised:
        slurm.executor().submit(_request(tmp_path), token="tok")
    said = str(raised.value)
    assert said.count("\n") == 0 and SOCKET_TIMEOUT in said
    assert "a Slurm job named tuner-t0-tok may be left" in said
    assert "scancel --name tuner-t0-tok" in said and "squeue --name tuner-t0-tok" in said


def test_a_job_that_will_not_end_after_a_failed_sbatch_is_named(
    slurm: StandIns, tmp_path: Path
) -> None:
    """scancel answering but the job staying queued past the cancel timeout: not taken as
    gone; the error names it and how to cancel it."""
    slurm.queue_one_job(f"echo '{SOCKET_TIMEOUT}' >&2; exit 1")
    slurm.behave("scancel", "exit 0")
    with pytest.raises(LaunchError, match=r"may be left \(Slurm job 4242 did not end\)"):
        slurm.executor().submit(_request(tmp_path), token="tok")
    assert slurm.queued()


def test_an_sbatch_that_found_no_slurm_configuration_is_not_looked_after(
    slurm: StandIns, tmp_path: Path
) -> None:
    """sbatch finding no slurm.conf reached no controller: no job can be left, and the error is
    the hint alone, not a job that "may be left"."""
    slurm.behave("sbatch", "echo 'sbatch: fatal: Could not establish a configuration source' >&2"
                           "\nexit 1")  # fmt: skip
    with pytest.raises(LaunchError, match="no Slurm configuration") as raised:
        slurm.executor().submit(_request(tmp_path), token="tok")
    assert "may be left" not in str(raised.value) and slurm.called("squeue") == []


@pytest.mark.parametrize("state", ["RESV_DEL_HOLD", "SPECIAL_EXIT", "REQUEUE_FED", "NEW_STATE"])
def test_a_held_or_unknown_state_is_no_end_and_the_job_is_cancelled(
    slurm: StandIns, tmp_path: Path, state: str
) -> None:
    """A job held by Slurm (its reservation deleted: RESV_DEL_HOLD; SPECIAL_EXIT) was taken as
    ended, with no exit codes: the trial was recorded as failed and run again elsewhere while
    the held job stayed queued, to run unwatched once released. Now it is cancelled and the
    trial is ``interrupted`` (the config runs again later)."""
    slurm.answer("sbatch", "4242\n")
    slurm.answer("scontrol", f"JobId=4242 JobName=tuner-t0-tok JobState={state} NodeList=n1\n")
    job = slurm.executor().submit(_request(tmp_path), token="tok")
    result = job.wait(timeout=30)
    assert slurm.called("scancel") == ["scancel 4242"]
    assert result.scheduler_verdict is not None
    assert result.scheduler_verdict[0] == str(Outcome.INTERRUPTED)
    assert f"is {state}, not an end state" in result.scheduler_verdict[1]


def test_an_answer_without_a_state_is_asked_again_never_an_end(
    slurm: StandIns, tmp_path: Path
) -> None:
    """``scontrol show job`` exiting 0 with nothing (a controller restarting): the job's state
    read as UNKNOWN and the trial ended at once, its job left running."""
    slurm.answer("sbatch", "4242\n")
    job = slurm.executor().submit(_request(tmp_path), token="tok")
    assert job.poll() is None
    assert slurm.called("scontrol") == ["scontrol show job -o 4242"]
    assert slurm.called("scancel") == [] and slurm.called("sacct") == []


def test_every_end_state_is_a_state_slurm_ends_a_job_in() -> None:
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"} <= ENDED
    assert not ENDED & {"PENDING", "RUNNING", "RESV_DEL_HOLD", "SPECIAL_EXIT", "UNKNOWN"}
