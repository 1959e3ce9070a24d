"""MoE routing in the step-time model: what runs around the experts of one MoE layer.

``tuner.models.moe`` times the expert GEMMs and the dispatch / combine collectives; this module
times the work between them, per MoE layer, micro-batch and rank (Megatron-LM core_v0.15):

[MR] megatron/core/transformer/moe/router.py ``TopKRouter``: the router GEMM (tokens x h) @
     (h x E), replicated over TP, logits in ``moe_router_dtype``; then
     moe_utils.py ``topk_routing_with_score_function``: softmax over the E scores, top-k, the
     top-k probs scattered into a dense (tokens x E) probs tensor and a (tokens x E) bool
     routing map.
[MA] moe_utils.py ``switch_load_balancing_loss_func`` / ``get_tokens_per_expert_and_token_count``
     (with ``--moe-aux-loss-coeff`` > 0): the scores for the aux loss are a second softmax
     over the logits, tokens per expert sum the routing map, the loss sums the probs, and the
     per-expert counts are all-reduced over the TP x CP group.
[MU] moe_utils.py ``permute``: the routing map and probs transposed to (E x tokens) contiguous,
     then ``tokens.index_select`` copies each routed token's row (read h, write h);
     ``unpermute``: probs gathered again, the expert outputs multiplied by them (read + write),
     a zero-filled output and ``scatter_add_`` of every routed row into it. With
     ``--moe-permute-fusion`` TE's fused kernels read each row once and write it once.
[MD] token_dispatcher.py ``MoEAlltoAllTokenDispatcher``: ``preprocess`` all-gathers the
     per-expert token counts over ETP x EP (its tp_ep_group) and moves them to the host (a
     synchronising collective); with several local experts the received tokens are regrouped
     by expert (``sort_chunks_by_idxs``, read + write per row) after the dispatch and back
     before the combine.

Backward: each gather becomes a scatter over the same rows and each scatter a gather, the
unpermute's backward also reduces every row against its saved copy for the probs gradient, and
softmax's backward reads its output and the gradient: ROUTING_BACKWARD_RATIO times the forward's
bytes; the router GEMM's backward runs its own two GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.kept import Kept
from tuner.models.moe import (
    ROUTER_MAP_BYTES,
    expert_tokens,
    moe_time_knobs,
    rank_tokens,
    router_score_bytes,
    tp_ep_group_size,
)
from tuner.models.rates import Link, Rates, gemm16_seconds
from tuner.spec.study import ModelSpec

ROUTING_BACKWARD_RATIO = 2.0
"""Backward bytes of the routing passes per forward byte (module docstring)."""
SCORE_PASSES = 4
"""Passes over the (tokens x E) scores in the forward ([MR]): softmax read + write, top-k read,
the probs scatter's write."""
AUX_SCORE_PASSES = 3
"""Passes of the aux loss ([MA]): its softmax read + write and the probs sum's read (the
routing-map sum reads ROUTER_MAP_BYTES per score on top)."""
PERMUTE_LAUNCHES = {False: 9, True: 3}
"""Kernels of permute + unpermute ([MU]), unfused: map and probs transposes, argsort,
index_select; probs transpose, masked_select, multiply, zero fill, scatter-add. Fused (TE): the
row-id map, the permute, the unpermute."""
UNFUSED_UNPERMUTE_ROW_PASSES = 3
"""Row passes of the unfused unpermute per routed token ([MU]): the probs multiply's read and
write, the scatter-add's read; the zero-filled output is written and updated once per token."""


@dataclass(frozen=True, slots=True)
class RoutingTimes:
    """Seconds of one MoE layer's routing on one rank, per micro-batch."""

    fwd: float
    """Router GEMM, scores, aux loss, permute / unpermute, token-count exchange (forward)."""
    bwd: float
    """Their backward."""


