"""A stand-in for Megatron-LM's ``pretrain_gpt.py`` (core_v0.15) that needs no GPU and no torch.

Run it as Megatron is run: ``torchrun --nproc_per_node N tests/standins/pretrain_gpt.py <flags>``
or as one process (``python tests/standins/pretrain_gpt.py <flags>``). It accepts Megatron's own
flag names only (an unknown flag fails as Megatron's argparse does: exit 2, ``pretrain_gpt.py:
error: unrecognized arguments: ...``), applies Megatron's validation rules with their exact texts
(raising AssertionError / ValueError, so the traceback is a real Python one, exit 1), then prints
Megatron's startup, per-iteration, memory-report and validation lines. Timings and memory come
from a *response surface*; each iteration really sleeps ``step_s * TUNER_STANDIN_TIME_SCALE``.

Environment
-----------
``WORLD_SIZE`` (default 1) and ``RANK`` come from torchrun. Without ``RANK`` the process plays
every rank at once: it prints rank 0's startup lines, the last rank's iteration lines and every
data-parallel-rank-0 memory report. ``CUDA_DEVICE_MAX_CONNECTIONS=1`` is required when TP or CP
> 1, as in Megatron. ``TUNER_STANDIN_TIME_SCALE`` (default 0.001: a 10 s step sleeps 10 ms; or a
file holding the number, read at every sleep) scales every sleep; the printed times are unscaled.
``TUNER_STANDIN_NOISE_SEED`` (default empty) is mixed into the seed of each config's noise, so
repeated studies can see different noise.
``TUNER_STANDIN_TE_VERSION`` (default 2.8.0) is the Transformer Engine version Megatron's
checks see.
``TUNER_STANDIN_SURFACE`` selects the surface:
``TUNER_STANDIN_IGNORE_SIGTERM=1`` makes every rank ignore SIGTERM, as a rank stuck in a CUDA call
does: only the executor's SIGKILL after its grace period ends it.

* a path to a JSON file (format below), or
* ``module:function`` or ``path/to/file.py:function``: ``function(config: dict) -> dict`` returning
  the fields of a table entry (below). ``config`` holds the variables listed below.

Without it a built-in surface is used (model FLOPs at 150 TFLOP/s per GPU with pipeline bubble
and recompute costs; memory from 18 (or 6 + 12/dp) bytes per parameter plus activations).

Surface JSON
------------
::

    {
      "kind": "formula",            # or "table": a config missing from "configs" is an error
      "step_s": <expr>,             # seconds per iteration (formula kind)
      "memory_gib": <expr>,         # peak "max allocated" of the busiest rank, GiB
      "tflops": <expr>,             # optional; default: Megatron's model-FLOPs formula
      "configs": {"tp=2,pp=4,cp=1,vp=1,mbs=2,recompute=selective,sp=1,distopt=1":
                  {"step_s": 3.2, "memory_gib": 61.0, "tflops": 410.0, "behaviour": {...}}},
      "behaviours": [{"when": {"tp": 8, "pp": 2}, "kind": "hang", "after_iterations": 3}],
      "gpu_memory_gib": 80,         # the GPU the OOM message names
      "oom_if_memory_above": 80,    # default: gpu_memory_gib
      "warmup_factor": 1.5,         # iteration 1 takes this much longer
      "noise": 0.01                 # +-1 % deterministic noise, seeded by the config key
    }

``<expr>`` is a number or ``{"base": b, "terms": {var: c}, "factors": {var: {value: m}},
"powers": {var: e}}`` meaning ``(b + sum c*var) * prod factors[var][str(var)] * prod var**e``
(a value missing from a factor table multiplies by 1). Variables: ``tp pp cp vp dp mbs gbs world
microbatches ep experts`` (ints; ep is ``--expert-model-parallel-size``, experts
``--num-experts`` or 0), ``recompute`` (``none|selective|full``), ``recompute_modules``
(selective's modules joined by ``+``, e.g. ``core_attn+moe_act``; empty otherwise), ``sp`` and
``distopt`` (0/1,
SP is 0 when tp is 1, as Megatron turns it off), ``layers hidden heads seq ffn vocab``,
``params`` (model parameters), ``expert_params`` (routed-expert parameters, all layers) and
``zero`` (the ZeRO stage; 0 for Megatron-LM). The config key is the canonical string shown
above.

Behaviours (``behaviour`` of a table entry, or ``behaviours`` matched on a partial config):
``{"kind": "hang" | "crash" | "nccl_timeout" | "oom", "after_iterations": N, "ranks": [...],
"exception": "RuntimeError", "message": "..."}``. ``hang`` sleeps forever after N iterations
(SIGTERM kills it as it kills any Python process); ``crash`` raises ``exception(message)``;
``nccl_timeout`` waits ``--distributed-timeout-minutes`` (scaled), prints torch's NCCL watchdog
lines and aborts (SIGABRT); ``oom`` raises torch's OutOfMemoryError. A peak memory above
``oom_if_memory_above`` always gives ``oom`` at iteration 1 on the busiest ranks. Ranks that do
not fail wait for the failed one as NCCL ranks do: the watchdog fires after the time-out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import importlib
import importlib.util
import json
import math
import os
import random
import re
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

_TOKENIZERS = (
    "BertWordPieceLowerCase",
    "BertWordPieceCase",
    "GPT2BPETokenizer",
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "HuggingFaceTokenizer",
    "Llama2Tokenizer",
    "TikTokenizer",
    "MultimodalTokenizer",
    "NullTokenizer",
    "NullMultimodalTokenizer",
    "SFTTokenizer",
)


class OutOfMemoryError(RuntimeError):
    """Printed by the traceback machinery as ``torch.OutOfMemoryError``, as torch >= 2.5 does."""


OutOfMemoryError.__module__ = "torch"


# --------------------------------------------------------------------------------------------
# Flags: Megatron's names, types and defaults (core_v0.15 megatron/training/arguments.py)


def _add_parallel(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(title="distributed")
    group.add_argument("--tensor-model-parallel-size", type=int, default=1)
    group.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    group.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    group.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    group.add_argument("--pipeline-model-parallel-layout", type=str, default=None)
    group.add_argument("--decoder-first-pipeline-num-layers", type=int, default=None)
    group.add_argument("--decoder-last-pipeline-num-layers", type=int, default=None)
    group.add_argument("--account-for-embedding-in-pipeline-split", action="store_true")
    group.add_argument("--account-for-loss-in-pipeline-split", action="store_true")
    group.add_argument(
        "--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_comm"
    )
    group.add_argument("--sequence-parallel", action="store_true")
    group.add_argument("--context-parallel-size", type=int, default=1)
    group.add_argument(
        "--cp-comm-type", nargs="+", type=str, default=["p2p"]
    )  # p2p, a2a, allgather, a2a+p2p
    group.add_argument("--use-distributed-optimizer", action="store_true")
    group.add_argument("--overlap-grad-reduce", action="store_true")
    group.add_argument("--overlap-param-gather", action="store_true")
    group.add_argument("--overlap-param-gather-with-optimizer-step", action="store_true")
    group.add_argument("--tp-comm-overlap", action="store_true")
    group.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
    group.add_argument("--distributed-timeout-minutes", type=int, default=10)
    group.add_argument("--local-rank", type=int, default=int(os.getenv("LOCAL_RANK", "0")))
    group.add_argument("--use-cpu-initialization", action="store_true", default=None)


def _add_moe(parser: argparse.ArgumentParser) -> None:
    """core_v0.15 arguments.py ``_add_moe_args`` (the flags the tuner passes, and neighbours)."""
    group = parser.add_argument_group(title="moe")
    group.add_argument("--expert-model-parallel-size", type=int, default=1)
    group.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    group.add_argument("--num-experts", type=int, default=None)
    group.add_argument("--moe-layer-freq", type=_moe_freq, default=1)
    group.add_argument("--moe-ffn-hidden-size", type=int, default=None)
    group.add_argument("--moe-shared-expert-intermediate-size", type=int, default=None)
    group.add_argument("--moe-shared-expert-overlap", action="store_true")
    group.add_argument("--moe-layer-recompute", action="store_true")
    group.add_argument("--moe-grouped-gemm", action="store_true")
    group.add_argument("--moe-router-load-balancing-type", nargs="+", type=str,
                       choices=["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn",
                                "none"], default="aux_loss")  # fmt: skip
    group.add_argument("--moe-router-dtype", type=str, choices=["fp32", "fp64"], default=None)
    group.add_argument("--moe-router-score-function", choices=["softmax", "sigmoid"],
                       default="softmax")  # fmt: skip
    group.add_argument("--moe-router-topk", type=int, default=2)
    group.add_argument("--moe-router-pre-softmax", action="store_true")
    group.add_argument("--moe-aux-loss-coeff", type=float, nargs="+", default=0.0)
    group.add_argument("--moe-z-loss-coeff", type=float, default=None)
    group.add_argument("--moe-token-dispatcher-type", type=str,
                       choices=["allgather", "alltoall", "flex"], default="allgather")  # fmt: skip
    group.add_argument("--moe-enable-deepep", action="store_true")
    group.add_argument("--moe-permute-fusion", action="store_true")
    group.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    group.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    group.add_argument("--moe-token-drop-policy", type=str, default="probs",
                       choices=["probs", "position"])  # fmt: skip
    group = parser.add_argument_group(title="Transformer-Engine")
    group.add_argument("--fp8-format", default=None, choices=["e4m3", "hybrid"], dest="fp8")
    group.add_argument("--fp8-recipe", default="delayed",
                       choices=["tensorwise", "delayed", "mxfp8", "blockwise"])  # fmt: skip
    group.add_argument("--fp8-margin", type=int, default=0)
    group.add_argument("--fp8-amax-history-len", type=int, default=1)
    group.add_argument("--fp8-amax-compute-algo", default="most_recent",
                       choices=["most_recent", "max"])  # fmt: skip
    group.add_argument("--fp8-param-gather", action="store_true")


def _moe_freq(text: str) -> int | list[int]:
    """arguments.py ``moe_freq_type``: an int, or a list pattern such as ``([0]+[1]*23)`` (Megatron
    evals it; the stand-in accepts the same two shapes without eval)."""
    if text.strip().isdigit():
        return int(text)
    compact = text.replace(" ", "")
    match = re.fullmatch(r"\(?\[([01])\]\*(\d+)(?:\+\[([01])\]\*(\d+))?\)?(?:\*(\d+))?", compact)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid moe_freq_type value: {text!r}")
    a, na, b, nb, rep = match.groups()
    unit = [int(a)] * int(na) + ([int(b)] * int(nb) if b is not None else [])
    return unit * int(rep or 1)


def _add_batch_and_precision(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(title="training")
    group.add_argument("--micro-batch-size", type=int, default=None)
    group.add_argument("--global-batch-size", type=int, default=None)
    group.add_argument("--rampup-batch-size", nargs="*", default=None)
    group.add_argument("--recompute-activations", action="store_true")
    group.add_argument(
        "--recompute-granularity", type=str, default=None, choices=["full", "selective"]
    )
    group.add_argument("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    group.add_argument("--recompute-num-layers", type=int, default=None)
    group.add_argument("--recompute-modules", nargs="*", type=str, default=None)
    group.add_argument("--distribute-saved-activations", action="store_true")
    group.add_argument("--no-gradient-accumulation-fusion", action="store_false",
                       dest="gradient_accumulation_fusion")  # fmt: skip
    group.add_argument("--cross-entropy-loss-fusion", action="store_true")
    group.add_argument("--cross-entropy-fusion-impl", type=str, default="native",
                       choices=["native", "te"])  # fmt: skip
    group = parser.add_argument_group(title="mixed precision")
    group.add_argument("--fp16", action="store_true")
    group.add_argument("--bf16", action="store_true")
    group.add_argument("--loss-scale", type=float, default=None)
    group.add_argument("--initial-loss-scale", type=float, default=2**32)
    group.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true")
    group.add_argument(
        "--attention-backend",
        default="auto",
        choices=["flash", "fused", "unfused", "local", "auto"],
    )
    group.add_argument("--use-flash-attn", action="store_true")
    group.add_argument(
        "--transformer-impl", default="transformer_engine", choices=["local", "transformer_engine"]
    )


def _add_model(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(title="network size")
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size"):
        group.add_argument(flag, type=int, default=None)
    group.add_argument("--kv-channels", type=int, default=None)
    group.add_argument("--group-query-attention", action="store_true")
    group.add_argument("--num-query-groups", type=int, default=1)
    group.add_argument("--max-position-embeddings", type=int, default=None)
    group.add_argument("--seq-length", type=int, default=None)
    group.add_argument("--encoder-seq-length", type=int, default=None)
    group.add_argument("--swiglu", action="store_true")
    group.add_argument("--multi-latent-attention", action="store_true")
    group.add_argument(
        "--position-embedding-type",
        type=str,
        default="learned_absolute",
        choices=["learned_absolute", "rope", "mrope", "relative", "none"],
    )
    group.add_argument("--rotary-base", type=int, default=10000)
    group.add_argument("--rotary-percent", type=float, default=1.0)
    group.add_argument("--use-rotary-position-embeddings", action="store_true")
    group.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    group.add_argument("--norm-epsilon", type=float, default=1e-5)
    group.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    group.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    group.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    group.add_argument("--init-method-std", type=float, default=0.02)
    group.add_argument("--attention-dropout", type=float, default=0.1)
    group.add_argument("--hidden-dropout", type=float, default=0.1)
    group.add_argument("--no-masked-softmax-fusion", action="store_false",
                       dest="masked_softmax_fusion")  # fmt: skip
    group.add_argument("--no-bias-swiglu-fusion", action="store_false", dest="bias_swiglu_fusion")
    group.add_argument("--no-rope-fusion", action="store_false", dest="apply_rope_fusion")


def _add_training(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(title="training length and optimizer")
    group.add_argument("--train-iters", type=int, default=None)
    group.add_argument("--train-samples", type=int, default=None)
    group.add_argument("--eval-iters", type=int, default=100)
    group.add_argument("--eval-interval", type=int, default=1000)
    group.add_argument("--skip-train", action="store_true")
    group.add_argument("--exit-interval", type=int, default=None)
    group.add_argument("--exit-duration-in-mins", type=int, default=None)
    group.add_argument("--exit-signal-handler", action="store_true")
    group.add_argument("--lr", type=float, default=None)
    group.add_argument("--min-lr", type=float, default=0.0)
    group.add_argument(
        "--lr-decay-style",
        type=str,
        default="linear",
        choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
    )
    group.add_argument("--lr-decay-iters", type=int, default=None)
    group.add_argument("--lr-warmup-iters", type=int, default=0)
    group.add_argument("--lr-warmup-fraction", type=float, default=None)
    group.add_argument("--weight-decay", type=float, default=0.01)
    group.add_argument("--clip-grad", type=float, default=1.0)
    group.add_argument("--adam-beta1", type=float, default=0.9)
    group.add_argument("--adam-beta2", type=float, default=0.999)
    group.add_argument("--adam-eps", type=float, default=1e-08)
    group.add_argument("--optimizer", type=str, default="adam", choices=["adam", "sgd"])
    group.add_argument("--seed", type=int, default=1234)


def _add_data_logging_checkpoint(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(title="data and logging")
    group.add_argument("--mock-data", action="store_true")
    group.add_argument("--data-path", nargs="*", default=None)
    group.add_argument("--split", type=str, default=None)
    group.add_argument("--data-cache-path", default=None)
    group.add_argument("--tokenizer-type", type=str, default=None, choices=_TOKENIZERS)
    group.add_argument("--tokenizer-model", type=str, default=None)
    group.add_argument("--vocab-size", type=int, default=None)
    group.add_argument("--vocab-file", type=str, default=None)
    group.add_argument("--merge-file", type=str, default=None)
    group.add_argument("--num-workers", type=int, default=2)
    group.add_argument("--log-interval", type=int, default=100)
    group.add_argument("--log-throughput", action="store_true")
    group.add_argument("--timing-log-level", type=int, default=0, choices=range(0, 3))
    group.add_argument("--timing-log-option", default="minmax", choices=["max", "minmax", "all"])
    group.add_argument("--log-params-norm", action="store_true")
    group.add_argument("--log-num-zeros-in-grad", action="store_true")
    group.add_argument("--log-timers-to-tensorboard", action="store_true")
    group.add_argument("--log-memory-to-tensorboard", action="store_true")
    group.add_argument("--tensorboard-dir", type=str, default=None)
    group.add_argument("--wandb-project", type=str, default="")
    group = parser.add_argument_group(title="checkpointing")
    group.add_argument("--save", type=str, default=None)
    group.add_argument("--save-interval", type=int, default=None)
    group.add_argument("--load", type=str, default=None)
    group.add_argument("--no-load-optim", action="store_true", default=None)
    group.add_argument("--no-load-rng", action="store_true", default=None)
    group.add_argument("--no-save-optim", action="store_true", default=None)
    group.add_argument("--ckpt-format", default="torch_dist", choices=["torch", "torch_dist"])


def build_parser() -> argparse.ArgumentParser:
    """Megatron's parser: no abbreviations, so ``--tensor-model`` is an unknown flag."""
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    _add_parallel(parser)
    _add_batch_and_precision(parser)
    _add_moe(parser)
    _add_model(parser)
    _add_training(parser)
    _add_data_logging_checkpoint(parser)
    return parser


