"""The tensors one rank allocates in a training step, by lifetime, for the allocator model.

Every size comes from the memory model's own terms (tuner.models.memory.terms,
tuner.models.optimizer_layout); this module only says how each term is cut into tensors, which is
what the caching allocator (tuner.models.memory.allocator) sees:

- parameters: one tensor per weight matrix of a layer (QKV, attention output, fc1, fc2), the
  word embeddings / output layer, and the small norm and bias vectors ([M] layer structure);
  Megatron keeps its fp32 main params and Adam states per parameter (of the parameter's shard
  with the distributed optimizer) and its gradients in one contiguous buffer per dtype
  (megatron/core/distributed/param_and_grad_buffer.py ``grad_data``); DeepSpeed flattens each
  state into one buffer (tuner.models.optimizer_layout ``StageStates.flat``);
- activations: [K] Table 2's saved tensors of one layer and micro-batch (the two LayerNorm
  inputs, the QKV and fc1 inputs, dropout masks, Q, K, V, the projection input, the MLP
  intermediates, the attention scores), each a separate allocation; full recompute keeps the
  layer input only and rebuilds one layer (or one chunk) at a time in backward;
- the last stage's logits: the fp32 vocab-parallel logits and their 16-bit copy ([K] sec. 4.3).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.models.memory.allocator import StepTensors, Tensors
from tuner.models.memory.terms import LayerActivations, param_counts, saved_mode
from tuner.models.optimizer_layout import StageStates
from tuner.spec.study import ModelSpec, Precision


def param_tensors(model: ModelSpec, c: ParallelConfig, layers: int, params: float) -> Tensors:
    """(elements, count) of the stage's parameter tensors on one rank, ``params`` in all."""
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_channels
    a, g = model.num_attention_heads, model.query_groups
    matrices = [
        h * (a + 2 * g) * kv / c.tp,  # fused QKV
        a * kv * h / c.tp,  # attention output projection
        h * f * (2 if model.swiglu else 1) / c.tp,  # fc1 (SwiGLU: gate and up)
        f * h / c.tp,  # fc2
    ]
    small = param_counts(model).layer_replicated
    out: list[tuple[float, int]] = [(m, layers) for m in matrices if layers]
    if layers and small:
        out.append((small / 2, 2 * layers))  # the two norms (and row-parallel biases)
    rest = params - layers * (sum(matrices) + small)
    if rest > 0:
        out.append((rest, 1))  # embeddings / output layer (and the final norm)
    return tuple(out)


def _scaled(parts: list[float], total: float) -> list[float]:
    whole = sum(parts)
    return [p * total / whole for p in parts if p > 0] if whole > 0 and total > 0 else []


def layer_tensors(
    model: ModelSpec, act: LayerActivations, c: ParallelConfig, recompute: str
) -> tuple[float, ...]:
    """Bytes of each tensor one layer saves for one micro-batch on one rank ([K] Table 2),
    ``recompute`` none or selective (selective drops the score tensors)."""
    return _layer_tensors(model, act, c.tp, c.sequence_parallel, recompute)


@functools.lru_cache(maxsize=1 << 12)
def _layer_tensors(
    model: ModelSpec, act: LayerActivations, tp: int, sequence_parallel: bool, recompute: str
) -> tuple[float, ...]:
    """:func:`layer_tensors` on what it reads of the config (tp and SP), cached: the configs of
    a space that share a micro-batch, CP, TP and SP share a layer's tensors."""
    hidden = act.layer_input  # e x s x b x h: one hidden-sized activation
    mask = (act.replicated - 4 * hidden) / 2 if model.dropout else 0.0  # 1 B per element
    rep_shard = tp if sequence_parallel else 1
    rep = [hidden / rep_shard] * 4 + ([mask / rep_shard] * 2 if mask > 0 else [])
    g_over_a = model.query_groups / model.num_attention_heads
    attn = [hidden, hidden * g_over_a, hidden * g_over_a, hidden]  # Q, K, V, projection input
    mlp = _scaled([2.0, 1.0] if model.swiglu else [1.0, 1.0], max(act.sharded - sum(attn), 0.0))
    if model.flash_attention or not model.dropout:
        scores = [act.scores]  # the log-sum-exp, or the softmax output alone
    else:
        scores = _scaled([2.0, 1.0, 2.0], act.scores)  # softmax out, dropout mask, dropout out
    kept = rep + [x / tp for x in attn + mlp]
    if recompute != "selective":
        kept += [x / tp for x in scores if x > 0]
    return tuple(kept)


