"""Model-state bytes of one pipeline stage in each phase of a step, per optimizer layout.

Two phases: ``fwd_bwd`` (activations live, gradients being produced and reduced) and ``step``
(activations freed; the optimizer's own temporaries live). Each returns weights, gradients,
optimizer states and framework buffers in bytes, for ``psi`` parameters held by the stage.

Sources:
[M]  Megatron-LM docs (distributed optimizer: 18 B/param bf16, 6 + 12/d; fp16 20 B, 4 + 16/d)
     and megatron/core/optimizer/optimizer.py (``_copy_model_grads_to_main_grads``: fp16 grads
     become an fp32 ``main_param.grad`` in the step, freed by the next ``zero_grad``).
[F2]  torch.distributed.fsdp ``fully_shard`` (FSDP2) as torchtitan 0.3.0 applies it
     (torchtitan/distributed/fsdp.py, config/configs.py): fp32 parameters sharded over the
     FSDP mesh dp_shard x cp (torchtitan ParallelDims.build_mesh: "fsdp ... includes dp_shard and
     cp"), MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), the optimizer steps the
     fp32 shard itself (no master copy), each block an FSDP unit all-gathered before use and
     freed after it unless reshard_after_forward is off; gradients reduce-scattered in fp32
     after each backward (torchtitan never defers the sync), so they stay sharded.
[DSE] DeepSpeed runtime/engine.py ``_do_optimizer_sanity_check`` (which wrapper a ds_config
     gets), runtime/bf16_optimizer.py, runtime/fp16/fused_optimizer.py,
     runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, runtime/zero/config.py (defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.spec.frameworks import traits
from tuner.spec.study import Framework, Precision
from tuner.spec.torchtitan import reshards_after_forward

# DeepSpeed ZeRO bucket settings the rendered ds_config leaves at DeepSpeed's defaults
# (runtime/zero/config.py: reduce_bucket_size 5e8, allgather_bucket_size 5e8,
# stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9,
# stage3_max_reuse_distance 1e9, stage3_param_persistence_threshold 1e5 elements). A study that
# sets its own passes them as ``zero_settings`` (the ds_config's ``zero_optimization`` mapping);
# this is the one definition (the time model reads it too: tuner.models.time.deepspeed).
DEEPSPEED_ZERO_DEFAULTS: Mapping[str, float] = {
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "stage3_prefetch_bucket_size": 5e7,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_param_persistence_threshold": 1e5,
}


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Model-state bytes of one phase: what the allocator holds for the states then."""

    weights: float
    grads: float
    optimizer: float
    buffers: float  # buckets, gathered parameters, step temporaries


@dataclass(frozen=True, slots=True)
class StageStates:
    """Both phases of one stage, and the optimizer layout's name (for the report)."""

    fwd_bwd: StateBytes
    step: StateBytes
    layout: str
    # Adam's exp_avg and exp_avg_sq (fp32, 8 B per owned parameter), part of ``optimizer``:
    # torch.optim.Adam(W) (``_init_group``), apex / Transformer Engine / DeepSpeed FusedAdam
    # create them in the first ``step`` (``if len(state) == 0``), so the first iteration's
    # forward/backward runs without them. DeepSpeed ZeRO-1/2 no longer steps once at init
    # (stage_1_and_2.py ``initialize_optimizer_states`` only sets the fp32 grad, v0.14.0).
    moments: float = 0.0
    # Whether the states are a few flat buffers (DeepSpeed flattens each group:
    # stage_1_and_2.py bit16_groups_flat / single_partition_of_fp32_groups, bf16_optimizer.py,
    # fp16/fused_optimizer.py fp16_groups_flat) rather than one tensor per parameter (Megatron's
    # optimizer over per-parameter main params; a plain torch optimizer).
    flat: bool = False


@dataclass(frozen=True, slots=True)
class LayerSizes:
    """Parameters of the stage's largest layer and its small ones (norms: ZeRO-3 keeps tensors
    under stage3_param_persistence_threshold whole on every rank)."""

    largest: float
    small: float  # all small parameters of the stage
    small_tensor: float  # elements of the largest such tensor (a norm weight: hidden size)


