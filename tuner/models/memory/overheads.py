"""Device memory outside the model's tensors: CUDA context, NCCL buffers, library workspaces, and
the caching allocator's slack. Figures come from the GPU catalog (tuner/catalog/gpus.yaml, with
its sources), which a study's ``cluster.overheads`` overrides.

Communicators: PyTorch creates a NCCL communicator for a process group on its first collective,
and NCCL >= 2.22 connects only what is used (NCCL_RUNTIME_CONNECT), so only the groups a training
step talks on count. A collective communicator holds ``nccl_channels x nccl_buffer_mib`` (one ring
connection per channel; NVIDIA/nccl#986: "memory usage is linearly tied to the number of
channels", ring "only has 2 connections regardless of the scale"); a send/recv communicator holds
``nccl_p2p_channels x nccl_p2p_buffer_mib`` per peer.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.allocator import Reserved, StepTensors, Sums, reserved_bytes, step_sums
from tuner.models.memory.kept import Kept
from tuner.spec.frameworks import traits
from tuner.spec.study import Framework

MIB = float(2**20)
GIB = float(2**30)


@dataclass(frozen=True, slots=True)
class Communicators:
    """The NCCL communicators one rank of a stage uses in a step."""

    collective: tuple[str, ...]  # group names, e.g. ("tp", "dp")
    p2p_peers: int  # send/recv peers over all p2p communicators (PP neighbours, CP ring)


def communicators(
    c: ParallelConfig, stage: int, framework: Framework, tied: bool, moe: bool = False
) -> Communicators:
    """Which groups a rank of ``stage`` talks on (Megatron parallel_state / DeepSpeed pipe;
    Megatron-DeepSpeed: Megatron's TP and DP groups, DeepSpeed's pipeline groups); ``moe``: the
    model has expert layers on this stage."""
    first, last = stage == 0, stage == c.pp - 1
    neighbours = (0 if first else 1) + (0 if last else 1)
    groups: list[str] = []
    peers = 0
    if c.tp > 1:
        groups.append("tp")  # activation all-reduce / reduce-scatter / all-gather
    if c.dp * c.cp > 1:
        groups.append("dp")  # gradient all-reduce or reduce-scatter + parameter all-gather
    if c.cp > 1:
        peers += 2  # Megatron CP attention: send/recv ring (prev and next rank)
        if c.dp > 1:
            groups.append("dp-only")  # loss averaging over the DP group without CP
    if not traits(framework).deepspeed_pipeline:
        peers += neighbours  # batch_isend_irecv with the previous and next stage
        if c.tp * c.pp > 1:
            groups.append("model-parallel")  # grad-norm / found-inf all-reduce
        if c.pp > 1 and tied and (first or last):
            groups.append("embedding")  # tied word-embedding gradient all-reduce
    elif c.pp > 1:
        # DeepSpeed pipe/p2p.py: one 2-rank group per adjacent stage pair, used by broadcast;
        # the pipeline engine all-reduces the grad norm over the pipeline group.
        groups += ["pipe-pair"] * neighbours + ["pipe"]
        if tied and (first or last):
            groups.append("tied-embedding")
    if moe:
        # megatron/core/parallel_state.py expert groups: the token dispatch all-to-all (or
        # all-gather) over EP, the experts' TP collectives over ETP when it differs from TP,
        # and the expert parameters' gradient reduction over the expert-data-parallel group.
        if c.ep > 1:
            groups.append("ep")
        if c.expert_tp > 1 and c.expert_tp != c.tp:
            groups.append("etp")
        if c.expert_dp > 1:
            groups.append("expert-dp")
    if c.world_size > 1:
        groups.append("world")  # barriers and timers on the default group
    return Communicators(tuple(groups), peers)


_COMM_KNOBS = operator.attrgetter("tp", "pp", "cp", "dp", "ep", "etp")
"""The config's knobs :func:`communicators` reads (with the stage only as first / last)."""


