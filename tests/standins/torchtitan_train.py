"""A stand-in for torchtitan 0.3.0's trainer (``python -m torchtitan.train``) that needs no GPU.

Run it as the trainer is run: ``torchrun --nproc_per_node N tests/standins/torchtitan_train.py
--module llama3 --config llama3_8b --section.option VALUE ... activation-checkpoint:MODE``. It
accepts the options of torchtitan 0.3.0 that tune sets (tyro's spelling with hyphens, underscores
accepted as tyro does; booleans as ``--section.flag`` / ``--section.no-flag``; the activation
checkpoint subcommand after every other option); anything else fails as tyro does (a box with
``Unrecognized options: ...`` on stderr, exit 2). It applies the release's start-up checks with
their texts (``ParallelDims._validate``'s AssertionError, the trainer's batch checks), then prints
torchtitan's metric line (``components/metrics.py`` ``MetricsProcessor.log``, ANSI colours unless
``--metrics.disable-color-printing``) every ``log_freq`` steps and at step 1, from rank 0.

Timing and memory are a fixed response surface of the config (below), deterministic; each step
really sleeps ``step_s * TUNER_STANDIN_TIME_SCALE`` (default 0.001). ``TUNER_STANDIN_GPU_GIB``
(default 80) is the memory over which a rank raises torch's CUDA OOM.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime

MODELS = {  # --config -> (parameters, layers, hidden): the registry's llama3 functions
    "llama3_debugmodel": (6.0e6, 6, 256),
    "llama3_8b": (8.03e9, 32, 4096),
    "llama3_70b": (70.6e9, 80, 8192),
}
INT, STR = "int", "str"
OPTIONS: dict[str, object] = {
    "training.local-batch-size": INT, "training.global-batch-size": INT,
    "training.seq-len": INT, "training.steps": INT, "training.gc-freq": INT,
    "training.max-norm": "float",
    "training.mixed-precision-param": ("bfloat16", "float32"),
    "training.dtype": ("bfloat16", "float32"),
    "parallelism.data-parallel-replicate-degree": INT,
    "parallelism.data-parallel-shard-degree": INT,
    "parallelism.fsdp-reshard-after-forward": ("default", "always", "never"),
    "parallelism.tensor-parallel-degree": INT,
    "parallelism.pipeline-parallel-degree": INT,
    "parallelism.pipeline-parallel-schedule": STR,
    "parallelism.pipeline-parallel-microbatch-size": INT,
    "parallelism.context-parallel-degree": INT,
    "parallelism.expert-parallel-degree": INT,
    "metrics.log-freq": INT,
}  # fmt: skip
SWITCHES = {
    "training.enable-cpu-offload", "training.disable-cuda-graphs",
    "parallelism.enable-sequence-parallel", "compile.enable",
    "compile.enable-async-tensor-parallel", "metrics.disable-color-printing",
}  # fmt: skip
DEFAULTS: dict[str, object] = {
    "training.local-batch-size": 8, "training.global-batch-size": -1, "training.seq-len": 2048,
    "training.steps": 10000, "training.gc-freq": 50, "training.mixed-precision-param": "bfloat16",
    "parallelism.data-parallel-replicate-degree": 1, "parallelism.data-parallel-shard-degree": -1,
    "parallelism.fsdp-reshard-after-forward": "default", "parallelism.tensor-parallel-degree": 1,
    "parallelism.enable-sequence-parallel": True, "parallelism.pipeline-parallel-degree": 1,
    "parallelism.pipeline-parallel-schedule": "1F1B",
    "parallelism.pipeline-parallel-microbatch-size": 1, "parallelism.context-parallel-degree": 1,
    "compile.enable": False, "compile.enable-async-tensor-parallel": False,
    "training.disable-cuda-graphs": False,
    "metrics.log-freq": 10, "metrics.disable-color-printing": False,
}  # fmt: skip


class OutOfMemoryError(RuntimeError):
    """Printed by the traceback machinery as ``torch.OutOfMemoryError``, as torch >= 2.5 does."""


OutOfMemoryError.__module__ = "torch"
AC_MODES = ("selective", "full", "memory-budget", "none")
SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")


def _usage_error(message: str) -> None:
    bar = "─" * (len(message) + 2)
    print(f"╭─ Parsing error {bar[16:]}╮\n│ {message} │\n╰{bar}╯", file=sys.stderr)
    sys.exit(2)


def parse(argv: list[str]) -> tuple[dict[str, object], str, str, str]:
    """(options, module, config, activation-checkpoint mode) as tyro would read them."""
    values, module, config, ac = dict(DEFAULTS), "", "", "selective"
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = name.replace("_", "-")
        if arg.replace("_", "-").startswith("activation-checkpoint:"):
            ac = arg.split(":", 1)[1]
            if ac not in AC_MODES or i != len(argv) - 1:
                _usage_error(f"Unrecognized options: {' '.join(argv[i:])}")
            break
        if name in ("module", "config"):
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            module, config = (value, config) if name == "module" else (module, value)
            i += 1 if eq else 2
            continue
        switch = name.replace(".no-", ".")
        if switch in SWITCHES and not eq:
            values[switch] = ".no-" not in name
            i += 1
            continue
        kind = OPTIONS.get(name)
        if kind is None or (not eq and i + 1 >= len(argv)):
            _usage_error(f"Unrecognized options: {arg}")
        raw = inline if eq else argv[i + 1]
        if isinstance(kind, tuple) and raw not in kind:
            _usage_error(f"Invalid choice: {raw!r} for {arg} (choose from {kind})")
        values[name] = int(raw) if kind == INT else float(raw) if kind == "float" else raw
        i += 1 if eq else 2
    if not module or not config:
        raise ValueError(
            "--module is required. Example: --module llama3 --config llama3_debugmodel"
        )
    if config not in MODELS:
        raise ValueError(f"Config function '{config}' not found in torchtitan.models.{module}")
    return values, module, config, ac


def check(v: dict[str, object], world: int) -> dict[str, int]:
    """torchtitan 0.3.0's start-up checks (ParallelDims._validate, Trainer.__init__)."""
    g = {
        k.split(".")[-1]: int(v[k])
        for k in v
        if isinstance(v[k], int) and not isinstance(v[k], bool)
    }  # noqa: E501
    r, s = g["data-parallel-replicate-degree"], g["data-parallel-shard-degree"]
    cp, tp, pp = (
        g["context-parallel-degree"],
        g["tensor-parallel-degree"],
        g["pipeline-parallel-degree"],
    )  # noqa: E501
    if s < 0:
        s = world // (r * cp * tp * pp)
    assert r * s * cp * tp * pp == world, (
        f"Invalid parallel dims: dp_replicate({r}) * dp_shard({s}) * cp({cp}) * tp({tp}) * "
        f"pp({pp}) != WORLD_SIZE({world})"
    )
    if pp > 1 and not v["training.disable-cuda-graphs"]:
        raise ValueError(
            "CUDA graphs do not support pipeline parallelism yet. "
            "Set --training.disable_cuda_graphs."
        )
    local, dp = g["local-batch-size"], r * s
    gbs = g["global-batch-size"] if g["global-batch-size"] > 0 else local * dp
    assert gbs % (local * dp) == 0, (
        "global batch size must be multiple of local batch size times data-parallel degree "
        f"({gbs} % ({local} * {dp}) != 0)"
    )
    if pp > 1 and local % g["pipeline-parallel-microbatch-size"]:
        raise ValueError(
            f"training.local_batch_size ({local}) must be evenly divisible by "
            f"parallelism.pipeline_parallel_microbatch_size "
            f"({g['pipeline-parallel-microbatch-size']}) when pipeline parallelism is enabled."
        )
    if pp > 1 and v["parallelism.pipeline-parallel-schedule"] not in SCHEDULES:
        raise ValueError(f"Unknown schedule {v['parallelism.pipeline-parallel-schedule']}")
    return {"r": r, "s": s, "cp": cp, "tp": tp, "pp": pp, "local": local, "gbs": gbs}