def _total(s: StateBytes) -> float:
    return s.weights + s.grads + s.optimizer + s.buffers


def _megatron(psi: float, c: ParallelConfig, precision: Precision, shard: int) -> StageStates:
    d = shard if c.distributed_optimizer else 1
    name = "megatron distributed optimizer" if c.distributed_optimizer else "megatron optimizer"
    if precision == "fp32":
        states = StateBytes(4 * psi, 4 * psi, 8 * psi / d, 0.0)  # [M] fp32: 16 B = 4 + 4 + 8
        return StageStates(states, states, name)
    if precision == "bf16":
        # [M] bf16: 2 B weights, 4 B fp32 main_grad buffer (the step reads it in place), fp32
        # master + Adam 12 B (sharded over DP x CP by the distributed optimizer).
        states = StateBytes(2 * psi, 4 * psi, 12 * psi / d, 0.0)
        return StageStates(states, states, name)
    # [M] fp16: 16-bit grads; the step makes an fp32 copy of them (of the shard with the
    # distributed optimizer) that zero_grad frees: 2 + 2 + 12 resident, +4 in the step.
    fwd = StateBytes(2 * psi, 2 * psi, 12 * psi / d, 0.0)
    step = StateBytes(2 * psi, 2 * psi, 12 * psi / d, 4 * psi / d)
    return StageStates(fwd, step, name)


def _bf16_optimizer(psi: float, c: ParallelConfig) -> StageStates:
    # [DSE] BF16_Optimizer: bf16 grads are accumulated into a flat fp32 buffer of the whole
    # stage (fp32_groups_gradients_flat) and then cleared; flat fp32 master + Adam partitioned
    # over DP; the hp grad partition is a view.
    fwd = StateBytes(2 * psi, 4 * psi + 2 * psi, 12 * psi / c.dp, 0.0)
    step = StateBytes(2 * psi, 4 * psi, 12 * psi / c.dp, 0.0)
    return StageStates(fwd, step, "deepspeed BF16_Optimizer")


def _deepspeed_zero0(psi: float, c: ParallelConfig, precision: Precision) -> StageStates:
    if precision == "fp32":
        states = StateBytes(4 * psi, 4 * psi, 8 * psi, 0.0)  # plain torch optimizer, no wrapper
        return StageStates(states, states, "torch optimizer")
    if precision == "bf16" and c.pp > 1:
        return _bf16_optimizer(psi, c)  # [DSE] bf16 with pipeline stages -> BF16_Optimizer
    # [DSE] fp16, or bf16 without pipeline -> FP16_Optimizer (fused): flat fp32 master copy +
    # Adam; the step flattens the 16-bit grads (2 B) and makes their fp32 copy (4 B).
    fwd = StateBytes(2 * psi, 2 * psi, 12 * psi, 0.0)
    step = StateBytes(2 * psi, 2 * psi, 12 * psi, 6 * psi)
    return StageStates(fwd, step, "deepspeed FP16_Optimizer")


