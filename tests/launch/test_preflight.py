"""The preflight check before the first trial: what a study needs, GPUs, and `tune run` stopping
with one line per problem before anything is launched (real loopback sshd nodes)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.launch import LocalExecutor
from tuner.launch.preflight import (
    SHOWN_HOSTS,
    STALE_LOCK_MINUTES,
    BuildLocks,
    PathCheck,
    PreflightChecks,
    Problem,
    checks_for,
    exit_code,
    problem_lines,
)
from tuner.launch.ssh import SSHExecutor
from tuner.spec.file import study_from_mapping
from tuner.spec.study import SSHSpec

from .sshd import REPO, LoopbackCluster

DEMO_SSH = REPO / "tuner" / "studies" / "demo-ssh.yaml"


def demo_ssh(**cluster: Any) -> dict[str, Any]:
    """The shipped 2-node SSH study, its ${...} paths filled in with this checkout."""
    text = DEMO_SSH.read_text().replace("${TUNER_DEMO_ROOT}", str(REPO))
    raw: dict[str, Any] = yaml.safe_load(text.replace("${TUNER_DEMO_SSH}", "/unused"))
    raw["launch"]["python"] = sys.executable
    raw["cluster"].update(cluster)
    return raw


def test_checks_for_a_study_name_its_fields() -> None:
    checks = checks_for(study_from_mapping(demo_ssh()))
    assert [(c.field, c.kind) for c in checks.paths] == [
        ("launch.python", "executable"),
        ("launch.script", "file"),
    ]
    assert checks.paths[1].path == str(REPO / "workloads" / "gpt_deepspeed.py")
    assert checks.gpus == 0  # gpu: cpu


def test_megatron_path_and_gpus_on_remote_nodes() -> None:
    raw = demo_ssh(gpu="h100-sxm-80gb", gpus_per_node=8)
    raw["framework"] = "megatron"
    raw["launch"].update(template="megatron_gpt", megatron_path="/shared/Megatron-LM/")
    del raw["launch"]["script"], raw["launch"]["probe_one_process"]  # DeepSpeed's workload's
    raw["space"] = {"tp": [1]}
    checks = checks_for(study_from_mapping(raw))
    assert [(c.path, c.kind) for c in checks.paths[1:]] == [
        ("/shared/Megatron-LM/", "dir"),
        ("/shared/Megatron-LM/pretrain_gpt.py", "file"),
    ]
    assert checks.gpus == 8
    # The local executor's "nodes" are this machine, where a stand-in plays the GPU cluster.
    raw["cluster"].update(executor="local", num_nodes=2)
    del raw["cluster"]["nodes"]
    assert checks_for(study_from_mapping(raw)).gpus == 0


def test_exit_code_2_for_a_config_problem_1_for_unreachable_nodes_only() -> None:
    down = Problem("gpu1", "cannot connect", config=False)
    assert exit_code([]) == 0
    assert exit_code([down]) == 1
    assert exit_code([down, Problem("gpu2", "launch.python: ...")]) == 2


def test_a_problem_every_node_shares_is_one_line_naming_them() -> None:
    """A login node without a Slurm config printed the same srun error for each of 16 slots."""
    fatal = "the preflight check could not run: srun: fatal: Could not establish a configuration"
    slots = [Problem(f"slurm-{i}", fatal, config=False) for i in range(16)]
    python = Problem("gpu-a", "launch.python: /venv/bin/python is not an executable file")
    assert problem_lines([*slots, python]) == [
        f"slurm-0, slurm-1, ..., slurm-15 (16 nodes): {fatal}",
        "gpu-a: launch.python: /venv/bin/python is not an executable file",
    ]
    few = slots[:SHOWN_HOSTS]  # a few nodes keep a line each: grep finds each host
    assert problem_lines(few) == [f"slurm-{i}: {fatal}" for i in range(SHOWN_HOSTS)]


def test_slurm_without_a_config_says_where_to_run_tune(tmp_path: Path) -> None:
    """srun's and sbatch's ``Could not establish a configuration source`` (``tune run`` and
    ``tune profile`` started off the login nodes) alone left the reader to find the cause in the
    troubleshooting guide."""
    from tuner.errors import LaunchError
    from tuner.launch.request import LaunchRequest
    from tuner.launch.slurm import SlurmExecutor
    from tuner.layout import ResultsLayout

    hint = "run tune on a login node where sinfo works, or point SLURM_CONF at the cluster's"
    checks = checks_for(study_from_mapping(demo_ssh()))
    fatal = "srun: fatal: Could not establish a configuration source\n"
    (problem,) = checks.problems("slurm-0", 1, "", "srun: error: res_nsearch error\n" + fatal)
    assert problem.message.startswith("the preflight check could not run: srun: fatal: Could")
    assert hint in problem.message
    (other,) = checks.problems("slurm-0", 1, "", "srun: error: Invalid partition name\n")
    assert "sinfo" not in other.message  # another failure: Slurm's own words only
    bin_dir = tmp_path / "bin"  # an sbatch as a machine without slurm.conf answers
    bin_dir.mkdir()
    said = fatal.replace("srun", "sbatch")
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\nprintf '%s' '{said}' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    ex = SlurmExecutor(env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    paths = ResultsLayout(tmp_path / "results", "s").trial(0)
    request = LaunchRequest(trial=0, hosts=("slurm-0",), scripts=("true",), paths=paths,
                            label="tune profile's job")  # fmt: skip
    try:
        with pytest.raises(LaunchError, match="^tune profile's job: sbatch refused") as exc:
            ex.submit(request)
        assert hint in str(exc.value)
    finally:
        ex.close()


def fake_nvidia_smi(bin_dir: Path, gpus: int) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(gpus))
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 2\n{lines}')
    script.chmod(0o755)


def test_gpus_are_counted_with_nvidia_smi(tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path / "bin", 2)
    ex = LocalExecutor(env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})
    try:
        assert ex.preflight(["local-0"], PreflightChecks(gpus=2)) == []
        assert [str(p) for p in ex.preflight(["local-0"], PreflightChecks(gpus=4))] == [
            "local-0: nvidia-smi -L lists 2 GPUs, but cluster.gpus_per_node asks for 4"
        ]
    finally:
        ex.close()
    if shutil.which("nvidia-smi", path="/usr/bin:/bin") is None:
        bare = LocalExecutor(env={"PATH": "/usr/bin:/bin"})
        try:
            assert [p.message for p in bare.preflight(["local-0"], PreflightChecks(gpus=1))] == [
                "nvidia-smi not found, but cluster.gpus_per_node asks for 1 GPUs"
            ]
        finally:
            bare.close()


def plant_lock(root: Path, *parts: str, age_min: float = 2 * STALE_LOCK_MINUTES) -> Path:
    """A build lock as torch.utils.file_baton leaves it when its build is killed: an empty file
    under the op's build directory, last touched ``age_min`` minutes ago."""
    lock = root.joinpath(*parts, "lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    then = time.time() - 60 * age_min
    os.utime(lock, (then, then))
    return lock


def stale(lock: Path) -> str:
    path = str(lock.resolve())
    return (
        f"stale torch-extension build lock {path} (an op build was killed; every DeepSpeed "
        f"start on this node would wait on it forever): remove it with rm {shlex.quote(path)}"
    )


def test_deepspeed_studies_look_for_build_locks_where_their_trials_build() -> None:
    raw = demo_ssh()
    assert checks_for(study_from_mapping(raw)).locks == BuildLocks()  # the nodes' own dirs
    raw["launch"]["env"] = {"TORCH_EXTENSIONS_DIR": "/scratch/ext", "XDG_CACHE_HOME": "/c"}
    assert checks_for(study_from_mapping(raw)).locks == BuildLocks(
        extensions_dir="/scratch/ext", cache_home="/c"
    )
    raw["framework"] = "megatron"
    raw["launch"].update(template="megatron_gpt", megatron_path="/shared/Megatron-LM/")
    del raw["launch"]["script"], raw["launch"]["probe_one_process"]  # DeepSpeed's workload's
    raw["space"] = {"tp": [1]}
    assert checks_for(study_from_mapping(raw)).locks is None


def test_a_stale_build_lock_is_found_a_live_or_recent_one_is_not(tmp_path: Path) -> None:
    cache = tmp_path / "cache"  # the node's XDG_CACHE_HOME: torch's default layout under it
    lock = plant_lock(cache / "torch_extensions", "py311_cpu", "deepspeed_shm_comm")
    ex = LocalExecutor(env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
                            "XDG_CACHE_HOME": str(cache)})  # fmt: skip
    try:
        assert ex.preflight(["local-0"], PreflightChecks()) == []  # not asked: no look
        problems = ex.preflight(["local-0"], PreflightChecks(locks=BuildLocks()))
        assert [str(p) for p in problems] == [f"local-0: {stale(lock)}"]
        assert exit_code(problems) == 2
        os.utime(lock)  # a build that started a moment ago
        assert ex.preflight(["local-0"], PreflightChecks(locks=BuildLocks())) == []
        # An old lock its build still holds open (a long op build) is not stale.
        old = plant_lock(tmp_path / "ext", "fused_adam")
        holder = subprocess.Popen(
            [sys.executable, "-c", "import os, sys, time; os.open(sys.argv[1], os.O_RDONLY); "
             "print(flush=True); time.sleep(120)", str(old)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "\n"
            held = PreflightChecks(locks=BuildLocks(extensions_dir=str(tmp_path / "ext")))
            assert ex.preflight(["local-0"], held) == []
        finally:
            holder.kill()
            holder.wait()
        assert [p.message for p in ex.preflight(["local-0"], held)] == [stale(old)]
    finally:
        ex.close()


# ----------------------------------------------------------------------------- real sshd


def write_config(cluster: LoopbackCluster, path: Path, extra: str = "") -> Path:
    """gpu-a and gpu-b: aliases of node-0 and node-1, as a user's ~/.ssh/config names them."""
    blocks = [
        f"Host gpu-{'ab'[k]}\n  HostName {n.address}\n  Port {n.port}\n"
        for k, n in enumerate(cluster.nodes[:2])
    ]
    common = (
        f"Host *\n  User {cluster.user}\n  IdentityFile {cluster.client_key}\n"
        f"  UserKnownHostsFile {cluster.known_hosts}\n"
    )
    path.write_text(extra + "".join(blocks) + common)
    return path


@pytest.fixture
def not_ssh() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts TCP, writes something that is not SSH, and hangs up."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    server.close()


@pytest.mark.ssh
def test_ssh_preflight_reports_a_node_it_cannot_reach(
    sshd_cluster: LoopbackCluster, tmp_path: Path, not_ssh: int
) -> None:
    extra = f"Host gpu-dead\n  HostName 127.0.0.1\n  Port {not_ssh}\n"
    config = write_config(sshd_cluster, tmp_path / "config", extra)
    checks = PreflightChecks(paths=(PathCheck("launch.python", sys.executable, "executable"),))
    with SSHExecutor(SSHSpec(config_file=str(config), connect_timeout_s=3)) as ex:
        problems = ex.preflight(["gpu-a", "gpu-dead", "gpu-b"], checks)
    assert [(p.host, p.config) for p in problems] == [("gpu-dead", False)]
    assert "no SSH server there" in problems[0].message
    assert exit_code(problems) == 1


def tune_run(study: Path, results: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}  # this checkout's tuner, whatever is installed
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", "run", "--study", str(study), "--results",
         str(results), "--quiet", *flags],
        capture_output=True, text=True, cwd=study.parent, env=env, timeout=120, check=False,
    )  # fmt: skip


