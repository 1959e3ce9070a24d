"""Achieved rates the time model reads: one frozen ``Rates`` per GPU type and precision.

``catalog_rates`` builds it from the catalog's datasheet figures, its GPUs' published measured
matmul ceilings (``gemm_efficiency``) and the efficiency constants below (each with its source); a
measured cluster profile builds its own ``Rates`` (achieved GEMM throughput by shape in
``gemm_samples``, alpha-beta costs per link type in ``intra`` / ``inter``) and passes it to
``tuner.models.time.estimate.estimate_time``. Also here: how a GEMM's shape and a collective's
group placement turn those rates into achieved ones (tile / wave quantization, NIC aggregation).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tuner.catalog import GPUSpec

# --- Efficiencies (fractions of the catalog's peak figures) -------------------------------------

GEMM_EFFICIENCY = 271.2 / 312.0
"""Share of dense peak that a full wave of whole tiles of a large 16-bit GEMM reaches on a GPU
without a measured matmul ceiling in the catalog: the A100 SXM's measured one (ml-engineering's
Maximum Achievable Matmul FLOPS table, 271.2 of 312 BF16 TFLOP/s, the best of its shape sweep).
A measured GPU uses its own (``gemm_efficiency``); tile and wave quantization (GEMM_TILES) come
on top. Before, 0.88 grid-fitted on Korthikanti et al. 2022's iteration times; the measurement
replaces the fit (its optimum was flat over 0.88-0.92)."""
CPU_GEMM_EFFICIENCY = 0.84
"""fp32 GEMMs on one CPU core (MKL / OpenBLAS sgemm reach 80-90% of the core's FMA peak on the
demo's matrices); CPU ranks have no tensor-core tiles, so no quantization either."""
FLASH_ATTENTION_EFFICIENCY = 0.60
"""FlashAttention-2 forward reaches 50-73% of A100 peak on the FLOPs it executes (Dao 2023);
the rate of attention on GPUs before Hopper (and on CPU ranks), forward and backward."""
HOPPER_ATTENTION = (
    (512, 0.32, 0.31),
    (1024, 0.41, 0.41),
    (2048, 0.49, 0.47),
    (4096, 0.52, 0.50),
    (8192, 0.53, 0.52),
    (16384, 0.54, 0.52),
)
"""(sequence length, forward, backward) shares of the 16-bit dense peak that attention reaches on
Hopper and later GPUs. Transformer Engine runs cuDNN's fused attention there: when both it and
FlashAttention could run, it drops FlashAttention "to give FusedAttention preference on Hopper+"
(transformer_engine/pytorch/attention/dot_product_attention/utils.py
``get_attention_backend``). cuDNN's measured speeds on an H100 SXM5, head dim 128, BF16, from
Shah et al. 2024 (FlashAttention-3, arXiv:2407.08608, Figs. 5-6): forward with the causal mask
315 / 410 / 484 / 518 / 529 / 539 TFLOP/s and backward 305 / 408 / 465 / 499 / 518 / 516 at
0.5k-16k tokens, over 989 dense. FlashAttention-2 on the same GPU stays at 35% (the paper's
abstract): Hopper attention runs well below A100's FLASH_ATTENTION_EFFICIENCY."""
HOPPER_COMPUTE_CAPABILITY = 9.0
FLASH_BACKWARD_RATIO = 2.5
"""FlashAttention's backward runs 5 GEMMs to the forward's 2 (it recomputes the scores); the
FlashAttention papers' backward TFLOP/s count the same 2.5x the forward's FLOPs."""
HBM_EFFICIENCY = 0.80
"""Achievable share of HBM bandwidth in streaming kernels (STREAM-like; 80-90% on A100/H100)."""
NVLINK_BUS_EFFICIENCY = 0.70
"""NCCL ring bus bandwidth over NVLink is ~70% of the per-direction link rate (nccl-tests
all_reduce busbw ~210-230 GB/s of 300 on DGX A100); jointly grid-fitted with the earlier flat
GEMM efficiency on Korthikanti et al. 2022's iteration times (flat over 0.60-0.75), kept."""
NETWORK_BUS_EFFICIENCY = 0.80
"""NCCL over InfiniBand reaches ~80% of the line rate per GPU (nccl-tests, large messages)."""
FP32_PEAK_FRACTION = 0.5
"""fp32 training runs on TF32 tensor cores: half the 16-bit dense rate (A100/H100 datasheets)."""

# --- Latencies and fixed costs (seconds) ---------------------------------------------------------

GPU_KERNEL_LATENCY_S = 4e-6
"""Launch + tail of one GPU kernel; dominates only for tiny kernels."""
CPU_OP_LATENCY_S = 30e-6
"""Dispatch cost of one PyTorch op on a CPU rank (eager mode, order of tens of microseconds)."""
NVLINK_COLLECTIVE_LATENCY_S = 15e-6
"""Startup of one NCCL collective inside a node (nccl-tests small-message all_reduce)."""
NETWORK_COLLECTIVE_LATENCY_S = 40e-6
"""Startup of one NCCL collective or p2p transfer across nodes."""
CPU_COLLECTIVE_LATENCY_S = 300e-6
"""One gloo collective between CPU ranks (shared memory / loopback TCP)."""
GPU_MICROBATCH_OVERHEAD_S = 0.3e-3
"""Framework work per micro-batch on GPUs (schedule bookkeeping, loss, launch gaps)."""
CPU_MICROBATCH_OVERHEAD_S = 15e-3
"""Framework work per micro-batch on CPU ranks (engine forward/backward calls, autograd setup)."""
GPU_STEP_OVERHEAD_S = 10e-3
"""Per optimizer step on GPUs: grad-norm reduction, loss scaling checks, logging."""
CPU_STEP_OVERHEAD_S = 50e-3
"""Per optimizer step on CPU ranks: the same work in eager Python, plus the engine's step."""

# --- Achieved rates: one structure, from the catalog or a measured cluster profile -------------

GEMM_TILES = ((128, 128), (256, 128), (128, 256))
"""Output tiles (rows, columns) of the 16-bit tensor-core GEMM kernels cuBLAS / CUTLASS choose
from on Ampere and Hopper (CUTLASS's tensor-op defaults). Each thread block computes one tile, so
a GEMM runs in ceil(tiles / SMs) waves, the last one partial, and dimensions are padded to whole
tiles (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": tile and wave
quantization); the heuristics pick the tile that wastes least. Small GEMMs from high TP or small
micro-batches lose most. GEMM_EFFICIENCY is the rate of a whole wave of whole tiles."""
SPLIT_K_MAX = 4
"""Most ways cuBLAS's heuristics split K for a sub-wave grid (CUTLASS split-K serial kernels)."""
FP8_OPERAND_BYTES = 1.0
"""Bytes per operand element of Transformer Engine's FP8 GEMMs: ``general_gemm`` reads the
quantized (E4M3 / E5M2) inputs, weights and output gradients, 1 byte each, and writes its output
in the 16-bit activation dtype (transformer_engine/pytorch/module/linear.py ``_Linear``: fprop,
dgrad and wgrad all take quantized operands under every FP8 recipe)."""
SPLIT_K_MIN_DEPTH = 1024
"""Shortest K slice worth a split: the fp32 partial sums of s slices (4·m·n·s bytes written and
read back) stay small next to the slices' operand traffic only while the slices stay long."""


@dataclass(frozen=True, slots=True)
class Link:
    """Alpha-beta cost over one kind of link: ``latency + bytes / bandwidth`` per collective
    (``bandwidth`` is NCCL's *bus* bandwidth per GPU, bytes/s)."""

    bandwidth: float
    latency: float


@dataclass(frozen=True, slots=True, eq=False)
class Rates:
    """Every achieved rate the time model reads, for one GPU type at one precision.

    ``catalog_rates`` builds it from the catalog's datasheet figures and this module's efficiency
    constants; a measured cluster profile can build its own and pass it to ``estimate_time``.
    Compared and hashed by identity (the per-shape caches key on it): build one per cluster.
    """

    peak: float
    """Dense tensor FLOP/s at the precision."""
    gemm: float
    """Achieved FLOP/s of a large, well-quantized GEMM of the linear layers (peak x
    ``gemm_efficiency``; under fp8 the FP8 peak's: Transformer Engine's layers)."""
    gemm16: float
    """The same for a 16-bit GEMM: equal to ``gemm`` unless ``fp8``, where it prices the GEMMs
    outside Transformer Engine's FP8 layers (``gemm16_seconds``)."""
    fp8: bool
    """Whether ``gemm`` is an FP8 rate: the linear layers' GEMMs then read FP8_OPERAND_BYTES per
    operand element, and ``gemm_samples`` (measured with 16-bit torch.matmul) price only the
    16-bit GEMMs; the FP8 ones keep the tile model."""
    sm_count: int
    """Streaming multiprocessors, for wave quantization; 0 turns it off (CPU ranks)."""
    gemm_samples: tuple[tuple[float, float, float, float], ...]
    """Measured (m, n, k, achieved FLOP/s) GEMMs; when given, the nearest in log-shape replaces
    the tile model (a cluster profile's samples)."""
    attention: tuple[tuple[float, float, float], ...]
    """Achieved FLOP/s of fused (flash) attention by sequence length: ``(tokens, forward,
    backward)`` rows, ascending; ``attention_rates`` interpolates them."""
    hbm: float
    """Achieved memory bandwidth of streaming kernels, bytes/s."""
    op_latency: float
    """Launch + tail of one kernel (or one eager op on a CPU rank), seconds."""
    intra: Link
    """A collective among GPUs of one node (NVLink / NVSwitch)."""
    inter: Link
    """A collective across nodes, per GPU: the node's network share of one GPU."""
    nics_aggregate: bool
    """Whether a group with several ranks on a node uses all their network shares at once (NCCL
    with one NIC per GPU: each ring channel crosses the node boundary on another NIC), or a
    single shared link (gloo over one TCP interface)."""
    microbatch_overhead: float
    """Fixed framework seconds per micro-batch."""
    step_overhead: float
    """Fixed framework seconds per optimizer step."""
    elem: int
    """Bytes per activation / parameter element (2 for 16-bit, 4 for fp32)."""
    all_to_all: Link | None = None
    """An all-to-all among ranks of one node (the MoE token dispatch and combine), where a
    cluster profile measured one (its alpha-beta fit); None: ``intra``, the all-reduce's. The
    two are different algorithms: an all-to-all is one exchange with each peer, an all-reduce a
    reduce-scatter and an all-gather. On the CPU demo's two gloo ranks the all-to-all measured
    0.13-0.29 ms up to 256 KiB in three profiles, while the all-reduce's fitted latency came out
    at 0.22-1.63 ms in eight (its small messages' medians are 0.25-0.5 ms or 1.4-3.7 ms)."""


def cudnn_attention(gpu: GPUSpec) -> bool:
    """Whether Transformer Engine runs cuDNN's fused attention on ``gpu`` (Hopper and later; see
    HOPPER_ATTENTION), not FlashAttention."""
    return gpu.name != "cpu" and gpu.compute_capability >= HOPPER_COMPUTE_CAPABILITY


def _attention_table(
    gpu: GPUSpec, peak: float, cpu: bool
) -> tuple[tuple[float, float, float], ...]:
    if cpu or not cudnn_attention(gpu):
        flash = peak * FLASH_ATTENTION_EFFICIENCY
        return ((1.0, flash, flash),)
    return tuple((float(s), peak * fwd, peak * bwd) for s, fwd, bwd in HOPPER_ATTENTION)


def attention_rates(rates: Rates, seq: float) -> tuple[float, float]:
    """(forward, backward) FLOP/s of fused attention over ``seq`` tokens: ``rates.attention``
    interpolated in log(tokens), held flat beyond its ends."""
    table = rates.attention
    if seq <= table[0][0]:
        return table[0][1], table[0][2]
    for (s0, f0, b0), (s1, f1, b1) in zip(table, table[1:], strict=False):
        if seq <= s1:
            w = math.log(seq / s0) / math.log(s1 / s0)
            return f0 + w * (f1 - f0), b0 + w * (b1 - b0)
    return table[-1][1], table[-1][2]


def attention_seconds(rates: Rates, flops: float, seq: float) -> tuple[float, float]:
    """(forward, backward) seconds of fused attention executing ``flops`` forward over ``seq``
    tokens (backward: FLASH_BACKWARD_RATIO times the FLOPs at the backward rate)."""
    fwd_rate, bwd_rate = attention_rates(rates, seq)
    fwd = flops / fwd_rate + rates.op_latency
    return fwd, FLASH_BACKWARD_RATIO * flops / bwd_rate + rates.op_latency


def gemm_efficiency(gpu: GPUSpec, fp8: bool = False) -> float:
    """Share of ``gpu``'s dense peak (its FP8 peak with ``fp8``) that a full wave of a large GEMM
    reaches: its measured maximum achievable matmul rate (``mamf_tflops``, as a share of peak).
    The same sweep of the same benchmark puts the A100 SXM at 86.9% of its BF16 peak and the
    H100 SXM at 80.3% (its FP8 at 70.9%): Hopper's tensor cores outrun what its power, clocks and
    memory system let a GEMM sustain. A GPU without a measurement gets GEMM_EFFICIENCY."""
    share = ceiling_share(gpu, fp8)
    return share if share > 0.0 else GEMM_EFFICIENCY


def ceiling_share(gpu: GPUSpec, fp8: bool = False) -> float:
    """``gpu``'s measured matmul ceiling as a share of its peak (its FP8 ones with ``fp8``); 0
    when the catalog has no measurement."""
    measured = gpu.mamf_fp8_tflops if fp8 else gpu.mamf_tflops
    peak = gpu.fp8_peak_tflops if fp8 else gpu.peak_tflops
    return measured / peak if measured > 0.0 and peak > 0.0 else 0.0


@functools.lru_cache(maxsize=64)
def catalog_rates(gpu: GPUSpec, precision: str) -> Rates:
    """The rates of ``gpu`` from the catalog and this module's constants (no measurements)."""
    cpu = gpu.name == "cpu"
    peak = gpu.peak_tflops * 1e12
    if precision == "fp32" and not cpu:  # the cpu entry's peak is already an fp32 figure
        peak *= FP32_PEAK_FRACTION
    intra_lat = CPU_COLLECTIVE_LATENCY_S if cpu else NVLINK_COLLECTIVE_LATENCY_S
    inter_lat = CPU_COLLECTIVE_LATENCY_S if cpu else NETWORK_COLLECTIVE_LATENCY_S
    # fp8: Transformer Engine runs the linear layers' GEMMs at the FP8 tensor-core peak (the
    # catalog's datasheet figure); attention (flash) and element-wise work stay bf16, and MFU
    # stays relative to the 16-bit peak (the convention of Megatron's and NeMo's FP8 figures).
    fp8 = precision == "fp8" and gpu.fp8_peak_tflops > 0
    # fp32 runs TF32 tensor cores at half the 16-bit rate: the 16-bit ceiling's share carries over
    gemm16 = peak * (CPU_GEMM_EFFICIENCY if cpu else gemm_efficiency(gpu))
    return Rates(
        peak=peak,
        gemm=gpu.fp8_peak_tflops * 1e12 * gemm_efficiency(gpu, fp8=True) if fp8 else gemm16,
        gemm16=gemm16,
        fp8=fp8,
        sm_count=0 if cpu else gpu.sm_count,
        gemm_samples=(),
        attention=_attention_table(gpu, peak, cpu),
        hbm=gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY,
        op_latency=CPU_OP_LATENCY_S if cpu else GPU_KERNEL_LATENCY_S,
        intra=Link(gpu.intra_node_gbps * 1e9 * NVLINK_BUS_EFFICIENCY, intra_lat),
        inter=Link(gpu.inter_node_gbps * 1e9 * NETWORK_BUS_EFFICIENCY, inter_lat),
        nics_aggregate=not cpu,
        microbatch_overhead=CPU_MICROBATCH_OVERHEAD_S if cpu else GPU_MICROBATCH_OVERHEAD_S,
        step_overhead=CPU_STEP_OVERHEAD_S if cpu else GPU_STEP_OVERHEAD_S,
        elem=4 if precision == "fp32" else 2,
    )


def group_link(rates: Rates, size: int, stride: int, gpus_per_node: int) -> Link:
    """Cost of a ring over ``size`` ranks ``stride`` apart (Megatron's rank order: tp, cp, dp, pp).

    Inside a node: NVLink. Across nodes a ring enters and leaves every node once per channel, and
    NCCL spreads its channels over the node's NICs (one per GPU on DGX-class nodes), so the ring's
    bus bandwidth is the network share of one GPU times the group's ranks on a node, never more
    than NVLink (nccl-tests: 3 nodes of 8 A100 with 4 HDR NICs reach 85-96 GB/s all-reduce busbw
    of the nodes' 100 GB/s, NVIDIA/nccl-tests#119; more NICs add bandwidth up to the NVLink rate,
    NVIDIA/nccl#412). A TP group of 16 over two DGX nodes thus runs at ~8x the per-GPU share.
    """
    if size * stride <= gpus_per_node or size == 1:
        return rates.intra
    on_node = max(1, min(size, gpus_per_node // stride)) if rates.nics_aggregate else 1
    bandwidth = min(rates.intra.bandwidth, rates.inter.bandwidth * on_node)
    return Link(bandwidth, rates.inter.latency)


def wave_fraction(sm_count: int, m: float, n: float, k: float) -> float:
    """Share of GEMM_EFFICIENCY an (m x n)-output, depth-k GEMM keeps after tile and wave
    quantization with the best tile of GEMM_TILES. A grid smaller than one wave may split the
    reduction (split-K, up to SPLIT_K_MAX ways, slices of at least SPLIT_K_MIN_DEPTH), as cuBLAS
    and CUTLASS do for small outputs with a long K (weight gradients of small micro-batches)."""
    best = 0.0
    for tm, tn in GEMM_TILES:
        rows, cols = math.ceil(m / tm), math.ceil(n / tn)
        pad = (m * n) / (rows * tm * cols * tn)
        splits = 1
        if rows * cols < sm_count:
            splits = max(1, min(SPLIT_K_MAX, int(k // SPLIT_K_MIN_DEPTH)))
        for split in range(1, splits + 1):
            waves = rows * cols * split / sm_count
            best = max(best, pad * waves / math.ceil(waves))
    return best


def gemm_seconds(rates: Rates, m: float, n: float, k: float, batch: float = 1.0) -> float:
    """Additive roofline of an (m x k) @ (k x n) GEMM of a linear layer, ``batch`` times, plus
    one launch: FLOPs at the achieved rate of its shape, operand and result bytes at the achieved
    HBM bandwidth. Under fp8 (``rates.fp8``) this is Transformer Engine's FP8 GEMM: the FP8
    rate, 1-byte operands (FP8_OPERAND_BYTES), a 16-bit result."""
    operand = FP8_OPERAND_BYTES if rates.fp8 else rates.elem
    moved = operand * (m * k + k * n) + rates.elem * m * n
    return _roofline(rates, m, n, k, batch, gemm_rate(rates, m, n, k), moved)


def gemm16_seconds(rates: Rates, m: float, n: float, k: float, batch: float = 1.0) -> float:
    """``gemm_seconds`` of a GEMM that runs in 16 bits even under fp8, because no Transformer
    Engine module runs it: Megatron's LM head (``tensor_parallel.ColumnParallelLinear``,
    megatron/core/models/gpt/gpt_model.py ``output_layer``), the MoE router (moe_utils.py
    ``RouterGatingLinearFunction``: the 16-bit input and weight through ``te_general_gemm``
    without a quantizer), the unfused attention's score and context batched GEMMs."""
    moved = rates.elem * (m * k + k * n + m * n)
    return _roofline(rates, m, n, k, batch, gemm_rate(rates, m, n, k, True), moved)


def _roofline(
    rates: Rates, m: float, n: float, k: float, batch: float, rate: float, moved: float
) -> float:
    return batch * (2.0 * m * n * k / rate + moved / rates.hbm) + rates.op_latency


@functools.lru_cache(maxsize=65536)
def gemm_rate(rates: Rates, m: float, n: float, k: float, wide: bool = False) -> float:
    """Achieved FLOP/s of an (m x k) @ (k x n) GEMM: a linear layer's, or (``wide``) a 16-bit
    one (``gemm16_seconds``). Measured samples are 16-bit GEMMs (the profile's torch.matmul):
    under fp8 they price only the 16-bit ones; the FP8 GEMMs keep the tile model's FP8 rate."""
    if rates.gemm_samples and (wide or not rates.fp8):
        shape = (math.log(m), math.log(n), math.log(k))
        return min(
            rates.gemm_samples,
            key=lambda s: sum((math.log(a) - b) ** 2 for a, b in zip(s[:3], shape, strict=True)),
        )[3]
    peak = rates.gemm16 if wide else rates.gemm
    if rates.sm_count == 0:
        return peak
    return peak * wave_fraction(rates.sm_count, m, n, k)