def stage_nccl_bytes(
    c: ParallelConfig, stage: int, framework: Framework, tied: bool, moe: bool, gpu: GPUSpec
) -> float:
    """``nccl_bytes(communicators(c, stage, framework, tied, moe), gpu)``, kept per (the
    config's sizes, whether the stage is first or last, framework, tied, moe, gpu): every
    stage of a space asks, and a few dozen combinations answer them all."""
    key = (_COMM_KNOBS(c), stage == 0, stage == c.pp - 1, framework, tied, moe, gpu)
    out = _NCCL.get(key)
    if out is None:
        out = _NCCL.put(key, nccl_bytes(communicators(c, stage, framework, tied, moe), gpu))
    return out


_NCCL: Kept[float] = Kept()


def nccl_bytes(comms: Communicators, gpu: GPUSpec) -> float:
    """Device bytes of the NCCL buffers of ``comms`` on ``gpu`` (0 on CPU: gloo)."""
    collective = len(comms.collective) * gpu.nccl_channels * gpu.nccl_buffer_mib
    p2p = comms.p2p_peers * gpu.nccl_p2p_channels * gpu.nccl_p2p_buffer_mib
    return (collective + p2p) * MIB


def context_bytes(gpu: GPUSpec) -> float:
    """CUDA context and loaded kernel images (outside PyTorch's allocator)."""
    return gpu.cuda_context_gib * GIB


BLAS_THREADS = 2
"""Threads that run GEMMs in a training step, each with its own cuBLAS handle: the Python thread
(forward, optimizer step) and the autograd engine's worker thread of the CUDA device, which
runs the backward (torch/csrc/autograd/engine.cpp ``thread_main`` on the device threads).
PyTorch hands each thread its own handle (aten/src/ATen/cuda/CublasHandlePool.cpp: a
``thread_local`` ``PoolWindow`` of the ``DeviceThreadHandlePool``) and keeps one workspace per
(handle, stream) pair, allocated through its caching allocator on the handle's first GEMM and
never freed (``cublas_handle_stream_to_workspace``, ``cublaslt_handle_stream_to_workspace``;
PyTorch docs notes/cuda.rst "cuBLAS workspaces"). Megatron-LM CI's resident bytes show both:
its ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` cases hold ~48 MiB (2 x (32 - 8.125)) more on A100 than
its cases without it. PyTorch builds that stop caching them by default
(``TORCH_CUBLAS_WORKSPACE_CACHE``) keep none between GEMMs: a study on such a stack sets
``cluster.overheads.cublas_workspace_mib: 0``."""


def te_workspace_bytes(gpu: GPUSpec) -> float:
    """One Transformer Engine cuBLAS workspace, ``get_cublas_workspace_size_bytes()``: 32 MiB +
    1 KiB on compute capability >= 9, 4 MiB before (NVIDIA/TransformerEngine v2.8-v2.9
    pytorch/module/base.py)."""
    return 32 * MIB + 1024 if gpu.compute_capability >= 9 else 4 * MIB


def workspace_bytes(gpu: GPUSpec, framework: Framework = "megatron") -> float:
    """GEMM workspaces held through PyTorch's allocator on every stage (0 on CPU).

    PyTorch's cuBLAS workspace for each of the :data:`BLAS_THREADS` handles. Its cuBLASLt
    workspace only where the model's layers run PyTorch's cuBLASLt GEMMs (``nn.Linear`` with a
    bias: addmm's ``gemm_and_bias``), i.e. not on Megatron-core, whose layers run their GEMMs in
    Transformer Engine, whose output layer is a bias-free ``torch.matmul``
    (megatron/core/tensor_parallel/layers.py ``_linear_forward``) and whose MoE router a TE GEMM
    or a bias-free ``torch.mm`` (moe/moe_utils.py ``RouterGatingLinearFunction``), the cuBLAS
    path. Megatron-core instead
    holds Transformer Engine's own workspace, one tensor per process (``get_workspace()``,
    module/base.py ``_cublas_workspace``; ``--transformer-impl transformer_engine``, the
    default of megatron/training/arguments.py).
    """
    if gpu.name == "cpu":
        return 0.0
    megatron = traits(framework).megatron_core  # tuner.spec.frameworks
    per_handle = gpu.cublas_workspace_mib + (0.0 if megatron else gpu.cublaslt_workspace_mib)
    return BLAS_THREADS * per_handle * MIB + (te_workspace_bytes(gpu) if megatron else 0.0)