def _deepspeed_zero(
    psi: float,
    c: ParallelConfig,
    precision: Precision,
    sizes: LayerSizes,
    settings: Mapping[str, float],
    views: bool = False,
) -> StageStates:
    e = 4.0 if precision == "fp32" else 2.0  # the model's (and its gradients') element size
    d = c.dp
    # A one-rank data-parallel group reduces nothing: no bucket is filled.
    bucket = e * min(settings["reduce_bucket_size"], psi) if d > 1 else 0.0
    # [DSE] ZeRO-1/2 keep an fp32 partition of the parameters (a clone even in fp32,
    # stage_1_and_2.py single_partition_of_fp32_groups) and the Adam moments: 12 B per owned
    # parameter. step() first frees the gradients this rank does not own, then flattens the
    # owned ones and converts them to fp32 (single_grad_partition: the estimator's "4 grads32";
    # no new tensor when they are fp32 already).
    optimizer = 12 * psi / d
    to_fp32 = 4 * psi / d if e != 4 else 0.0
    if c.zero_stage == 1:
        # Full gradients live through backward; after it they are all-reduced in
        # reduce_bucket_size pieces, each flattened into a new tensor (allreduce_bucket), while
        # the activations are gone. Then the update moment above. The step peaks at the larger.
        fwd = StateBytes(e * psi, e * psi, optimizer, 0.0)
        reduce = StateBytes(e * psi, e * psi, optimizer, bucket)
        update = StateBytes(e * psi, e * psi / d, optimizer, e * psi / d + to_fp32)
        return StageStates(fwd, max(reduce, update, key=_total), "deepspeed ZeRO-1")
    if c.zero_stage == 2:
        # Gradients are reduced during backward through the reduce bucket into the contiguous
        # partition buffer (contiguous_gradients: e B per owned parameter, already flat).
        # [DS] stage_1_and_2.py: that buffer (grads_in_partition) is made by
        # copy_grads_in_partition after a micro-batch's reduction, in the backward's epilogue
        # (reduce_ipg_grads), and the owned gradients stay views of it through the later
        # micro-batches' backwards, beside the bucket. With one micro-batch per step the only
        # backward runs with the bucket alone and the epilogue then moves the gradients from
        # the bucket into the partition: a figure that counts tensor views (CPU ranks, the
        # workloads' accounting; measured on the demo at 20.3 MiB of gradients with one
        # micro-batch, 30.6 MiB with 2 and 4) never holds both. An allocator holds the bucket's
        # whole allocation beside the new partition in the epilogue, so on GPUs the sum stays.
        held = 0.0 if views and c.num_microbatches == 1 else e * psi / d
        fwd = StateBytes(e * psi, held, optimizer, bucket)
        step = StateBytes(e * psi, e * psi / d, optimizer, to_fp32)
        return StageStates(fwd, step, "deepspeed ZeRO-2")
    # ZeRO-3: parameters partitioned too; parameters under the persistence threshold stay whole.
    # Backward holds the gathered largest layer with its gradient (4 B per parameter, the [DS]
    # estimator's largest_layer_memory) and the 16-bit prefetch bucket (capped by
    # max_live_parameters and by the stage's own parameters). Kept as the estimator counts it:
    # the demo's measured ZeRO-3 peaks (fp32, tests/test_memory.py) do not show fp32-sized
    # gathers, so a per-dtype working set is left for measured data to settle.
    prefetch = min(
        settings["stage3_prefetch_bucket_size"], settings["stage3_max_live_parameters"], psi
    )
    # stage3.py _create_fp32_partitions: an fp32 model's partition is its own master copy.
    optimizer = (8 if e == 4 else 12) * psi / d
    persistent = (
        sizes.small if sizes.small_tensor < settings["stage3_param_persistence_threshold"] else 0.0
    )
    weights = e * psi / d + e * persistent
    fwd = StateBytes(weights, e * psi / d, optimizer, 4 * sizes.largest + 2 * prefetch)
    step = StateBytes(weights, e * psi / d, optimizer, to_fp32)
    return StageStates(fwd, step, "deepspeed ZeRO-3")


