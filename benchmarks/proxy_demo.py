"""The proxy check for real on CPUs (``benchmarks/proxy_accuracy.py --demo``).

Starts two loopback sshd "nodes" (``tools/loopback_sshd.py``), runs the SSH demo's small GPT
(``studies/demo-ssh.yaml``) with one config, once on both nodes (dp 2, global batch 8) and once
on the first node alone (dp 1, global batch 4: the same micro-batch and micro-batches per step),
through ``tune run`` as a user would, and extrapolates the 2-node step from the 1-node one with
``tuner.models.time.proxy.extrapolate`` (the cluster profile's rates when ``tune profile`` saved
one under ``results/``, else the catalog's CPU rates). Prints both measured steps, the
extrapolated one and its error. Needs ``make dev`` and sshd; takes a few minutes.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import yaml

from tuner.config.parallel import ParallelConfig
from tuner.models.time.proxy import extrapolate
from tuner.profile.rates import study_rates
from tuner.report.leaderboard import leaderboard
from tuner.space.enumerate import study_gpu
from tuner.spec.file import load_study

ROOT = Path(__file__).resolve().parents[1]
MBS, ZERO = 2, 0
"""The config both runs measure (the demo's space: micro-batch 1-4, ZeRO 0-3)."""


def _study(base: dict[str, object], name: str, nodes: list[str], gbs: int) -> dict[str, object]:
    data = dict(base, name=name)
    data["cluster"] = dict(base["cluster"], nodes=nodes)  # type: ignore[arg-type]
    data["training"] = dict(base["training"], global_batch_size=gbs)  # type: ignore[arg-type]
    data["space"] = {"micro_batch_size": [MBS], "zero_stage": [ZERO]}
    data["search"] = dict(base["search"], n_trials=1, nodes_per_trial=len(nodes))  # type: ignore[arg-type]
    # the nodes build DeepSpeed's CPU ops on first use (minutes on a busy machine): a cache of
    # this checkout's, and a limit that leaves room for the build
    launch = dict(base["launch"], train_iters=20)  # type: ignore[arg-type]
    launch["env"] = dict(launch["env"], TORCH_EXTENSIONS_DIR=str(ROOT / ".torch_ext"))
    data["launch"] = launch
    data["search"]["trial_timeout_min"] = 20  # type: ignore[index]
    return data


def _measure(path: Path, results: Path, env: dict[str, str]) -> tuple[float, ParallelConfig]:
    tune = str(ROOT / ".venv" / "bin" / "tune")
    subprocess.run([tune, "run", "--study", str(path), "--results", str(results)], check=True,
                   env=env, cwd=ROOT)  # fmt: skip
    spec = load_study(str(path))
    board = leaderboard(spec, results=str(results))
    row = board.iloc[0]
    config = ParallelConfig(
        dp=int(row.dp),
        micro_batch_size=MBS,
        global_batch_size=spec.training.global_batch_size,
        zero_stage=ZERO,
    )
    return float(row.measured_step_s), config


def run_demo() -> None:
    """Run both studies and print the extrapolation error (module docstring)."""
    base = yaml.safe_load((ROOT / "studies" / "demo-ssh.yaml").read_text())
    nodes = list(base["cluster"]["nodes"])
    with tempfile.TemporaryDirectory(prefix="proxy-demo-") as tmp:
        work = Path(tmp)
        sshd = ROOT / "tools" / "loopback_sshd.py"
        python = str(ROOT / ".venv" / "bin" / "python")
        subprocess.run([python, str(sshd), "start", "--dir", str(work / "ssh"), "--nodes", "2"],
                       check=True, cwd=ROOT)  # fmt: skip
        env = {**os.environ, "TUNER_DEMO_ROOT": str(ROOT), "TUNER_DEMO_SSH": str(work / "ssh")}
        try:
            full_path, proxy_path = work / "full.yaml", work / "proxy.yaml"
            full_path.write_text(yaml.safe_dump(_study(base, "proxy-demo-full", nodes, 8)))
            proxy_path.write_text(yaml.safe_dump(_study(base, "proxy-demo-proxy", nodes[:1], 4)))
            old = dict(os.environ)
            os.environ.update(env)  # the study files read ${TUNER_DEMO_*}
            try:
                full_s, full = _measure(full_path, work / "results", env)
                proxy_s, proxy = _measure(proxy_path, work / "results", env)
                spec = load_study(str(full_path))
            finally:
                os.environ.clear()
                os.environ.update(old)
        finally:
            subprocess.run([python, str(sshd), "stop", "--dir", str(work / "ssh")], check=False)
    rates = study_rates(spec, str(ROOT / "results"))
    found = extrapolate(spec.model, spec.training, full, proxy, proxy_s, study_gpu(spec),
                        spec.cluster.gpus_per_node, spec.framework, rates)  # fmt: skip
    print(f"CPU demo (DeepSpeed, mbs {MBS}, ZeRO {ZERO}, {'profile' if rates else 'catalog'} "
          f"rates): 1-node proxy dp{proxy.dp} {proxy_s:.4f} s, 2-node dp{full.dp} measured "
          f"{full_s:.4f} s, extrapolated {found.step_s:.4f} s, error "
          f"{100 * (found.step_s / full_s - 1):+.1f} % (proxy as is "
          f"{100 * (proxy_s / full_s - 1):+.1f} %; scale {found.scale:.2f})")  # fmt: skip
