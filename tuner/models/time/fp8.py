"""FP8 casts in the step-time model: Transformer Engine's quantize passes around each FP8 GEMM.

``tuner.models.rates`` runs the linear layers' GEMMs at the FP8 tensor-core peak; their operands
must first be written in FP8, by memory-bound kernels this module times at the achieved HBM
bandwidth. Per FP8 GEMM, in Transformer Engine 2.x (transformer_engine/pytorch/module/linear.py,
layernorm_linear.py, grouped_linear.py ``_Linear`` / ``_LayerNormLinear`` / ``_GroupedLinear``):

- forward: the 16-bit input is quantized row-wise for the forward GEMM and, because backward
  needs it (``input_quantizer.set_usage(rowwise=True, columnwise=backward_needs_input)``), also
  column-wise for the weight-gradient GEMM (Hopper's FP8 GEMMs take only the TN layout, so the
  column-wise copy is a transpose; MXFP8 keeps a second, column-scaled copy). One kernel reads
  the 16-bit tensor once and writes both 1-byte copies (``fp8_cast_transpose_fused``).
- weights: the same quantize (row-wise + column-wise), but once per step: Megatron marks the
  first micro-batch (schedules.py ``set_is_first_microbatch``) and TE reuses the cached FP8
  weight for the others (``is_first_microbatch``).
- backward: the output gradient is quantized row-wise (data gradient) and column-wise (weight
  gradient) in one pass (``grad_output_preprocess``).
- sequence parallelism: a column-parallel input (QKV, fc1) and a row-parallel output gradient
  (proj, fc2) are all-gathered over TP. TE quantizes the local shard and gathers FP8; per-tensor
  recipes (delayed, tensorwise) gather row-wise data only (``supports_only_rowwise_all_gather``),
  so the column-wise copy is a transpose of the gathered tensor (read 1 B, write 1 B per element)
  in the backward; block-scaled recipes quantize both copies of the shard before the gather.
- the norm in front of QKV and fc1 (Megatron's ``TELayerNormColumnParallelLinear``): with
  delayed scaling TE's norm kernel writes the FP8 output itself (pytorch/csrc/extensions/
  normalization.cpp: ``FULLY_FUSED`` for ``Float8Quantizer``) and the column-wise copy is an
  ``nvte_transpose`` of it (common/normalization/layernorm, rmsnorm ``*_api.cpp``: "Compute FP8
  transpose if required" for tensor scaling); with current scaling the norm writes 16 bits
  and its amax (``FUSED_NORM_AMAX_FP8``), then a quantize without the amax pass; block scaling
  runs the norm unfused, then quantizes.

Per recipe: delayed scaling takes its scale from the amax history, so a cast is one pass; once
per model chunk and micro-batch, forward and backward, TE all-reduces the amaxes over the amax
group and updates the scales in one fused kernel (Megatron wraps the whole block in one
``fp8_autocast`` for delayed scaling, one per layer otherwise: transformer_block.py).
Current (tensorwise) scaling first reads the tensor for its amax (``nvte_compute_amax``) and, for
the sequence-parallel inputs and gradients above, all-reduces it over TP
(``set_quantizer_amax_reduction_group``). Blockwise (1x128 / 128x128) and MXFP8 (1x32) compute
their block scales inside the quantize kernel and write them beside the data.

The gathers themselves (``tp_gather_ratios``; transformer_engine/pytorch/distributed.py
``gather_along_first_dim``): the forward gather of a column-parallel input carries its row-wise
FP8 data and scales only, under every recipe (linear.py / layernorm_linear.py set the gather's
quantizer to ``rowwise=True, columnwise=False``); the backward gather of a row-parallel output
gradient asks for both usages, which per-tensor recipes drop to row-wise (``_all_gather_fp8``
then transposes) while block-scaled ones gather both copies with their scales
(``_all_gather_mxfp8``, ``_start_all_gather_fp8_blockwise``). The reduce-scatters of the
row-parallel outputs and the column-parallel input gradients stay 16-bit: they reduce GEMM
outputs, which TE writes in the activation dtype. The FP8 GEMMs' 1-byte operands are
``tuner.models.rates.gemm_seconds``'; the LM head and the router stay 16-bit (``gemm16_seconds``).

Not subtracted: the norm's 1-byte write replacing its 2-byte one under delayed scaling
(``tuner.models.time.estimate`` counts norms at 16 bits): it leaves the FP8 step slightly long.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.models.moe import expert_params_per_layer, expert_tokens
from tuner.models.rates import Rates, group_link
from tuner.spec.fp8 import FP8_WEIGHT_COPY_BYTES
from tuner.spec.study import ModelSpec, TrainingSpec

SOURCE_BYTES = 2.0
"""The 16-bit (bf16) tensor every cast reads; FP8 training keeps activations and weights in it."""
TRANSPOSE_BYTES = 2.0
"""An FP8 transpose of an FP8 tensor: read 1 B, write 1 B per element."""
ACTIVATION_COPY_BYTES: dict[str, float] = {
    "delayed": 2.0,
    "tensorwise": 2.0,
    "blockwise": 2.0 + 2 * 4.0 / 128,  # fp32 scale per 1x128 block of each copy
    "mxfp8": 2.0 + 2.0 / 32,  # E8M0 scale per 32 elements of each copy
}
"""Bytes written per element of an activation or gradient: its row-wise and column-wise FP8
copies with their scales (the weights' are ``tuner.spec.fp8.FP8_WEIGHT_COPY_BYTES``)."""
PER_TENSOR = ("delayed", "tensorwise")
"""Recipes with one scale per tensor: FP8 all-gathers carry row-wise data only."""
AMAX_PASS = {"tensorwise": SOURCE_BYTES}
"""Bytes per element read only to find the amax before casting (current scaling)."""


def tp_gather_ratios(training: TrainingSpec, elem: int) -> tuple[float, float]:
    """Bytes per element of the sequence-parallel TP all-gathers over the 16-bit ``elem``:
    (forward, of the column-parallel inputs; backward, of the row-parallel output gradients);
    1 unless ``training`` runs fp8 (module docstring)."""
    if training.precision != "fp8":
        return 1.0, 1.0
    both = ACTIVATION_COPY_BYTES[training.fp8_recipe]  # row-wise + column-wise, with scales
    backward = both / 2 if training.fp8_recipe in PER_TENSOR else both
    return both / 2 / elem, backward / elem


@dataclass(frozen=True, slots=True)
class CastTimes:
    """Seconds of Transformer Engine's FP8 casts for one layer on one rank."""

    fwd: float
    """Per micro-batch: quantizing the forward GEMMs' inputs."""
    bwd: float
    """Per micro-batch: quantizing the output gradients, transposing gathered FP8 inputs."""
    weights: float
    """Per step: quantizing the layer's GEMM weights (cached over the micro-batches)."""


def quantize_bytes(recipe: str, elements: float, fused_norm: bool = False) -> float:
    """HBM bytes to write the row-wise and column-wise FP8 copies of a 16-bit tensor of
    ``elements`` (``fused_norm``: its producer is the norm in front of the GEMM)."""
    if fused_norm and recipe == "delayed":  # the norm writes FP8 rows; the transpose is left
        return elements * TRANSPOSE_BYTES
    amax = 0.0 if fused_norm else AMAX_PASS.get(recipe, 0.0)
    return elements * (amax + SOURCE_BYTES + ACTIVATION_COPY_BYTES[recipe])


def gathered_bytes(
    recipe: str, elements: float, tp: int, fused_norm: bool = False
) -> tuple[float, float]:
    """(bytes before the gather, bytes in the backward) of a tensor of ``elements`` all-gathered
    over ``tp`` ranks under sequence parallelism (module docstring)."""
    local = elements / tp
    if recipe not in PER_TENSOR:
        return quantize_bytes(recipe, local, fused_norm), 0.0
    if fused_norm and recipe == "delayed":
        rowwise = 0.0
    else:
        amax = 0.0 if fused_norm else AMAX_PASS.get(recipe, 0.0)
        rowwise = local * (amax + SOURCE_BYTES + ACTIVATION_COPY_BYTES[recipe] / 2)
    return rowwise, elements * TRANSPOSE_BYTES


@dataclass(frozen=True, slots=True)
class _Moved:
    """What one layer's casts move: bytes forward and backward, weight elements, GEMMs (one
    quantized input and one quantized output gradient each), tensors gathered over TP."""

    fwd: float
    bwd: float
    weights: float
    gemms: int
    gathered: int

    def __add__(self, other: _Moved) -> _Moved:
        return _Moved(self.fwd + other.fwd, self.bwd + other.bwd, self.weights + other.weights,
                      self.gemms + other.gemms, self.gathered + other.gathered)  # fmt: skip


def _pair(recipe: str, gathered: float, local: float, tp: int, fused_norm: bool) -> _Moved:
    """A column-parallel GEMM's input of ``gathered`` elements (the norm's output when
    ``fused_norm``) and the output gradient of ``local`` elements of the GEMM after it, or, with
    sequence parallelism over ``tp`` > 1, a column-parallel input and a row-parallel output
    gradient both gathered (module docstring)."""
    if tp > 1:
        fwd, bwd = gathered_bytes(recipe, gathered, tp, fused_norm)
        g_fwd, g_bwd = gathered_bytes(recipe, gathered, tp)
        return _Moved(fwd, bwd + g_fwd + g_bwd, 0.0, 0, 2)
    fwd = quantize_bytes(recipe, gathered, fused_norm)
    return _Moved(fwd, quantize_bytes(recipe, local), 0.0, 0, 0)


def _mlp(
    recipe: str, tokens: float, h: float, width: float, swiglu: bool, gather: int, norm: bool
) -> _Moved:
    """An MLP of ``width`` on ``tokens``: fc1's input (gathered over ``gather`` ranks when > 1;
    ``norm``: produced by the fused norm) and fc2's output gradient, fc2's input and fc1's
    output gradient, the two weights."""
    fc1_out = 2 * width if swiglu else width
    outer = _pair(recipe, tokens * h, tokens * h, gather, norm)
    inner = quantize_bytes(recipe, tokens * width), quantize_bytes(recipe, tokens * fc1_out)
    return outer + _Moved(inner[0], inner[1], h * (fc1_out + width), 2, 0)


@functools.lru_cache(maxsize=4096)
def fp8_cast_times(
    model: ModelSpec, rates: Rates, c: ParallelConfig, recipe: str, gpus_per_node: int
) -> CastTimes:
    """One dense layer's casts (QKV, proj, fc1, fc2) on one rank."""
    h, tp = model.hidden_size, c.tp
    tokens = c.micro_batch_size * model.seq_length / c.cp  # the GEMMs' rows, after any gather
    kv = 2 * model.query_groups * model.kv_channels
    gather = tp if c.sequence_parallel and tp > 1 else 1
    attention = _pair(recipe, tokens * h, tokens * h, gather, True) + _Moved(
        quantize_bytes(recipe, tokens * h / tp),  # proj input: the attention output
        quantize_bytes(recipe, tokens * (h + kv) / tp),  # QKV output gradient
        h * (h + kv) / tp + h * h / tp,
        2,
        0,
    )
    mlp = _mlp(recipe, tokens, h, model.ffn_hidden_size / tp, model.swiglu, gather, True)
    return _times(rates, c, recipe, gpus_per_node, attention + mlp)


def _times(
    rates: Rates, c: ParallelConfig, recipe: str, gpus_per_node: int, moved: _Moved
) -> CastTimes:
    """Seconds of ``moved``, with the recipe's launches and amax all-reduces (module
    docstring): a quantize per GEMM input and output gradient (tensorwise: and its amax pass), a
    transpose per gathered per-tensor-scaled copy, a TP all-reduce of each gathered tensor's
    amax under current scaling."""
    lat = rates.op_latency
    per_tensor = 2 if recipe == "tensorwise" else 1
    transposes = moved.gathered if recipe in PER_TENSOR else 0
    sync = 0.0
    if recipe == "tensorwise" and moved.gathered:
        sync = moved.gathered / 2 * group_link(rates, c.tp, 1, gpus_per_node).latency
    weights = moved.weights * (SOURCE_BYTES + AMAX_PASS.get(recipe, 0.0))
    weights += moved.weights * FP8_WEIGHT_COPY_BYTES[recipe]
    return CastTimes(
        fwd=moved.fwd / rates.hbm + moved.gemms * per_tensor * lat + sync,
        bwd=moved.bwd / rates.hbm + (moved.gemms * per_tensor + transposes) * lat + sync,
        weights=weights / rates.hbm + moved.gemms * lat,
    )


def fp8_moe_cast_delta(
    model: ModelSpec, rates: Rates, c: ParallelConfig, recipe: str, gpus_per_node: int
) -> CastTimes:
    """An MoE layer's casts minus the dense MLP's that ``fp8_cast_times`` counted: the routed
    experts' grouped GEMMs (one multi-tensor quantize per projection, on the busiest rank's
    routed tokens, no TP gather) and the shared experts as an MLP. Megatron's MoE layers put a
    separate norm before them (``pre_mlp_layernorm``: TENorm), so no cast is fused with it."""
    moe = model.moe
    assert moe is not None
    h, tp = model.hidden_size, c.tp
    tokens = c.micro_batch_size * model.seq_length / c.cp
    gather = tp if c.sequence_parallel and tp > 1 else 1
    dense = _mlp(recipe, tokens, h, model.ffn_hidden_size / tp, model.swiglu, gather, True)
    fe = (moe.ffn_hidden_size or model.ffn_hidden_size) / c.expert_tp
    experts = _mlp(recipe, expert_tokens(model, c), h, fe, model.swiglu, 1, False)
    experts = _Moved(experts.fwd, experts.bwd, expert_params_per_layer(model, c), 2, 0)
    if moe.shared:
        experts += _mlp(recipe, tokens, h, moe.shared / tp, model.swiglu, gather, False)
    moe_t = _times(rates, c, recipe, gpus_per_node, experts)
    dense_t = _times(rates, c, recipe, gpus_per_node, dense)
    return CastTimes(
        fwd=moe_t.fwd - dense_t.fwd,
        bwd=moe_t.bwd - dense_t.bwd,
        weights=moe_t.weights - dense_t.weights,
    )


def amax_sync_seconds(rates: Rates, c: ParallelConfig, recipe: str, gpus_per_node: int) -> float:
    """Delayed scaling, per micro-batch: per model chunk, forward and backward, one all-reduce of
    the amax buffer over the amax group (Megatron: TP x CP x DP) and the fused scale update."""
    if recipe != "delayed":
        return 0.0
    group = c.tp * c.cp * c.dp
    link = group_link(rates, group, 1, gpus_per_node)
    reduce = link.latency if group > 1 else 0.0
    return max(1, c.vp) * 2.0 * (reduce + rates.op_latency)


def layer_casts(
    model: ModelSpec,
    rates: Rates,
    c: ParallelConfig,
    recipe: str,
    gpus_per_node: int,
    moe_share: float,
) -> CastTimes:
    """The casts of the stage's average layer (``moe_share`` of the layers MoE)."""
    dense = fp8_cast_times(model, rates, c, recipe, gpus_per_node)
    if not moe_share:
        return dense
    delta = fp8_moe_cast_delta(model, rates, c, recipe, gpus_per_node)
    return CastTimes(
        fwd=dense.fwd + moe_share * delta.fwd,
        bwd=dense.bwd + moe_share * delta.bwd,
        weights=dense.weights + moe_share * delta.weights,
    )