def surface(v: dict[str, object], d: dict[str, int], ac: str, config: str) -> tuple[float, float]:
    """(step seconds, max reserved GiB) of a rank: 6 N FLOPs per token at 400 TFLOP/s with
    costs for recompute, TP, the pipeline bubble and resharding; 16 B per parameter over the
    FSDP mesh plus activations per checkpointing mode."""
    params, layers, hidden = MODELS[config]
    world = d["r"] * d["s"] * d["cp"] * d["tp"] * d["pp"]
    seq = int(str(v["training.seq-len"]))
    step = 6 * params * d["gbs"] * seq / world / 400e12
    step *= {"none": 1.0, "selective": 1.1, "full": 1.33, "memory-budget": 1.2}[ac]
    step *= 1 + 0.06 * (d["tp"] - 1) + 0.03 * (d["cp"] - 1)
    if d["pp"] > 1:
        m = d["local"] // int(str(v["parallelism.pipeline-parallel-microbatch-size"]))
        step *= 1 + (d["pp"] - 1) / max(m, 1)
    if v["parallelism.fsdp-reshard-after-forward"] == "never":
        step *= 0.97
    if v["compile.enable"]:
        step *= 0.9
    states = 16 * params / (d["s"] * d["cp"] * d["tp"] * d["pp"]) / 2**30
    mbs = (
        d["local"]
        if d["pp"] == 1
        else int(str(v["parallelism.pipeline-parallel-microbatch-size"]))
    )  # noqa: E501
    act = {"none": 34, "selective": 14, "full": 2, "memory-budget": 10}[ac]
    acts = act * seq * mbs * hidden * layers / (d["pp"] * d["tp"] * d["cp"]) / 2**30
    return step, states + acts + 1.5


