"""The pipeline's side of the step-time model: point-to-point transfers between stages, the
1F1B fill / drain bubble and the tied-embedding gradient reduction between the first and last
stage (Megatron's and DeepSpeed's pipeline engines). Pure arithmetic, as in
``tuner.models.time.estimate``.
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Link, Rates, group_link
from tuner.models.time.dp import MEGATRON_GRAD_BYTES
from tuner.spec.frameworks import traits
from tuner.spec.study import ModelSpec


def stage_link(config: ParallelConfig, rates: Rates, gpus_per_node: int) -> Link:
    """Point-to-point between pipeline stages: every GPU of a stage talks to its own peer at once,
    so a pair crossing nodes gets one GPU's network share; the slowest hop sets the pace."""
    stride = config.tp * config.cp * config.dp  # Megatron's rank order: tp, cp, dp, pp
    return rates.intra if config.pp * stride <= gpus_per_node else rates.inter


def pipeline_seconds(
    config: ParallelConfig,
    model: ModelSpec,
    rates: Rates,
    gpus_per_node: int,
    stage_mb: float,
    framework: str,
    chunks: tuple[float, float],
    p2p_overlap: bool = True,
) -> tuple[float, float]:
    """(point-to-point seconds, bubble seconds) of the (interleaved) 1F1B schedule.

    ``chunks``: one micro-batch's (forward, backward) seconds on the stage, all its model chunks;
    with ``p2p_overlap`` (Megatron's ``overlap_p2p_comm``) the interleaved schedule's steady-state
    transfers hide behind them (``exposed_hops``)."""
    pp, vp = config.pp, max(1, config.vp)
    if pp == 1:
        return 0.0, 0.0
    link = stage_link(config, rates, gpus_per_node)
    tokens = config.micro_batch_size * model.seq_length / config.cp
    activation = tokens * model.hidden_size * rates.elem
    # Megatron's scatter-gather sends a 1/tp slice from each TP rank (Narayanan et al. 2021,
    # section 4.1). DeepSpeed's PipelineEngine does the same through its own path: with a
    # model-parallel group (TP > 1) it sets is_pipe_partitioned / is_grad_partitioned
    # (deepspeed/runtime/pipe/engine.py __init__; ds_config pipeline.pipe_partitioned and
    # grad_partitioned default true), _exec_forward_pass wraps the stage output in a
    # PartitionedTensor over the TP group and sends only the local part, and the receiver's
    # PartitionedTensor.full() all-gathers it over the TP group before computing (the same for
    # gradients in _exec_backward_pass): on the critical path, the engine overlaps nothing. Under
    # Megatron-DeepSpeed's sequence parallelism the activation is already a 1/tp sequence shard.
    transfer = activation / config.tp / link.bandwidth + link.latency
    if traits(framework).deepspeed_pipeline and config.tp > 1:
        local = activation / (config.tp if config.sequence_parallel else 1)
        tp_link = group_link(rates, config.tp, 1, gpus_per_node)
        gather = (config.tp - 1) / config.tp * local / tp_link.bandwidth + tp_link.latency
        transfer = local / config.tp / link.bandwidth + link.latency + gather
    # per micro-batch: a send/recv pair forward and backward per model chunk, plus fill/drain
    steady = vp * max(1, config.num_microbatches)
    bubble = (pp - 1) / vp * (stage_mb + rates.microbatch_overhead)
    fill = 2.0 * (pp - 1) * transfer
    if vp > 1 and p2p_overlap and not traits(framework).deepspeed_pipeline:
        return fill + steady * exposed_hops(transfer, chunks[0] / vp, chunks[1] / vp), bubble
    return fill + 2.0 * steady * transfer, bubble


def exposed_hops(transfer: float, forward: float, backward: float) -> float:
    """Exposed seconds of one model chunk's two steady-state transfers in Megatron's interleaved
    1F1B schedule with ``overlap_p2p_comm`` (Megatron-LM's default since 2023-10, commit
    4eeff55d1f "Make overlap_p2p_comm the default"; ``--no-overlap-p2p-communication`` turns it
    off; without interleaving arguments.py forces it off). In
    ``forward_backward_pipelining_with_interleaving`` each steady-state step runs a forward chunk,
    posts its activation send and the next activation receive asynchronously
    (``send_forward_recv_forward(..., overlap_p2p_comm=True)``), runs a backward chunk, posts the
    gradient send / receive, and waits for a receive only before the chunk that consumes it: the
    activation travels behind a backward chunk, the gradient behind a forward chunk."""
    return max(0.0, transfer - backward) + max(0.0, transfer - forward)


def tied_embedding_sync(
    model: ModelSpec,
    config: ParallelConfig,
    rates: Rates,
    embedding: float,
    gpus_per_node: int,
    grad_bytes: float = MEGATRON_GRAD_BYTES,
) -> float:
    """First and last stage all-reduce the shared word-embedding gradient once per step, after
    the flush and before the DP reduction (Megatron's _allreduce_word_embedding_grads on the
    fp32 main_grad; DeepSpeed's ReduceTiedGrads step, pipe/engine.py _exec_reduce_tied_grads, on
    ``weight._hp_grad`` (fp32) under BF16_Optimizer, else on the 16-bit ``weight.grad``)."""
    if config.pp == 1 or not model.tied_embeddings:
        return 0.0
    link = stage_link(config, rates, gpus_per_node)
    return embedding * grad_bytes / link.bandwidth + link.latency
