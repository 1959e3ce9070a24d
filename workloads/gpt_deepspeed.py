"""A small GPT trained with the real DeepSpeed engine, for tuner's demo study and tests.

Launch with torchrun (one process per device; gloo on CPU, nccl on CUDA)::

    torchrun --nproc_per_node 2 workloads/gpt_deepspeed.py --deepspeed_config ds_config.json

Everything about parallelism and precision comes from the ds_config.json: ZeRO stage 0-3,
``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps`` / ``train_batch_size``,
``bf16.enabled``, an ``activation_checkpointing`` section (only the transformer blocks are
checkpointed), ``"pipeline": {"stages": P, "partition": METHOD}`` (P > 1 builds a DeepSpeed
``PipelineModule`` with ``partition_method=METHOD``: ``type:Block`` when absent or DeepSpeed's
default ``best``, else ``uniform``, ``parameters`` or ``type:REGEX``; ZeRO 0/1 only), and an
optional ``optimizer`` section (without one, ``torch.optim.AdamW`` is created here).
Tokens are synthetic and seeded.

Mixture of experts (``--num-experts E``): the MLP of the blocks ``--moe-layer-freq`` picks is a
``deepspeed.moe.layer.MoE`` over E copies of the MLP (width ``--moe-ffn-hidden-size``), split over
``--ep-size`` expert-parallel ranks, top-``--moe-router-topk`` gating with
``--moe-capacity-factor`` / ``--moe-min-capacity`` (no factor: dropless), the gates' summed
``l_aux`` times ``--moe-aux-loss-coeff`` added to the loss; the expert parameters get their own
optimizer groups (``split_params_into_different_moe_groups_for_optimizer``). Refused, one line,
exit 2: ZeRO-3 (DeepSpeed's native MoE does not run under it), pipeline stages, and a
data-parallel world that ``--ep-size`` does not divide.

Printed lines (besides DeepSpeed's own log, which is switched to INFO level):

- every optimizer step, from every rank::

    tuner-step: iter=N time_s=S samples_per_s=X max_allocated_gib=A max_reserved_gib=R rank=K

  (MoE runs add ``aux_loss=L`` before ``rank``: the summed ``l_aux`` of the step's last
  micro-batch, unscaled.)

  ``time_s`` is the wall clock of all micro-steps of the global batch, between two barriers;
  ``samples_per_s`` is the global batch size divided by it.
- once, after the first step, from every rank::

    tuner-memory: rank=K params=B grads=B optimizer=B activations=B

- at the end: ``tuner-done: iters=N rank=K``.

Memory. On CUDA ``max_allocated_gib`` / ``max_reserved_gib`` are
``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()``. On CPU torch keeps no allocator
statistics, so:

- ``max_allocated_gib`` is the tensor accounting of the ``tuner-memory`` line, summed:
  params + grads + optimizer + activations. It is the analogue of ``max_memory_allocated`` (live
  tensor bytes at the peak, no allocator slack) and it isolates what the memory model predicts.
  Each part is counted by storage, deduplicated, so flat buffers and views count once:
  ``params`` are the module's parameter storages resident on this rank (ZeRO-3: the partition
  ``ds_tensor`` plus any gathered or persistent full parameter); ``grads`` are the gradient
  storages alive when the inner optimizer's ``step`` starts (``.grad`` of module and optimizer
  parameters, and the ZeRO / bf16 wrapper's gradient buffers); ``optimizer`` is the inner torch
  optimizer's state plus its parameters that are not module storages (fp32 master copies);
  ``activations`` is the peak of the bytes saved for backward (``saved_tensors_hooks``; parameter
  storages excluded; deduplicated by storage; tracked through backward, so recomputation under
  activation checkpointing is included) during the first optimizer step.
- ``max_reserved_gib`` is the growth of the process's resident set: peak RSS (``VmHWM``) minus
  the RSS taken after imports, process-group start and a warm-up collective, before the model is
  built. It includes allocator slack, DeepSpeed's communication buffers and library pages, so it
  is noisy for small models and always larger than the accounting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

PROG = "gpt_deepspeed"
GIB = 2**30


class WorkloadConfigError(Exception):
    """The command line or the ds_config cannot be run; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEShape:
    """DeepSpeed-MoE layers (``deepspeed.moe.layer.MoE``) replacing the MLP of some blocks."""

    num_experts: int
    ep_size: int
    top_k: int
    capacity_factor: float | None  # None: dropless (MoE(drop_tokens=False))
    min_capacity: int
    aux_loss_coeff: float
    ffn_hidden_size: int
    layers: tuple[bool, ...]  # per block: is its MLP an MoE layer


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The GPT's dimensions."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    moe: MoEShape | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """What the ds_config asks for, resolved against the world size."""

    zero_stage: int
    pipeline_stages: int
    micro_batch: int
    grad_accum: int
    dp_size: int
    bf16: bool
    checkpointing: bool
    has_optimizer: bool
    partition_method: str = "type:Block"
    moe: bool = False

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp_size


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="Small GPT on the DeepSpeed engine.")
    p.add_argument("--deepspeed_config", "--deepspeed-config", required=True, type=Path)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--ffn-hidden-size", type=int, default=None, help="default: 4 * hidden")
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--train-iters", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    moe = p.add_argument_group("mixture of experts (deepspeed.moe.layer.MoE)")
    moe.add_argument("--num-experts", type=int, default=None, help="default: a dense model")
    moe.add_argument("--ep-size", type=int, default=1, help="expert-parallel ranks")
    moe.add_argument("--moe-router-topk", type=int, default=2, help="experts per token (k)")
    moe.add_argument("--moe-ffn-hidden-size", type=int, default=None, help="default: FFN width")
    moe.add_argument("--moe-capacity-factor", type=float, default=None, help="default: dropless")
    moe.add_argument("--moe-min-capacity", type=int, default=4)
    moe.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    moe.add_argument("--moe-layer-freq", default="1", help="N (every N-th block) or [1,0,...]")
    # The `deepspeed` launcher appends --local_rank; torchrun sets LOCAL_RANK instead.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def model_shape(args: argparse.Namespace) -> ModelShape:
    ffn = args.ffn_hidden_size if args.ffn_hidden_size is not None else 4 * args.hidden_size
    shape = ModelShape(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=ffn,
        seq_length=args.seq_length,
        vocab_size=args.vocab_size,
        moe=moe_shape(args, args.num_layers, ffn),
    )
    for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"):
        if getattr(shape, name) < 1:
            raise WorkloadConfigError(f"--{name.replace('_', '-')} must be >= 1")
    if shape.seq_length < 1 or shape.vocab_size < 2 or args.train_iters < 1:
        raise WorkloadConfigError("--seq-length, --vocab-size (>= 2), --train-iters must be >= 1")
    if shape.hidden_size % shape.num_attention_heads:
        raise WorkloadConfigError(
            f"--hidden-size ({shape.hidden_size}) is not divisible by "
            f"--num-attention-heads ({shape.num_attention_heads})"
        )
    return shape


