"""Megatron's ``--tp-comm-overlap``: Transformer Engine's userbuffers overlap of the TP
collectives with the GEMMs of the linear layers: its device memory and its step time (its rules,
which judge a config before any model runs, are :mod:`tuner.config.tp_overlap`).

Facts, from NVIDIA/TransformerEngine ``transformer_engine/pytorch/module/base.py``
``initialize_ub`` (its default configuration, the one Megatron uses without
``--tp-comm-overlap-cfg``) and ``transformer_engine/common/comm_gemm_overlap/
comm_gemm_overlap.cpp``, and Megatron-LM ``megatron/training/initialize.py``
``_initialize_tp_communicators`` / ``arguments.py`` ``validate_args``:

- Megatron builds the communicators once, for a buffer of ``(seq_length x micro_batch / cp,
  hidden)`` elements, and asserts sequence parallelism (``'Tensor parallel communication/GEMM
  overlap can happen only when sequence parallelism is enabled'``).
- Twelve communicators, one buffer each of that shape: ``ring_exchange`` for the forward
  all-gathers of the column-parallel inputs (qkv_fprop, fc1_fprop) and the backward all-gathers of
  the row-parallel output gradients (proj_dgrad, fc2_dgrad): the GEMM runs in ``tp`` chunks while
  the next chunk moves peer to peer on the copy engines (``use_ce``, one SM); ``pipeline`` for the
  forward reduce-scatters of the row-parallel outputs (proj_fprop, fc2_fprop): ``num_splits`` 4
  chunks, each chunk's reduce-scatter behind the next chunk's GEMM, on 16 SMs the GEMM gives up
  (``set_sm_margin``); ``bulk`` for the column-parallel backward (qkv/fc1 dgrad: the re-gather of
  the input behind the dgrad GEMM; qkv/fc1 wgrad: the dgrad output's reduce-scatter behind the
  wgrad GEMM), also on 16 SMs; ``external`` for proj/fc2 wgrad (they reuse the ring exchange's
  gathered gradient, no traffic of their own, but still a buffer). Under FP8 the all-gather
  buffers (``fp8_buf``: the eight of ``layers_all_gather_overlap``) hold 1-byte elements.
- Userbuffers map the peers' buffers over NVLink (CUDA IPC / multicast), so the TP group must lie
  inside one node.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from tuner.models.rates import Link, Rates, gemm_seconds

UB_COMMUNICATORS = 12
"""Communicators ``initialize_ub`` creates by default (4 ring_exchange, 2 pipeline, 4 bulk,
2 external), each with its own registered buffer."""
UB_FP8_BUFFERS = 8
"""Of them, the all-gather ones whose buffer is FP8 (1 byte) under an FP8 recipe."""
UB_PIPELINE_SPLITS = 4
"""``num_splits`` of the pipelined reduce-scatter overlaps (ring exchange uses tp chunks)."""
UB_COMM_SMS = 16
"""SMs the pipelined and bulk overlaps run their communication kernels on (``num_sm``), taken from
the GEMM (``set_sm_margin``)."""


def ub_buffer_bytes(tokens: float, hidden: int, fp8: bool, elem: float = 2.0) -> float:
    """Device bytes of the userbuffers: one ``tokens x hidden`` buffer per communicator
    (``tokens`` = seq_length x micro_batch / cp), FP8 all-gather buffers at 1 byte."""
    one = tokens * hidden
    if fp8:
        return one * (UB_FP8_BUFFERS * 1.0 + (UB_COMMUNICATORS - UB_FP8_BUFFERS) * elem)
    return one * UB_COMMUNICATORS * elem


@dataclass(frozen=True, slots=True)
class Block:
    """One tensor-parallel GEMM with the collective userbuffers overlap with it: (m, n, k) of the
    GEMM as run, the bytes the collective moves into or out of this rank's share."""

    m: float
    n: float
    k: float
    comm_bytes: float


