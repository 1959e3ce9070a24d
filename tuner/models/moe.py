"""Mixture-of-experts terms of the memory and time models (one place; memory and perf call it).

Sources:
[MT] Megatron-LM core_v0.15 megatron/training/theoretical_memory_usage.py (MoE layer parameters:
     experts x 2h x F_e x gated, shared experts 2h x F_s x gated, moe_layer_pattern) and
     megatron/training/training.py ``num_floating_point_operations`` (routed experts count
     top-k times per token, shared experts once, the router's h x E GEMM).
[MP] megatron/core/parallel_state.py: the expert grid etp-ep-dp-pp is folded over the same ranks
     as tp-cp-dp-pp; expert parameters' gradients are reduced and their optimizer states sharded
     over the expert-data-parallel group (world / (etp x ep x pp)), the others' over dp x cp
     (megatron/core/distributed/distributed_data_parallel.py: ``expert_data_parallel_group``
     buffers for params with ``allreduce = False``).
[MD] megatron/core/transformer/moe/token_dispatcher.py: alltoall dispatcher = permute ->
     all-to-all over EP -> (ETP > 1: all-gather over ETP) -> experts -> (reduce-scatter) ->
     all-to-all -> unpermute; allgather dispatcher = all-gather the tokens over ETP x EP, run the
     local experts on all of them, reduce-scatter the outputs. Backward mirrors both.
[MR] megatron/core/transformer/moe/router.py (router weight E x h, replicated over TP; scores
     in ``moe_router_dtype``), moe_utils.py ``get_capacity`` (ceil(tokens x topk / E x factor)).
[ME] megatron/core/transformer/moe/experts.py (core_v0.15 and main): TEGroupedMLP /
     SequentialMLP take the permuted probs and apply them after the activation
     (``activation_func_with_probs``: ``activation(x) * probs``; ``weighted_bias_swiglu_impl``);
     the dispatchers' ``unpermute`` gets no probs.
[K]  Korthikanti et al. 2022 Table 2 (saved activations of an MLP), as in
tuner.models.memory.terms. [DS] DeepSpeed 0.19.8 deepspeed/moe/sharded_moe.py: TopKGate computes
the logits and softmax in
     fp32; every expert takes a [capacity, h] slice of the dispatched [E, C, h] buffer, C =
     max(ceil(T x topk / E x factor), min_capacity) (``_capacity``) or, dropless, the busiest
     expert's count; one all-to-all over the EP group each way (``_AllToAll``);
     deepspeed/moe/experts.py runs the local experts one after another; utils/groups.py: expert
     parameters reduce over the expert-data-parallel group (dp / ep ranks).

Framework ``deepspeed`` (DeepSpeed-MoE) takes the same terms through :func:`framework_moe`, which
states [DS] in Megatron's knobs: router in fp32, inputs padded to capacity, no grouped GEMM.

Tokens per rank: a rank enters an MoE layer with its sequence-parallel shard, T = b s / (cp tp)
(Megatron requires SP with TP and MoE). Of the T x topk assignments of the EP x ETP ranks, one EP
rank's local experts receive 1/ep, all of which each ETP rank sees: T x topk x etp on average,
times the stated load factor (``MoESpec.imbalance``, capped by a capacity factor; with
``pad_to_capacity`` exactly that factor). No overlap of the all-to-alls with compute: the flags
that enable it (``--overlap-moe-expert-parallel-comm``, ``--moe-shared-expert-overlap``) are not
passed by the tuner's templates.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from dataclasses import dataclass

from tuner.config.build import replaced
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import chunk_layers
from tuner.models.memory.kept import Kept
from tuner.models.memory.terms import LayerActivations, mlp_width_bytes
from tuner.models.rates import Link, Rates, gemm_seconds
from tuner.spec.moe import MoESpec
from tuner.spec.study import Framework, ModelSpec, Precision

ROUTER_MAP_BYTES = 1.0
"""The routing map (tokens x experts bools) the router keeps for its backward ([MR])."""
PERMUTE_INDEX_BYTES = 4.0
"""Per routed token: the int32 row-id map permute/unpermute keep (moe_utils.py permute)."""
EXPERT_WIDTH_TENSORS = 3
"""F_e-wide tensors an expert keeps per routed token ([ME]): the routing probs multiply the
activation output, so GeLU keeps fc1's output (GeLU's input), the GeLU output (the multiply's
other operand) and the product (fc2's input); SwiGLU's fused weighted kernel
(``weighted_bias_swiglu_impl``, the default ``bias_swiglu_fusion``) keeps fc1's 2F_e output and
fc2 its F_e input. Three either way (the dense [K] MLP keeps 2 with GeLU)."""


def _moe(model: ModelSpec) -> MoESpec:
    if model.moe is None:
        raise ValueError("not an MoE model")
    return model.moe


def framework_moe(model: ModelSpec, c: ParallelConfig, framework: Framework) -> ModelSpec:
    """``model`` as the MoE terms must see it under ``framework``: itself for Megatron; for
    DeepSpeed-MoE ([DS]) the router in fp32, the local experts looped (no grouped GEMM), and
    with a capacity factor every expert padded to its capacity, the factor raised to what
    ``min_capacity`` forces when that is more: min_capacity x E / (T x topk)."""
    if framework != "deepspeed" or model.moe is None:
        return model
    return _deepspeed_moe(model, c)


@functools.lru_cache(maxsize=256)
def _deepspeed_moe(model: ModelSpec, c: ParallelConfig) -> ModelSpec:
    moe = _moe(model)
    ds = dataclasses.replace(moe, router_dtype="fp32", grouped_gemm=False)
    if moe.capacity_factor is not None:
        tokens = rank_tokens(model, c) * moe.router_topk
        floor = moe.deepspeed_min_capacity * moe.num_experts / tokens
        factor = max(moe.capacity_factor, floor)
        ds = dataclasses.replace(ds, capacity_factor=factor, pad_to_capacity=True)
    return dataclasses.replace(model, moe=ds)


def gated(model: ModelSpec) -> int:
    """Weight matrices' width factor of an MLP: SwiGLU fc1 is 2F wide (3 h F), GeLU 2 h F."""
    return 3 if model.swiglu else 2


@functools.lru_cache(maxsize=256)
def moe_layer_flags(model: ModelSpec) -> tuple[bool, ...]:
    """Per layer: is it MoE ([MT] moe_layer_pattern); all False for a dense model."""
    if model.moe is None:
        return (False,) * model.num_layers
    return model.moe.moe_layers(model.num_layers)


def moe_layers_per_stage(
    model: ModelSpec, c: ParallelConfig, framework: Framework
) -> tuple[int, ...]:
    """MoE layers on each pipeline rank: the virtual stages in Megatron's order (chunk j of rank
    i is virtual stage j x pp + i) laid over the layer pattern."""
    if not any(moe_layer_flags(model)):
        return (0,) * c.pp
    return _per_stage(model, c.pp, chunk_layers(model, c, framework))


@functools.lru_cache(maxsize=1 << 12)
def _per_stage(model: ModelSpec, pp: int, chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """:func:`moe_layers_per_stage` from the chunks (cached: asked per stage and config)."""
    flags = moe_layer_flags(model)
    order = sorted(
        ((j * pp + i, i, n) for i, rank in enumerate(chunks) for j, n in enumerate(rank))
    )
    out = [0] * pp
    start = 0
    for _, rank, n in order:
        out[rank] += sum(flags[start : start + n])
        start += n
    return tuple(out)


def moe_layers_on(model: ModelSpec, c: ParallelConfig, stage: int, framework: Framework) -> int:
    """MoE layers on pipeline rank ``stage`` (0 for a dense model)."""
    if model.moe is None:
        return 0
    return moe_layers_per_stage(model, c, framework)[stage]


# ----------------------------------------------------------------------------- parameters


def expert_params_per_layer(model: ModelSpec, c: ParallelConfig) -> float:
    """Routed-expert parameters of one MoE layer on one rank: E / ep experts of gated x h x F_e,
    each split over ETP ([MT]; biases when the model has them)."""
    moe = _moe(model)
    h, fe = model.hidden_size, moe.ffn_hidden_size or model.ffn_hidden_size
    bias = ((2 * fe if model.swiglu else fe) + h) if model.add_bias_linear else 0
    per_expert = (gated(model) * h * fe + bias) / c.expert_tp
    return moe.num_experts / c.ep * per_expert


def nonexpert_delta_per_layer(model: ModelSpec, c: ParallelConfig) -> float:
    """What an MoE layer holds besides its experts, minus the dense MLP ``param_counts`` counted
    for it, per rank: + router (E x h, replicated over TP) + shared experts (TP-sharded) - MLP."""
    moe = _moe(model)
    h, f = model.hidden_size, model.ffn_hidden_size

    def bias(w: float) -> float:
        return ((2 * w if model.swiglu else w) + h) if model.add_bias_linear else 0.0

    dense = (gated(model) * h * f + bias(f)) / c.tp
    shared = (gated(model) * h * moe.shared + bias(moe.shared)) / c.tp if moe.shared else 0.0
    return moe.num_experts * h + shared - dense


def expert_config(c: ParallelConfig) -> ParallelConfig:
    """The config as the expert parameters see it: their data-parallel group is the expert-DP
    group ([MP], [DS]), so optimizer sharding and gradient reduction run over ``expert_dp``
    ranks; the global batch is the group's share, so the micro-batches per step (which set
    DeepSpeed's per-micro-batch reductions) stay the config's."""
    gbs = c.micro_batch_size * c.num_microbatches * c.expert_dp
    return _replace(c, c.expert_tp, c.expert_dp, gbs)


@functools.lru_cache(maxsize=1 << 10)
def _replace(c: ParallelConfig, tp: int, dp: int, gbs: int) -> ParallelConfig:
    """``c`` with the expert grid's sizes (cached: the memory model asks per stage, the time
    model again, for the same config)."""
    return replaced(c, tp=tp, cp=1, dp=dp, global_batch_size=gbs)


def memory_view(c: ParallelConfig) -> ParallelConfig:
    """``c`` as the memory model reads it: the token dispatcher only as allgather or not (the
    allgather dispatcher holds the ETP x EP group's gathered tokens; alltoall and flex each
    permute the rank's own, so their terms are the same here), so ``flex`` reads as
    ``alltoall``. Configs with one view have one memory breakdown, which the enumeration then
    estimates once (tests/test_space_fast.py checks the two equal on every config of MoE
    spaces)."""
    if c.moe_token_dispatcher == "flex":
        return replaced(c, moe_token_dispatcher="alltoall")
    return c


# ----------------------------------------------------------------------------- activations


def rank_tokens(model: ModelSpec, c: ParallelConfig) -> float:
    """Tokens one rank feeds an MoE layer: its sequence-parallel shard b s / (cp tp)."""
    shard = c.tp if c.sequence_parallel else 1
    return c.micro_batch_size * model.seq_length / c.cp / shard


def tp_ep_group_size(c: ParallelConfig) -> int:
    """Ranks the allgather dispatcher gathers tokens over: the expert grid's tensor-and-expert
    group, ETP x EP ([MD] ``self.tp_ep_group = pg_collection.tp_ep``; parallel_state.py builds
    it from the expert rank generator's ``tp-ep``, whose tp is the expert TP)."""
    return c.expert_tp * c.ep


def load_factor(moe: MoESpec) -> float:
    """Tokens of the busiest expert rank / the mean: the stated imbalance, at most the capacity
    factor when tokens are dropped, exactly it when inputs are padded to capacity ([MR])."""
    if moe.capacity_factor is None:
        return moe.imbalance
    if moe.pad_to_capacity:
        return moe.capacity_factor
    return min(moe.imbalance, moe.capacity_factor)


def expert_tokens(model: ModelSpec, c: ParallelConfig) -> float:
    """Routed tokens the busiest rank's local experts compute (see the module docstring)."""
    moe = _moe(model)
    if c.moe_token_dispatcher == "allgather":
        # [MD] allgather: every rank sees the tokens of the whole ETP x EP group; its local
        # experts take their topk / E share of them.
        group = rank_tokens(model, c) * tp_ep_group_size(c)
        return group * moe.router_topk / c.ep * load_factor(moe)
    return rank_tokens(model, c) * moe.router_topk * c.expert_tp * load_factor(moe)


def moe_layer_activations(
    model: ModelSpec, c: ParallelConfig, precision: Precision, dense: LayerActivations
) -> LayerActivations:
    """``dense`` ([K], one layer, one micro-batch) with its MLP replaced by the MoE block.

    The MoE terms are per rank; ``LayerActivations.stored`` divides ``sharded`` by tp, so they
    enter it multiplied by tp. Kept: the router's fp32 (router_dtype) scores and routing map; per
    routed token the dispatched input (fc1 input, h), three F_e-wide tensors split over ETP (see
    EXPERT_WIDTH_TENSORS), its routing prob and the permute index; the shared experts as a dense
    MLP of width F_s ([K]). The probs weigh the activation inside the experts ([ME]), so
    unpermute only scatters the expert outputs back and keeps none of them.
    """
    moe = _moe(model)
    e = 4.0 if precision == "fp32" else 2.0
    tp = c.tp
    s, b = model.seq_length / c.cp, c.micro_batch_size
    f = model.ffn_hidden_size
    mlp_factor = mlp_width_bytes(model, e)  # [K] MLP intermediates per width element
    dense_mlp = s * b * f * mlp_factor
    shared = s * b * moe.shared * mlp_factor
    sharded = dense.sharded - dense_mlp + shared + tp * moe_block_bytes(model, c, e, e)
    # dataclasses.replace(dense, sharded=sharded), built directly (asked per stage)
    return LayerActivations(dense.replicated, sharded, dense.scores, dense.layer_input)


def router_score_bytes(moe: MoESpec, e: float) -> float:
    """Bytes of one router score (and routing prob): ``moe_router_dtype`` (fp32 / fp64), else
    the model's ``e``."""
    return {"fp32": 4.0, "fp64": 8.0}.get(moe.router_dtype or "", e)


def moe_block_bytes(model: ModelSpec, c: ParallelConfig, e: float, eg: float) -> float:
    """What one rank's MoE block (less its shared experts) keeps for the backward of one
    micro-batch: the router's scores (router_dtype) and routing map; per routed token the
    dispatched input (fc1's input), EXPERT_WIDTH_TENSORS F_e / etp-wide tensors (the last is
    fc2's input), its routing prob and the permute index. ``e``: the activations' bytes; ``eg``:
    a GEMM input's (1 under FP8, tuner.models.memory.fp8; ``e`` otherwise). The one count
    ``moe_layer_activations`` and selective recompute's ``moe`` region
    (tuner.models.memory.recompute) both read."""
    moe = _moe(model)
    router_e = router_score_bytes(moe, e)
    router = rank_tokens(model, c) * moe.num_experts * (router_e + ROUTER_MAP_BYTES)
    fe = (moe.ffn_hidden_size or model.ffn_hidden_size) / c.expert_tp
    width = fe * ((EXPERT_WIDTH_TENSORS - 1) * e + eg)
    per_token = model.hidden_size * eg + width + router_e + PERMUTE_INDEX_BYTES
    return router + expert_tokens(model, c) * per_token


def allgather_gathered_bytes(model: ModelSpec, c: ParallelConfig, precision: Precision) -> float:
    """The allgather dispatcher's gathered hidden states, the ETP x EP group's tokens x h: [MD]
    token_dispatch gathers them with ``use_global_buffer=True``, into Megatron's global memory
    buffer (tuner.models.memory.terms.global_buffer_bytes), when the group has more than one
    rank."""
    if model.moe is None or c.moe_token_dispatcher != "allgather" or tp_ep_group_size(c) == 1:
        return 0.0
    e = 4.0 if precision == "fp32" else 2.0
    return rank_tokens(model, c) * tp_ep_group_size(c) * model.hidden_size * e


def dispatch_buffer_bytes(model: ModelSpec, c: ParallelConfig, precision: Precision) -> float:
    """Transient bytes of one MoE layer's dispatch: the permuted send buffer of the dispatch
    all-to-all and the expert output before the combine all-to-all ([MD]); with ETP > 1 also
    the all-gathered copy; the allgather dispatcher holds the ETP x EP group's gathered tokens.
    Live while one layer's forward (or backward) runs."""
    if model.moe is None:
        return 0.0
    e = 4.0 if precision == "fp32" else 2.0
    h = model.hidden_size
    if c.moe_token_dispatcher == "allgather":
        # [MD] the hidden states gathered over ETP x EP, and the reduce-scatter's input
        return 2.0 * rank_tokens(model, c) * tp_ep_group_size(c) * h * e
    sent = rank_tokens(model, c) * model.moe.router_topk * load_factor(model.moe)
    return 2.0 * sent * h * e + (expert_tokens(model, c) * h * e if c.expert_tp > 1 else 0.0)


# ----------------------------------------------------------------------------- time


@dataclass(frozen=True, slots=True)
class MoETimes:
    """Seconds per micro-batch of one MoE layer on one rank, against the dense layer."""

    fwd_delta: float
    """Forward compute added: experts (+ shared) - the dense MLP (routing:
    tuner.models.time.moe)."""
    bwd_delta: float
    """Backward compute added, same terms."""
    comm_fwd: float
    """Dispatch + combine (all-to-all or all-gather / reduce-scatter) in the forward."""
    comm_bwd: float
    """The same in the backward (the transposed collectives)."""


def mlp_seconds(
    rates: Rates, tokens: float, h: float, f: float, swiglu: bool
) -> tuple[float, float]:
    """(forward, backward) GEMM seconds of an MLP of width f on ``tokens`` (fc1, fc2)."""
    fc1 = (tokens, (2 * f if swiglu else f), h)
    fc2 = (tokens, h, f)
    fwd = gemm_seconds(rates, *fc1) + gemm_seconds(rates, *fc2)
    bwd = sum(
        gemm_seconds(rates, m, k, n) + gemm_seconds(rates, k, n, m) for m, n, k in (fc1, fc2)
    )
    return fwd, bwd


def _all_to_all(rates: Rates, bytes_out: float, ep: int, etp: int, gpus_per_node: int) -> float:
    """One all-to-all over the EP group (ranks etp apart): each rank sends (ep-1)/ep of its
    buffer; peers on its node at the profile's all-to-all where measured (else the all-reduce's
    link), the others over its own share of the network (no ring NIC aggregation: every GPU's
    off-node bytes leave through its own NIC)."""
    if ep == 1:
        return 0.0
    on_node, own = max(1, min(ep, gpus_per_node // max(etp, 1))), rates.all_to_all or rates.intra
    per_peer = bytes_out / ep
    intra = (on_node - 1) * per_peer / own.bandwidth
    inter = (ep - on_node) * per_peer / rates.inter.bandwidth
    latency = own.latency if on_node == ep else rates.inter.latency
    return max(intra, inter) + latency


def _ring(link: Link, size: int, size_bytes: float) -> float:
    """All-gather or reduce-scatter of a ``size_bytes`` result over ``size`` ranks."""
    if size == 1:
        return 0.0
    return (size - 1) / size * size_bytes / link.bandwidth + link.latency


MOE_TIME_KNOBS = (
    "tp", "cp", "sequence_parallel", "micro_batch_size", "ep", "etp", "moe_token_dispatcher",
)  # fmt: skip
"""The config's knobs an MoE layer's times read: the MoE time terms are kept per their values."""
moe_time_knobs = operator.attrgetter(*MOE_TIME_KNOBS)  # their values as one tuple, read in C


def moe_layer_times(
    model: ModelSpec, rates: Rates, c: ParallelConfig, gpus_per_node: int, group_link: Link
) -> MoETimes:
    """:func:`moe_layer_times_uncached`, kept per (model, rates, the config's
    :data:`MOE_TIME_KNOBS`, gpus_per_node, group_link)."""
    key = (model, rates, moe_time_knobs(c), gpus_per_node, group_link)
    return _LAYER_TIMES.get(key) or _LAYER_TIMES.put(
        key, moe_layer_times_uncached(model, rates, c, gpus_per_node, group_link)
    )


_LAYER_TIMES: Kept[MoETimes] = Kept()


def moe_layer_times_uncached(
    model: ModelSpec, rates: Rates, c: ParallelConfig, gpus_per_node: int, group_link: Link
) -> MoETimes:
    """One MoE layer against the dense layer ``perf`` costs (``group_link``: the ring link of
    the ETP x EP group, for the allgather dispatcher).

    Expert GEMMs: the busiest rank's routed tokens over its E / ep local experts, each an MLP of
    width F_e / etp; one grouped GEMM launch with ``grouped_gemm``, one per expert without.
    """
    moe = _moe(model)
    h, e = model.hidden_size, rates.elem
    tokens = rank_tokens(model, c)
    full_tokens = tokens * (c.tp if c.sequence_parallel else 1)  # the dense MLP's input
    dense_f, dense_b = mlp_seconds(rates, full_tokens, h, model.ffn_hidden_size / c.tp,
                                    model.swiglu)  # fmt: skip
    local = max(1, moe.num_experts // c.ep)
    routed = expert_tokens(model, c)
    fe = (moe.ffn_hidden_size or model.ffn_hidden_size) / c.expert_tp
    if moe.grouped_gemm:
        # one grouped GEMM per projection: the experts' tiles share the SMs' waves, one launch
        exp_f, exp_b = mlp_seconds(rates, max(routed, 1.0), h, fe, model.swiglu)
    else:  # SequentialMLP: one GEMM per local expert on its share of the tokens
        per_f, per_b = mlp_seconds(rates, max(routed / local, 1.0), h, fe, model.swiglu)
        exp_f, exp_b = local * per_f, local * per_b
    shared_f = shared_b = 0.0
    if moe.shared:
        shared_f, shared_b = mlp_seconds(rates, full_tokens, h, moe.shared / c.tp, model.swiglu)
    # the expert activation: a streaming pass over the routed tokens (the router, scores and
    # permute / unpermute are tuner.models.time.moe's routing term)
    act = routed * fe * (3 if model.swiglu else 2) * e
    stream = act / rates.hbm + 2 * rates.op_latency
    fwd = exp_f + shared_f + stream - dense_f
    bwd = exp_b + shared_b + 2.0 * stream - dense_b
    if c.moe_token_dispatcher == "allgather":
        g = tp_ep_group_size(c)
        comm = 2.0 * _ring(group_link, g, tokens * g * h * e)  # all-gather + reduce-scatter
    else:
        sent = tokens * moe.router_topk * load_factor(moe) * h * e
        comm = 2.0 * _all_to_all(rates, sent, c.ep, c.expert_tp, gpus_per_node)
        if c.expert_tp > 1:  # [MD] all-gather / reduce-scatter over ETP around the experts
            link = rates.intra if c.expert_tp <= gpus_per_node else rates.inter
            comm += 2.0 * _ring(link, c.expert_tp, routed * h * e)
    return MoETimes(fwd, bwd, comm, comm)


def mlp_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the MLP block per token, averaged over the layers ([MT] training.py
    num_floating_point_operations: top-k routed experts, shared experts once, the router)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    per_width = 2.0 * h * (3 if model.swiglu else 2)  # fc1 (2F with SwiGLU) + fc2, 2 FLOPs/MAC
    dense = per_width * f
    if model.moe is None:
        return dense
    moe = model.moe
    fe = moe.ffn_hidden_size or f
    routed = per_width * (fe * moe.router_topk + moe.shared) + 2.0 * h * moe.num_experts
    share = sum(moe_layer_flags(model)) / model.num_layers
    return share * routed + (1 - share) * dense


# ----------------------------------------------------------------------------- one stage


@dataclass(frozen=True, slots=True)
class MoEStageMemory:
    """What the MoE layers change in one pipeline rank's activations (tuner.models.memory.estimate
    adds it in one place; their parameters are :func:`moe_stage_params`)."""

    activations: LayerActivations
    """Saved activations of the stage's average layer (dense and MoE layers weighed)."""
    dispatch: float
    """Transient dispatch / combine buffers of one MoE layer (0 without MoE layers)."""


_ACTIVATION_FIELDS = tuple(LayerActivations.__dataclass_fields__)
"""LayerActivations' fields in order (``dataclasses.fields``' names, read once)."""


def moe_stage_memory(
    model: ModelSpec,
    c: ParallelConfig,
    stage: int,
    layers: int,
    framework: Framework,
    precision: Precision,
    dense: LayerActivations,
) -> MoEStageMemory:
    """The MoE activation terms of rank ``stage`` holding ``layers`` layers (a dense stage: the
    dense layer's, no dispatch)."""
    n = moe_layers_on(model, c, stage, framework)
    if n == 0 or layers == 0:
        return MoEStageMemory(dense, 0.0)
    model = framework_moe(model, c, framework)
    moe_act = moe_layer_activations(model, c, precision, dense)
    w = n / layers

    def mix(name: str) -> float:
        return float((1 - w) * getattr(dense, name) + w * getattr(moe_act, name))

    average = LayerActivations(*(mix(name) for name in _ACTIVATION_FIELDS))
    return MoEStageMemory(activations=average, dispatch=dispatch_buffer_bytes(model, c, precision))


def moe_stage_params(
    model: ModelSpec, c: ParallelConfig, stage: int, layers: int, framework: Framework
) -> tuple[float, float]:
    """(parameters the MoE layers of rank ``stage`` add to the dense count: routers and shared
    experts less the replaced MLPs, its routed-expert parameters); zero for a dense stage. Of
    ``model`` as given: ``framework_moe`` changes only the router's dtype, the grouped GEMM and
    the capacity, which parameter counts do not read."""
    n = moe_layers_on(model, c, stage, framework)
    if n == 0 or layers == 0:
        return 0.0, 0.0
    return n * nonexpert_delta_per_layer(model, c), n * expert_params_per_layer(model, c)
