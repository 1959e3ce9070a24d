"""What ``tune profile`` measures: the plan that the probe (:mod:`tuner.profile.job`) runs.

The plan comes from the study: the GEMM shapes of the model per micro-batch size, TP and CP degree;
the collectives of every group size the space can form (TP, CP and DP groups; send/recv between
pipeline neighbours), placed within a node and across nodes, at message sizes from a few KiB up to
the largest message a config of the space sends (a DP gradient bucket or a TP activation), so the
alpha-beta fits are measured where the time model uses them instead of extrapolated; the
causal fused attention of every micro-batch size, TP and CP degree (with the kernel family the
framework runs); one memory-streaming buffer size past the device's last-level cache; and a chain
of tiny ops for the cost of launching one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.catalog import get_gpu
from tuner.models.optimizer_layout import DEEPSPEED_ZERO_DEFAULTS
from tuner.models.rates import cudnn_attention
from tuner.models.time.dp import megatron_bucket_params, rank_params
from tuner.space.enumerate import expand_axes
from tuner.spec.frameworks import traits
from tuner.spec.study import StudySpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeOptions:
    """How much the probe measures: more repeats and sizes cost minutes, not hours."""

    warmup: int = 3
    """Untimed repetitions before each measurement (first calls set up buffers and kernels)."""
    repeats: int = 10
    """Timed repetitions; the median is reported."""
    message_bytes: tuple[int, ...] | None = None
    """Collective message sizes; default: :func:`message_sizes`."""
    timeout_s: float = 900.0
    """The job is killed past this."""


MESSAGE_STEP = 4
"""Message sizes go up x4 at a time (nccl-tests' ``-f`` factor, here coarser to stay short)."""
GPU_MESSAGES = tuple(1 << k for k in range(16, 29, 2))  # 64 KiB ... 256 MiB, x4 apart
CPU_MESSAGES = tuple(1 << k for k in range(12, 21, 2))  # 4 KiB ... 1 MiB, x4 apart
GPU_MAX_MESSAGE = 1 << 30
"""The ladder stops at 1 GiB on GPUs: DeepSpeed's default reduce bucket of 5e8 16-bit elements."""
CPU_MAX_MESSAGE = 1 << 26
"""... and at 64 MiB on CPUs, where gloo's ring all-reduce of a 64 MiB buffer takes ~0.1 s on two
local ranks (measured with ``tune profile`` on the demo's machine): longer buckets would only
stretch the probe."""
GRAD_BYTES = 4
"""Bytes a gradient element takes in the DP reduction, at most: Megatron reduces its fp32
``main_grad`` buffer (tuner.models.time.dp.MEGATRON_GRAD_BYTES), fp32 training fp32 gradients;
DeepSpeed's 16-bit gradients take half, so the ladder then reaches one step further than needed."""
GPU_STREAM_BYTES = 1 << 28
"""Each buffer of the memory-streaming probe on a GPU: 256 MiB, five times the H100's 50 MB L2
and six times the A100's 40 MB (NVIDIA's Hopper and Ampere whitepapers): it streams HBM."""
CPU_STREAM_BYTES = 1 << 26
"""Each buffer on a CPU rank: 64 MiB, three per rank and every rank at once, past a node's L3."""


LAUNCH_OPS = 1000
"""Tiny element-wise ops timed back to back for the per-op launch cost: enough that the one
synchronisation at the end is a rounding error (a few microseconds of several milliseconds)."""


def largest_message(spec: StudySpec) -> int:
    """Bytes of the largest collective message a config of the space sends: a DP gradient bucket
    (the busiest rank's gradients at the smallest TP x PP, capped by the framework's bucket:
    DeepSpeed's ``reduce_bucket_size``, Megatron DDP's max(40M, 1M x dp) parameters) or a TP
    all-reduce of one micro-batch's activations (``mbs * seq / cp`` tokens x hidden)."""
    axes, m, world = expand_axes(spec), spec.model, spec.world_size
    tp, pp = min(axes.tp), min(axes.pp)
    dp = max(world // (tp * pp * min(axes.cp)), 1)
    if traits(spec.framework).deepspeed_optimizer:
        bucket = DEEPSPEED_ZERO_DEFAULTS["reduce_bucket_size"]
    else:
        bucket = megatron_bucket_params(dp)
    grads = min(rank_params(m, tp, pp)[0], bucket) * GRAD_BYTES
    elem = 4 if spec.training.precision == "fp32" else 2
    tokens = max(axes.micro_batch_size) * m.seq_length // min(axes.cp)
    activations = tokens * m.hidden_size * elem if max(axes.tp) > 1 else 0
    return int(max(grads, activations))


def message_sizes(spec: StudySpec) -> tuple[int, ...]:
    """The default ladder (64 KiB ... 256 MiB on GPUs, 4 KiB ... 1 MiB on CPUs), extended x4 at a
    time past :func:`largest_message` (up to 1 GiB / 64 MiB): a fit over small messages alone
    mis-states large ones (gloo's two-rank all-reduce: 0.27 GB/s fitted on 4 KiB-1 MiB, 0.9 GB/s
    measured at 16-64 MiB)."""
    cpu = spec.cluster.gpu == "cpu"
    sizes = list(CPU_MESSAGES if cpu else GPU_MESSAGES)
    top = min(largest_message(spec), CPU_MAX_MESSAGE if cpu else GPU_MAX_MESSAGE)
    while sizes[-1] < top:
        sizes.append(sizes[-1] * MESSAGE_STEP)
    return tuple(sizes)


def gemm_shapes(spec: StudySpec) -> list[dict[str, Any]]:
    """The per-layer GEMMs of the model (and its LM head) at every micro-batch size, TP and CP
    degree of the space: Megatron's column/row-parallel split of QKV, attention output and MLP
    (Shoeybi et al. 2019, section 3), tokens per rank ``mbs * seq / cp``."""
    m, axes = spec.model, expand_axes(spec)
    h, kv = m.hidden_size, m.query_groups * m.kv_channels
    fc1 = m.ffn_hidden_size * (2 if m.swiglu else 1)  # SwiGLU: gate and up in one GEMM
    out: dict[tuple[int, int, int], dict[str, Any]] = {}
    for mbs in axes.micro_batch_size:
        for tp in axes.tp:
            for cp in axes.cp:
                tokens = max(mbs * m.seq_length // cp, 1)
                tag = f"mbs={mbs} tp={tp} cp={cp}"
                for label, k, n in (
                    ("qkv", h, (m.num_attention_heads * m.kv_channels + 2 * kv) // tp),
                    ("attn_out", m.num_attention_heads * m.kv_channels // tp, h),
                    ("fc1", h, fc1 // tp),
                    ("fc2", m.ffn_hidden_size // tp, h),
                    ("lm_head", h, m.vocab_size // tp),
                ):
                    shape = (tokens, k, max(n, 1))
                    out.setdefault(shape, {"label": f"{label} {tag}", "m": shape[0],
                                           "k": shape[1], "n": shape[2]})  # fmt: skip
    return list(out.values())


def attention_shapes(spec: StudySpec) -> list[dict[str, Any]]:
    """The fused attention calls of the space, ``(batch, heads, seq, head_dim)`` causal: one
    micro-batch, the heads of one TP rank, each CP rank's ``seq / cp`` tokens (the length of one
    ring step's call). None for a model without flash attention: its scores are GEMMs and
    streaming kernels, which the GEMM and stream probes price."""
    m, axes = spec.model, expand_axes(spec)
    if not m.flash_attention:
        return []
    out: dict[tuple[int, int, int], dict[str, Any]] = {}
    for mbs in axes.micro_batch_size:
        for tp in axes.tp:
            for cp in axes.cp:
                key = (mbs, max(m.num_attention_heads // tp, 1), max(m.seq_length // cp, 1))
                out.setdefault(key, {"label": f"attention mbs={mbs} tp={tp} cp={cp}",
                                     "batch": key[0], "heads": key[1], "seq": key[2],
                                     "head_dim": m.kv_channels})  # fmt: skip
    return list(out.values())


def attention_backend(spec: StudySpec) -> str:
    """Which kernels the probe asks torch's ``scaled_dot_product_attention`` for: ``cudnn`` where
    Megatron's model code runs on Hopper or later (Transformer Engine prefers cuDNN's fused
    attention there: tuner.models.rates.cudnn_attention), else ``default`` (FlashAttention-2 on
    GPUs, as TE and the DeepSpeed workload run it elsewhere; the CPU kernel on CPUs)."""
    megatron = traits(spec.framework).megatron_model
    return "cudnn" if megatron and cudnn_attention(get_gpu(spec.cluster.gpu)) else "default"


def group_sizes(spec: StudySpec) -> dict[int, set[str]]:
    """Group size -> the collectives configs of the space run on groups of that size."""
    axes, world = expand_axes(spec), spec.world_size
    sizes: dict[int, set[str]] = {}
    for tp in axes.tp:
        for pp in axes.pp:
            for cp in axes.cp:
                dp = world // (tp * pp * cp)
                if dp < 1 or tp * pp * cp * dp != world:
                    continue
                # TP: all-reduce (and all-gather / reduce-scatter with sequence parallelism);
                # DP: gradient all-reduce, or reduce-scatter + all-gather with ZeRO / distopt;
                # CP: ring attention exchanges (send/recv) plus all-gathers of K/V.
                for g in (tp, dp, cp):
                    if g > 1:
                        sizes.setdefault(g, set()).update(
                            ("all_reduce", "all_gather", "reduce_scatter")
                        )
                if pp > 1 or cp > 1:
                    sizes.setdefault(2, set()).add("send_recv")
    # EP: the token dispatch and combine, one all-to-all each way (tuner.models.moe)
    for ep in (e for e in axes.ep if e > 1):
        sizes.setdefault(ep, set()).add("all_to_all")
    return sizes


def groups(spec: StudySpec) -> list[dict[str, Any]]:
    """The probe's groups: each size placed on one node and across nodes, where it can be."""
    gpn, nodes = spec.cluster.gpus_per_node, spec.nodes_per_trial
    out = []
    for size, ops in sorted(group_sizes(spec).items()):
        placements = []
        if size <= gpn:
            placements.append(("intra", list(range(size))))
            if nodes > 1 and size <= nodes:
                placements.append(("inter", [i * gpn for i in range(size)]))
        elif size <= gpn * nodes:
            placements.append(("inter", list(range(size))))
        for link, ranks in placements:
            for op in sorted(ops):
                sub = ranks[:2] if op == "send_recv" else ranks
                out.append({"link": link, "ranks": sub, "ops": [op]})
    return out


def make_plan(spec: StudySpec, options: ProbeOptions) -> dict[str, Any]:
    """The probe's input (``plan.json``). Under fp8 the probe measures bf16: Megatron's FP8
    training is ``--bf16`` with Transformer Engine's linear layers in FP8 (tuner.spec.fp8), and the
    probe's torch.matmul has no FP8 path; its samples price the 16-bit GEMMs and the collectives
    (tuner.models.rates.gemm_rate)."""
    cpu = spec.cluster.gpu == "cpu"
    precision = spec.training.precision
    return {
        "device": "cpu" if cpu else "cuda",
        "dtype": "fp32" if cpu else "bf16" if precision == "fp8" else precision,
        "warmup": options.warmup,
        "repeats": options.repeats,
        "message_bytes": list(options.message_bytes or message_sizes(spec)),
        "stream_bytes": CPU_STREAM_BYTES if cpu else GPU_STREAM_BYTES,
        "launch_ops": LAUNCH_OPS,
        "gemms": gemm_shapes(spec),
        "attention": attention_shapes(spec),
        "attention_backend": attention_backend(spec),
        "groups": groups(spec),
    }
