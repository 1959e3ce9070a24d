"""A stand-in for microsoft/Megatron-DeepSpeed's ``pretrain_gpt.py`` (HEAD f4157bea): no GPU, no
torch, no DeepSpeed.

The machinery (response surface, behaviours, sleeping, memory reports, failures, environment
variables) is the Megatron stand-in's (``tests/standins/pretrain_gpt.py``, read its docstring);
this file gives it the fork's :class:`Dialect`: the fork's flags (megatron/arguments.py plus
DeepSpeed's ``--deepspeed`` / ``--deepspeed_config``; no ``--context-parallel-size``, no
``--mock-data``; an unknown flag fails as argparse does, exit 2), the fork's checks with their
texts (megatron/arguments.py validate_args, the TP ``divide()`` checks, DeepSpeed's batch check on
the ds_config and PipelineEngine's ZeRO assertion), and the fork's iteration line
(megatron/training.py ``training_log``: no timestamp, ``consumed tokens``, ``actual seqlen``,
``samples per second``, ``tokens per gpu per second (tgs)``, ``TFLOPs`` with recompute counted).
It also prints DeepSpeed's ``DeepSpeed Final Optimizer = ...`` line, naming the wrapper
DeepSpeed's engine.py ``_do_optimizer_sanity_check`` would pick for the ds_config.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

_BASE_PATH = Path(__file__).resolve().parents[1] / "pretrain_gpt.py"
_SPEC = importlib.util.spec_from_file_location("tuner_megatron_standin", _BASE_PATH)
assert _SPEC is not None and _SPEC.loader is not None
base: Any = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = base  # its dataclasses look their module up while being built
_SPEC.loader.exec_module(base)

_TOKENIZERS = (
    "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer", "HFTokenizer", "NullTokenizer",
)  # fmt: skip


def _add_fork(parser: argparse.ArgumentParser) -> None:
    """The fork's own flags (megatron/arguments.py) and DeepSpeed's two."""
    group = parser.add_argument_group(title="deepspeed")
    group.add_argument("--deepspeed", action="store_true")
    group.add_argument("--deepspeed_config", type=str, default=None)
    group.add_argument("--zero-stage", type=int, default=1.0)
    group.add_argument("--deepspeed-activation-checkpointing", action="store_true")
    group.add_argument("--partition-activations", action="store_true")
    group.add_argument("--no-pipeline-parallel", action="store_true")
    group.add_argument("--ds-sequence-parallel-size", type=int, default=1)
    # bigscience-workshop/Megatron-DeepSpeed's spelling (megatron/arguments.py:578)
    group.add_argument("--pp-partition-method", type=str, default=None)
    group = parser.add_argument_group(title="distributed")
    group.add_argument("--tensor-model-parallel-size", type=int, default=1)
    group.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    group.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    group.add_argument("--sequence-parallel", action="store_true")
    group.add_argument("--use-distributed-optimizer", action="store_true")
    group.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
    group.add_argument("--distributed-timeout-minutes", type=int, default=10)
    group.add_argument("--local-rank", type=int, default=None)
    group.add_argument("--use-cpu-initialization", action="store_true", default=None)


def _add_model_and_training(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(title="network size")
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size"):
        group.add_argument(flag, type=int, default=None)
    group.add_argument("--num-key-value-heads", type=int, default=None)
    group.add_argument("--kv-channels", type=int, default=None)
    group.add_argument("--max-position-embeddings", type=int, default=None)
    group.add_argument("--use-rotary-position-embeddings", action="store_true")
    group.add_argument("--no-position-embedding", action="store_false",
                       dest="add_position_embedding")  # fmt: skip
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    group.add_argument("--normalization", default="layernorm", choices=["layernorm", "rmsnorm"])
    group.add_argument("--swiglu", action="store_true")
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    group.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    group.add_argument("--use-flash-attn-v2", action="store_true")
    group.add_argument("--attention-dropout", type=float, default=0.1)
    group.add_argument("--hidden-dropout", type=float, default=0.1)
    group = parser.add_argument_group(title="training")
    group.add_argument("--micro-batch-size", type=int, default=None)
    group.add_argument("--global-batch-size", type=int, default=None)
    group.add_argument("--recompute-activations", action="store_true")
    group.add_argument("--recompute-granularity", type=str, default=None,
                       choices=["full", "selective"])  # fmt: skip
    group.add_argument("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    group.add_argument("--recompute-num-layers", type=int, default=1)
    group.add_argument("--checkpoint-activations", action="store_true")
    group.add_argument("--checkpoint-num-layers", type=int, default=1)
    group.add_argument("--train-iters", type=int, default=None)
    group.add_argument("--eval-iters", type=int, default=100)
    group.add_argument("--eval-interval", type=int, default=1000)
    group.add_argument("--skip-train", action="store_true")
    group.add_argument("--exit-interval", type=int, default=None)
    group.add_argument("--exit-duration-in-mins", type=int, default=None)
    group.add_argument("--optimizer", type=str, default="adam", choices=["adam", "sgd"])
    group.add_argument("--lr", type=float, default=None)
    group.add_argument("--min-lr", type=float, default=0.0)
    decay = ["constant", "linear", "cosine", "inverse-square-root"]
    group.add_argument("--lr-decay-style", type=str, default="linear", choices=decay)
    group.add_argument("--lr-warmup-iters", type=int, default=0)
    group.add_argument("--weight-decay", type=float, default=0.01)
    group.add_argument("--clip-grad", type=float, default=1.0)
    group.add_argument("--seed", type=int, default=1234)
    group.add_argument("--fp16", action="store_true")
    group.add_argument("--bf16", action="store_true")
    group = parser.add_argument_group(title="data and logging")
    group.add_argument("--seq-length", type=int, default=None)
    group.add_argument("--data-path", nargs="*", default=None)
    group.add_argument("--split", type=str, default="969, 30, 1")
    group.add_argument("--tokenizer-type", type=str, default=None, choices=_TOKENIZERS)
    group.add_argument("--vocab-size", type=int, default=None)
    group.add_argument("--vocab-file", type=str, default=None)
    group.add_argument("--merge-file", type=str, default=None)
    group.add_argument("--log-interval", type=int, default=100)
    group.add_argument("--save", type=str, default=None)
    group.add_argument("--save-interval", type=int, default=None)
    group.add_argument("--load", type=str, default=None)


def build_parser() -> argparse.ArgumentParser:
    """The fork's parser (no abbreviations, as Megatron's)."""
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    _add_fork(parser)
    _add_model_and_training(parser)
    return parser


def _ds_config(args: argparse.Namespace) -> dict[str, Any]:
    if not args.deepspeed or not args.deepspeed_config:
        raise AssertionError("the Megatron-DeepSpeed stand-in runs --deepspeed --deepspeed_config")
    with open(args.deepspeed_config, encoding="utf-8") as handle:
        config: dict[str, Any] = json.load(handle)
    return config


def validate_args(args: argparse.Namespace, world: int, rank: int | None) -> Any:
    """megatron/arguments.py validate_args (the parts a tuner trial reaches), in its order."""
    tp = args.tensor_model_parallel_size = min(args.tensor_model_parallel_size, world)
    if world % tp:
        raise AssertionError(
            f"world size ({world}) is not divisible by tensor model parallel size ({tp})"
        )
    pp = args.pipeline_model_parallel_size = min(args.pipeline_model_parallel_size, world // tp)
    if args.no_pipeline_parallel and pp != 1:
        raise AssertionError(
            "pipeline_model_parallel_size must be 1 if pipeline parallel is disabled"
        )
    sp = args.ds_sequence_parallel_size
    if world % (tp * pp * sp):
        raise AssertionError(
            f"world size ({world}) is not divisible by tensor parallel size ({tp}) times "
            f"pipeline parallel size ({pp}) times seqence parallel size ({sp})"
        )
    args.data_parallel_size = world // (tp * pp * sp)
    base._print_rank_0(
        rank,
        f"using world size: {world}, data-parallel-size: {args.data_parallel_size}, "
        f"sequence-parallel size: {sp}, tensor-model-parallel size: {tp}, "
        f"pipeline-model-parallel size: {pp} ",
    )
    if args.recompute_activations:
        args.recompute_granularity = "selective"
    if args.micro_batch_size is None or args.micro_batch_size <= 0:
        raise AssertionError
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
        base._print_rank_0(rank, f"setting global batch size to {args.global_batch_size}")
    if args.fp16 and args.bf16:
        raise AssertionError
    if args.recompute_granularity == "selective" and args.recompute_method is not None:
        raise AssertionError(
            "recompute method is not yet supported for selective recomputing granularity"
        )
    if tp == 1:
        args.sequence_parallel = False
    if args.sequence_parallel and os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        raise RuntimeError(
            "Using sequence parallelism requires setting the environment variable "
            "CUDA_DEVICE_MAX_CONNECTIONS to 1"
        )
    if args.num_key_value_heads is None:
        args.num_key_value_heads = args.num_attention_heads
    if args.num_attention_heads % args.num_key_value_heads:
        raise AssertionError(
            "num_attention_heads must be divisible by num_key_value_heads (got "
            f"`num_attention_heads`: {args.num_attention_heads} and `num_key_value_heads`: "
            f"{args.num_key_value_heads})."
        )
    for name in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        if getattr(args, name) is None:
            raise AssertionError(f"{name} argument is None")
    if not args.data_path:
        # the fork has no mock data: GPT datasets are built from --data-path
        raise AssertionError("Megatron-DeepSpeed needs --data-path (it has no --mock-data)")
    _fill_megatron_names(args)
    return base.Topology(world=world, tp=tp, pp=pp, cp=1, dp=args.data_parallel_size, vp=1)


def _fill_megatron_names(args: argparse.Namespace) -> None:
    """The names the shared stand-in machinery reads, from the fork's."""
    h = args.hidden_size
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = int((4 * h * 2 / 3) / 64) * 64 if args.swiglu else 4 * h
    args.kv_channels = args.kv_channels or h // args.num_attention_heads
    args.num_query_groups = args.num_key_value_heads
    args.context_parallel_size = 1
    args.normalization = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[args.normalization]
    learned = args.add_position_embedding and not args.use_rotary_position_embeddings
    args.position_embedding_type = "learned_absolute" if learned else "rope"
    if args.checkpoint_activations:
        args.recompute_granularity = "full"


