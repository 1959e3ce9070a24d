"""The Megatron-Bridge stand-in recipe script: only v0.6.0's real override keys and types,
Megatron-Core's and Bridge's checks with their texts, the benchmark recipes' weak scaling of the
global batch, and Bridge's log lines, which tuner's parser reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tuner.logs import parse_log
from tuner.outcome import Outcome

STANDIN = Path(__file__).resolve().parent / "megatron_bridge" / "scripts" / "training"
SCRIPT = STANDIN / "run_recipe.py"
BASE = [
    "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=1",
    "model.context_parallel_size=1", "model.num_layers=4", "model.hidden_size=512",
    "model.ffn_hidden_size=2048", "model.num_attention_heads=8", "model.num_query_groups=8",
    "dataset.seq_length=256", "train.micro_batch_size=1", "train.train_iters=3",
    "logger.log_interval=1", "validation.eval_iters=0",
]  # fmt: skip


def _run(*overrides: str, recipe: str = "llama3_8b_pretrain_config", world: int = 4,
         base: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = ["--recipe", recipe, "--dataset", "mock", *(BASE if base else []), *overrides]
    env = dict(os.environ, WORLD_SIZE=str(world), TUNER_STANDIN_TIME_SCALE="0",
               CUDA_DEVICE_MAX_CONNECTIONS="1")  # fmt: skip
    env.pop("RANK", None)
    return subprocess.run([sys.executable, str(SCRIPT), *argv], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_runs_and_prints_bridges_lines() -> None:
    done = _run("train.global_batch_size=8", "logger.log_throughput=false")
    assert done.returncode == 0, done.stderr
    assert "MODEL_TFLOP/s/GPU" in done.stdout and "memory (GB) | mem-allocated-gigabytes" in (
        done.stdout
    )
    metrics = parse_log(done.stdout, "megatron-bridge", warmup=1)
    assert metrics.outcome is Outcome.OK and metrics.iterations == 3
    assert metrics.tflops_per_gpu is not None  # from the Step Time lines: no throughput field


def test_an_unknown_field_fails_as_the_struct_override_does() -> None:
    done = _run("train.global_batch_size=8", "model.tensor_parallel_size=2")
    assert done.returncode == 1
    assert "OverridesError: Failed to parse Hydra overrides: Could not override " in done.stderr
    assert "'model.tensor_parallel_size'" in done.stderr
    assert _run("train.global_batch_size=8", "trainer.max_steps=2").returncode == 1


def test_a_value_of_the_wrong_type_fails() -> None:
    done = _run("train.global_batch_size=8", "model.sequence_parallel=yes")
    assert done.returncode == 1 and "could not be converted" in done.stderr
    assert _run("train.global_batch_size=8", "model.recompute_method=sometimes").returncode == 1
    assert _run("train.global_batch_size=8", "+model.new_field=1").returncode == 0  # + adds


def test_megatron_core_rules_with_their_texts() -> None:
    sp = _run("train.global_batch_size=8", "model.tensor_model_parallel_size=1",
              "model.sequence_parallel=true")  # fmt: skip
    assert "ValueError: Cannot use sequence parallelism without tensor parallelism" in sp.stderr
    world = _run("train.global_batch_size=8", "model.tensor_model_parallel_size=3")
    assert "world size (4) is not divisible by total_model_size" in world.stderr
    heads = _run("train.global_batch_size=8", "model.tensor_model_parallel_size=4",
                 "model.num_attention_heads=2", "model.num_query_groups=2")  # fmt: skip
    assert "num_attention_heads (2) must be a multiple of tensor_model_parallel_size (4)" in (
        heads.stderr
    )
    batch = _run("train.global_batch_size=7")
    assert "global batch size (7) is not divisible by micro batch size (1)" in batch.stderr


def test_benchmark_recipe_weak_scales_an_unset_global_batch() -> None:
    recipe = "llama3_8b_pretrain_8gpu_h100_bf16_config"
    scaled = _run("model.context_parallel_size=2", recipe=recipe, world=4, base=False)
    # canonical: 8 GPUs / cp 2 = DP 4, batch 128; here 4 GPUs: DP 2, so 64
    assert "Weak scaled benchmark global batch size from 128 to 64 for DP 4 -> 2." in (
        scaled.stdout
    )
    kept = _run("model.context_parallel_size=2", "train.global_batch_size=128", recipe=recipe,
                world=4, base=False, )  # fmt: skip
    assert "Weak scaled" not in kept.stdout
    # 128 (64) samples / (micro-batch 1 x DP 2); the full 8B model then runs out of memory on
    # the stand-in's built-in surface, after the batch was set up
    assert "setting number of microbatches to constant 64" in kept.stdout
    assert "setting number of microbatches to constant 32" in scaled.stdout


def test_comm_overlap_overrides_need_the_recipes_section() -> None:
    done = _run("train.global_batch_size=8", "comm_overlap.tp_comm_overlap=false")
    assert done.returncode == 1 and "Could not override 'comm_overlap.tp_comm_overlap'" in (
        done.stderr
    )