# --------------------------------------------------------------------------------------------
# Validation: Megatron's rules and texts (interfaces reference §1e)


@dataclasses.dataclass(frozen=True)
class Topology:
    """The process grid; rank order is Megatron's default tp-cp-ep-dp-pp (tp fastest)."""

    world: int
    tp: int
    pp: int
    cp: int
    dp: int
    vp: int

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp rank, cp rank, dp rank, pp rank) of a global rank."""
        rest, tp_rank = divmod(rank, self.tp)
        rest, cp_rank = divmod(rest, self.cp)
        pp_rank, dp_rank = divmod(rest, self.dp)
        return tp_rank, cp_rank, dp_rank, pp_rank


def _print_rank_0(rank: int | None, text: str) -> None:
    if rank in (None, 0):
        print(text, flush=True)


def _check_world(args: argparse.Namespace, world: int, rank: int | None) -> None:
    model_size = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    if world % model_size != 0:
        raise AssertionError(
            f"world size ({world}) is not divisible by total_model_size "
            f"(total_model_size={model_size})"
        )
    args.data_parallel_size = world // model_size
    # getattr: the Megatron-DeepSpeed stand-in shares this code and has no MoE flags
    etp = getattr(args, "expert_tensor_parallel_size", None) or args.tensor_model_parallel_size
    ep = getattr(args, "expert_model_parallel_size", 1)
    expert_grid = etp * ep * args.pipeline_model_parallel_size
    if world % expert_grid != 0:  # megatron/core/parallel_state.py initialize_model_parallel
        raise RuntimeError(
            f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel "
            f"size ({expert_grid})"
        )
    _print_rank_0(
        rank,
        f"using world size: {world}, data-parallel size: {args.data_parallel_size}, "
        f"context-parallel size: {args.context_parallel_size}, hierarchical context-parallel "
        f"sizes: None, tensor-model-parallel size: {args.tensor_model_parallel_size}, "
        f"pipeline-model-parallel size: {args.pipeline_model_parallel_size}",
    )


def _check_required(args: argparse.Namespace, rank: int | None) -> None:
    for name in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        if getattr(args, name) is None:
            raise AssertionError(f"{name} argument is None")
    if args.micro_batch_size is None or args.micro_batch_size <= 0:
        raise AssertionError
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
        _print_rank_0(rank, f"setting global batch size to {args.global_batch_size}")
    if args.fp16 and args.bf16:
        raise AssertionError
    if args.seq_length is None:
        if args.encoder_seq_length is None:
            raise AssertionError
        args.seq_length = args.encoder_seq_length


def _check_pipeline(args: argparse.Namespace) -> None:
    """megatron/training/arguments.py validate_args: the virtual pipeline size and the layer
    divisibility checks (the TransformerConfig checks of uneven splits are tuner's own)."""
    pp, layers = args.pipeline_model_parallel_size, args.num_layers
    layers += int(args.account_for_embedding_in_pipeline_split)
    layers += int(args.account_for_loss_in_pipeline_split)
    uneven = (
        args.decoder_first_pipeline_num_layers is not None
        or args.decoder_last_pipeline_num_layers is not None
    )
    vpp_flags = [
        args.num_layers_per_virtual_pipeline_stage,
        args.num_virtual_stages_per_pipeline_rank,
        args.pipeline_model_parallel_layout,
    ]
    if sum(flag is not None for flag in vpp_flags) > 1:
        raise AssertionError(
            "No more than one of the following arguments can be set at the same time: "
            "--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank,"
            "--pipeline-model-parallel-layout."
        )
    args.virtual_pipeline_model_parallel_size = None
    if vpp_flags[2] is not None:
        stages = _layout_stages(vpp_flags[2])
        if stages % pp != 0:
            raise AssertionError(
                "The length of pipeline_model_parallel_layout must be divisible by "
                f"pipeline_model_parallel_size (num_stages={stages}, "
                f"args.pipeline_model_parallel_size={pp})"
            )
        args.virtual_pipeline_model_parallel_size = (stages // pp) if stages > pp else None
    elif vpp_flags[1] is not None:
        args.virtual_pipeline_model_parallel_size = vpp_flags[1]
    elif vpp_flags[0] is not None:
        if uneven:
            raise AssertionError(
                "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline "
                "parallel degree when enable uneven pipeline parallelism"
            )
        if layers % pp != 0:
            raise AssertionError(
                "number of layers of the model must be divisible pipeline model parallel size"
            )
        if (layers // pp) % vpp_flags[0] != 0:
            raise AssertionError(
                "number of layers per pipeline stage must be divisible number of layers per "
                "virtual pipeline stage"
            )
        args.virtual_pipeline_model_parallel_size = layers // pp // vpp_flags[0]
    elif not uneven and layers % pp != 0:
        raise AssertionError(
            "Number of layers should be divisible by the pipeline-model-parallel size"
        )
    if args.virtual_pipeline_model_parallel_size == 1:
        args.virtual_pipeline_model_parallel_size = None
    if args.virtual_pipeline_model_parallel_size is not None:
        if args.overlap_p2p_comm and pp <= 1:
            raise AssertionError(
                "When interleaved schedule is used, pipeline-model-parallel size should be "
                "greater than 1"
            )
        if not args.overlap_p2p_comm and pp <= 2:
            raise AssertionError(
                "When interleaved schedule is used and p2p communication overlap is disabled, "
                "pipeline-model-parallel size should be greater than 2 to avoid having multiple "
                "p2p sends and recvs between same 2 ranks per communication batch"
            )


def _layout_stages(layout: str) -> int:
    """Stages of a --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py)."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return len(text.split("|"))


def _check_features(args: argparse.Namespace, rank: int | None) -> None:
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        raise AssertionError(
            "--overlap-param-gather only supported with distributed optimizer or megatron fsdp"
        )
    if args.overlap_param_gather and not args.overlap_grad_reduce:
        raise AssertionError("Must use --overlap-param-gather with --overlap-grad-reduce")
    if args.tensor_model_parallel_size == 1 and args.sequence_parallel:
        _print_rank_0(
            rank, "Disabling sequence parallelism because tensor model parallelism is disabled"
        )
        args.sequence_parallel = False
    if args.tp_comm_overlap and not args.sequence_parallel:
        raise AssertionError(
            "Tensor parallel communication/GEMM overlap can happen only when sequence "
            "parallelism is enabled"
        )
    if args.recompute_activations:
        args.recompute_granularity = "selective"
    if args.recompute_granularity == "selective" and args.recompute_method is not None:
        raise AssertionError(
            "recompute method is not yet supported for selective recomputing granularity"
        )
    cp = args.context_parallel_size
    if cp > 1 and args.seq_length % (cp * 2) != 0:
        raise AssertionError(
            "seq-length should be a multiple of 2 * context-parallel-size if "
            "context-parallel-size > 1."
        )
    if args.max_position_embeddings < args.seq_length:
        raise AssertionError(
            f"max_position_embeddings ({args.max_position_embeddings}) must be greater than or "
            f"equal to seq_length ({args.seq_length})."
        )
    _check_moe(args)


def _check_moe(args: argparse.Namespace) -> None:
    """validate_args' MoE checks (core_v0.15 arguments.py), in its order."""
    if args.num_experts == 0:
        args.num_experts = None
    if args.num_experts is not None and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
        print("Warning: moe_ffn_hidden_size is not set, using ffn_hidden_size for MoE instead.")
    if args.expert_model_parallel_size > 1:
        if args.num_experts is None:
            raise AssertionError("num_experts must be non None to use expert model parallelism")
        if args.num_experts % args.expert_model_parallel_size != 0:
            raise AssertionError(
                "Number of experts should be a multiple of expert model parallel_size."
            )
        if args.fp16:
            raise AssertionError("Expert parallelism is not supported with fp16 training.")


def _check_env_and_data(args: argparse.Namespace) -> None:
    if args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1:
        if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
            raise AssertionError(
                "Using tensor model parallelism or context parallelism require setting the "
                "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"
            )
    if bool(args.mock_data) == bool(args.data_path):
        raise AssertionError("A single data source must be provided in training mode, else None")


def validate_args(args: argparse.Namespace, world: int, rank: int | None) -> Topology:
    """Megatron's validate_args, in its order; returns the process grid."""
    _check_world(args, world, rank)
    _check_required(args, rank)
    _check_pipeline(args)
    _check_features(args, rank)
    _check_env_and_data(args)
    if args.ffn_hidden_size is None:
        h = args.hidden_size
        args.ffn_hidden_size = int((4 * h * 2 / 3) / 64) * 64 if args.swiglu else 4 * h
    if args.kv_channels is None:
        if args.hidden_size % args.num_attention_heads != 0:
            raise AssertionError
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    return Topology(
        world=world,
        tp=args.tensor_model_parallel_size,
        pp=args.pipeline_model_parallel_size,
        cp=args.context_parallel_size,
        dp=args.data_parallel_size,
        vp=args.virtual_pipeline_model_parallel_size or 1,
    )


def num_microbatches(args: argparse.Namespace) -> int:
    """megatron/core/num_microbatches_calculator.py ConstantNumMicroBatchesCalculator."""
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % per_step != 0:
        raise AssertionError(
            f"global batch size ({args.global_batch_size}) is not divisible by micro batch "
            f"size ({args.micro_batch_size}) times data parallel size "
            f"({args.data_parallel_size})"
        )
    return int(args.global_batch_size // per_step)


def padded_vocab_size(args: argparse.Namespace) -> int:
    """Build the tokenizer (NullTokenizer: V + 1 with EOD) and pad as Megatron does."""
    if args.tokenizer_type == "NullTokenizer":
        if args.vocab_size is None:
            raise AssertionError
        vocab = args.vocab_size + 1
    elif args.tokenizer_type in (None, "GPT2BPETokenizer"):
        if args.vocab_file is None or args.merge_file is None:
            raise AssertionError
        vocab = 50257
    else:
        vocab = args.vocab_size or 32000
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return int(((vocab + multiple - 1) // multiple) * multiple)


def transformer_config(args: argparse.Namespace) -> None:
    """TransformerConfig.__post_init__ and the linear layers' divide() checks."""
    tp, layers_per_rank = args.tensor_model_parallel_size, 0
    if args.num_attention_heads % tp != 0:
        raise ValueError(
            f"num_attention_heads ({args.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})."
        )
    if args.num_query_groups % tp != 0:
        raise ValueError(
            f"num_query_groups ({args.num_query_groups}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})."
        )
    if args.recompute_granularity == "full":
        layers_per_rank = args.num_layers // args.pipeline_model_parallel_size
        if args.recompute_method is None:
            raise ValueError(
                f"Using recompute_granularity: {args.recompute_granularity} so recompute_method "
                'must be "block" or "uniform"'
            )
        if args.recompute_num_layers is None or not (
            1 <= args.recompute_num_layers <= layers_per_rank
        ):
            raise ValueError(
                f"When using recompute_granularity: {args.recompute_granularity} "
                "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank: "
                f"{layers_per_rank}"
            )
    elif args.recompute_granularity == "selective" and args.recompute_num_layers is not None:
        raise ValueError(
            f"When using recompute_granularity: {args.recompute_granularity} "
            "recompute_num_layers must be None."
        )
    _recompute_modules_config(args)
    if args.ffn_hidden_size % tp != 0:
        raise AssertionError(f"{args.ffn_hidden_size} is not divisible by {tp}")
    _moe_config(args)


_RECOMPUTE_MODULES = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"
)  # fmt: skip


def _te_at_least(version: str) -> bool:
    """``is_te_min_version``: the stand-in's Transformer Engine is TUNER_STANDIN_TE_VERSION."""
    have = os.environ.get("TUNER_STANDIN_TE_VERSION", "2.8.0")

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", text.split("dev")[0])[:3])

    return parts(have) >= parts(version)


def _recompute_modules_config(args: argparse.Namespace) -> None:
    """TransformerConfig.__post_init__'s recompute_modules checks (core_v0.15), in its order."""
    if args.recompute_modules is None:
        args.recompute_modules = ["core_attn"]
    modules = args.recompute_modules
    if args.recompute_granularity == "selective":
        invalid = set(modules) - set(_RECOMPUTE_MODULES)
        if modules and invalid:
            raise AssertionError(
                f"Invalid choices for recompute_modules: {invalid}. "
                f"Allowed modules are: {set(_RECOMPUTE_MODULES)}"
            )
        if "moe_act" in modules and not args.moe_grouped_gemm:
            raise ValueError(
                "moe_act in recompute_modules is only supported with moe_grouped_gemm."
            )
        if "mla_up_proj" in modules and not args.multi_latent_attention:
            raise ValueError(
                "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
            )
        if "shared_experts" in modules and (
            args.moe_shared_expert_intermediate_size is not None and args.moe_shared_expert_overlap
        ):
            raise ValueError(
                "shared_experts recompute cannot work with --moe-shared-expert-overlap."
            )
        if args.fp8 and ("moe_act" in modules or "layernorm" in modules):
            if args.fp8_recipe == "delayed":
                raise ValueError(
                    "Delayed scaling does not support moe_act and layernorm recompute for fp8."
                )
            if not _te_at_least("2.6.0dev0"):
                raise ValueError(
                    "moe_act and layernorm recompute for fp8 needs transformer-engine>=2.6.0dev0, "
                    f"but your version is {os.environ.get('TUNER_STANDIN_TE_VERSION')}."
                )
    if args.moe_layer_recompute:
        print(
            "UserWarning: --moe-layer-recompute is deprecated. Use --recompute-granularity "
            "selective --recompute-modules moe_layer instead.",
            file=sys.stderr,
        )
        if args.recompute_granularity == "full":
            raise ValueError("Do not set --moe-layer-recompute with full recompute granularity. ")
        args.recompute_granularity = "selective"
        if "moe" not in modules:
            modules.append("moe")


def _moe_config(args: argparse.Namespace) -> None:
    """TransformerConfig's MoE checks, the experts' divide() and MoELayer.forward's SP check."""
    if args.num_experts is None:
        if args.moe_ffn_hidden_size is not None:
            raise AssertionError("moe_ffn_hidden_size must be None when num_experts is not set.")
        return
    if args.moe_enable_deepep and args.moe_token_dispatcher_type != "flex":
        raise ValueError("DeepEP backend is only supported with flex token dispatcher.")
    if args.moe_token_dispatcher_type == "flex" and args.moe_pad_expert_input_to_capacity:
        raise ValueError("Flex token dispatcher does not support moe_pad_expert_input_to_capacity")
    if args.moe_pad_expert_input_to_capacity and args.moe_expert_capacity_factor is None:
        raise ValueError(
            "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity"
        )
    if (
        args.moe_router_topk == 1
        and args.moe_router_score_function == "softmax"
        and not args.moe_router_pre_softmax
        and args.moe_router_load_balancing_type != "sinkhorn"
    ):
        raise ValueError("Please use --moe-router-pre-softmax when topk is 1.")
    if isinstance(args.moe_layer_freq, list) and len(args.moe_layer_freq) != args.num_layers:
        raise AssertionError(
            f"Invalid length of moe_layer_pattern: {len(args.moe_layer_freq)}, expected "
            f"{args.num_layers}, current moe layer pattern: {args.moe_layer_freq}"
        )
    if args.moe_ffn_hidden_size is None:  # transformer_config.py: the same default, again
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    tp = args.tensor_model_parallel_size
    etp = args.expert_tensor_parallel_size or tp
    if args.moe_ffn_hidden_size % etp != 0:
        raise AssertionError(f"{args.moe_ffn_hidden_size} is not divisible by {etp}")
    if args.moe_token_dispatcher_type == "flex" and etp * args.expert_model_parallel_size <= 1:
        raise AssertionError("Flex token dispatcher requires TPxEP > 1")
    if tp > 1 and not args.sequence_parallel:
        raise ValueError(
            "During training, performance may degrade if MoE and tensor parallelism"
            "are enabled without also enabling sequence parallelism."
        )


# --------------------------------------------------------------------------------------------
# Model arithmetic (approximate parameter counts; Megatron's model-FLOPs formula, §1f)


def layer_params(args: argparse.Namespace) -> int:
    """Parameters of one transformer layer (whole, before tensor parallelism)."""
    h, kv = args.hidden_size, args.kv_channels
    qkv = h * kv * (args.num_attention_heads + 2 * args.num_query_groups)
    proj = kv * args.num_attention_heads * h
    mlp = h * args.ffn_hidden_size * (3 if args.swiglu else 2)
    norms = 2 * h * (1 if args.normalization == "RMSNorm" else 2)
    if getattr(args, "num_experts", None) is not None:  # all layers MoE (ignores layer freq)
        experts = args.num_experts * (args.moe_ffn_hidden_size or args.ffn_hidden_size)
        shared = args.moe_shared_expert_intermediate_size or 0
        mlp = h * (experts + shared) * (3 if args.swiglu else 2) + h * args.num_experts
    return int(qkv + proj + mlp + norms)


def expert_params(args: argparse.Namespace) -> int:
    """Routed-expert parameters of one layer (0 for a dense model)."""
    if getattr(args, "num_experts", None) is None:
        return 0
    width = args.moe_ffn_hidden_size or args.ffn_hidden_size
    return int(args.num_experts * width * args.hidden_size * (3 if args.swiglu else 2))


def stage_params(args: argparse.Namespace, vocab: int, pp_rank: int) -> int:
    """Parameters held by one (tensor, pipeline) rank."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    count = layer_params(args) * (args.num_layers // pp) // tp
    embedding = vocab * args.hidden_size // tp
    if pp_rank == 0:
        count += embedding
        if args.position_embedding_type == "learned_absolute":
            count += args.max_position_embeddings * args.hidden_size
    if pp_rank == pp - 1:
        count += embedding if (args.untie_embeddings_and_output_weights or pp > 1) else 0
        count += args.hidden_size
    return int(count)


def model_flops(args: argparse.Namespace, vocab: int) -> float:
    """FLOPs of one iteration as Megatron counts them (recompute not included)."""
    b, s, h = args.global_batch_size, args.seq_length, args.hidden_size
    a, g, layers = args.num_attention_heads, args.num_query_groups, args.num_layers
    gated = 1.5 if args.swiglu else 1.0
    mlp = 12 * layers * h * args.ffn_hidden_size * gated
    attention = 12 * layers * h * h * ((1 + g / a + s / (2 * h)) * (args.kv_channels * a / h))
    return float(b * s * (mlp + attention + 6 * h * vocab))


# --------------------------------------------------------------------------------------------
# Response surface


@dataclasses.dataclass(frozen=True)
class Point:
    """What the surface says about one configuration."""

    step_s: float
    memory_gib: float
    tflops: float | None
    behaviour: dict[str, Any] | None


def surface_variables(args: argparse.Namespace, topo: Topology, vocab: int) -> dict[str, Any]:
    """The variables a surface sees (see the module docstring)."""
    return {
        "tp": topo.tp,
        "pp": topo.pp,
        "cp": topo.cp,
        "vp": topo.vp,
        "dp": topo.dp,
        "world": topo.world,
        "mbs": args.micro_batch_size,
        "gbs": args.global_batch_size,
        "microbatches": args.global_batch_size // (args.micro_batch_size * topo.dp),
        "recompute": args.recompute_granularity or "none",
        "recompute_modules": (
            "+".join(getattr(args, "recompute_modules", None) or ())
            if args.recompute_granularity == "selective"
            else ""
        ),
        "sp": int(bool(args.sequence_parallel)),
        "distopt": int(bool(args.use_distributed_optimizer)),
        "ep": getattr(args, "expert_model_parallel_size", 1),
        "experts": getattr(args, "num_experts", None) or 0,
        "zero": int(getattr(args, "zero_stage", 0)),
        "layers": args.num_layers,
        "hidden": args.hidden_size,
        "heads": args.num_attention_heads,
        "seq": args.seq_length,
        "ffn": args.ffn_hidden_size,
        "vocab": vocab,
        "params": layer_params(args) * args.num_layers + vocab * args.hidden_size,
        "expert_params": expert_params(args) * args.num_layers,
        "flops": model_flops(args, vocab),
    }


def config_key(v: dict[str, Any]) -> str:
    """``tp=2,pp=4,cp=1,vp=1,mbs=2,recompute=selective,sp=1,distopt=1``."""
    names = ("tp", "pp", "cp", "vp", "mbs", "recompute", "sp", "distopt")
    return ",".join(f"{name}={v[name]}" for name in names)


def evaluate(expr: Any, v: dict[str, Any]) -> float:
    """A surface ``<expr>``: a number or ``{base, terms, factors, powers}``."""
    if isinstance(expr, int | float):
        return float(expr)
    value = float(expr.get("base", 0.0))
    value += sum(float(c) * float(v[name]) for name, c in expr.get("terms", {}).items())
    for name, table in expr.get("factors", {}).items():
        value *= float(table.get(str(v[name]), 1.0))
    for name, exponent in expr.get("powers", {}).items():
        value *= float(v[name]) ** float(exponent)
    return value


def default_point(v: dict[str, Any]) -> dict[str, Any]:
    """The built-in surface: a plausible shape when no surface is configured."""
    bubble = 1 + (v["pp"] - 1) / (v["microbatches"] * v["vp"])
    recompute = {"none": 1.0, "selective": 1.03, "full": 1.33}[v["recompute"]]
    comm = 1 + 0.04 * (v["tp"] - 1) + 0.02 * (v["cp"] - 1)
    step = v["flops"] / (v["world"] * 150e12) * bubble * recompute * comm
    bytes_per_param = 6 + 12 / v["dp"] if v["distopt"] else 18
    dense = v["params"] - v.get("expert_params", 0)
    experts = v.get("expert_params", 0) / v.get("ep", 1)  # EP shards the experts
    weights = (dense + experts) / (v["tp"] * v["pp"]) * bytes_per_param
    s, b, h, a = v["seq"], v["mbs"], v["hidden"], v["heads"]
    per_layer = {"none": 34 + 5 * a * s / h, "selective": 34.0, "full": 2.0}[v["recompute"]]
    shard = v["tp"] * v["cp"] if (v["sp"] or v["recompute"] == "full") else v["cp"]
    inflight = min(v["pp"], v["microbatches"])
    activations = s * b * h * per_layer * (v["layers"] / v["pp"]) * inflight / shard
    return {"step_s": step, "memory_gib": (weights + activations) / 2**30}


class Surface:
    """The configured response surface (``TUNER_STANDIN_SURFACE``) or the built-in one."""

    def __init__(self, spec: dict[str, Any], function: Callable[..., Any] | None = None) -> None:
        self.spec = spec
        self.function = function
        self.gpu_memory_gib = float(spec.get("gpu_memory_gib", 80.0))
        self.oom_above = float(spec.get("oom_if_memory_above", self.gpu_memory_gib))
        self.warmup_factor = float(spec.get("warmup_factor", 1.5))
        self.noise = float(spec.get("noise", 0.01))

    @classmethod
    def from_env(cls) -> Surface:
        """Load from ``TUNER_STANDIN_SURFACE`` (JSON path or ``module:function``)."""
        where = os.environ.get("TUNER_STANDIN_SURFACE", "")
        if not where:
            return cls({"kind": "default"})
        target, _, name = where.rpartition(":")
        if target and name.isidentifier() and not os.path.isfile(where):
            return cls({"kind": "python"}, _load_function(target, name))
        with open(where, encoding="utf-8") as handle:
            spec = json.load(handle)
        if spec.get("kind") == "python":
            target, _, name = str(spec["function"]).rpartition(":")
            return cls(spec, _load_function(target, name))
        return cls(spec)

    def point(self, v: dict[str, Any]) -> Point:
        """Step time, peak memory, TFLOP/s and behaviour for one configuration."""
        key = config_key(v)
        entry = dict(self.spec.get("configs", {}).get(key, {}))
        if not entry and self.function is not None:
            entry = dict(self.function(dict(v)))
        if not entry and self.spec.get("kind") == "table":
            raise RuntimeError(f"stand-in surface has no entry for {key}")
        fallback = default_point(v) if self.spec.get("kind") == "default" else {}
        for name in ("step_s", "memory_gib", "tflops"):
            if name not in entry and name in self.spec:
                entry[name] = evaluate(self.spec[name], v)
            elif name not in entry and name in fallback:
                entry[name] = fallback[name]
        if "step_s" not in entry or "memory_gib" not in entry:
            raise RuntimeError(f"stand-in surface gives no step_s / memory_gib for {key}")
        tflops = entry.get("tflops")
        return Point(
            step_s=float(entry["step_s"]),
            memory_gib=float(entry["memory_gib"]),
            tflops=float(tflops) if tflops is not None else None,
            behaviour=entry.get("behaviour") or self._behaviour(v),
        )

    def _behaviour(self, v: dict[str, Any]) -> dict[str, Any] | None:
        for rule in self.spec.get("behaviours", []):
            when = rule.get("when", {})
            if all(str(v.get(name)) == str(value) for name, value in when.items()):
                return dict(rule)
        return None


def _load_function(target: str, name: str) -> Callable[..., Any]:
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location("tuner_standin_surface", target)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load surface module {target}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    function: Callable[..., Any] = getattr(module, name)
    return function


# --------------------------------------------------------------------------------------------
# Output


def _time_scale() -> float:
    """``TUNER_STANDIN_TIME_SCALE``: a number, or the path of a file holding one, read at every
    sleep (a test can then pace a study it interrupts and resume it unpaced: the study file,
    and so its fingerprint, stay the same)."""
    value = os.environ.get("TUNER_STANDIN_TIME_SCALE", "0.001")
    try:
        return float(value)
    except ValueError:
        with open(value) as f:
            return float(f.read())


def _now(micro: bool = False) -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S" + (".%f" if micro else ""))


def _sleep(seconds: float) -> None:
    scale = _time_scale()
    if seconds * scale > 0:
        time.sleep(seconds * scale)


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between Megatron-LM and a fork the stand-in plays (its flags, checks, lines).

    ``tests/standins/megatron_deepspeed/pretrain_gpt.py`` passes Megatron-DeepSpeed's.
    """

    build_parser: Callable[[], argparse.ArgumentParser]
    validate_args: Callable[[argparse.Namespace, int, int | None], Topology]
    model_checks: Callable[[argparse.Namespace], None]
    iteration_line: Callable[[Run, int, float], str]
    banner: tuple[str, ...] = ()
    memory_report: Callable[[Run, int], None] | None = None
    """The memory lines after the first logged iteration (None: Megatron-LM's MB report)."""


@dataclasses.dataclass
class Run:
    """One process's view of the job: which ranks it plays and what the surface says."""

    args: argparse.Namespace
    topo: Topology
    ranks: list[int]
    point: Point
    surface: Surface
    vocab: int
    key: str
    dialect: Dialect | None = None

    @property
    def first(self) -> bool:
        return 0 in self.ranks

    @property
    def last(self) -> bool:
        return self.topo.world - 1 in self.ranks

    def say(self, text: str, *, last: bool = False) -> None:
        """print_rank_0 (or print_rank_last with ``last``)."""
        if self.last if last else self.first:
            print(text, flush=True)

    def rank_memory_gib(self, rank: int) -> float:
        """The first pipeline stage holds the most in-flight activations: it peaks highest."""
        pp_rank = self.topo.coords(rank)[3]
        return self.point.memory_gib * (1 - 0.05 * pp_rank / max(1, self.topo.pp - 1))


def memory_report(run: Run, iteration: int) -> None:
    """``[Rank N] (after K iterations) memory (MB) | ...`` from every DP-rank-0 rank played."""
    for rank in run.ranks:
        if run.topo.coords(rank)[2] != 0:
            continue
        peak = round(run.rank_memory_gib(rank) * 2**30 / 512) * 512
        allocated = round(peak * 0.62 / 512) * 512
        reserved = float(math.ceil(peak * 1.06 / 2**21) * 2)
        print(
            f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: "
            f"{allocated / 2**20} | max allocated: {peak / 2**20} | reserved: {reserved} | "
            f"max reserved: {reserved}",
            flush=True,
        )


def iteration_line(run: Run, iteration: int, elapsed_s: float) -> str:
    """training_log()'s line, core_v0.15 format."""
    args = run.args
    iters = args.train_iters
    lr = (args.lr or 0.0) - ((args.lr or 0.0) - args.min_lr) * iteration / max(1, iters)
    loss = 2.0 + 9.0 * math.exp(-iteration / 40)
    if run.point.tflops is not None:
        tflops = run.point.tflops * run.point.step_s / elapsed_s
    else:
        tflops = model_flops(args, run.vocab) / (elapsed_s * 1e12 * run.topo.world)
    text = f" [{_now()}] iteration {iteration:8d}/{iters:8d} |"
    text += f" consumed samples: {iteration * args.global_batch_size:12d} |"
    text += f" elapsed time per iteration (ms): {elapsed_s * 1000:.1f} |"
    if args.log_throughput:
        text += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    text += f" learning rate: {lr:.6E} | global batch size: {args.global_batch_size:5d} |"
    text += f" lm loss: {loss:.6E} |"
    coeff = args.moe_aux_loss_coeff
    if args.num_experts is not None and (coeff[0] if isinstance(coeff, list) else coeff) > 0:
        # training.py track_moe_metrics: the summed aux loss over MoE layers / num layers
        text += f" load_balancing_loss: {1.0 + 0.1 * math.exp(-iteration / 20):.6E} |"
    text += f" loss scale: {65536.0 if args.fp16 else 1.0:.1f} |"
    text += f" grad norm: {1.0 + 4.0 * math.exp(-iteration / 10):.3f} |"
    return text + " number of skipped iterations:   0 | number of nan iterations:   0 |"


def validation_block(run: Run, iteration: int, where: str = "") -> None:
    """The framed validation-loss lines (print_rank_last)."""
    loss = 2.1 + 9.0 * math.exp(-iteration / 40)
    body = (
        f" validation loss at iteration {iteration}{where} | lm loss value: {loss:.6E} | "
        f"lm loss PPL: {math.exp(loss):.6E} | "
    )
    rule = "-" * (len(body) + 1)
    for text in (rule, body, rule):
        run.say(text, last=True)


# --------------------------------------------------------------------------------------------
# Failures


def out_of_memory(run: Run, rank: int) -> None:
    """Raise torch >= 2.5's OutOfMemoryError with its real message shape."""
    capacity = run.surface.gpu_memory_gib * 0.98875
    free_mib = 117.56
    in_use = capacity - free_mib / 1024
    allocated = in_use - 0.74
    wanted = max(0.02, run.rank_memory_gib(rank) - allocated)
    gpu = rank % int(os.environ.get("LOCAL_WORLD_SIZE", "8"))
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {wanted:.2f} GiB. GPU {gpu} has a total capacity "
        f"of {capacity:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch "
        f"memory, this process has {in_use:.2f} GiB memory in use. Of the allocated memory "
        f"{allocated:.2f} GiB is allocated by PyTorch, and 613.35 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def nccl_watchdog_abort(run: Run, sequence: int) -> None:
    """Wait out the process-group time-out, print the NCCL watchdog lines, abort (SIGABRT)."""
    timeout_ms = run.args.distributed_timeout_minutes * 60_000
    _sleep(timeout_ms / 1000)
    now = datetime.datetime.now()
    stamp = f"E{now:%m%d %H:%M:%S}.{now.microsecond * 1000:09d}"
    work = (
        f"WorkNCCL(SeqNum={sequence}, OpType=ALLREDUCE, NumelIn=466119168, "
        f"NumelOut=466119168, Timeout(ms)={timeout_ms}) ran for {timeout_ms + 61} milliseconds "
        "before timing out."
    )
    for rank in run.ranks:
        print(
            f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: {work}\n"
            f"[rank{rank}]:[{stamp} ProcessGroupNCCL.cpp:1664] [PG 1 Rank {rank}] Exception "
            f"(either an error or timeout) detected by watchdog at work: {sequence}, last "
            f"enqueued NCCL work: {sequence + 2}, last completed NCCL work: {sequence - 1}.",
            file=sys.stderr,
            flush=True,
        )
    rank = run.ranks[0]
    print(
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  [PG 1 Rank {rank}] Process group watchdog thread terminated with "
        f"exception: [Rank {rank}] Watchdog caught collective operation timeout: {work}",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.abort()


def hang_forever() -> None:
    """Block as a rank stuck in a collective does; SIGTERM ends it as it ends any Python."""
    while True:
        time.sleep(3600)


def misbehave(run: Run, behaviour: dict[str, Any], iteration: int) -> None:
    """Act out a surface behaviour at the start of ``iteration``."""
    kind = behaviour.get("kind")
    default_ranks = [0] if kind == "crash" else list(range(run.topo.world))
    mine = [r for r in run.ranks if r in behaviour.get("ranks", default_ranks)]
    if kind == "hang":
        hang_forever()
    if not mine or kind == "nccl_timeout":
        nccl_watchdog_abort(run, sequence=40 * iteration + 7)
    if kind == "oom":
        out_of_memory(run, mine[0])
    if kind == "crash":
        import builtins

        exception = getattr(builtins, str(behaviour.get("exception", "RuntimeError")))
        if not (isinstance(exception, type) and issubclass(exception, Exception)):
            exception = RuntimeError
        raise exception(behaviour.get("message", "CUDA error: an illegal memory access was "
                                                 "encountered"))  # fmt: skip
    raise RuntimeError(f"unknown stand-in behaviour {kind!r}")


# --------------------------------------------------------------------------------------------
# The run


def noise_source(run: Run) -> Iterator[float]:
    """Deterministic multiplicative noise, seeded by the configuration key."""
    seed = run.key + os.environ.get("TUNER_STANDIN_NOISE_SEED", "")
    rng = random.Random(int(hashlib.sha256(seed.encode()).hexdigest()[:16], 16))
    while True:
        yield 1.0 + rng.uniform(-run.surface.noise, run.surface.noise)


def train_step(run: Run, iteration: int, noise: Iterator[float]) -> float:
    """One iteration: fail if the surface says so, else sleep (scaled); returns seconds."""
    behaviour = run.point.behaviour
    if behaviour and iteration == int(behaviour.get("after_iterations", 0)) + 1:
        misbehave(run, behaviour, iteration)
    if iteration == 1:
        over = [r for r in range(run.topo.world) if run.rank_memory_gib(r) > run.surface.oom_above]
        mine = [r for r in run.ranks if r in over]
        if mine:
            out_of_memory(run, mine[0])
        if over:
            nccl_watchdog_abort(run, sequence=7)
    elapsed = run.point.step_s * next(noise)
    if iteration == 1:
        elapsed *= run.surface.warmup_factor
    _sleep(elapsed)
    return elapsed


def train(run: Run, start: float) -> int:
    """The training loop: iteration lines every --log-interval, one memory report."""
    args, noise, interval, reported = run.args, noise_source(run), [], False
    iteration = 0
    for iteration in range(1, (args.train_iters or 0) + 1):
        interval.append(train_step(run, iteration, noise))
        if iteration % args.log_interval == 0:
            line = run.dialect.iteration_line if run.dialect else iteration_line
            run.say(line(run, iteration, sum(interval) / len(interval)), last=True)
            interval = []
            if not reported:
                report = run.dialect.memory_report if run.dialect else None
                (report or memory_report)(run, iteration)
                reported = True
        if args.eval_iters and args.eval_interval and iteration % args.eval_interval == 0:
            validation_block(run, iteration)
        if args.save and args.save_interval and iteration % args.save_interval == 0:
            run.say(f"saving checkpoint at iteration {iteration:7d} to {args.save} in "
                    f"{args.ckpt_format} format")  # fmt: skip
        if args.exit_interval and iteration % args.exit_interval == 0:
            run.say(f"[exiting program at iteration {iteration}] datetime: {_now()} ")
            break
        minutes = (time.time() - start) / 60
        if args.exit_duration_in_mins and minutes > args.exit_duration_in_mins:
            run.say(f"[exiting program after {minutes} minutes] datetime: {_now()} ")
            break
    return iteration


def startup(
    args: argparse.Namespace, world: int, rank: int | None, start: float, dialect: Dialect
) -> Run:
    """initialize_megatron + setup_model_and_optimizer + dataloaders, with their prints."""
    topo = dialect.validate_args(args, world, rank)
    ranks = list(range(world)) if rank is None else [rank]

    def say(text: str) -> None:
        if 0 in ranks:
            print(text, flush=True)

    say("> initializing torch distributed ...")
    say(f"> initialized tensor model parallel with size {topo.tp}")
    say(f"> initialized pipeline model parallel with size {topo.pp}")
    say(f"> setting random seeds to {args.seed} ...")
    microbatches = num_microbatches(args)
    say(f"setting number of microbatches to constant {microbatches}")
    say(f"> building {args.tokenizer_type or 'GPT2BPETokenizer'} tokenizer ...")
    vocab = padded_vocab_size(args)
    raw = args.vocab_size + 1 if args.tokenizer_type == "NullTokenizer" else vocab
    say(f" > padded vocab (size: {raw}) with {vocab - raw} dummy tokens (new size: {vocab})")
    say(f"time to initialize megatron (seconds): {time.time() - start:.3f}")
    say(f"[after megatron is initialized] datetime: {_now()} ")
    say("building GPT model ...")
    dialect.model_checks(args)
    for text in dialect.banner:
        say(text)
    for r in ranks:
        tp_rank, cp_rank, dp_rank, pp_rank = topo.coords(r)
        if dp_rank == 0 and cp_rank == 0:
            count = stage_params(args, vocab, pp_rank)
            print(
                " > number of parameters on (tensor, pipeline) model parallel rank "
                f"({tp_rank}, {pp_rank}): {count}",
                flush=True,
            )
    say(f"[after model, optimizer, and learning rate scheduler are built] datetime: {_now()} ")
    say("> building train, validation, and test datasets for GPT ...")
    say(f"[after dataloaders are built] datetime: {_now()} ")
    say("done with setup ...")
    surface = Surface.from_env()
    variables = surface_variables(args, topo, vocab)
    point = surface.point(variables)
    return Run(args, topo, ranks, point, surface, vocab, config_key(variables), dialect)


MEGATRON = Dialect(build_parser, validate_args, transformer_config, iteration_line)


def pretrain(argv: list[str] | None = None, dialect: Dialect = MEGATRON) -> int:
    """pretrain_gpt.py's main: parse, validate, set up, train, evaluate."""
    start = time.time()
    if os.environ.get("TUNER_STANDIN_IGNORE_SIGTERM"):
        # a rank stuck in a CUDA call or a collective does not act on SIGTERM: only SIGKILL
        # after the executor's grace period ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    args = dialect.build_parser().parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ["RANK"]) if "RANK" in os.environ else None
    run = startup(args, world, rank, start, dialect)
    run.say("training ...")
    run.say(f"[before the start of training step] datetime: {_now()} ")
    iteration = train(run, start) if not args.skip_train else 0
    run.say(f"[after training is done] datetime: {_now()} ")
    if args.eval_iters and iteration:
        validation_block(run, iteration, " on validation set")
        validation_block(run, iteration, " on test set")
    return 0


if __name__ == "__main__":
    sys.exit(pretrain())