def moe_layers(text: str, num_layers: int) -> tuple[bool, ...]:
    """``--moe-layer-freq``: N (block i is MoE when i % N == 0, Megatron's --moe-layer-freq) or
    a 0/1 list with one entry per block."""
    compact = text.replace(" ", "")
    if compact.isdigit() and int(compact) >= 1:
        return tuple(i % int(compact) == 0 for i in range(num_layers))
    if re.fullmatch(r"\[[01](,[01])*\]", compact):
        flags = tuple(ch == "1" for ch in compact[1:-1].split(","))
        if len(flags) == num_layers:
            return flags
    raise WorkloadConfigError(
        f"--moe-layer-freq must be N >= 1 or a 0/1 list of --num-layers ({num_layers}) "
        f"entries, got {text!r}"
    )


def moe_shape(args: argparse.Namespace, num_layers: int, ffn: int) -> MoEShape | None:
    if args.num_experts is None:
        if args.ep_size != 1:
            raise WorkloadConfigError(f"--ep-size ({args.ep_size}) needs --num-experts")
        return None
    e, ep = args.num_experts, args.ep_size
    if e < 1 or ep < 1:
        raise WorkloadConfigError("--num-experts and --ep-size must be >= 1")
    if e % ep:  # deepspeed/moe/layer.py MoE.__init__ asserts it
        raise WorkloadConfigError(
            f"Number of experts ({e}) should be divisible by expert parallel size ({ep})"
        )
    if not 1 <= args.moe_router_topk <= e:
        raise WorkloadConfigError(f"--moe-router-topk must be in 1..{e}")
    cf = args.moe_capacity_factor
    if (cf is not None and cf <= 0) or args.moe_min_capacity < 0:
        raise WorkloadConfigError("--moe-capacity-factor must be > 0, --moe-min-capacity >= 0")
    return MoEShape(
        num_experts=e,
        ep_size=ep,
        top_k=args.moe_router_topk,
        capacity_factor=cf,
        min_capacity=args.moe_min_capacity,
        aux_loss_coeff=args.moe_aux_loss_coeff,
        ffn_hidden_size=args.moe_ffn_hidden_size or ffn,
        layers=moe_layers(args.moe_layer_freq, num_layers),
    )


