"""The Slurm client commands (``scontrol``, ``squeue``, ``scancel``, ...) as run from the login
node: their answers read into job ids and fields, their failures into one-line
:class:`~tuner.errors.LaunchError` messages."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence

from tuner.errors import LaunchError
from tuner.launch.slurm_states import ACTIVE, job_state, parse_job, slurm_hint

COMMAND_TIMEOUT_S = 60
"""How long one Slurm command may take before it is killed (a hung controller)."""


class SlurmCommands:
    """The Slurm client commands, run here with one environment (``SLURM_CONF`` and PATH)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = None if env is None else dict(env)

    def run(
        self, argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT_S
    ) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); a missing command or a hang is a :class:`LaunchError`."""
        try:
            done = subprocess.run(
                list(argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                check=False, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise LaunchError(f"{argv[0]}: {exc}") from None
        except subprocess.TimeoutExpired:
            raise LaunchError(f"{argv[0]}: no answer within {timeout:g} s (killed)") from None
        return done.returncode, done.stdout, done.stderr

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """The job's fields, or None when Slurm no longer knows it."""
        code, out, err = self.run(["scontrol", "show", "job", "-o", job_id])
        if code != 0:
            if "Invalid job id" in err:
                return None
            raise LaunchError(f"scontrol show job {job_id}: {error_line(err, code)}")
        fields = parse_job(out)
        if "JobState" not in fields:  # garbage or nothing: asked again, never taken as an end
            said = out.strip().splitlines()[:1] or ["nothing"]
            raise LaunchError(f"scontrol show job {job_id} said no JobState: {said[0][:200]!r}")
        return fields

    def hostnames(self, nodelist: str) -> tuple[str, ...]:
        """``n[1-2]`` -> ``("n1", "n2")``."""
        if not nodelist or nodelist == "(null)":
            return ()
        code, out, err = self.run(["scontrol", "show", "hostnames", nodelist])
        if code != 0:
            raise LaunchError(f"scontrol show hostnames {nodelist}: {error_line(err, code)}")
        return tuple(out.split())

    def find_jobs(self, name: str) -> list[str]:
        """Ids of the live jobs called ``name``."""
        code, out, err = self.run(["squeue", "-h", "--name", name, "-o", "%i"])
        if code != 0:
            raise LaunchError(f"squeue --name {name}: {error_line(err, code)}")
        return out.split()

    def cancel(self, job_id: str) -> None:
        """``scancel`` the job (an already finished job is no error)."""
        code, _out, err = self.run(["scancel", job_id])
        if code != 0 and "Invalid job id" not in err and "already completing" not in err:
            raise LaunchError(f"scancel {job_id}: {error_line(err, code)}")

    def wait_gone(self, job_id: str, timeout_s: float) -> bool:
        """Wait until Slurm reports the job ended (no process of it left on any node)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fields = self.show_job(job_id)
            if fields is None or job_state(fields) not in ACTIVE:
                return True
            time.sleep(0.1)
        return False


def error_line(err: str, code: int) -> str:
    """The last line of a Slurm command's stderr (with :func:`slurm_hint`), or its exit status."""
    lines = err.strip().splitlines()
    return slurm_hint(lines[-1]) if lines else f"exit status {code}"
