"""The workload's command line and ds_config, checked before anything starts.

The model's shape (:class:`ModelShape`, its DeepSpeed-MoE layers :class:`MoEShape`) comes
from the command line; the :class:`RunPlan` (ZeRO stage, pipeline stages, batch, precision,
checkpointing) from the ds_config resolved against the world size. What cannot run raises
:class:`WorkloadConfigError` with one line naming the flag or key, in DeepSpeed's words where
DeepSpeed has them.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROG = "gpt_deepspeed"


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
    p.add_argument(
        "--probe-points", type=Path, default=None,
        help="JSON {marker, points: [{point, argv}]}: run each point's arguments in turn in this "
        "process (one start for a framework probe's points), each framed by marker lines",
    )  # fmt: skip
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