def routing_bytes(model: ModelSpec, c: ParallelConfig, elem: int) -> tuple[float, float]:
    """Forward bytes moved by one rank's routing of one MoE layer: (scores and aux loss over the
    (tokens x E) matrix, token rows permuted and unpermuted); see the module docstring."""
    moe = model.moe
    assert moe is not None
    tokens, experts, h = rank_tokens(model, c), moe.num_experts, model.hidden_size
    score = router_score_bytes(moe, float(elem))
    scores = tokens * experts * (SCORE_PASSES * score + ROUTER_MAP_BYTES)
    if moe.aux_loss_coeff > 0:
        scores += tokens * experts * (AUX_SCORE_PASSES * score + ROUTER_MAP_BYTES)
    # alltoall: the rank permutes its own (token, expert) rows (dropless); allgather: the
    # gathered ETP x EP tokens' rows for its local experts, unpermuted into the gathered shape
    sent, out = tokens * moe.router_topk, tokens
    if c.moe_token_dispatcher == "allgather":
        sent, out = expert_tokens(model, c), tokens * tp_ep_group_size(c)
    row = h * elem
    if moe.permute_fusion:  # TE fused permute / unpermute: each row read once, written once
        rows = 2.0 * sent * row + (sent * row + out * row)
    else:
        # permute: map and probs transposed (read + write each), index_select read + write
        scores += 2.0 * tokens * experts * (ROUTER_MAP_BYTES + score)
        rows = 2.0 * sent * row
        # unpermute: probs gathered again (read + write), multiply, scatter-add, zero fill
        scores += 2.0 * tokens * experts * score
        rows += UNFUSED_UNPERMUTE_ROW_PASSES * sent * row + 2.0 * out * row
    local = max(1, moe.num_experts // c.ep)
    if c.moe_token_dispatcher == "alltoall" and c.ep > 1 and local > 1:
        rows += 2.0 * 2.0 * expert_tokens(model, c) * row  # regroup by expert and back ([MD])
    return scores, rows


def moe_routing_times(
    model: ModelSpec, rates: Rates, c: ParallelConfig, tp_cp: Link, tp_ep: Link
) -> RoutingTimes:
    """:func:`moe_routing_times_uncached`, kept per (model, rates, the config's
    ``moe.MOE_TIME_KNOBS``, tp_cp, tp_ep): the configs that differ only in other knobs share it."""
    key = (model, rates, moe_time_knobs(c), tp_cp, tp_ep)
    times = _ROUTING_TIMES.get(key)
    if times is None:
        times = _ROUTING_TIMES.put(key, moe_routing_times_uncached(model, rates, c, tp_cp, tp_ep))
    return times


_ROUTING_TIMES: Kept[RoutingTimes] = Kept()


def moe_routing_times_uncached(
    model: ModelSpec, rates: Rates, c: ParallelConfig, tp_cp: Link, tp_ep: Link
) -> RoutingTimes:
    """Routing of one MoE layer on one rank (``tp_cp``: the link of the aux loss's count
    all-reduce; ``tp_ep``: that of the dispatcher's token-count all-gather)."""
    moe = model.moe
    assert moe is not None
    tokens, experts, h = rank_tokens(model, c), moe.num_experts, model.hidden_size
    # not a Transformer Engine module: 16-bit even under fp8 ([MR],
    # tuner.models.rates.gemm16_seconds)
    router_f = gemm16_seconds(rates, tokens, experts, h)
    router_b = gemm16_seconds(rates, tokens, h, experts)
    router_b += gemm16_seconds(rates, h, experts, tokens)
    scores, rows = routing_bytes(model, c, rates.elem)
    launches = SCORE_PASSES + PERMUTE_LAUNCHES[moe.permute_fusion]
    collectives = 0.0  # forward only: the backward treats the counts as constants
    if moe.aux_loss_coeff > 0:
        launches += AUX_SCORE_PASSES + 1
        collectives += tp_cp.latency if c.tp * c.cp > 1 else 0.0
    if c.moe_token_dispatcher == "alltoall" and c.ep * c.tp > 1:
        collectives += tp_ep.latency
    stream = (scores + rows) / rates.hbm + launches * rates.op_latency
    fwd = router_f + stream + collectives
    bwd = router_b + ROUTING_BACKWARD_RATIO * stream
    return RoutingTimes(fwd, bwd)
