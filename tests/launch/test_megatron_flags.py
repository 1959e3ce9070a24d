"""The Megatron flags a trial's script passes are the ones ``tune best --emit args`` exports.

The script is run for real under bash with a fake ``torchrun`` that records its argv, so what is
compared is what Megatron would have received, not the template's text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.launch.megatron_flags import megatron_parallel_args, megatron_parallel_flags
from tuner.launch.templates import render_launch
from tuner.report.leaderboard import megatron_args
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

FAKE_TORCHRUN = """#!{python}
import json, os, sys
with open(os.environ["FAKE_TORCHRUN_OUT"], "w") as f:
    json.dump(sys.argv[1:], f)
"""

CONFIGS = {
    "tp2-pp2-vp2-sp-full-uniform-1-distopt": ParallelConfig(
        tp=2, pp=2, dp=4, vp=2, sequence_parallel=True, micro_batch_size=1, global_batch_size=64,
        recompute="full", recompute_method="uniform", recompute_num_layers=1,
        distributed_optimizer=True,
    ),
    "tp1-cp2-selective": ParallelConfig(
        tp=1, cp=2, dp=8, micro_batch_size=2, global_batch_size=64, recompute="selective"
    ),
    "tp4-sp-selective-distopt": ParallelConfig(
        tp=4, dp=4, sequence_parallel=True, micro_batch_size=4, global_batch_size=64,
        recompute="selective", distributed_optimizer=True,
    ),
    "tp2-pp4-vp4-cp2-full-block-2": ParallelConfig(
        tp=2, pp=4, cp=2, vp=4, dp=1, micro_batch_size=1, global_batch_size=64,
        recompute="full", recompute_method="block", recompute_num_layers=2,
    ),
    "tp4-sp-selective-core_attn-mlp": ParallelConfig(
        tp=4, dp=4, sequence_parallel=True, micro_batch_size=1, global_batch_size=64,
        recompute="selective", recompute_modules=("mlp", "core_attn"),
    ),
    "dp16-plain": ParallelConfig(dp=16, global_batch_size=64),
    "pp4-vp2-first6-last6": ParallelConfig(
        pp=4, dp=4, vp=2, micro_batch_size=1, global_batch_size=64,
        pipeline_split="first=6,last=6",
    ),
    "pp4-layout": ParallelConfig(
        pp=4, dp=4, micro_batch_size=1, global_batch_size=64,
        pipeline_split="layout:Et*7|t*9|t*9|t*7L",
    ),
}  # fmt: skip


def study(tmp_path: Path) -> StudySpec:
    return study_from_mapping(_mapping(tmp_path))


def _mapping(tmp_path: Path) -> dict[str, Any]:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "torchrun"
    fake.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    fake.chmod(0o755)
    return {
        "name": "flags",
        "model": {"preset": "llama3-8b"},
        "training": {"global_batch_size": 64, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["n1", "n2"],
                    "executor": "ssh"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "python": str(bin_dir / "python"),
                   "megatron_path": "/opt/Megatron-LM", "extra_args": ["--use-flash-attn"]},
    }  # fmt: skip


def launched_argv(spec: StudySpec, config: ParallelConfig, tmp_path: Path) -> list[str]:
    """What torchrun was started with when node 0's rendered script ran."""
    out = render_launch(spec, config, hosts=["n1", "n2"], master_addr="n1", master_port=29500,
                        trial_dir="/results/flags/trials/0", cwd=tmp_path)  # fmt: skip
    script = tmp_path / "launch.sh"
    script.write_text(out.scripts[0])
    dump = tmp_path / "argv.json"
    env = {"PATH": "/usr/bin:/bin", "FAKE_TORCHRUN_OUT": str(dump), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    argv: list[str] = json.loads(dump.read_text())
    return argv[argv.index("/opt/Megatron-LM/pretrain_gpt.py") + 1 :]


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_script_and_exported_args_agree(case: str, tmp_path: Path) -> None:
    spec, config = study(tmp_path), CONFIGS[case]
    assert validate(config, spec.model, spec.world_size, spec.framework) == []
    exported = megatron_args(spec, config)
    launched = launched_argv(spec, config, tmp_path)
    assert launched[: len(exported)] == exported
    # none of these flags is given a second time further on (the model, precision, extra args)
    flag_names = {flag[0] for flag in megatron_parallel_flags(config, spec.model.num_layers)}
    assert not flag_names & set(launched[len(exported) :])


def test_flags_follow_the_config() -> None:
    c = CONFIGS["tp2-pp2-vp2-sp-full-uniform-1-distopt"]
    flags = dict((f[0], f[1:]) for f in megatron_parallel_flags(c, num_layers=32))
    assert flags["--num-layers-per-virtual-pipeline-stage"] == ("8",)  # 32 / (pp 2 * vp 2)
    assert flags["--recompute-granularity"] == ("full",)
    assert flags["--recompute-method"] == ("uniform",)
    assert flags["--recompute-num-layers"] == ("1",)
    assert flags["--sequence-parallel"] == () and flags["--use-distributed-optimizer"] == ()
    plain = megatron_parallel_args(CONFIGS["dp16-plain"], num_layers=32)
    assert plain == [
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
        "--context-parallel-size", "1", "--micro-batch-size", "1", "--global-batch-size", "64",
        "--overlap-grad-reduce",
    ]  # fmt: skip
    # the distributed optimizer gathers its parameters behind the next forward
    # (tuner.models.time.dp)
    assert flags["--overlap-param-gather"] == () and flags["--overlap-grad-reduce"] == ()
    selective = megatron_parallel_args(CONFIGS["tp1-cp2-selective"], num_layers=32)
    assert "--recompute-method" not in selective and "--sequence-parallel" not in selective
    assert "--recompute-modules" not in selective  # Megatron's default, core_attn
    modules = megatron_parallel_args(CONFIGS["tp4-sp-selective-core_attn-mlp"], num_layers=32)
    i = modules.index("--recompute-granularity")
    assert modules[i : i + 5] == [
        "--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"
    ]  # fmt: skip


def _run_standin(launched: list[str], world: int) -> subprocess.CompletedProcess[str]:
    standin = Path(__file__).resolve().parents[1] / "standins" / "pretrain_gpt.py"
    env = {**os.environ, "WORLD_SIZE": str(world), "TUNER_STANDIN_TIME_SCALE": "0.0001"}
    env.pop("RANK", None)
    argv = [a if a != "30" or launched[i - 1] != "--train-iters" else "3"
            for i, a in enumerate(launched)]  # fmt: skip
    return subprocess.run([sys.executable, str(standin), *argv], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_moe_selective_modules_reach_megatron_and_the_standin_accepts_them(
    tmp_path: Path,
) -> None:
    """Mixtral with selective recompute of the attention core, the expert activation and the
    norms: the script passes Megatron's --recompute-modules in its order, as exported."""
    dense = study(tmp_path)
    spec = dataclasses.replace(dense, model=study_from_mapping(
        {**_mapping(tmp_path), "model": {"preset": "mixtral-8x7b"}}).model)  # fmt: skip
    config = ParallelConfig(pp=2, dp=8, ep=8, global_batch_size=64, distributed_optimizer=True,
                            recompute="selective",
                            recompute_modules=("layernorm", "moe_act", "core_attn"))  # fmt: skip
    assert validate(config, spec.model, spec.world_size, spec.framework, spec.training) == []
    exported = megatron_args(spec, config)
    launched = launched_argv(spec, config, tmp_path)
    assert launched[: len(exported)] == exported
    assert ("--recompute-granularity selective --recompute-modules core_attn moe_act layernorm"
            in " ".join(launched))  # fmt: skip
    done = _run_standin(launched, 16)
    assert done.returncode == 0, done.stderr[-2000:]
    # the stand-in applies Megatron's checks: without grouped GEMM moe_act is refused
    argv = [a for a in launched if a != "--moe-grouped-gemm"]
    refused = _run_standin(argv, 16)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "ValueError: moe_act in recompute_modules is only supported with moe_grouped_gemm."
    )


def test_moe_fp8_script_matches_the_export_and_the_standin_accepts_it(tmp_path: Path) -> None:
    """A Mixtral study in fp8 with EP 8 and the fused loss: the script's flags start with the
    exported ones, carry the MoE, Transformer Engine and loss-fusion flags, and the Megatron
    stand-in accepts every one of them."""
    dense = study(tmp_path)
    spec = dataclasses.replace(
        dense,
        model=study_from_mapping(
            {**_mapping(tmp_path), "model": {"preset": "mixtral-8x7b"}}
        ).model,
        training=dataclasses.replace(
            dense.training, precision="fp8", fp8_recipe="tensorwise", cross_entropy_fusion=True
        ),
    )
    config = ParallelConfig(pp=2, dp=8, ep=8, global_batch_size=64, distributed_optimizer=True,
                            recompute="full", recompute_method="uniform",
                            recompute_num_layers=1)  # fmt: skip
    assert validate(config, spec.model, spec.world_size, spec.framework) == []
    exported = megatron_args(spec, config)
    launched = launched_argv(spec, config, tmp_path)
    assert launched[: len(exported)] == exported
    text = " ".join(launched)
    for words in ("--num-experts 8", "--moe-router-topk 2", "--expert-model-parallel-size 8",
                  "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm",
                  "--bf16 --fp8-format hybrid --fp8-recipe tensorwise",
                  "--cross-entropy-loss-fusion"):  # fmt: skip
        assert words in text
    standin = Path(__file__).resolve().parents[1] / "standins" / "pretrain_gpt.py"
    env = {**os.environ, "WORLD_SIZE": "16", "TUNER_STANDIN_TIME_SCALE": "0.0001"}
    env.pop("RANK", None)
    argv = [a if a != "30" or launched[i - 1] != "--train-iters" else "3"
            for i, a in enumerate(launched)]  # fmt: skip
    done = subprocess.run([sys.executable, str(standin), *argv], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "load_balancing_loss:" in done.stdout


def test_tp_comm_overlap_reaches_megatron_and_the_standin_accepts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--tp-comm-overlap (TE userbuffers, tuner.models.time.tp_overlap) rides with
    --sequence-parallel."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the script exports it (TP > 1)
    spec = study(tmp_path)
    config = ParallelConfig(tp=8, dp=2, sequence_parallel=True, tp_comm_overlap=True,
                            global_batch_size=64, distributed_optimizer=True)  # fmt: skip
    assert validate(config, spec.model, spec.world_size, spec.framework, spec.training, 8) == []
    assert "--tp-comm-overlap" in megatron_parallel_args(config, spec.model.num_layers)
    assert (
        ",tpo=1" in config.key()
        and ",tpo" not in ParallelConfig(tp=2, dp=8, global_batch_size=64).key()
    )
    launched = launched_argv(spec, config, tmp_path)
    assert "--tp-comm-overlap" in launched and "--sequence-parallel" in launched
    done = _run_standin(launched, 16)
    assert done.returncode == 0, done.stderr[-2000:]