def activation_tensors(
    model: ModelSpec, act: LayerActivations, c: ParallelConfig, layers: int, held: float
) -> tuple[Tensors, Tensors]:
    """(saved tensors of the stage's held micro-batches, the recompute working set), with the
    layer counts of tuner.models.memory.terms.layers_activation_bytes."""
    if c.recompute != "full":
        count = max(int(round(held * layers)), 0)
        return tuple((x, count) for x in layer_tensors(model, act, c, saved_mode(c))), ()
    full = [(x, 1) for x in layer_tensors(model, act, c, "none")]
    ckpt = act.stored(c.tp, c.sequence_parallel, "full")
    n = c.recompute_num_layers or 1
    if c.recompute_method == "block":
        kept = min(n, layers)
        saved = [(ckpt, int(round(held * kept)))]
        saved += [(x, int(round(held * (layers - kept)))) for x, _ in full]
        return tuple(saved), tuple(full)
    chunks = -(-layers // n) if layers else 0
    return ((ckpt, int(round(held * chunks))),), tuple((x, n) for x, _ in full)


def _state(total: float, psi: float, shapes: Tensors, flat: bool) -> Tensors:
    """``total`` bytes over ``psi`` parameters as one flat buffer or one tensor per parameter."""
    if total <= 0:
        return ()
    if flat or psi <= 0:
        return ((total, 1),)
    return tuple((elems * total / psi, n) for elems, n in shapes)


@dataclass(frozen=True, slots=True)
class StateTensors:
    """The model states' share of a stage's :class:`StepTensors` (what the states alone set;
    kept with them by tuner.models.memory.stage_states)."""

    resident: Tensors
    """Weights, the gradient buffer, the fp32 master (the workspace is added per config)."""
    lazy: Tensors
    """The Adam moments."""
    fwd_bwd: Tensors
    """The states' transient tensors of the forward/backward (after the activations)."""
    step: Tensors
    """The optimizer step's temporaries."""


def state_tensors(
    model: ModelSpec, c: ParallelConfig, layers: int, params: float, states: StageStates
) -> StateTensors:
    """The states' tensors of a stage holding ``params`` parameters in ``layers`` layers."""
    shapes = param_tensors(model, c, layers, params)
    flat = states.flat
    fwd, step = states.fwd_bwd, states.step
    grads = min(fwd.grads, step.grads)
    master = fwd.optimizer - states.moments
    resident = (
        _state(fwd.weights, params, shapes, flat)
        + _state(grads, params, shapes, True)  # contiguous grad buffer / DeepSpeed partition
        + _state(master, params, shapes, flat)
    )
    lazy = _state(states.moments / 2, params, shapes, flat) * 2  # exp_avg, exp_avg_sq
    fwd_tensors = _state(fwd.buffers, params, shapes, True) + _state(
        fwd.grads - grads, params, shapes, True
    )
    step_list = _state(step.buffers, params, shapes, flat) + _state(
        step.grads - grads, params, shapes, True
    )
    return StateTensors(resident, lazy, fwd_tensors, step_list)


def step_tensors(
    model: ModelSpec,
    c: ParallelConfig,
    layers: int,
    params: float,
    states: StageStates,
    activations: tuple[Tensors, Tensors],
    extras: float,
    workspace: float,
    precision: Precision,
    last: bool,
    own: StateTensors | None = None,
) -> StepTensors:
    """The stage's tensors grouped as tuner.models.memory.allocator needs them (``own``: the
    states' share, :func:`state_tensors` of the same arguments, where known)."""
    s = own or state_tensors(model, c, layers, params, states)
    resident = s.resident + workspace_tensors(workspace)
    saved, working = activations
    fwd_tensors = saved + working + extra_tensors(extras, precision, last) + s.fwd_bwd
    return StepTensors(resident, s.lazy, fwd_tensors, s.step)


def workspace_tensors(workspace: float) -> Tensors:
    """The stage's workspaces, one resident tensor (none when nil)."""
    return ((workspace, 1),) if workspace else ()


def extra_tensors(extras: float, precision: Precision, last: bool) -> Tensors:
    """The stage's extras (``terms.stage_extras``) as tensors: on the last stage mostly the fp32
    logits and their 16-bit copy, on the first its embedding dropout masks (small)."""
    e = 4.0 if precision == "fp32" else 2.0
    logits = _scaled([4.0, e], extras) if last else [extras]
    return tuple((x, 1) for x in logits)
