"""One contract every Executor must honour; test_local.py and test_ssh.py run it."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tuner.launch import Executor, Job, LaunchRequest
from tuner.launch.preflight import STALE_LOCK_MINUTES, BuildLocks, PathCheck, PreflightChecks
from tuner.layout import ResultsLayout

from .conftest import live_processes, read, wait_for

ALL_REDUCE = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():.0f}", flush=True)
if os.environ.get("SLEEP"):
    print(f"ready {dist.get_rank()}", flush=True)
    time.sleep(600)
dist.destroy_process_group()
"""


def _torch_missing() -> str | None:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (pip install -e '.[train]')"
    return None


needs_torch = pytest.mark.skipif(_torch_missing() is not None, reason=str(_torch_missing()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ExecutorContract:
    """Subclasses provide ``make_executor(**kwargs)`` and ``hosts`` (two nodes)."""

    hosts: tuple[str, ...]

    def make_executor(self, **kwargs: Any) -> Executor:
        raise NotImplementedError

    @pytest.fixture
    def layout(self, tmp_path: Path) -> ResultsLayout:
        # A hostile directory name: spaces and quotes must survive every shell on the way.
        return ResultsLayout(tmp_path / "res ults 'q'", "contract")

    @pytest.fixture
    def executor(self) -> Any:
        # The grace between SIGTERM and SIGKILL: what a process ignoring SIGTERM costs a cancel
        # (test_cancel_kills_every_process_even_those_that_ignore_term waits it out in full).
        ex = _tracking(self.make_executor(grace_s=1.0))
        yield ex
        _cancel_leftovers(ex)
        ex.close()

    def request(
        self, layout: ResultsLayout, n: int, scripts: list[str], **kw: Any
    ) -> LaunchRequest:
        return LaunchRequest(
            trial=n, hosts=self.hosts, scripts=tuple(scripts), paths=layout.trial(n), **kw
        )

    def test_runs_each_node_script_and_reports_exit_codes(
        self, executor: Executor, layout: ResultsLayout
    ) -> None:
        scripts = ['echo "node 0 in $PWD"; echo oops >&2', 'echo "node 1 $(cat data.txt)"; exit 3']
        job = executor.submit(self.request(layout, 0, scripts, files={"data.txt": "from file"}))
        result = job.wait(timeout=60)
        assert result.exit_codes == (0, 3)
        assert not result.ok and not result.timed_out and not result.node_errors
        assert "node 0 in" in read(result.logs[0]) and "oops" in read(result.logs[0])
        assert "node 1 from file" in read(result.logs[1])
        assert job.paths.launch_script(1).read_text() == scripts[1]
        assert job.paths.result_json.exists()

    def test_logs_are_streamed_while_running(
        self, executor: Executor, layout: ResultsLayout
    ) -> None:
        """The logs while the job runs; then a file sent to the running job (``send_files``,
        how the framework probe's verdict reaches its nodes) found by each node's script in its
        own directory."""
        script = "echo started; while [ ! -e go.txt ]; do sleep 0.05; done; echo got $(cat go.txt)"
        request = self.request(layout, 1, [script, script])
        job = executor.submit(request)
        for log in (job.paths.node_log(0), job.paths.node_log(1)):
            wait_for(lambda log=log: "started" in read(log), what="first line in the log")
        assert job.poll() is None
        executor.send_files(request, {"go.txt": "3 1\n"})
        result = job.wait(timeout=60)
        assert result.ok, result
        assert all("got 3 1" in read(log) for log in result.logs), [read(g) for g in result.logs]

    def test_cancel_kills_every_process_even_those_that_ignore_term(
        self, executor: Executor, layout: ResultsLayout
    ) -> None:
        marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
        # A detached grandchild in its own session, and one that ignores SIGTERM.
        script = (
            f"setsid bash -c 'exec -a {marker} sleep 3001' >/dev/null 2>&1 &\n"
            f"(trap '' TERM; exec -a {marker} sleep 3002) &\n"
            f"echo up; (exec -a {marker} sleep 3003)\n"
        )
        job = executor.submit(self.request(layout, 2, [script, script]))
        wait_for(lambda: len(live_processes(marker)) == 6, what="all six sleeps")
        started = time.monotonic()
        job.cancel()
        assert time.monotonic() - started < 15
        result = job.result()
        assert result is not None and result.cancelled and not result.timed_out
        assert result.survivors == ()
        assert live_processes(marker) == []

    def test_reap_lost_ends_a_trial_known_only_by_its_token(
        self, executor: Executor, layout: ResultsLayout
    ) -> None:
        """What a worker does for a dead worker's trial: no Job, only hosts, paths and token."""
        marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
        script = f"echo up; (exec -a {marker} sleep 3004)\n"
        job = executor.submit(self.request(layout, 5, [script, script]))
        wait_for(lambda: len(live_processes(marker)) == 2, what="both sleeps")
        lost = self.request(layout, 5, ["", ""])  # rebuilt from what the trial recorded
        assert executor.reap_lost(lost, job.token) == []
        assert live_processes(marker) == []
        job.wait(timeout=60)

    def test_time_limit_kills_the_trial(self, layout: ResultsLayout) -> None:
        clock = FakeClock()
        ex = _tracking(self.make_executor(clock=clock, grace_s=2.0))
        try:
            marker = f"tuner-marker-{uuid.uuid4().hex[:8]}"
            script = f"(exec -a {marker} sleep 3004)"
            job = ex.submit(self.request(layout, 3, [script, script], timeout_s=60))
            wait_for(lambda: len(live_processes(marker)) == 2, what="both sleeps")
            assert job.poll() is None
            clock.now += 61
            result = job.poll()
            assert result is not None
            assert result.timed_out and not result.ok
            assert result.duration_s >= 61
            assert live_processes(marker) == []
        finally:
            _cancel_leftovers(ex)
            ex.close()

    def test_preflight_passes_when_every_path_is_there(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        hostile = tmp_path / "a b 'c'; echo pwned"
        hostile.mkdir()
        (hostile / "train.py").write_text("")
        checks = PreflightChecks(
            paths=(
                PathCheck("launch.python", sys.executable, "executable"),
                PathCheck("launch.python", "sh", "executable"),  # a bare name: on PATH
                PathCheck("launch.megatron_path", str(hostile), "dir"),
                PathCheck("launch.script", "train.py", "file"),  # relative: from workdir
            ),
            workdir=str(hostile),
        )
        assert executor.preflight(self.hosts, checks) == []

    def test_preflight_names_every_node_and_what_is_missing(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        missing = tmp_path / "no venv" / "bin" / "python"
        checks = PreflightChecks(
            paths=(
                PathCheck("launch.python", str(missing), "executable"),
                PathCheck("launch.python", "no-such-python-3.99", "executable"),
                PathCheck("launch.script", str(tmp_path), "file"),  # a directory, not a file
            )
        )
        problems = executor.preflight(self.hosts, checks)
        assert [p.host for p in problems] == [h for h in self.hosts for _ in range(3)]
        assert all(p.config for p in problems)
        first = [str(p) for p in problems[:3]]
        assert first == [
            f"{self.hosts[0]}: launch.python: {missing} is not an executable file",
            f"{self.hosts[0]}: launch.python: 'no-such-python-3.99' is not on the node's PATH",
            f"{self.hosts[0]}: launch.script: {tmp_path} is not a file",
        ]
        workdir = PreflightChecks(workdir=str(tmp_path / "gone"))
        assert [p.message for p in executor.preflight(self.hosts[:1], workdir)] == [
            f"launch.workdir: {tmp_path / 'gone'} is not a directory"
        ]

    def test_preflight_finds_a_stale_torch_extension_build_lock(
        self, executor: Executor, tmp_path: Path
    ) -> None:
        lock = tmp_path / "ext dir" / "deepspeed_shm_comm" / "lock"  # <TORCH_EXTENSIONS_DIR>/<op>
        lock.parent.mkdir(parents=True)
        lock.touch()
        then = time.time() - 60 * 2 * STALE_LOCK_MINUTES  # left by a killed build
        os.utime(lock, (then, then))
        checks = PreflightChecks(locks=BuildLocks(extensions_dir=str(lock.parent.parent)))
        problems = executor.preflight(self.hosts, checks)
        assert [(p.host, p.message) for p in problems] == [
            (h, BuildLocks.problem(str(lock.resolve()))) for h in self.hosts
        ]
        assert all(p.config for p in problems)

    @pytest.mark.torch
    @pytest.mark.slow
    @needs_torch
    def test_two_node_torchrun_all_reduce(
        self, executor: Executor, layout: ResultsLayout, tmp_path: Path
    ) -> None:
        scripts = self._torchrun_scripts(executor, tmp_path, sleep=False)
        result = executor.submit(self.request(layout, 4, scripts)).wait(timeout=180)
        logs = read(result.logs[0]) + read(result.logs[1])
        assert result.ok, logs
        assert "rank 0/2 sum 3" in logs and "rank 1/2 sum 3" in logs

    @pytest.mark.torch
    @pytest.mark.slow
    @needs_torch
    def test_cancel_torchrun_leaves_no_process_on_any_node(
        self, executor: Executor, layout: ResultsLayout, tmp_path: Path
    ) -> None:
        scripts = self._torchrun_scripts(executor, tmp_path, sleep=True)
        job = executor.submit(self.request(layout, 5, scripts))
        logs = job.paths.node_log(0), job.paths.node_log(1)
        wait_for(
            lambda: "ready 0" in read(logs[0]) and "ready 1" in read(logs[1]),
            timeout=180,
            what="both ranks ready",
        )
        marker = str(tmp_path / "worker.py")
        assert len(live_processes(marker)) >= 4, live_processes("worker")  # 2 agents, 2 workers
        job.cancel()
        assert live_processes(marker) == []

    def _torchrun_scripts(self, executor: Executor, tmp_path: Path, *, sleep: bool) -> list[str]:
        worker = tmp_path / "worker.py"
        worker.write_text(ALL_REDUCE)
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
        assert torchrun is not None
        addr, port = executor.master_addr(self.hosts), free_port()
        return [
            textwrap.dedent(f"""\
                export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 {"SLEEP=1" if sleep else ""}
                exec {torchrun} --nnodes 2 --node_rank {k} --nproc_per_node 1 \\
                    --master_addr {addr} --master_port {port} {worker}
                """)
            for k in range(2)
        ]


def _tracking(ex: Executor) -> Executor:
    """Remember every job, so a failing test does not leave its processes running."""
    jobs: list[Job] = []
    submit = ex.submit

    def tracked(request: LaunchRequest) -> Job:
        job = submit(request)
        jobs.append(job)
        return job

    ex.submit = tracked  # type: ignore[method-assign]
    ex._test_jobs = jobs  # type: ignore[attr-defined]
    return ex


def _cancel_leftovers(ex: Executor) -> None:
    for job in getattr(ex, "_test_jobs", []):
        if not job.done:
            job.cancel()
