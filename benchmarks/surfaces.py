"""Response surfaces for the Megatron stand-in, used by ``search_efficiency.py``.

Each function takes the stand-in's surface variables (see ``tests/standins/pretrain_gpt.py``) and
returns ``{"step_s", "memory_gib"}``. The stand-in loads them in every trial process
(``TUNER_STANDIN_SURFACE=benchmarks/surfaces.py:high_tp``), so this module imports the standard
library only.

The shape is the same for all three, a plain performance model written independently of
``tuner.models.time.estimate`` and ``tuner.models.memory.estimate``:

* compute: the model FLOPs at an achievable 700 TFLOP/s per GPU, scaled by a GEMM efficiency
  that grows with the per-GPU GEMM size ``micro_batch * seq * hidden / tp`` (``size / (size +
  half)``: bigger micro-batches and less tensor slicing run closer to peak);
* activation recomputation: selective +4 %, full +33 % of compute;
* pipeline bubble ``(pp - 1) / microbatches``; tensor parallel communication ``tp_cost * log2 tp``
  of compute; data-parallel gradient reduce-scatter/all-gather over ``dp_gbps``, half hidden;
* memory: Megatron's 18 bytes per parameter (6 + 12 / dp with the distributed optimizer) on the
  first stage's share, Korthikanti's activations (34 sbh per layer with flash attention and
  sequence parallelism, 2 sbh with full recomputation) for the in-flight micro-batches, plus 4 GiB
  of context, NCCL and fragmentation. The stand-in OOMs above 80 GiB.

What differs is the machine each one describes:

* ``high_tp``: NVLink-class tensor parallelism (cheap), a slow data-parallel network and GEMMs
  that saturate early: a large TP wins.
* ``pipeline``: costly tensor parallelism (e.g. a PCIe box) and many micro-batches: PP wins.
* ``micro_batch``: GEMMs far from saturation at small sizes: the largest micro-batch that fits
  (with the recomputation that lets it fit) wins.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

PEAK_FLOPS = 700e12
GIB = 2**30


def _model(v: dict[str, Any], *, half: float, tp_cost: float, dp_gbps: float) -> dict[str, float]:
    size = v["mbs"] * v["seq"] / v["cp"] * v["hidden"] / v["tp"]
    efficiency = size / (size + half)
    compute = v["flops"] / (v["world"] * PEAK_FLOPS * efficiency)
    compute *= {"none": 1.0, "selective": 1.04, "full": 1.33}[v["recompute"]]
    bubble = (v["pp"] - 1) / (v["microbatches"] * v["vp"])
    tensor = tp_cost * math.log2(v["tp"])
    shard_params = v["params"] / (v["tp"] * v["pp"])
    grad_bytes = 2 * (v["dp"] - 1) / v["dp"] * 2 * shard_params
    data = 0.5 * grad_bytes / (dp_gbps * 1e9)
    step = compute * (1 + bubble + tensor) + data

    bytes_per_param = 6 + 12 / v["dp"] if v["distopt"] else 18
    weights = shard_params * bytes_per_param
    s, b, h = v["seq"] / v["cp"], v["mbs"], v["hidden"]
    per_layer = {"none": 34.0, "selective": 34.0, "full": 2.0}[v["recompute"]]
    if v["recompute"] == "none":
        per_layer += 5 * v["heads"] * s / h * 0.1  # flash attention keeps a little of the scores
    shard = v["tp"] if v["sp"] or v["recompute"] == "full" else 1
    inflight = min(v["pp"], v["microbatches"])
    activations = s * b * h * per_layer / shard * (v["layers"] / v["pp"]) * inflight
    return {"step_s": step, "memory_gib": (weights + activations) / GIB + 4.0}


def high_tp(v: dict[str, Any]) -> dict[str, float]:
    """Cheap TP, slow DP network, early-saturating GEMMs: large TP wins."""
    return _model(v, half=1.0e6, tp_cost=0.005, dp_gbps=3.0)


def pipeline(v: dict[str, Any]) -> dict[str, float]:
    """Costly TP, fast DP, many micro-batches: pipeline parallelism wins."""
    return _model(v, half=4.0e6, tp_cost=0.6, dp_gbps=100.0)


def micro_batch(v: dict[str, Any]) -> dict[str, float]:
    """GEMMs far from saturation: the largest micro-batch that fits wins."""
    return _model(v, half=8.0e7, tp_cost=0.08, dp_gbps=50.0)


def rugged(v: dict[str, Any]) -> dict[str, float]:
    """Held out (the sampler was not tuned on it): the ``pipeline`` machine times a fixed random
    factor of +-25 % per knob value and +-10 % per pair of knob values, a surface no smooth model
    explains."""
    point = _model(v, half=4.0e6, tp_cost=0.3, dp_gbps=50.0)
    knobs = {k: str(v[k]) for k in ("tp", "pp", "mbs", "recompute", "dp")}
    factor = 1.0
    for name, value in knobs.items():
        factor *= 1 + 0.25 * _unit(f"{name}={value}")
    names = sorted(knobs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            factor *= 1 + 0.10 * _unit(f"{a}={knobs[a]},{b}={knobs[b]}")
    return {"step_s": point["step_s"] * factor, "memory_gib": point["memory_gib"]}


def _unit(text: str) -> float:
    """A fixed pseudo-random number in [-1, 1] for ``text``."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**63 - 1.0


SURFACES = {"high_tp": high_tp, "pipeline": pipeline, "micro_batch": micro_batch, "rugged": rugged}
