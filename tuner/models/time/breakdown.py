"""The step-time model's result, ``TimeBreakdown``, and the FLOPs it reports.

FLOPs convention (``tuner.models.time.estimate``'s breakdowns, ``model_flops_per_step``,
``hardware_flops_per_step``): a multiply-add is 2 FLOPs; the backward pass costs twice the forward;
every transformer layer counts its QKV, output, MLP GEMMs and the full (not causally halved)
attention scores QK^T and scores x V; the LM head (logits GEMM) is included; embedding look-ups,
norms, softmax and other element-wise work are not. For a GPT with F = 4h and multi-head attention
this is Korthikanti et al.'s model FLOPs, 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)). *Model* FLOPs
never count recomputation (MFU); *hardware* FLOPs add what recomputation runs again: one more
forward of every recomputed layer for full recompute (Narayanan et al.'s 96·B·s·L·h²(...) for full
uniform recompute), the attention core (4·B·s²·h per layer) for selective recompute (HFU).
Korthikanti's printed selective-recompute HFU formula, 72·B·s·L·h²(1 + s/(3h) + ...), adds three
times that; we count what is executed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.moe import mlp_flops_per_token
from tuner.models.rates import Rates
from tuner.models.time.recompute import selective_flops_per_sequence
from tuner.models.uncertainty import (
    CATALOG_TIME_SIGMA,
    CATALOG_TIME_STACK_SIGMA,
    TIME_GROUPS,
    Provenance,
    TermSource,
    combined_sigma,
    term_sources,
)
from tuner.spec.study import ModelSpec


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    """Predicted seconds per optimizer step on the critical path (the slowest pipeline stage).

    The parts add up to ``step``. FLOPs follow this module's convention (its docstring):
    ``model_flops`` excludes recomputation (MFU), ``hardware_flops`` includes it (HFU).
    """

    compute: float
    """Forward + backward of the transformer layers (plus the LM head when pp = 1)."""
    recompute: float
    """Forward work run again in backward (full or selective recomputation)."""
    tp_comm: float
    """Tensor-parallel all-reduce / reduce-scatter + all-gather, including recomputed ones."""
    cp_comm: float
    """Context-parallel K/V exchange not hidden behind the attention kernels."""
    ep_comm: float
    """MoE token dispatch and combine (all-to-all over EP, or all-gather / reduce-scatter),
    forward and backward, on the critical path (tuner.models.moe)."""
    pp_p2p: float
    """Pipeline point-to-point sends and receives on the critical path."""
    pp_bubble: float
    """Pipeline fill and drain: (p - 1) / v micro-batch slots of the stage."""
    dp_comm: float
    """Exposed (not overlapped) data-parallel gradient / parameter traffic (ZeRO included)."""
    optimizer: float
    """The optimizer step, and gradient accumulation outside the GEMMs (DeepSpeed), both
    memory-bandwidth bound."""
    stage_imbalance: float
    """Extra work of the last pipeline stage (LM head, loss) and the tied-embedding reduction."""
    overhead: float
    """Fixed framework cost per micro-batch and per step (dominates tiny models on CPU ranks)."""
    fp8_cast: float
    """Transformer Engine's FP8 quantize / transpose passes and amax reductions
    (tuner.models.time.fp8; 0 unless precision is fp8)."""
    moe_routing: float
    """MoE router GEMM, scores, aux loss and token permute / unpermute (tuner.models.time.moe)."""
    step: float
    """Seconds per optimizer step: the sum of the parts above."""
    model_flops: float
    """FLOPs of one step, whole model, no recomputation."""
    hardware_flops: float
    """FLOPs of one step, whole model, recomputation included."""
    tokens_per_s: float
    """Tokens per second over the whole job."""
    tokens_per_s_per_gpu: float
    """Tokens per second per GPU."""
    model_tflops_per_gpu: float
    """model_flops / step / GPUs, in TFLOP/s (Megatron-LM's logged figure)."""
    mfu: float
    """Model FLOPs utilisation: model_flops / (step x GPUs x peak)."""
    hfu: float
    """Hardware FLOPs utilisation: hardware_flops / (step x GPUs x peak)."""
    provenance: Provenance = ()
    """Terms measured on this stack (name, source); every other term is the catalog's
    (:mod:`tuner.models.uncertainty`)."""

    @property
    def sigma(self) -> float:
        """Relative sd of ``step``, from where its terms came (each catalog term carries the
        held-out error of its group, a measured one its spread) and, on its catalog terms' share,
        an unseen stack's own bias (:data:`tuner.models.uncertainty.CATALOG_TIME_STACK_SIGMA`)."""
        parts = {name: float(getattr(self, name)) for name in TIME_GROUPS}
        return combined_sigma(parts, time_sources(self.provenance), CATALOG_TIME_STACK_SIGMA)

    def to_dict(self) -> dict[str, float]:
        """Every field by name (for JSON, tables and Optuna attributes)."""
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in dataclasses.fields(TimeBreakdown) if f.name != "provenance")


@functools.lru_cache(maxsize=256)
def time_sources(provenance: Provenance = ()) -> Mapping[str, TermSource]:
    """Every step-time term's source: ``provenance``'s where given, else the catalog's (cached,
    read-only)."""
    return MappingProxyType(term_sources(TIME_GROUPS, provenance, TIME_GROUPS, CATALOG_TIME_SIGMA))