def main() -> None:
    values, _module, config, ac = parse(sys.argv[1:])
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    d = check(values, world)
    step_s, reserved = surface(values, d, ac, config)
    capacity = float(os.environ.get("TUNER_STANDIN_GPU_GIB", "80"))
    if reserved > capacity:
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU {rank % 8} has a total capacity "
            f"of {capacity:.2f} GiB of which 1.21 GiB is free."
        )
    scale = float(os.environ.get("TUNER_STANDIN_TIME_SCALE", "0.001"))
    seq, freq = int(str(values["training.seq-len"])), int(str(values["metrics.log-freq"]))
    tokens = d["gbs"] * seq / (d["r"] * d["s"])  # this DP rank's tokens per step
    color = not values["metrics.disable-color-printing"]
    c = {k: (f"\x1b[{n}m" if color else "") for k, n in
         (("red", 31), ("green", 32), ("orange", 33), ("turquoise", 36), ("blue", 34),
          ("cyan", 96), ("magenta", 35), ("reset", 0))}  # fmt: skip
    since = 0.0
    for step in range(1, int(str(values["training.steps"])) + 1):
        this = step_s * (1.5 if step == 1 else 1.0)
        time.sleep(this * scale)
        since += this
        if rank != 0 or not (step == 1 or step % freq == 0):
            continue
        n = 1 if step == 1 else freq
        tps = n * tokens / (since * d["cp"] * d["tp"] * d["pp"])
        tflops = 6 * MODELS[config][0] * tps / 1e12
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        print(
            f"[titan] {stamp} - root - INFO - {c['red']}step: {step:2}  "
            f"{c['green']}loss: {8.0 / step**0.1:8.5f}  {c['orange']}grad_norm: {1.0:7.4f}  "
            f"{c['turquoise']}memory: {reserved:5.2f}GiB({100 * reserved / capacity:.2f}%)  "
            f"{c['blue']}tps: {round(tps):,}  {c['cyan']}tflops: {tflops:,.2f}  "
            f"{c['magenta']}mfu: {100 * tflops / 989:.2f}%{c['reset']}",
            flush=True,
        )
        since = 0.0


if __name__ == "__main__":
    main()
