"""The Megatron-DeepSpeed stand-in: the fork's flags (and no Megatron-LM-only ones), its checks and
its iteration line, which tuner's parser reads as the fork's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tuner.logs import parse_log
from tuner.outcome import Outcome

STANDIN = Path(__file__).resolve().parent / "megatron_deepspeed" / "pretrain_gpt.py"


def _run(tmp: Path, *extra: str, world: int = 8, **ds: object) -> subprocess.CompletedProcess[str]:
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
              "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1},
              "bf16": {"enabled": True}, **ds}  # fmt: skip
    (tmp / "ds.json").write_text(json.dumps(config))
    argv = [
        "--deepspeed", "--deepspeed_config", str(tmp / "ds.json"),
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--micro-batch-size", "2", "--global-batch-size", "16", "--zero-stage", "1", "--bf16",
        "--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8",
        "--seq-length", "256", "--max-position-embeddings", "256",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--train-iters", "4",
        "--log-interval", "1", "--data-path", "prefix", "--lr", "1e-4", *extra,
    ]  # fmt: skip
    env = dict(os.environ, WORLD_SIZE=str(world), TUNER_STANDIN_TIME_SCALE="0")
    env.pop("RANK", None)
    return subprocess.run([sys.executable, str(STANDIN), *argv], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_prints_the_forks_lines(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "using world size: 8, data-parallel-size: 2, sequence-parallel size: 1" in out
    assert "DeepSpeed Final Optimizer = DeepSpeedZeroOptimizer" in out  # no fp32 accumulation
    line = next(x for x in out.splitlines() if x.startswith(" iteration        4/       4 |"))
    for key in ("consumed tokens:", "actual seqlen:", "samples per second:", "TFLOPs:"):
        assert key in line
    assert "throughput per GPU" not in line  # Megatron-LM's field, not the fork's
    m = parse_log(out, "megatron-deepspeed", warmup=1)
    assert m.outcome is Outcome.OK and m.iterations == 4 and m.tflops_includes_recompute


def test_bf16_with_fp32_accumulation_gets_the_bf16_optimizer(tmp_path: Path) -> None:
    done = _run(tmp_path, data_types={"grad_accum_dtype": "fp32"})
    assert "DeepSpeed Final Optimizer = BF16_Optimizer" in done.stdout


def test_rejects_megatron_lm_only_flags_and_what_the_fork_refuses(tmp_path: Path) -> None:
    done = _run(tmp_path, "--mock-data")
    assert done.returncode == 2 and "unrecognized arguments: --mock-data" in done.stderr
    done = _run(tmp_path, "--no-pipeline-parallel")
    assert done.returncode == 1
    assert "pipeline_model_parallel_size must be 1 if pipeline parallel is disabled" in done.stderr
    done = _run(tmp_path, "--num-key-value-heads", "3")
    assert "num_attention_heads must be divisible by num_key_value_heads" in done.stderr
    done = _run(tmp_path, world=6)
    assert "world size (6) is not divisible by tensor parallel size (2) times pipeline" in (
        done.stderr
    )
    done = _run(tmp_path, train_batch_size=32)
    assert "train_batch_size is not equal to micro_batch_per_gpu" in done.stderr