def model_checks(args: argparse.Namespace) -> None:
    """The TP ``divide()`` checks (megatron/core/utils.py ensure_divisibility), DeepSpeed's batch
    check and PipelineEngine's ZeRO assertion, on the ds_config the run was given."""
    tp = args.tensor_model_parallel_size
    for value in (args.num_attention_heads, args.num_key_value_heads, args.ffn_hidden_size):
        if value % tp:
            raise AssertionError(f"{value} is not divisible by {tp}")
    config = _ds_config(args)
    dp, mbs = args.data_parallel_size, config.get("train_micro_batch_size_per_gpu")
    gas, total = config.get("gradient_accumulation_steps"), config.get("train_batch_size")
    if total != mbs * gas * dp:
        raise AssertionError(
            "Check batch related parameters. train_batch_size is not equal to "
            f"micro_batch_per_gpu * gradient_acc_step * world_size {total} != {mbs} * {gas} * "
            f"{dp}"
        )
    stage = int(config.get("zero_optimization", {}).get("stage", 0))
    if not args.no_pipeline_parallel and stage >= 2:
        raise AssertionError("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    args.zero_stage = stage
    args.optimizer_wrapper = _wrapper(args, config, stage)


def _wrapper(args: argparse.Namespace, config: dict[str, Any], stage: int) -> str:
    """The optimizer class DeepSpeed's engine ends up with (_do_optimizer_sanity_check)."""
    bf16 = bool(config.get("bf16", {}).get("enabled"))
    accum = config.get("data_types", {}).get("grad_accum_dtype")
    if stage:
        if bf16 and accum == "fp32" and stage == 1:
            return "BF16_Optimizer"
        return "DeepSpeedZeroOptimizer" if stage < 3 else "DeepSpeedZeroOptimizer_Stage3"
    if bf16 and not args.no_pipeline_parallel:
        return "BF16_Optimizer"
    return "FP16_Optimizer" if args.fp16 or bf16 else args.optimizer.capitalize()


def iteration_line(run: Any, iteration: int, elapsed_s: float) -> str:
    """megatron/training.py training_log's line, as the fork prints it."""
    args = run.args
    iters, gbs, seq = args.train_iters, args.global_batch_size, args.seq_length
    lr = (args.lr or 0.0) - ((args.lr or 0.0) - args.min_lr) * iteration / max(1, iters)
    loss = 2.0 + 9.0 * math.exp(-iteration / 40)
    recompute = 4.0 / 3.0 if args.recompute_granularity == "full" else 1.0
    tflops = base.model_flops(args, run.vocab) * recompute / (elapsed_s * 1e12 * run.topo.world)
    samples = gbs / elapsed_s
    text = f" iteration {iteration:8d}/{iters:8d} |"
    text += f" consumed samples: {iteration * gbs:12d} |"
    text += f" consumed tokens: {iteration * gbs * seq:12d} |"
    text += f" elapsed time per iteration (ms): {elapsed_s * 1000:.1f} |"
    text += f" learning rate: {lr:.3E} | global batch size: {gbs:5d} |"
    text += f" lm loss: {loss:.6E} | loss scale: {65536.0 if args.fp16 else 1.0:.1f} |"
    text += f" grad norm: {1.0 + 4.0 * math.exp(-iteration / 10):.3f} |"
    text += f" actual seqlen: {seq:5d} |"
    text += " number of skipped iterations:   0 | number of nan iterations:   0 |"
    text += f" samples per second: {samples:.3f} |"
    text += f" tokens per gpu per second (tgs): {samples * seq / run.topo.world:.3f} |"
    return text + f" TFLOPs: {tflops:.2f} |"


def _banner(args: argparse.Namespace) -> tuple[str, ...]:
    stamp = base._now() + ",000"
    where = f"[{stamp}] [INFO] [logging.py:96:log_dist] [Rank 0]"
    return (
        f"{where} DeepSpeed info: version=0.19.8, git-hash=unknown, git-branch=unknown",
        f"{where} DeepSpeed Final Optimizer = {args.optimizer_wrapper}",
    )


def pretrain(argv: list[str] | None = None) -> int:
    """Parse once to learn the banner, then run the shared machinery with the fork's dialect."""
    args = build_parser().parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    probe = argparse.Namespace(**vars(args))
    validate_args(probe, world, rank=-1)
    model_checks(probe)
    dialect = base.Dialect(build_parser, validate_args, model_checks, iteration_line,
                           banner=_banner(probe))  # fmt: skip
    return int(base.pretrain(argv, dialect))


if __name__ == "__main__":
    sys.exit(pretrain())
