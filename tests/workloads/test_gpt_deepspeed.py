"""Real 2-rank DeepSpeed runs of workloads/gpt_deepspeed.py under torchrun (gloo on CPU).

The first run on a machine compiles DeepSpeed's CPU shared-memory comm op (about 30-45 s, cached
in ~/.cache/torch_extensions); later runs take about 5 s each.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("torch") is None,
        reason="deepspeed/torch not installed (pip install -e '.[train]')",
    ),
]

SCRIPT = Path(__file__).resolve().parents[2] / "workloads" / "gpt_deepspeed.py"
ITERS = 4
WORLD = 2
MODEL_ARGS = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "64", "--vocab-size", "512", "--train-iters", str(ITERS),
]  # fmt: skip
ADAM = {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}}

STEP_RE = re.compile(
    r"^tuner-step: iter=(\d+) time_s=([\d.]+) samples_per_s=([\d.]+) "
    r"max_allocated_gib=([\d.]+) max_reserved_gib=([\d.]+) rank=(\d+)$",
    re.MULTILINE,
)
MEMORY_RE = re.compile(
    r"^tuner-memory: rank=(\d+) params=(\d+) grads=(\d+) optimizer=(\d+) activations=(\d+)$",
    re.MULTILINE,
)
TPUT_RE = re.compile(r"epoch=\d+/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=")
PIPE_RE = re.compile(r"steps: \d+ loss: [\d.]+ iter time \(s\): [\d.]+ samples/sec: [\d.]+")

CONFIGS: dict[str, dict[str, Any]] = {
    "zero0": {"zero_optimization": {"stage": 0}},
    "zero2": {"zero_optimization": {"stage": 2}},
    "zero3": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    "bf16": {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}},
    "checkpointing": {
        "zero_optimization": {"stage": 0},
        "activation_checkpointing": {"partition_activations": False},
    },
    "pipeline": {
        "zero_optimization": {"stage": 1},
        "pipeline": {"stages": 2},
        "gradient_accumulation_steps": 2,
    },
    "grad_accum": {"zero_optimization": {"stage": 0}, "gradient_accumulation_steps": 2},
}


@dataclass(frozen=True)
class Run:
    rc: int
    output: str
    seconds: float

    def steps(self) -> list[tuple[int, float, float, float, float, int]]:
        return [
            (int(i), float(t), float(s), float(a), float(r), int(k))
            for i, t, s, a, r, k in STEP_RE.findall(self.output)
        ]

    def memory(self, rank: int) -> dict[str, int]:
        for match in MEMORY_RE.finditer(self.output):
            if int(match.group(1)) == rank:
                keys = ("params", "grads", "optimizer", "activations")
                return dict(zip(keys, map(int, match.groups()[1:]), strict=True))
        raise AssertionError(f"no tuner-memory line for rank {rank}:\n{self.output[-3000:]}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_command(config_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node_rank", "0",
        "--nproc_per_node", str(WORLD), "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(SCRIPT), "--deepspeed_config", str(config_path),
        *MODEL_ARGS, *extra,
    ]  # fmt: skip


def workload_env() -> dict[str, str]:
    # The venv's bin first: DeepSpeed's JIT op loader runs `ninja`, and a different one rebuilds.
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def write_config(directory: Path, name: str, overrides: dict[str, Any]) -> Path:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "steps_per_print": 1,
        "optimizer": ADAM,
        **overrides,
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def run_workload(directory: Path, name: str, overrides: dict[str, Any]) -> Run:
    cmd = torchrun_command(write_config(directory, name, overrides))
    start = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=workload_env(), timeout=300, check=False
    )
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Run]]:
    """Runs each named config once per module; later tests reuse the result."""
    directory = tmp_path_factory.mktemp("ds_configs")
    cache: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in cache:
            cache[name] = run_workload(directory, name, CONFIGS[name])
            print(f"{name}: {cache[name].seconds:.1f} s")
        return cache[name]

    yield get


@pytest.mark.parametrize("name", list(CONFIGS))
def test_run_reports_steps_memory_and_deepspeed_lines(
    workload: Callable[[str], Run], name: str
) -> None:
    run = workload(name)
    assert run.rc == 0, run.output[-4000:]
    steps = run.steps()
    assert len(steps) == ITERS * WORLD, run.output[-4000:]
    for rank in range(WORLD):
        assert [s[0] for s in steps if s[5] == rank] == list(range(1, ITERS + 1))
        assert f"tuner-done: iters={ITERS} rank={rank}" in run.output
        assert all(v > 0 for v in run.memory(rank).values())
    for _, time_s, samples, allocated, reserved, _ in steps:
        assert time_s > 0 and samples > 0 and allocated > 0 and reserved > 0
    pattern = PIPE_RE if "pipeline" in CONFIGS[name] else TPUT_RE
    assert pattern.search(run.output), f"no DeepSpeed throughput line:\n{run.output[-3000:]}"


def test_probe_points_run_in_one_process_as_each_runs_alone(
    workload: Callable[[str], Run], tmp_path: Path
) -> None:
    """``--probe-points``: configs run in turn in one process (a pipeline and ZeRO-3 first, so
    what they leave behind would show in the next: the pipeline's model-parallel unit, which
    DeepSpeed keeps module-wide, failed the next engine's build), each framed by the marker
    lines, and each point's tensor accounting is the one its own run reports."""
    from tuner.profile.probe import POINT, split_points

    names = ("pipeline", "zero3", "zero0")
    points = [{"point": k, "argv": ["--deepspeed_config",
                                    str(write_config(tmp_path, name, CONFIGS[name])), *MODEL_ARGS]}
              for k, name in enumerate(names)]  # fmt: skip
    plan = tmp_path / "points.json"
    plan.write_text(json.dumps({"marker": POINT, "points": points}))
    base = write_config(tmp_path, "base", CONFIGS["zero0"])
    proc = subprocess.run(torchrun_command(base, "--probe-points", str(plan)), capture_output=True,
                          text=True, env=workload_env(), timeout=300, check=False)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert all(output.count(f"{POINT} {k} end rc=0") == 1 for k in range(len(names)))
    parts = split_points(output)
    for k, name in enumerate(names):
        point = Run(0, parts[k], 0.0)
        assert len(point.steps()) == ITERS * WORLD, parts[k][-3000:]
        for rank in range(WORLD):
            assert point.memory(rank) == workload(name).memory(rank)


def test_zero3_shards_params_and_optimizer(workload: Callable[[str], Run]) -> None:
    zero0, zero3 = workload("zero0").memory(0), workload("zero3").memory(0)
    assert zero3["params"] + zero3["optimizer"] < zero0["params"] + zero0["optimizer"]
    assert zero3["params"] < zero0["params"]  # persistence threshold 0: every param sharded


def test_bf16_halves_parameter_bytes(workload: Callable[[str], Run]) -> None:
    assert workload("bf16").memory(0)["params"] * 2 == workload("zero0").memory(0)["params"]


def test_checkpointing_saves_fewer_activation_bytes(workload: Callable[[str], Run]) -> None:
    ckpt, plain = workload("checkpointing").memory(0), workload("zero0").memory(0)
    assert ckpt["activations"] < plain["activations"]


def test_grad_accumulation_counts_micro_steps(workload: Callable[[str], Run]) -> None:
    micro, global_step = TPUT_RE.findall(workload("grad_accum").output)[-1]
    assert int(micro) == 2 * int(global_step)


def test_zero2_with_pipeline_fails_with_one_line(tmp_path: Path) -> None:
    overrides = {"zero_optimization": {"stage": 2}, "pipeline": {"stages": 2}}
    run = run_workload(tmp_path, "bad", overrides)
    assert run.rc != 0
    errors = [line for line in run.output.splitlines() if line.startswith("gpt_deepspeed: error:")]
    assert len(errors) == 1, run.output[-3000:]
    assert "zero_optimization.stage 2 cannot be combined with pipeline.stages (2)" in errors[0]
    assert "tuner-step:" not in run.output


def test_sigterm_to_torchrun_stops_the_run_promptly(tmp_path: Path) -> None:
    path = write_config(tmp_path, "long", CONFIGS["zero0"])
    cmd = [*torchrun_command(path), "--train-iters", "100000"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=workload_env(), start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("tuner-step: iter=2 "):
                break
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        proc.communicate(timeout=30)
        assert time.monotonic() - start < 15
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------- DeepSpeed-MoE

MOE_STEP_RE = re.compile(
    r"^tuner-step: iter=(\d+) time_s=[\d.]+ samples_per_s=[\d.]+ max_allocated_gib=[\d.]+ "
    r"max_reserved_gib=[\d.]+ aux_loss=([\d.]+) rank=(\d+)$",
    re.MULTILINE,
)
EXPERTS, HIDDEN, FFN, LAYERS = 4, 64, 256, 2  # MODEL_ARGS: h=64, ffn 4h, 2 layers


def run_moe(directory: Path, name: str, zero: int, *moe_args: str) -> Run:
    path = write_config(directory, name, {"zero_optimization": {"stage": zero}})
    cmd = [*torchrun_command(path), "--num-experts", str(EXPERTS), "--moe-capacity-factor",
           "1.0", "--moe-aux-loss-coeff", "0.01", *moe_args]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=workload_env(), timeout=300, check=False
    )
    return Run(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Run]:
    """ZeRO-1 with the experts replicated (ep 1) and split over both ranks (ep 2)."""
    directory = tmp_path_factory.mktemp("moe")
    return {ep: run_moe(directory, f"ep{ep}", 1, "--ep-size", str(ep)) for ep in (1, 2)}


def test_moe_ep2_trains_with_aux_loss_on_every_rank(moe_runs: dict[int, Run]) -> None:
    from tuner.logs import parse_deepspeed
    from tuner.outcome import Outcome

    run = moe_runs[2]
    assert run.rc == 0, run.output[-4000:]
    steps = MOE_STEP_RE.findall(run.output)
    assert sorted((int(r), int(i)) for i, _, r in steps) == [
        (r, i) for r in range(WORLD) for i in range(1, ITERS + 1)
    ], run.output[-3000:]
    # DeepSpeed's l_aux = E * sum_e(mean gate_e * routed share_e) / k per layer, >= 1 per layer
    # at any routing (sharded_moe.py topkgating), summed over the MoE layers
    assert all(float(aux) >= LAYERS * 0.99 for _, aux, _ in steps)
    assert "creating expert parallel process group named ep_size_2 with ranks: [0, 1]" in (
        run.output
    )
    metrics = parse_deepspeed(run.output, warmup=1)
    assert metrics.outcome is Outcome.OK and metrics.step_time_s and metrics.step_time_s > 0


def test_moe_ep2_holds_half_the_experts(moe_runs: dict[int, Run]) -> None:
    assert moe_runs[1].rc == 0, moe_runs[1].output[-4000:]
    expert = (HIDDEN * FFN + FFN) + (FFN * HIDDEN + HIDDEN)  # fc1 + fc2 with biases
    ep1, ep2 = moe_runs[1].memory(0), moe_runs[2].memory(0)
    assert ep1["params"] - ep2["params"] == 4 * LAYERS * (EXPERTS - EXPERTS // 2) * expert


@pytest.mark.parametrize(
    ("zero", "extra", "message"),
    [
        (3, ("--ep-size", "2"), "Native DeepSpeed MoE is not supported with ZeRO Stage 3"),
        (1, ("--ep-size", "3"), "Number of experts (4) should be divisible by expert parallel"),
    ],
)
def test_moe_refusals_are_one_line(
    tmp_path: Path, zero: int, extra: tuple[str, ...], message: str
) -> None:
    run = run_moe(tmp_path, "bad", zero, *extra)
    assert run.rc != 0
    errors = [line for line in run.output.splitlines() if line.startswith("gpt_deepspeed: error:")]
    assert len(errors) == 1 and message in errors[0], run.output[-3000:]
    assert "tuner-step:" not in run.output
