"""A stand-in for Megatron-Bridge's ``scripts/training/run_recipe.py`` (v0.6.0): no GPU, no torch,
no Bridge.

Run it as Bridge's is run: ``torchrun ... run_recipe.py --recipe NAME [--mode pretrain]
[--dataset mock] [-tp N ...] section.field=value ...``. The trailing overrides are checked
against the field table of Bridge v0.6.0's config dataclasses (``../../fields.json``, written by
``tools/bridge_fields.py`` from the pinned source): an unknown section or field fails as Bridge's
Hydra override step does in struct mode (``OverridesError: Failed to parse Hydra overrides: Could
not override ...``), and a value the field's annotation cannot hold fails too (the stand-in is
stricter than OmegaConf here, on purpose: it catches a mistyped rendering). ``+key=value`` adds and
``~key`` deletes, as in Hydra.

A small registry of real recipe names gives the recipe's own values (model shape, parallelism,
batch, ``comm_overlap``); benchmark recipes weak-scale the global batch when the world size
changes the data-parallel size and no override names ``train.global_batch_size``, as the real
script does (``_apply_benchmark_weak_scaling``). Then Megatron-Core's and Bridge's checks run with
their texts (``ConfigContainer.get_data_parallel_size``, ``ModelParallelConfig.__post_init__``,
``ConfigContainer.validate``'s context-parallel check), the resolved config is handed to the
Megatron stand-in's machinery (``tests/standins/pretrain_gpt.py``: its response surface, its
Megatron-Core rules and texts, failures and environment variables), and the run prints Bridge's
lines (training/utils/train_utils.py ``training_log``): ``Step Time : ...s GPU utilization:
...MODEL_TFLOP/s/GPU``, the iteration line, and the ``memory (GB)`` report with the
``mem-*-gigabytes`` keys (GB = 1e9 bytes, ``report_memory``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve()
_BASE_PATH = _HERE.parents[3] / "pretrain_gpt.py"
_SPEC = importlib.util.spec_from_file_location("tuner_megatron_standin", _BASE_PATH)
assert _SPEC is not None and _SPEC.loader is not None
base: Any = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = base  # its dataclasses look their module up while being built
_SPEC.loader.exec_module(base)

FIELDS: dict[str, dict[str, str]] = {
    k: v for k, v in json.loads((_HERE.parents[2] / "fields.json").read_text()).items()
    if not k.startswith("_")
}  # fmt: skip

_LLAMA3_8B = {
    # recipes/llama/llama3.py (Llama3ModelProvider8B) and perf_recipes/llama/h100/llama3.py
    "model.num_layers": 32, "model.hidden_size": 4096, "model.ffn_hidden_size": 14336,
    "model.num_attention_heads": 32, "model.num_query_groups": 8, "model.vocab_size": 128256,
    "dataset.seq_length": 8192, "model.tensor_model_parallel_size": 1,
    "model.pipeline_model_parallel_size": 1, "model.context_parallel_size": 2,
    "model.virtual_pipeline_model_parallel_size": None, "model.sequence_parallel": False,
    "train.global_batch_size": 128, "train.micro_batch_size": 1, "train.train_iters": 1168251,
    "mixed_precision": "bf16_mixed", "logger.log_interval": 10, "validation.eval_iters": 32,
    "validation.eval_interval": 2000, "ddp.use_distributed_optimizer": True,
    "optimizer.use_distributed_optimizer": True, "ddp.overlap_grad_reduce": True,
    "ddp.overlap_param_gather": True, "optimizer.overlap_param_gather": True,
    "dist.distributed_timeout_minutes": 10, "logger.log_throughput": False,
}  # fmt: skip
RECIPES: dict[str, dict[str, Any]] = {
    "llama3_8b_pretrain_config": {**_LLAMA3_8B, "comm_overlap": None},
    "llama3_8b_pretrain_8gpu_h100_bf16_config": {
        **_LLAMA3_8B, "comm_overlap.tp_comm_overlap": False, "_benchmark_gpus": 8,
    },
}  # fmt: skip
_SHORT = {
    "-ms": "train.train_iters",
    "-gb": "train.global_batch_size",
    "-mb": "train.micro_batch_size",
    "-sl": "dataset.seq_length",
    "-tp": "model.tensor_model_parallel_size",
    "-pp": "model.pipeline_model_parallel_size",
    "-cp": "model.context_parallel_size",
    "-vp": "model.virtual_pipeline_model_parallel_size",
    "-ep": "model.expert_model_parallel_size",
    "-etp": "model.expert_tensor_parallel_size",
}
# fmt: skip


class OverridesError(Exception):
    """megatron/bridge/training/utils/omegaconf_utils.py OverridesError."""


OverridesError.__module__ = "megatron.bridge.training.utils.omegaconf_utils"


def build_parser() -> argparse.ArgumentParser:
    """run_recipe.py ``_build_parser`` (the options a tuner trial and the tests use)."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    selection = parser.add_mutually_exclusive_group(required=True)
    selection.add_argument("--model")
    selection.add_argument("--recipe")
    parser.add_argument("--mode", choices=["pretrain", "sft", "lora", "dora"])
    parser.add_argument("--dataset", choices=["mock", "megatron-indexed"])
    for short, field in _SHORT.items():
        parser.add_argument(short, "--" + field.split(".")[1], dest=field, type=int)
    parser.add_argument("--dry-run", "--dry_run", action="store_true", dest="dryrun")
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Public arguments and the ordered overrides (``_collect_overrides``' checks and texts)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    overrides = [f"{f}={getattr(args, f)}" for f in _SHORT.values() if getattr(args, f)]
    for value in unknown:
        if value.startswith("-"):
            parser.error(f"Unknown option: {value}")
        if "=" not in value and not value.startswith("~"):
            parser.error(f"Expected override in KEY=VALUE form, got {value!r}")
        overrides.append(value)
    if args.mode is None and args.recipe and "_pretrain_" in args.recipe:
        args.mode = "pretrain"
    if args.mode != "pretrain":
        raise ValueError("the stand-in runs pretraining recipes only (--mode pretrain)")
    return args, overrides


def hydra_value(text: str) -> Any:
    """One override value: null, true/false, numbers, quoted strings, [a,b] lists, else text."""
    text = text.strip()
    if text == "null":
        return None
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return float(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    if text.startswith("[") and text.endswith("]"):
        return [hydra_value(t) for t in text[1:-1].split(",") if t.strip()]
    return text


def accepts(annotation: str, value: Any) -> bool:
    """Whether a field annotated ``annotation`` (source text) can hold ``value``."""
    if value is None:
        return "Optional" in annotation or "None" in annotation
    literals = re.findall(r"Literal\[([^\]]*)\]", annotation)
    if isinstance(value, bool):
        return "bool" in annotation
    if isinstance(value, int | float) and re.search(r"\b(int|float)\b", annotation):
        return isinstance(value, int) or "float" in annotation
    if isinstance(value, list):
        return bool(re.search(r"\b(List|list|tuple|Tuple)\b", annotation))
    if isinstance(value, str):
        if re.search(r"\bstr\b", annotation) or "PipelineParallelLayerLayout" in annotation:
            return True
        return any(repr(value) in lit or f'"{value}"' in lit for lit in literals)
    return False


def _struct_error(key: str, text: str) -> OverridesError:
    field = key.rsplit(".", 1)[-1]
    return OverridesError(
        f"Failed to parse Hydra overrides: Could not override '{key}'.\nTo append to your "
        f"config use +{key}={text}\nKey '{field}' is not in struct\n    full_key: {key}"
    )


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> set[str]:
    """Apply ``overrides`` to the recipe's flattened ``values``; returns the keys named."""
    named: set[str] = set()
    for item in overrides:
        add, delete = item.startswith("+"), item.startswith("~")
        key, _, text = item.lstrip("+~").partition("=")
        section, _, field = key.partition(".")
        named.add(key)
        if delete:
            values.pop(key, None)
            continue
        value = hydra_value(text)
        if key == "mixed_precision":  # a recipe name (mixed_precision.py registers them)
            if value is not None and not isinstance(value, str):
                raise OverridesError(f"Failed to parse Hydra overrides: bad {item!r}")
            values[key] = value
            continue
        if section == "comm_overlap" and values.get("comm_overlap", 0) is None and not add:
            raise _struct_error(key, text)  # the recipe's comm_overlap is None
        annotation = FIELDS.get(section, {}).get(field)
        if annotation is None and not add:
            raise _struct_error(key, text)
        if annotation is not None and not accepts(annotation, value):
            raise OverridesError(
                f"Failed to parse Hydra overrides: Value '{text}' of {key} could not be "
                f"converted to {annotation}\n    full_key: {key}"
            )
        values[key] = value
    return named


def weak_scale(values: dict[str, Any], named: set[str], world: int) -> None:
    """``_apply_benchmark_weak_scaling``: keep samples per DP rank when DP differs."""
    gpus = values.get("_benchmark_gpus")
    if gpus is None or "train.global_batch_size" in named or "train" in named:
        return
    model = (
        values["model.tensor_model_parallel_size"]
        * values["model.pipeline_model_parallel_size"]
        * values["model.context_parallel_size"]
    )
    canonical, requested = gpus // model, world // model
    if requested and requested != canonical:
        scaled = values["train.global_batch_size"] * requested // canonical
        print(f"INFO:__main__:Weak scaled benchmark global batch size from "
              f"{values['train.global_batch_size']} to {scaled} for DP {canonical} -> "
              f"{requested}.", flush=True)  # fmt: skip
        values["train.global_batch_size"] = scaled


def core_checks(v: dict[str, Any], world: int) -> None:
    """The checks Bridge reaches before Megatron-Core's parallel state, with their texts."""
    tp, pp = v["model.tensor_model_parallel_size"], v["model.pipeline_model_parallel_size"]
    cp = v["model.context_parallel_size"]
    if world % (tp * pp * cp):  # training/config.py ConfigContainer.get_data_parallel_size
        raise AssertionError(
            f"\n        world size ({world}) is not divisible by total_model_size "
            f"(model_cfg.tensor_model_parallel_size={tp} * "
            f"model_cfg.pipeline_model_parallel_size={pp} * "
            f"model_cfg.context_parallel_size={cp})\n        "
        )
    if v.get("model.sequence_parallel") and tp <= 1:  # core model_parallel_config.py
        raise ValueError("Cannot use sequence parallelism without tensor parallelism")
    if cp > 1 and v["dataset.seq_length"] % (cp * 2):  # ConfigContainer.validate
        raise AssertionError(
            "Sequence length must be divisible by 2 * context parallel size if context "
            "parallel is used."
        )


def megatron_argv(v: dict[str, Any], dataset: str | None) -> list[str]:
    """The resolved config in the Megatron stand-in's flag names (the same Megatron-Core)."""
    flag = {
        "model.tensor_model_parallel_size": "--tensor-model-parallel-size",
        "model.pipeline_model_parallel_size": "--pipeline-model-parallel-size",
        "model.context_parallel_size": "--context-parallel-size",
        "model.virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
        "model.num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
        "model.num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
        "model.pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
        "train.micro_batch_size": "--micro-batch-size",
        "train.global_batch_size": "--global-batch-size",
        "model.recompute_granularity": "--recompute-granularity",
        "model.recompute_method": "--recompute-method",
        "model.recompute_num_layers": "--recompute-num-layers",
        "model.num_layers": "--num-layers", "model.hidden_size": "--hidden-size",
        "model.ffn_hidden_size": "--ffn-hidden-size",
        "model.num_attention_heads": "--num-attention-heads",
        "model.num_query_groups": "--num-query-groups", "dataset.seq_length": "--seq-length",
        "train.train_iters": "--train-iters", "validation.eval_iters": "--eval-iters",
        "logger.log_interval": "--log-interval",
        "dist.distributed_timeout_minutes": "--distributed-timeout-minutes",
        "model.expert_model_parallel_size": "--expert-model-parallel-size",
        "model.expert_tensor_parallel_size": "--expert-tensor-parallel-size",
        "model.num_moe_experts": "--num-experts", "model.moe_router_topk": "--moe-router-topk",
        "model.moe_ffn_hidden_size": "--moe-ffn-hidden-size",
        "model.moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    }  # fmt: skip
    switch = {
        "model.sequence_parallel": "--sequence-parallel",
        "model.tp_comm_overlap": "--tp-comm-overlap",
        "model.account_for_embedding_in_pipeline_split":
            "--account-for-embedding-in-pipeline-split",
        "model.account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
        "ddp.overlap_grad_reduce": "--overlap-grad-reduce",
        "logger.log_throughput": "--log-throughput",
        "model.moe_grouped_gemm": "--moe-grouped-gemm",
    }  # fmt: skip
    argv: list[str] = []
    for key, name in flag.items():
        if v.get(key) is not None:
            argv += [name, str(v[key])]
    argv += [name for key, name in switch.items() if v.get(key)]
    if v.get("model.recompute_modules") and v.get("model.recompute_granularity") == "selective":
        argv += ["--recompute-modules", *map(str, v["model.recompute_modules"])]
    # _validate_and_sync_distributed_optimizer_settings: either side on turns both on
    if v.get("ddp.use_distributed_optimizer") or v.get("optimizer.use_distributed_optimizer"):
        argv.append("--use-distributed-optimizer")
    if v.get("ddp.overlap_param_gather") or v.get("optimizer.overlap_param_gather"):
        argv.append("--overlap-param-gather")
    precision = v.get("mixed_precision")
    argv += {"bf16_mixed": ["--bf16"], "fp16_mixed": ["--fp16"], None: []}[precision]
    if v["model.num_query_groups"] != v["model.num_attention_heads"]:
        argv.append("--group-query-attention")
    argv += ["--max-position-embeddings", str(v["dataset.seq_length"]), "--swiglu",
             "--normalization", "RMSNorm", "--position-embedding-type", "rope",
             "--untie-embeddings-and-output-weights", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", str(v["model.vocab_size"] - 1), "--lr", "3e-4"]  # fmt: skip
    return argv + (["--mock-data"] if dataset in ("mock", None) else ["--data-path", "data"])


def iteration_line(run: Any, iteration: int, elapsed_s: float) -> str:
    """train_utils.py training_log: rank 0's ``Step Time`` line, then the iteration line."""
    tflops = base.model_flops(run.args, run.vocab) / (elapsed_s * 1e12 * run.topo.world)
    if run.point.tflops is not None:
        tflops = run.point.tflops * run.point.step_s / elapsed_s
    run.say(f"Step Time : {elapsed_s:.2f}s GPU utilization: {tflops:.1f}MODEL_TFLOP/s/GPU")
    return str(base.iteration_line(run, iteration, elapsed_s))


def memory_report(run: Any, iteration: int) -> None:
    """``[Rank N] (after K iterations) memory (GB) | mem-...-gigabytes: ...`` (GB = 1e9 B, five
    significant digits, train_utils.py report_memory), from every DP-rank-0 rank played."""

    def gb(value: float) -> float:
        return round(value, -int(math.floor(math.log10(abs(value)))) + 4) if value else 0.0

    for rank in run.ranks:
        if run.topo.coords(rank)[2] != 0:
            continue
        peak = run.rank_memory_gib(rank) * 2**30
        stats = {
            "mem-allocated-gigabytes": peak * 0.62,
            "mem-max-allocated-gigabytes": peak,
            "mem-reserved-gigabytes": peak * 1.06,
            "mem-max-reserved-gigabytes": peak * 1.06,
        }
        text = " | ".join(f"{k}: {gb(b / 1e9)}" for k, b in stats.items())  # fmt: skip
        print(f"[Rank {rank}] (after {iteration} iterations) memory (GB) | {text} | "
              "mem-alloc-retires: 0", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Load the recipe, apply the overrides, check, and run the Megatron stand-in's loop."""
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    name = args.recipe or f"{args.model}_pretrain_config"
    if name not in RECIPES:
        raise ValueError(f"Unknown recipe: {name!r} (stand-in recipes: {sorted(RECIPES)})")
    values = dict(RECIPES[name])
    named = apply_overrides(values, overrides)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    weak_scale(values, named, world)
    core_checks(values, world)
    dialect = base.Dialect(base.build_parser, base.validate_args, base.transformer_config,
                           iteration_line, memory_report=memory_report)  # fmt: skip
    return int(base.pretrain(megatron_argv(values, args.dataset), dialect))


if __name__ == "__main__":
    sys.exit(main())