# --------------------------------------------------------------------------- ds_config


def load_ds_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise WorkloadConfigError(f"cannot read --deepspeed_config {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise WorkloadConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise WorkloadConfigError(f"{path}: the top level must be a JSON object")
    return config


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise WorkloadConfigError(f"ds_config.{key} must be an object, got {value!r}")
    return value


def _positive_int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WorkloadConfigError(f"ds_config.{key} must be a positive integer, got {value!r}")
    return value


def resolve_batch(config: dict[str, Any], dp: int) -> tuple[int, int]:
    """(micro batch, gradient accumulation) by DeepSpeed's rules, with the factors named."""
    tb = _positive_int(config, "train_batch_size")
    mb = _positive_int(config, "train_micro_batch_size_per_gpu")
    gas = _positive_int(config, "gradient_accumulation_steps")
    if mb is None and tb is None:
        raise WorkloadConfigError(
            "ds_config needs train_micro_batch_size_per_gpu or train_batch_size"
        )
    if tb is not None and mb is not None and gas is not None:
        if tb != mb * gas * dp:
            raise WorkloadConfigError(
                f"train_batch_size ({tb}) != train_micro_batch_size_per_gpu ({mb}) * "
                f"gradient_accumulation_steps ({gas}) * data-parallel size ({dp})"
            )
        return mb, gas
    if mb is not None:
        if tb is None:
            return mb, gas or 1
        if tb % (mb * dp):
            raise WorkloadConfigError(
                f"train_batch_size ({tb}) is not divisible by train_micro_batch_size_per_gpu "
                f"({mb}) * data-parallel size ({dp})"
            )
        return mb, tb // (mb * dp)
    gas = gas or 1
    tb = tb or 0  # not None here: mb is None, and one of the two is set
    if tb % (gas * dp):
        raise WorkloadConfigError(
            f"train_batch_size ({tb}) is not divisible by gradient_accumulation_steps ({gas}) "
            f"* data-parallel size ({dp})"
        )
    return tb // (gas * dp), gas


def _pipeline_stages(config: dict[str, Any], world: int, shape: ModelShape) -> int:
    stages = _section(config, "pipeline").get("stages", 1)
    if stages == "auto":
        stages = 1
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise WorkloadConfigError(f"ds_config.pipeline.stages must be >= 1, got {stages!r}")
    if world % stages:
        raise WorkloadConfigError(
            f"pipeline.stages ({stages}) does not divide the world size ({world})"
        )
    if stages > shape.num_layers:
        raise WorkloadConfigError(
            f"pipeline.stages ({stages}) is more than --num-layers ({shape.num_layers})"
        )
    return stages


def plan_run(config: dict[str, Any], world: int, shape: ModelShape) -> RunPlan:
    """Validate the config for this workload; raise WorkloadConfigError naming the key."""
    zero = _section(config, "zero_optimization").get("stage", 0)
    if zero not in (0, 1, 2, 3):
        raise WorkloadConfigError(f"zero_optimization.stage must be 0-3, got {zero!r}")
    stages = _pipeline_stages(config, world, shape)
    if stages > 1 and zero > 1:
        raise WorkloadConfigError(
            f"zero_optimization.stage {zero} cannot be combined with pipeline.stages "
            f"({stages}) > 1: DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only"
        )
    if stages > 1 and config.get("wall_clock_breakdown"):
        raise WorkloadConfigError(
            "wall_clock_breakdown must be false with pipeline.stages > 1 "
            "(it breaks DeepSpeed's pipeline engine)"
        )
    if _section(config, "fp16").get("enabled"):
        raise WorkloadConfigError("fp16.enabled is not supported by this workload; use bf16")
    ckpt = _section(config, "activation_checkpointing")
    if ckpt.get("partition_activations") or ckpt.get("cpu_checkpointing"):
        raise WorkloadConfigError(
            "activation_checkpointing.partition_activations / cpu_checkpointing need tensor "
            "parallelism, which this workload does not have"
        )
    if shape.moe is not None:
        check_moe(shape.moe, zero, stages, world // stages)
    micro, gas = resolve_batch(config, world // stages)
    partition = _section(config, "pipeline").get("partition", "best")
    if not isinstance(partition, str):
        raise WorkloadConfigError(f"pipeline.partition must be a string, got {partition!r}")
    if partition != "best" and not (
        partition in ("uniform", "parameters") or partition.startswith("type:")
    ):
        raise WorkloadConfigError(
            f"pipeline.partition must be uniform, parameters or type:REGEX, got {partition!r}"
        )
    return RunPlan(
        partition_method="type:Block" if partition == "best" else partition,
        zero_stage=zero,
        pipeline_stages=stages,
        micro_batch=micro,
        grad_accum=gas,
        dp_size=world // stages,
        bf16=bool(_section(config, "bf16").get("enabled", False)),
        checkpointing="activation_checkpointing" in config,
        has_optimizer="optimizer" in config,
        moe=shape.moe is not None,
    )


def check_moe(moe: MoEShape, zero: int, stages: int, dp: int) -> None:
    """What DeepSpeed-MoE (0.19.8) refuses, or this workload does not build, with its words."""
    if zero == 3:  # runtime/engine.py _validate_zero3_moe_compatibility
        raise WorkloadConfigError(
            "Native DeepSpeed MoE is not supported with ZeRO Stage 3 "
            "(zero_optimization.stage 3 with --num-experts; use stage 0-2)"
        )
    if stages > 1:
        raise WorkloadConfigError(
            f"--num-experts cannot be combined with pipeline.stages ({stages}) > 1: the "
            "PipelineModule passes one activation tensor between stages, with no path for the "
            "MoE layers' aux loss"
        )
    if dp % moe.ep_size:  # utils/groups.py _create_expert_and_data_parallel
        raise WorkloadConfigError(
            f"{dp} is not divisible by {moe.ep_size} (the data-parallel world, {dp} ranks, "
            f"must split into expert-parallel groups of --ep-size {moe.ep_size})"
        )


def engine_config(config: dict[str, Any], plan: RunPlan) -> dict[str, Any]:
    """The dict handed to deepspeed.initialize: logging on, batch keys made explicit."""
    out = dict(config)
    out.setdefault("steps_per_print", 1)  # None crashes the pipeline engine (modulo by None)
    out.setdefault("log_level", "info")
    out["train_micro_batch_size_per_gpu"] = plan.micro_batch
    out["gradient_accumulation_steps"] = plan.grad_accum
    out["train_batch_size"] = plan.global_batch
    return out


# --------------------------------------------------------------------------- model


class MLP(nn.Module):
    """fc1 -> GELU -> fc2 (the dense MLP, and each DeepSpeed-MoE expert)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.heads = shape.num_attention_heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.mlp = self.make_mlp(shape)

    def make_mlp(self, shape: ModelShape) -> nn.Module:
        return MLP(shape.hidden_size, shape.ffn_hidden_size)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(att.transpose(1, 2).reshape(b, s, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return x + self.mlp(self.ln2(x))


class MoEBlock(Block):
    """A block whose MLP is ``deepspeed.moe.layer.MoE`` over copies of the MLP; returns the
    output and the gate's load-balancing loss (``l_aux``)."""

    def make_mlp(self, shape: ModelShape) -> nn.Module:
        from deepspeed.moe.layer import MoE

        moe = shape.moe
        if moe is None:
            raise ValueError("MoEBlock needs ModelShape.moe")
        cf = moe.capacity_factor
        return MoE(
            hidden_size=shape.hidden_size,
            expert=MLP(shape.hidden_size, moe.ffn_hidden_size),
            num_experts=moe.num_experts,
            ep_size=moe.ep_size,
            k=moe.top_k,
            capacity_factor=cf or 1.0,
            eval_capacity_factor=cf or 1.0,
            min_capacity=moe.min_capacity,
            drop_tokens=cf is not None,
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = self.attention(x)
        out, l_aux, _ = self.mlp(self.ln2(x))
        return x + out, l_aux


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.tok = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.pos = nn.Embedding(shape.seq_length, shape.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


class Head(nn.Module):
    """Final LayerNorm and the (untied) output projection to logits."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(shape.hidden_size)
        self.out = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    """The whole model for the non-pipeline engine; forward returns the LM loss."""

    def __init__(self, shape: ModelShape, checkpoint: Callable[..., Any] | None) -> None:
        super().__init__()
        self.embed = Embedding(shape)
        moe = shape.moe.layers if shape.moe else (False,) * shape.num_layers
        self.blocks = nn.ModuleList(MoEBlock(shape) if m else Block(shape) for m in moe)
        self.head = Head(shape)
        self.checkpoint = checkpoint
        self.aux_loss_coeff = shape.moe.aux_loss_coeff if shape.moe else 0.0
        self.last_aux_loss = 0.0  # the MoE layers' summed l_aux of the last forward

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        aux = torch.zeros((), device=x.device)
        for block in self.blocks:
            out = self.checkpoint(block, x) if self.checkpoint else block(x)
            if isinstance(out, tuple):  # an MoEBlock: (output, l_aux)
                x, l_aux = out
                aux = aux + l_aux
            else:
                x = out
        self.last_aux_loss = float(aux.detach())
        loss = lm_loss(self.head(x), labels)
        return loss + self.aux_loss_coeff * aux if self.aux_loss_coeff else loss


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def configure_checkpointing(config: dict[str, Any]) -> Callable[..., Any]:
    """DeepSpeed's activation checkpointing, set from the config section (no model parallel)."""
    import deepspeed

    section = config["activation_checkpointing"]
    deepspeed.checkpointing.configure(
        None,
        partition_activations=False,
        contiguous_checkpointing=bool(section.get("contiguous_memory_optimization", False)),
        num_checkpoints=section.get("number_checkpoints"),
        checkpoint_in_cpu=False,
        synchronize=bool(section.get("synchronize_checkpoint_boundary", False)),
        profile=bool(section.get("profile", False)),
    )
    return deepspeed.checkpointing.checkpoint


def build_model(shape: ModelShape, plan: RunPlan, config: dict[str, Any], seed: int) -> Any:
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(seed)
    checkpoint = configure_checkpointing(config) if plan.checkpointing else None
    if plan.pipeline_stages == 1:
        return GPT(shape, checkpoint)
    layers = [LayerSpec(Embedding, shape)]
    layers += [LayerSpec(Block, shape) for _ in range(shape.num_layers)]
    layers.append(LayerSpec(Head, shape))
    return PipelineModule(
        layers=layers,
        num_stages=plan.pipeline_stages,
        loss_fn=lm_loss,
        partition_method=plan.partition_method,
        activation_checkpoint_interval=1 if checkpoint else 0,
        checkpointable_layers=["Block"],  # never the embedding (integer input) or the head
        base_seed=seed,
    )


# --------------------------------------------------------------------------- memory accounting


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    """{storage address: bytes the tensors reference in it}, overlaps counted once.

    Views are measured, not whole storages: DeepSpeed hands out gradients as views into
    communication buckets (``reduce_bucket_size`` elements, mostly untouched), and its flat
    buffers are viewed both whole and per parameter.
    """
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        base = t.untyped_storage().data_ptr()
        if not base:
            continue
        start = t.data_ptr() - base
        extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        spans.setdefault(base, []).append((start, start + extent * t.element_size()))
    return {base: _union_length(intervals) for base, intervals in spans.items()}


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, -1
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _walk_tensors(obj: Any, depth: int = 3) -> Iterator[Any]:
    """Tensors inside nested lists, tuples and dicts (DeepSpeed's buffer containers)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0 and isinstance(obj, list | tuple):
        for item in obj:
            yield from _walk_tensors(item, depth - 1)
    elif depth > 0 and isinstance(obj, dict):
        for item in obj.values():
            yield from _walk_tensors(item, depth - 1)


def param_storages(module: Any) -> dict[int, int]:
    """Parameter bytes resident on this rank: ZeRO-3 partitions plus any full (gathered) data."""
    tensors: list[Any] = []
    for p in module.parameters():
        tensors.append(p.data)
        if hasattr(p, "ds_tensor"):
            tensors.append(p.ds_tensor)
    return _storages(tensors)


def optimizer_storages(inner: Any, params: dict[int, int]) -> dict[int, int]:
    """The torch optimizer's state plus its parameters that are not module storages."""
    state = [t for s in inner.state.values() for t in _walk_tensors(s)]
    masters = [p for g in inner.param_groups for p in g["params"]]
    out = _storages(state)
    out.update({k: v for k, v in _storages(masters).items() if k not in params})
    return out


def grad_storages(module: Any, inner: Any, wrapper: Any) -> dict[int, int]:
    """Gradient storages: .grad of module and optimizer params and the wrapper's grad buffers."""
    tensors = [p.grad for p in module.parameters()]
    tensors += [p.grad for g in inner.param_groups for p in g["params"]]
    if wrapper is not inner:
        for name, value in vars(wrapper).items():
            if "grad" in name.lower():
                tensors.extend(_walk_tensors(value))
    return _storages(tensors)


class SavedTensorMeter:
    """Peak bytes saved for backward, deduplicated by storage, parameters excluded."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.refs: dict[int, list[int]] = {}  # storage address -> [references, bytes]
        self.live = 0
        self.peak = 0

    def pack(self, t: Any) -> Any:
        key = t.untyped_storage().data_ptr()
        if not key or key in param_storages(self.module):
            return t
        entry = self.refs.setdefault(key, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Saved(t, self, key)

    def unpack(self, packed: Any) -> Any:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.refs[key]


class _Saved:
    """A saved tensor whose destruction (graph freed) lowers the meter's live count."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: Any, meter: SavedTensorMeter, key: int) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter.release(self.key)


@dataclass(slots=True)
class MemoryAccount:
    """Per-rank tensor bytes by kind, filled during the first optimizer step."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations


def rss_kib(field: str) -> int:
    """VmRSS / VmHWM of this process in KiB (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------- training


@dataclass(slots=True)
class Session:
    """The live run: engine, plan and where this rank sits."""

    engine: Any
    inner: Any  # the torch optimizer that DeepSpeed wraps
    plan: RunPlan
    shape: ModelShape
    rank: int
    dp_rank: int
    device: Any
    seed: int
    rss_base_kib: int
    account: MemoryAccount | None = None


def batches(s: Session, step: int) -> Iterator[tuple[Any, Any]]:
    """The micro-batches of one optimizer step: seeded by (seed, data-parallel rank, step)."""
    gen = torch.Generator().manual_seed(s.seed * 1_000_003 + s.dp_rank * 7919 + step)
    for _ in range(s.plan.grad_accum):
        shape = (s.plan.micro_batch, s.shape.seq_length + 1)
        tokens = torch.randint(0, s.shape.vocab_size, shape, generator=gen).to(s.device)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def train_step(s: Session, step: int) -> None:
    """One optimizer step: all micro-steps of the global batch."""
    if s.plan.pipeline_stages > 1:
        s.engine.train_batch(data_iter=batches(s, step))
        return
    for ids, labels in batches(s, step):
        loss = s.engine(ids, labels)
        s.engine.backward(loss)
        s.engine.step()


def measured_first_step(s: Session) -> MemoryAccount:
    """Run step 1 with the saved-tensor meter and gradient probes.

    Gradient bytes are sampled after each parameter's gradient is accumulated (ZeRO 0/1 hold
    full gradients until the boundary reduction) and when the inner optimizer's step starts
    (ZeRO 2/3 and bf16 hold partitions or fp32 buffers by then); the largest sample is kept.
    """
    module = s.engine.module
    account = MemoryAccount()
    real_step = s.inner.step

    def sample() -> None:
        grads = grad_storages(module, s.inner, s.engine.optimizer)
        account.grads = max(account.grads, sum(grads.values()))

    def probed_step(*args: Any, **kwargs: Any) -> Any:
        sample()
        return real_step(*args, **kwargs)

    meter = SavedTensorMeter(module)
    hooks = [
        p.register_post_accumulate_grad_hook(lambda _: sample())
        for p in module.parameters()
        if p.requires_grad
    ]
    s.inner.step = probed_step
    try:
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            train_step(s, 1)
    finally:
        del s.inner.step  # back to the class's method
        for hook in hooks:
            hook.remove()
    params = param_storages(module)
    account.params = sum(params.values())
    account.optimizer = sum(optimizer_storages(s.inner, params).values())
    account.activations = meter.peak
    return account


def memory_gib(s: Session) -> tuple[float, float]:
    """(max_allocated, max_reserved) in GiB; see the module docstring for CPU."""
    if s.device.type == "cuda":
        return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB
    allocated = s.account.total if s.account else 0
    grown_kib = max(rss_kib("VmHWM"), rss_kib("VmRSS")) - s.rss_base_kib
    return allocated / GIB, max(grown_kib, 0) * 1024 / GIB


def emit(line: str) -> None:
    """Write one whole line with a single write(2), so ranks sharing a pipe never interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def run_steps(s: Session, iters: int) -> None:
    for step in range(1, iters + 1):
        dist.barrier()
        start = time.perf_counter()
        if step == 1:
            s.account = measured_first_step(s)
        else:
            train_step(s, step)
        dist.barrier()
        elapsed = time.perf_counter() - start
        if step == 1:
            a = s.account
            emit(
                f"tuner-memory: rank={s.rank} params={a.params} grads={a.grads} "
                f"optimizer={a.optimizer} activations={a.activations}"
            )
        allocated, reserved = memory_gib(s)
        # MoE runs add the last micro-batch's summed gate loss (a key the parser skips)
        aux = f" aux_loss={s.engine.module.last_aux_loss:.6f}" if s.plan.moe else ""
        emit(
            f"tuner-step: iter={step} time_s={elapsed:.6f} "
            f"samples_per_s={s.plan.global_batch / elapsed:.3f} "
            f"max_allocated_gib={allocated:.6f} max_reserved_gib={reserved:.6f}{aux} "
            f"rank={s.rank}"
        )
    emit(f"tuner-done: iters={iters} rank={s.rank}")


# --------------------------------------------------------------------------- setup and main


def prefer_own_ninja() -> None:
    """Put this interpreter's bin first on PATH when it has a ninja.

    DeepSpeed's JIT op loader runs whichever ``ninja`` PATH finds, and a ninja of another version
    than the one that built the cached op rebuilds it (about 45 s), e.g. over a remote shell
    whose PATH lacks the venv.
    """
    bin_dir = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if (bin_dir / "ninja").exists() and not path.startswith(f"{bin_dir}{os.pathsep}"):
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{path}"


def start_distributed() -> tuple[Any, int]:
    """Init the process group (nccl on CUDA, gloo on CPU) and run one untimed collective.

    The collective makes DeepSpeed build or load its CPU shared-memory comm op (about 45 s the
    first time on a machine, cached in ~/.cache/torch_extensions) before anything is timed.
    """
    import deepspeed

    prefer_own_ninja()
    for key, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, default)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(1)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    warm = torch.ones(1024, device=device)
    deepspeed.comm.all_reduce(warm)
    dist.barrier()
    return device, dist.get_rank()


def start_engine(model: Any, plan: RunPlan, config: dict[str, Any]) -> tuple[Any, Any]:
    """deepspeed.initialize; DeepSpeed's own config errors become WorkloadConfigError."""
    import deepspeed

    def make_adamw(params: Any) -> Any:
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)

    params: list[Any] = [p for p in model.parameters() if p.requires_grad]
    if plan.moe:
        # Expert parameters in their own groups: ZeRO partitions (and the engine reduces) them
        # over the expert-data-parallel group, the others over the whole data-parallel group.
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        params = split_params_into_different_moe_groups_for_optimizer(
            {"params": params, "name": "dense-params"}
        )
    try:
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=params,
            optimizer=None if plan.has_optimizer else make_adamw,
            config=engine_config(config, plan),
        )
    except (AssertionError, ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadConfigError(f"deepspeed rejected the config: {first}") from exc
    return engine, engine.basic_optimizer


def data_parallel_rank(engine: Any, rank: int) -> int:
    grid = getattr(engine, "grid", None)
    return int(grid.get_data_parallel_id()) if grid is not None else rank


def fail(exc: Exception) -> int:
    """One line on stderr from the first process of each node; exit code 2 (bad input)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        shape = model_shape(args)
        config = load_ds_config(args.deepspeed_config)
        plan = plan_run(config, int(os.environ.get("WORLD_SIZE", "1")), shape)
    except WorkloadConfigError as exc:
        return fail(exc)
    device, rank = start_distributed()
    rss_base = rss_kib("VmRSS")
    try:
        model = build_model(shape, plan, config, args.seed)
        engine, inner = start_engine(model, plan, config)
    except WorkloadConfigError as exc:
        return fail(exc)
    session = Session(
        engine=engine,
        inner=inner,
        plan=plan,
        shape=shape,
        rank=rank,
        dp_rank=data_parallel_rank(engine, rank),
        device=device,
        seed=args.seed,
        rss_base_kib=rss_base,
    )
    run_steps(session, args.train_iters)
    shutdown(engine)
    return 0


def shutdown(engine: Any) -> None:
    """Release DeepSpeed and the process group, then leave without interpreter teardown.

    With ZeRO-3 on CPU, one rank in a few aborted in teardown after finishing
    ("terminate called without an active exception", exit -6), failing a complete run.
    """
    engine.destroy()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