TE_COMPUTE_STREAMS = 4
"""Transformer Engine's compute streams (common/util/multi_stream.cpp ``num_compute_streams``)."""


def grouped_gemm_workspace_bytes(gpu: GPUSpec) -> float:
    """cuBLAS workspaces Transformer Engine's grouped GEMM (Megatron's TEGroupedMLP,
    ``--moe-grouped-gemm``) allocates once per process with ``torch.empty``, one per compute
    stream, each of :func:`te_workspace_bytes` (NVIDIA/TransformerEngine v2.8-v2.9
    pytorch/module/base.py ``get_multi_stream_cublas_workspace``; main: cpp_extensions/gemm.py
    ``get_cublas_workspace`` with ``grouped_gemm=True``). Megatron-LM CI's MoE peaks show it:
    grouped-GEMM cases hold ~90 MiB more resident bytes on H100 / GB200 than on A100 (112 MiB
    expected), cases with SequentialMLP none."""
    if gpu.name == "cpu":
        return 0.0
    return TE_COMPUTE_STREAMS * te_workspace_bytes(gpu)


def allocator_slack(
    t: StepTensors, gpu: GPUSpec, reserved: Reserved | None = None
) -> tuple[float, float]:
    """Reserved minus allocated bytes at the (fwd_bwd, step) peaks.

    The caching allocator's segments for the step's tensors (tuner.models.memory.allocator:
    rounding, blocks that later requests cannot reuse, the first step's lazily created moments),
    plus a share ``gpu.allocator_fragmentation`` of the forward/backward's transient bytes for what
    that phase-level simulation does not see (one phase's tensors carved out of each other's freed
    blocks as the 1F1B schedule interleaves them). No caching allocator on CPU (plain malloc).

    ``reserved``: the simulation's (:func:`~tuner.models.memory.allocator.reserved_bytes`) when
    None, or a bound on it (``allocator.reserved_bounds``); both slacks are non-decreasing in
    each of its figures (sums, min and max only), so a bound there gives a bound here.
    """
    return allocator_slacks(t, gpu, (reserved,))[0]


def allocator_slacks(
    t: StepTensors, gpu: GPUSpec, reserveds: tuple[Reserved | None, ...],
    sums: Sums | None = None,
) -> list[tuple[float, float]]:  # fmt: skip
    """:func:`allocator_slack` at each of ``reserveds`` (None: the simulation's), the same sums
    in the same order; the byte sums they share are read once (the bounds ask for two), from
    ``sums`` (``allocator.step_sums`` of ``t``) where the caller has them."""
    if gpu.name == "cpu":
        return [(0.0, 0.0)] * len(reserveds)
    (res, *_), (lazy, *_), (transient, *_), (temporaries, *_) = sums or step_sums(t)
    states = res + lazy
    inside = gpu.allocator_fragmentation * transient
    fwd_alloc, step_alloc = states + transient, states + temporaries
    out = []
    for reserved in reserveds:
        if reserved is None:
            reserved = reserved_bytes(t)
        total = reserved.total + inside
        # The cache's peak is charged to the phase with the most live bytes; the other phase
        # shows the segments its own tensors need.
        if fwd_alloc >= step_alloc:
            fwd, step = total, min(reserved.step, total)
        else:
            fwd, step = min(reserved.fwd_bwd + inside, total), total
        out.append((max(fwd - fwd_alloc, 0.0), max(step - step_alloc, 0.0)))
    return out
