"""The ``megatron_deepspeed_gpt`` template: golden scripts and ds_configs for TP 4 x PP 6 with an
uneven split, the fork's flag spellings, and the rendered script run on the fork's stand-in.

Re-record the golden files after an intended change with ``TUNER_REGOLD=1 pytest tests/launch``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.launch.test_templates import check_golden
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.config.rules import validate
from tuner.launch.megatron_flags import megatron_deepspeed_parallel_flags, parallel_args
from tuner.launch.templates import RenderedLaunch, render_launch
from tuner.logs import parse_log
from tuner.outcome import Outcome
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standins" / "megatron_deepspeed"
HOSTS = [f"gpu{i:03d}" for i in range(1, 7)]  # 6 nodes x 8 GPUs = TP 4 x PP 6 x DP 2


def study(**launch: Any) -> StudySpec:
    return study_from_mapping(
        {
            "name": "golden",
            # 40 layers over 6 stages: DeepSpeed's partition is uneven whatever the method
            "model": {"num_layers": 40, "hidden_size": 5120, "ffn_hidden_size": 20480,
                      "num_attention_heads": 40, "vocab_size": 50257, "seq_length": 2048},
            "training": {"global_batch_size": 96, "precision": "bf16"},
            "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": HOSTS,
                        "executor": "ssh"},
            "framework": "megatron-deepspeed",
            "launch": {"template": "megatron_deepspeed_gpt", "python": "/opt/venv/bin/python",
                       "megatron_path": "/opt/Megatron-DeepSpeed", "env": {"NCCL_DEBUG": "WARN"},
                       "extra_args": ["--data-path", "/data/pile_text_document"], **launch},
        }
    )  # fmt: skip


CONFIGS = {
    # type:transformer (the fork's own): 7, 7, 7, 7, 6, 6 layers
    "tp4-pp6-even-zero1": ParallelConfig(
        tp=4, pp=6, dp=2, micro_batch_size=1, global_batch_size=96, zero_stage=1
    ),
    # partition by parameters: 6, 7, 7, 7, 7, 6 layers; full recompute, sequence parallel
    "tp4-pp6-parameters-sp-full": ParallelConfig(
        tp=4, pp=6, dp=2, sequence_parallel=True, micro_batch_size=2, global_batch_size=96,
        recompute="full", recompute_method="uniform", recompute_num_layers=1, zero_stage=1,
        pipeline_split="parameters",
    ),
}  # fmt: skip


def render(spec: StudySpec, cfg: ParallelConfig, tmp_path: Path, **kw: Any) -> RenderedLaunch:
    args: dict[str, Any] = {
        "hosts": HOSTS,
        "master_addr": "10.0.0.1",
        "master_port": 29501,
        "trial_dir": "/results/golden/trials/3",
        "cwd": tmp_path,
    }
    return render_launch(spec, cfg, **{**args, **kw})


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_golden(case: str, tmp_path: Path) -> None:
    spec, c = study(), CONFIGS[case]
    assert validate(c, spec.model, spec.world_size, spec.framework) == []
    assert len(set(stage_layers(spec.model, c, spec.framework))) > 1  # uneven
    out = render(spec, c, tmp_path)
    check_golden(f"megatron_deepspeed_gpt-{case}-node0.sh", out.scripts[0])
    check_golden(f"ds_config-mds-{case}.json", out.files["ds_config.json"])


def test_the_forks_flags() -> None:
    even = dict(megatron_deepspeed_parallel_flags(CONFIGS["tp4-pp6-even-zero1"],
                                                  "type:transformer"))  # fmt: skip
    assert even["--tensor-model-parallel-size"] == "4"
    assert even["--pipeline-model-parallel-size"] == "6" and even["--zero-stage"] == "1"
    assert "--pp-partition-method" not in even  # the fork's own partition: no flag
    assert "--no-pipeline-parallel" not in even
    words = parallel_args(CONFIGS["tp4-pp6-parameters-sp-full"], 40, "megatron-deepspeed")
    assert " ".join(words).count("--pp-partition-method parameters") == 1
    for word in ("--sequence-parallel", "--deepspeed-activation-checkpointing"):
        assert word in words
    assert "--recompute-granularity full --recompute-method uniform" in " ".join(words)
    flat = ParallelConfig(tp=2, dp=4, micro_batch_size=2, global_batch_size=16, zero_stage=3)
    words = parallel_args(flat, 40, "megatron-deepspeed")
    assert "--no-pipeline-parallel" in words and words[words.index("--zero-stage") + 1] == "3"
    for megatron_only in ("--context-parallel-size", "--use-distributed-optimizer", "--mock-data"):
        assert megatron_only not in words


def test_ds_config_has_no_optimizer_and_picks_bf16_optimizer(tmp_path: Path) -> None:
    ds = json.loads(
        render(study(), CONFIGS["tp4-pp6-even-zero1"], tmp_path).files["ds_config.json"]
    )
    assert "optimizer" not in ds and "pipeline" not in ds  # Megatron builds both
    assert ds["bf16"] == {"enabled": True} and ds["zero_optimization"] == {"stage": 1}
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}  # -> DeepSpeed's BF16_Optimizer
    assert ds["train_batch_size"] == 96 == ds["train_micro_batch_size_per_gpu"] * 48 * 2
    assert ds["wall_clock_breakdown"] is False  # it breaks the pipeline engine


FAKE_TORCHRUN = """#!{python}
import os, sys
argv = sys.argv[1:]
world = int(argv[argv.index("--nnodes") + 1]) * int(argv[argv.index("--nproc_per_node") + 1])
script = next(a for a in argv if a.endswith("pretrain_gpt.py"))
os.environ["WORLD_SIZE"] = str(world)
os.execv(sys.executable, [sys.executable, script, *argv[argv.index(script) + 1:]])
"""


def _run(tmp_path: Path, cfg: ParallelConfig, **launch: Any) -> subprocess.CompletedProcess[str]:
    """The rendered script of node 0, run with a torchrun that plays every rank in one process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    spec = study(python=str(bin_dir / "python"), megatron_path=str(STANDIN), **launch)
    trial = tmp_path / "trial"
    trial.mkdir(exist_ok=True)
    out = render(spec, cfg, tmp_path, trial_dir=str(trial))
    for name, text in out.files.items():
        (trial / name).write_text(text)
    (tmp_path / "launch.sh").write_text(out.scripts[0])
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TUNER_STANDIN_TIME_SCALE": "0",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.run(
        ["bash", str(tmp_path / "launch.sh")], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_the_stand_in_runs_the_rendered_script(case: str, tmp_path: Path) -> None:
    done = _run(tmp_path, CONFIGS[case], train_iters=6, warmup_iters=1)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DeepSpeed Final Optimizer = BF16_Optimizer" in done.stdout
    assert " TFLOPs: " in done.stdout and "tokens per gpu per second (tgs)" in done.stdout
    metrics = parse_log(done.stdout, "megatron-deepspeed", warmup=1)
    assert metrics.outcome is Outcome.OK
    assert metrics.iterations == 6 and metrics.step_time_s and metrics.step_time_s > 0
    assert metrics.tflops_includes_recompute is True  # the fork's TFLOPs field
    assert metrics.peak_memory_gib is not None


def test_the_stand_in_refuses_what_the_fork_refuses(tmp_path: Path) -> None:
    done = _run(tmp_path, CONFIGS["tp4-pp6-even-zero1"], extra_args=["--context-parallel-size",
                                                                      "2"])  # fmt: skip
    assert (
        done.returncode == 2 and "unrecognized arguments: --context-parallel-size" in done.stderr
    )
    zero2 = ParallelConfig(tp=4, pp=6, dp=2, micro_batch_size=1, global_batch_size=96,
                           zero_stage=2)  # fmt: skip
    done = _run(tmp_path, zero2)
    assert done.returncode == 1
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in done.stderr
    done = _run(tmp_path, CONFIGS["tp4-pp6-even-zero1"], extra_args=[])
    assert done.returncode == 1 and "--data-path" in done.stderr