# --- FLOPs ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _flops_per_sequence(model: ModelSpec) -> tuple[float, float, float]:
    """Forward FLOPs of one sequence: (one layer, its attention core, the LM head)."""
    s, h = model.seq_length, model.hidden_size
    kv = 2 * model.query_groups * model.kv_channels
    attn_core = 4.0 * s * s * h
    mlp = s * mlp_flops_per_token(model)  # 2 s (mlp_in + F) h dense; MoE: tuner.models.moe
    layer = 2.0 * s * h * (h + kv) + attn_core + 2.0 * s * h * h + mlp
    head = 2.0 * s * h * model.vocab_size
    return layer, attn_core, head


def model_flops_per_step(model: ModelSpec, global_batch_size: int) -> float:
    """Model FLOPs of one optimizer step (module convention: 2 per MAC, backward = 2x forward,
    full attention scores, LM head included, no recomputation)."""
    layer, _, head = _flops_per_sequence(model)
    return 3.0 * global_batch_size * (model.num_layers * layer + head)


def fastest_step_s(model: ModelSpec, global_batch_size: int, world: int, gpu: GPUSpec,
                   ) -> float | None:  # fmt: skip
    """The physical lower bound on one optimizer step of ``world`` GPUs: the FLOPs every step
    executes at least, on every GPU at the fastest dense tensor rate it has. A measured step
    below it is no measurement (a broken timer, a log that is not the run's). None on CPU
    ranks: the ``cpu`` entry's peak is one core's at an assumed vector width, while a rank may
    run on a wider core or on several threads, so it bounds nothing.

    - The FLOPs: :func:`model_flops_per_step` less half the attention scores. The convention
      counts the full score matrices, but causal kernels skip the masked half of them
      (``tuner.models.time.estimate._attention_core``), so at long sequences a sound run
      executes fewer FLOPs than the convention counts (at 128k tokens and h = 4096 the scores
      are most of the work). Recomputation only adds FLOPs, so leaving it out keeps a bound.
    - The rate: the larger of the GPU's dense 16-bit and FP8 peaks (no sparsity), whatever
      the study's precision: a study's arguments can select FP8 layers beside a bf16
      ``training.precision`` (a Megatron-Bridge recipe's ``mixed_precision``), and no dense
      tensor work on the GPU runs faster than its fastest datasheet rate. A cluster profile
      measures achieved rates below these, never the peak, so the catalog entry (with the
      study's overrides) is the one source.

    No margin is added: both are upper limits of the hardware, not estimates of a run."""
    if gpu.name == "cpu":
        return None
    _, attn_core, _ = _flops_per_sequence(model)
    executed = model_flops_per_step(model, global_batch_size) - (
        3.0 * global_batch_size * model.num_layers * attn_core / 2)  # fmt: skip
    peak = max(gpu.peak_tflops, gpu.fp8_peak_tflops) * 1e12
    return executed / (world * peak)


def recompute_fraction(config: ParallelConfig, model: ModelSpec) -> float:
    """Share of a stage's layers that full recomputation runs again."""
    if config.recompute != "full" or config.recompute_method != "block":
        return 1.0
    per_chunk = max(1, model.num_layers // (config.pp * config.vp))
    return min(config.recompute_num_layers or per_chunk, per_chunk) / per_chunk


def hardware_flops_per_step(model: ModelSpec, config: ParallelConfig) -> float:
    """Model FLOPs plus the forward work that ``config.recompute`` runs again."""
    layer, attn_core, _ = _flops_per_sequence(model)
    base = model_flops_per_step(model, config.global_batch_size)
    if config.recompute == "full":
        extra = layer * recompute_fraction(config, model)
    elif config.recompute == "selective":  # the modules' FLOPs: tuner.models.time.recompute
        core = attn_core if "core_attn" in config.recomputed_modules else 0.0
        extra = core + selective_flops_per_sequence(model, config)
    else:
        return base
    return base + config.global_batch_size * model.num_layers * extra


def breakdown(
    parts: tuple[float, ...], model: ModelSpec, config: ParallelConfig, rates: Rates
) -> TimeBreakdown:
    step = sum(parts)
    model_flops = model_flops_per_step(model, config.global_batch_size)
    hardware_flops = hardware_flops_per_step(model, config)
    world = config.world_size
    tokens = config.global_batch_size * model.seq_length / step
    compute, recompute, tp_comm, cp_comm, p2p, bubble, dp, optimizer, imbalance, overhead = parts[
        :10
    ]
    ep_comm, fp8_cast, moe_routing = parts[10:13]
    return TimeBreakdown(
        compute=compute,
        recompute=recompute,
        tp_comm=tp_comm,
        cp_comm=cp_comm,
        ep_comm=ep_comm,
        pp_p2p=p2p,
        pp_bubble=bubble,
        dp_comm=dp,
        optimizer=optimizer,
        stage_imbalance=imbalance,
        overhead=overhead,
        fp8_cast=fp8_cast,
        moe_routing=moe_routing,
        step=step,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        tokens_per_s=tokens,
        tokens_per_s_per_gpu=tokens / world,
        model_tflops_per_gpu=model_flops / step / world / 1e12,
        mfu=model_flops / (step * world * rates.peak),
        hfu=hardware_flops / (step * world * rates.peak),
    )