def write_study(tmp_path: Path, config: Path, nodes: list[str], **launch: Any) -> Path:
    raw = demo_ssh(nodes=nodes, ssh={"config_file": str(config), "connect_timeout_s": 3})
    raw["name"] = "preflight"
    raw["launch"].update(launch)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.ssh
def test_tune_run_stops_before_launching_when_the_python_is_missing(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    config = write_config(sshd_cluster, tmp_path / "config")
    missing = tmp_path / "venv" / "bin" / "python"
    study = write_study(tmp_path, config, ["gpu-a", "gpu-b"], python=str(missing))
    run = tune_run(study, tmp_path / "results")
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"tune: preflight: {host}: launch.python: {missing} is not an executable file"
        for host in ("gpu-a", "gpu-b")
    ]
    assert not (tmp_path / "results").exists()  # no study opened, no trial launched


@pytest.mark.ssh
def test_tune_run_names_an_unreachable_node_in_one_quiet_line(
    sshd_cluster: LoopbackCluster, tmp_path: Path, not_ssh: int
) -> None:
    extra = f"Host gpu-dead\n  HostName 127.0.0.1\n  Port {not_ssh}\n"
    config = write_config(sshd_cluster, tmp_path / "config", extra)
    study = write_study(tmp_path, config, ["gpu-a", "gpu-dead"])
    run = tune_run(study, tmp_path / "results")
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines() == [
        f"tune: preflight: gpu-dead: cannot connect to {sshd_cluster.user}@127.0.0.1:{not_ssh}: "
        "no SSH server there (no SSH protocol banner within 3 s)"
    ]
    assert not (tmp_path / "results").exists()


@pytest.mark.ssh
def test_tune_run_stops_on_a_stale_build_lock_on_the_nodes(
    sshd_cluster: LoopbackCluster, tmp_path: Path
) -> None:
    config = write_config(sshd_cluster, tmp_path / "config")
    ext = tmp_path / "torch ext"  # the study's TORCH_EXTENSIONS_DIR: <dir>/<op>/lock
    lock = plant_lock(ext, "deepspeed_shm_comm")
    study = write_study(tmp_path, config, ["gpu-a", "gpu-b"],
                        env={"TORCH_EXTENSIONS_DIR": str(ext)})  # fmt: skip
    run = tune_run(study, tmp_path / "results")
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        f"tune: preflight: {host}: {stale(lock)}" for host in ("gpu-a", "gpu-b")
    ]
    assert not (tmp_path / "results").exists()