@functools.lru_cache(maxsize=64)
def margin_rates(rates: Rates) -> Rates:
    """``rates`` on the SMs a pipelined or bulk overlap leaves its GEMM: UB_COMM_SMS fewer
    (cuBLAS's SM-count target), the achieved rates scaled by the SMs kept; wave quantization
    then counts the smaller grid."""
    if rates.sm_count <= UB_COMM_SMS:
        return rates
    kept = (rates.sm_count - UB_COMM_SMS) / rates.sm_count
    samples = tuple((m, n, k, rate * kept) for m, n, k, rate in rates.gemm_samples)
    return dataclasses.replace(
        rates, sm_count=rates.sm_count - UB_COMM_SMS, gemm=rates.gemm * kept,
        gemm16=rates.gemm16 * kept, gemm_samples=samples,
    )  # fmt: skip


def ring_exchange(rates: Rates, b: Block, tp: int, link: Link) -> float:
    """Seconds of an all-gather + GEMM ring exchange: the GEMM in ``tp`` row chunks, the first on
    the local shard, each next one behind its chunk's peer-to-peer step. The chunks' GEMMs run
    on several compute streams (``_stream_compute``, comm_gemm_overlap.cpp
    ``split_overlap_ag``), so together they fill the GPU like the whole GEMM: a chunk is a
    ``tp``-th of it."""
    chunk = gemm_seconds(rates, b.m, b.n, b.k) / tp
    step = b.comm_bytes / tp / link.bandwidth + link.latency
    return (tp - 1) * max(chunk, step) + chunk


def pipelined_reduce_scatter(rates: Rates, b: Block, tp: int, link: Link) -> float:
    """Seconds of a GEMM + reduce-scatter pipeline: UB_PIPELINE_SPLITS row chunks (on several
    streams, as in ``ring_exchange``) on the SMs the communication leaves, each chunk's
    reduce-scatter behind the next chunk's GEMM, the last one exposed."""
    n = UB_PIPELINE_SPLITS
    chunk = gemm_seconds(margin_rates(rates), b.m, b.n, b.k) / n
    rs = (tp - 1) / tp * b.comm_bytes / n / link.bandwidth + link.latency
    return chunk + (n - 1) * max(chunk, rs) + rs


def bulk(rates: Rates, b: Block, tp: int, link: Link) -> float:
    """Seconds of a whole collective running beside a whole GEMM on UB_COMM_SMS SMs."""
    gemm = gemm_seconds(margin_rates(rates), b.m, b.n, b.k)
    comm = (tp - 1) / tp * b.comm_bytes / link.bandwidth + link.latency
    return max(gemm, comm)


def ub_exposed(
    rates: Rates,
    shapes: tuple[tuple[float, float, float], ...],
    tp: int,
    hidden: int,
    link: Link,
    gather: tuple[float, float],
) -> tuple[float, float]:
    """(forward, backward) seconds userbuffers add to one layer's GEMMs: each overlapped block's
    time less its plain GEMM's (the exposed communication, the chunking's and the SM margin's
    cost). ``shapes``: (m, n, k) of QKV, FC1 (column-parallel), projection and FC2
    (row-parallel) as ``tuner.models.time.estimate`` runs them; ``gather``: bytes of an
    all-gathered element per 16-bit one, forward and backward (FP8 buffers:
    ``tuner.models.time.fp8.tp_gather_ratios``)."""
    tokens = shapes[0][0]
    full = tokens * hidden * rates.elem  # the gathered / reduced activation of the TP group
    fwd = bwd = 0.0
    for m, n, k in shapes[:2]:  # column-parallel: AG before the GEMM; backward: bulk AG + RS
        fwd += ring_exchange(rates, Block(m, n, k, full * gather[0]), tp, link)
        fwd -= gemm_seconds(rates, m, n, k)
        dgrad, wgrad = Block(m, k, n, full * gather[0]), Block(k, n, m, full)
        bwd += bulk(rates, dgrad, tp, link) - gemm_seconds(rates, m, k, n)
        bwd += bulk(rates, wgrad, tp, link) - gemm_seconds(rates, k, n, m)
    for m, n, k in shapes[2:]:  # row-parallel: RS after the GEMM; backward: AG of dY + dgrad
        fwd += pipelined_reduce_scatter(rates, Block(m, n, k, full), tp, link)
        fwd -= gemm_seconds(rates, m, n, k)
        bwd += ring_exchange(rates, Block(m, k, n, full * gather[1]), tp, link)
        bwd -= gemm_seconds(rates, m, k, n)
    return max(0.0, fwd), max(0.0, bwd)