def _fsdp2(psi: float, c: ParallelConfig, precision: Precision, sizes: LayerSizes) -> StageStates:
    """[F2] States of a stage under FSDP2: 4 B fp32 shard + 4 B fp32 sharded gradient + 8 B Adam
    per parameter over the FSDP degree f; in flight (buffers) the unsharded units."""
    f = c.dp_shard * c.cp
    gathered = 4.0 if precision == "fp32" else 2.0  # param_dtype of the all-gather output
    unit = sizes.largest
    # Forward: the unit computing and the next one prefetched (FSDP2's implicit forward
    # prefetch issues unit i+1's all-gather while i computes). Backward: the unit's unsharded
    # parameters and the prefetched previous one, its unsharded gradient in param_dtype, the
    # fp32 reduce-scatter input (a cast copy, skipped when already fp32) and its output shard.
    cast = 4.0 if gathered != 4.0 else 0.0
    backward = unit * (2 * gathered + gathered + cast) + 4.0 * unit / f
    if c.pp > 1 and c.num_microbatches > 1:
        # torch.distributed.pipelining stage.py turns off gradient sync and reshard-after-
        # backward for all but the last micro-batch: the stage's parameters stay gathered and
        # its gradients accumulate unsharded in reduce_dtype (_fsdp_param.py
        # unsharded_accumulated_grad) until the last backward.
        backward = gathered * psi + 4.0 * psi + 4.0 * unit / f
    elif not reshards_after_forward(c.reshard_after_forward, c.pp):
        # Not resharded after forward: every unit of the stage stays gathered until its
        # backward; the two in-flight copies above are among them.
        backward += gathered * (psi - 2 * unit)
    states = StateBytes(4.0 * psi / f, 4.0 * psi / f, 8.0 * psi / f, max(backward, 0.0))
    step = StateBytes(4.0 * psi / f, 4.0 * psi / f, 8.0 * psi / f, 0.0)
    return StageStates(states, step, "fsdp2", moments=8.0 * psi / f)


def uses_bf16_optimizer(framework: Framework, precision: Precision, c: ParallelConfig) -> bool:
    """Whether DeepSpeed wraps the optimizer in BF16_Optimizer (fp32 gradient accumulation, its
    own DP partitioning of the fp32 states) rather than ZeRO's or FP16_Optimizer."""
    if not traits(framework).deepspeed_optimizer or precision != "bf16":
        return False
    # [DSE] engine.py _do_optimizer_sanity_check: bf16 model, fp32 gradient accumulation
    # (the ds_config's data_types.grad_accum_dtype, which the megatron-deepspeed template
    # sets, as BLOOM's configs did) and ZeRO-1 -> BF16_Optimizer, not ZeRO's optimizer;
    # [DSE] bf16 with pipeline stages and no ZeRO -> BF16_Optimizer.
    if framework == "megatron-deepspeed" and c.zero_stage == 1:
        return True
    return c.zero_stage == 0 and c.pp > 1


def stage_states(
    psi: float,
    c: ParallelConfig,
    framework: Framework,
    precision: Precision,
    sizes: LayerSizes,
    zero_settings: Mapping[str, float] | None = None,
    views: bool = False,
) -> StageStates:
    """Model-state bytes of a stage holding ``psi`` parameters, in both phases; ``views``: as a
    figure that counts tensor views sees them (CPU ranks' tensor accounting), not an
    allocator."""
    if traits(framework).fsdp2:
        return _fsdp2(psi, c, precision, sizes)
    if not traits(framework).deepspeed_optimizer:
        owned = psi / (c.dp * c.cp if c.distributed_optimizer else 1)
        states = _megatron(psi, c, precision, c.dp * c.cp)  # [M] shards over DP x CP
        return _with(states, 8 * owned, states.flat)
    if c.zero_stage == 1 and uses_bf16_optimizer(framework, precision, c):
        return _with(_bf16_optimizer(psi, c), 8 * psi / c.dp, True)
    if c.zero_stage == 0:
        states = _deepspeed_zero0(psi, c, precision)
        # BF16_Optimizer partitions its Adam moments over DP; FP16_Optimizer keeps them whole.
        owned = psi / c.dp if states.layout == "deepspeed BF16_Optimizer" else psi
        return _with(states, 8 * owned, precision != "fp32")
    settings = {**DEEPSPEED_ZERO_DEFAULTS, **(zero_settings or {})}
    states = _deepspeed_zero(psi, c, precision, sizes, settings, views)
    return _with(states, 8 * psi / c.dp, True)


def _with(states: StageStates, moments: float, flat: bool) -> StageStates:
    """``dataclasses.replace(states, moments=moments, flat=flat)``, built directly (asked per
    stage of every config of a space; ``replace`` costs several times the constructor)."""
    return StageStates(states.fwd_bwd, states.step, states.layout, moments, flat)
