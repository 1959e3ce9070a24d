"""Launch templates: golden files, Megatron flag names, ds_config arithmetic, hostile values.

Re-record the golden files after an intended change with ``TUNER_REGOLD=1 pytest tests/launch``.
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
from tuner.errors import ConfigError
from tuner.launch.templates import RenderedLaunch, TemplateRenderer, render_launch
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

GOLDEN = Path(__file__).parent / "golden"


def study(framework: str = "megatron", **launch: Any) -> StudySpec:
    template = {"megatron": "megatron_gpt", "deepspeed": "deepspeed_gpt",
                "megatron-deepspeed": "megatron_deepspeed_gpt"}[framework]  # fmt: skip
    defaults: dict[str, Any] = {
        "template": template,
        "python": "/opt/venv/bin/python",
        "megatron_path": "/opt/Megatron-LM",
        "script": "workloads/gpt_deepspeed.py",
        "env": {"NCCL_DEBUG": "WARN"},
    }
    cpu = framework == "deepspeed"
    return study_from_mapping(
        {
            "name": "golden",
            "model": {"preset": "llama3-8b"} if not cpu else _tiny_model(),
            "training": {"global_batch_size": 64 if not cpu else 16, "precision": "bf16"},
            "cluster": {
                "gpu": "h100-sxm-80gb" if not cpu else "cpu",
                "gpus_per_node": 8 if not cpu else 2,
                "nodes": ["gpu001", "gpu002"],
                "executor": "ssh",
            },
            "framework": framework,
            "launch": {**defaults, **launch},
        }
    )


def _tiny_model() -> dict[str, Any]:
    return {
        "num_layers": 4,
        "hidden_size": 128,
        "ffn_hidden_size": 512,
        "num_attention_heads": 4,
        "vocab_size": 1024,
        "seq_length": 128,
    }


MEGATRON_CONFIGS = {
    "tp2-pp2-vp2-sp-full": ParallelConfig(
        tp=2,
        pp=2,
        dp=4,
        vp=2,
        sequence_parallel=True,
        micro_batch_size=1,
        global_batch_size=64,
        recompute="full",
        recompute_method="uniform",
        recompute_num_layers=1,
        distributed_optimizer=True,
    ),
    "tp1-cp2-selective": ParallelConfig(
        tp=1, cp=2, dp=8, micro_batch_size=2, global_batch_size=64, recompute="selective"
    ),
}
DEEPSPEED_CONFIGS = {
    "zero2-dp4": ParallelConfig(dp=4, micro_batch_size=2, global_batch_size=16, zero_stage=2),
    "pp2-zero1-ckpt": ParallelConfig(
        pp=2,
        dp=2,
        micro_batch_size=1,
        global_batch_size=16,
        zero_stage=1,
        recompute="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    ),
}


def render(spec: StudySpec, cfg: ParallelConfig, tmp_path: Path, **kw: Any) -> RenderedLaunch:
    args: dict[str, Any] = {
        "hosts": ["gpu001", "gpu002"],
        "master_addr": "10.0.0.1",
        "master_port": 29501,
        "trial_dir": "/results/golden/trials/3",
        "cwd": tmp_path,
    }
    return render_launch(spec, cfg, **{**args, **kw})


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TUNER_REGOLD"):
        path.write_text(text)
    if not path.exists():
        pytest.fail(
            f"golden file {path} is missing; record it with TUNER_REGOLD=1 pytest {__file__}"
        )
    assert text == path.read_text(), (
        f"{name} differs from its golden file; if the change is intended, re-record with "
        f"TUNER_REGOLD=1 pytest {__file__}"
    )


@pytest.mark.parametrize("case", sorted(MEGATRON_CONFIGS))
def test_megatron_golden(case: str, tmp_path: Path) -> None:
    out = render(study(), MEGATRON_CONFIGS[case], tmp_path)
    assert out.files == {}
    for k, script in enumerate(out.scripts):
        check_golden(f"megatron_gpt-{case}-node{k}.sh", script)


@pytest.mark.parametrize("case", sorted(DEEPSPEED_CONFIGS))
def test_deepspeed_golden(case: str, tmp_path: Path) -> None:
    out = render(study("deepspeed"), DEEPSPEED_CONFIGS[case], tmp_path)
    check_golden(f"deepspeed_gpt-{case}-node0.sh", out.scripts[0])
    check_golden(f"ds_config-{case}.json", out.files["ds_config.json"])


def test_megatron_flags_follow_the_config(tmp_path: Path) -> None:
    script = render(study(), MEGATRON_CONFIGS["tp2-pp2-vp2-sp-full"], tmp_path).scripts[1]
    assert "--num-layers-per-virtual-pipeline-stage 8" in script  # 32 layers / (pp 2 * vp 2)
    assert "--virtual-pipeline-model-parallel-size" not in script  # no such Megatron flag
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    assert "--node_rank 1" in script and "--nnodes 2" in script
    assert script.index("export PATH=/opt/venv/bin:") < script.index("exec torchrun")
    plain = render(study(), ParallelConfig(dp=16, global_batch_size=64), tmp_path).scripts[0]
    for absent in (
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "--sequence-parallel",
        "--recompute",
        "--num-layers-per-virtual",
    ):
        assert absent not in plain


@pytest.mark.parametrize("case", sorted(DEEPSPEED_CONFIGS))
def test_ds_config_batch_arithmetic(case: str, tmp_path: Path) -> None:
    cfg = DEEPSPEED_CONFIGS[case]
    ds = json.loads(render(study("deepspeed"), cfg, tmp_path).files["ds_config.json"])
    assert ds["train_batch_size"] == (
        ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * cfg.dp
    )
    assert ds["train_batch_size"] == cfg.global_batch_size
    assert ds["zero_optimization"]["stage"] == cfg.zero_stage
    assert ds["optimizer"]["params"]["torch_adam"] is True  # cluster.gpu: cpu
    assert ds["steps_per_print"] == 1
    assert ds["wall_clock_breakdown"] is (cfg.pp == 1)
    assert ("pipeline" in ds) is (cfg.pp > 1)


def test_deepspeed_script_points_at_the_rendered_config(tmp_path: Path) -> None:
    out = render(study("deepspeed"), DEEPSPEED_CONFIGS["zero2-dp4"], tmp_path)
    assert "--deepspeed_config /results/golden/trials/3/ds_config.json" in out.scripts[0]


def test_user_templates_dir_and_lookup_order(tmp_path: Path) -> None:
    (tmp_path / "launch_templates").mkdir()
    (tmp_path / "launch_templates" / "megatron_gpt.sh.j2").write_text("local {{ node_rank }}\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "custom.sh.j2").write_text(
        '{% set extra_files = ["hosts.txt"] %}run {{ files["hosts.txt"] | shq }} {{ cfg.tp }}\n'
    )
    (mine / "hosts.txt.j2").write_text("{{ hosts | join('\\n') }}\n")
    cfg = ParallelConfig(dp=16, global_batch_size=64)
    assert render(study(), cfg, tmp_path).scripts == ("local 0\n", "local 1\n")
    out = render(study(template="custom", templates_dir="mine"), cfg, tmp_path)
    assert out.scripts[0] == "run /results/golden/trials/3/hosts.txt 1\n"
    assert out.files == {"hosts.txt": "gpu001\ngpu002\n"}
    assert "custom" in TemplateRenderer([mine]).available()


def test_errors_name_the_setting(tmp_path: Path) -> None:
    cfg = ParallelConfig(dp=16, global_batch_size=64)
    with pytest.raises(ConfigError, match="launch.template.*available: .*deepspeed_gpt"):
        render(study(template="nope"), cfg, tmp_path)
    with pytest.raises(ConfigError, match="launch.megatron_path"):
        render(study(megatron_path=None), cfg, tmp_path)
    with pytest.raises(ConfigError, match="launch.env"):
        render(study(env={"BAD NAME": "x"}), cfg, tmp_path)


HOSTILE = [
    "has space",
    'it\'s quoted "twice"',
    "$(touch pwned)",
    "a'; echo pwned; touch pwned; '",
    "`touch pwned`",
    "semi;colon && touch pwned",
    "*",
]

FAKE_TORCHRUN = """#!{python}
import json, os, sys
with open(os.environ["FAKE_TORCHRUN_OUT"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}, f)
"""


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "megatron-deepspeed"])
def test_hostile_values_arrive_verbatim_and_never_run(framework: str, tmp_path: Path) -> None:
    weird = tmp_path / "we ird $(touch pwned) 'dir'"
    bin_dir = weird / "venv bin"
    bin_dir.mkdir(parents=True)
    fake = bin_dir / "torchrun"
    fake.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    fake.chmod(0o755)
    workdir = weird / "work; touch pwned"
    workdir.mkdir()
    env = {f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}
    spec = study(
        framework,
        python=str(bin_dir / "python"),
        megatron_path=str(weird / "Megatron $(touch pwned)"),
        script=str(weird / "train'; touch pwned.py"),
        script_args=HOSTILE,
        extra_args=HOSTILE,
        env=env,
        workdir=str(workdir),
    )
    trial_dir = weird / "trial `touch pwned`"
    cfg = {
        "megatron": MEGATRON_CONFIGS["tp1-cp2-selective"],
        "deepspeed": DEEPSPEED_CONFIGS["zero2-dp4"],
        "megatron-deepspeed": ParallelConfig(tp=2, pp=2, dp=4, global_batch_size=64, zero_stage=1),
    }[framework]
    out = render(spec, cfg, tmp_path, trial_dir=str(trial_dir))
    script = tmp_path / "launch.sh"
    script.write_text(out.scripts[1])
    dump = tmp_path / "argv.json"
    clean_env = {"PATH": "/usr/bin:/bin", "FAKE_TORCHRUN_OUT": str(dump), "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=clean_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("pwned*")), "a hostile value was executed"
    seen = json.loads(dump.read_text())
    argv, seen_env = seen["argv"], seen["env"]
    assert seen["cwd"] == str(workdir)
    assert seen_env["PATH"].startswith(str(bin_dir) + ":")
    for name, value in env.items():
        assert seen_env[name] == value
    assert argv[-len(HOSTILE) :] == HOSTILE  # extra args last, verbatim
    if framework != "deepspeed":
        assert str(weird / "Megatron $(touch pwned)" / "pretrain_gpt.py") in argv
    if framework == "megatron-deepspeed":
        assert str(trial_dir / "ds_config.json") in argv
    if framework == "deepspeed":
        assert str(weird / "train'; touch pwned.py") in argv
        assert str(trial_dir / "ds_config.json") in argv
        assert argv[-2 * len(HOSTILE) : -len(HOSTILE)] == HOSTILE  # script args, then extra args


def test_megatron_moe_fp8_golden(tmp_path: Path) -> None:
    """DeepSeekMoE 16B in fp8 with EP 8 and ETP 1: the MoE and Transformer Engine flags."""
    dense = study()
    moe = study_from_mapping({
        "name": "golden", "model": {"preset": "deepseek-moe-16b"},
        "training": {"global_batch_size": 64, "precision": "fp8", "fp8_recipe": "blockwise"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["gpu001", "gpu002"],
                    "executor": "ssh"},
        "framework": "megatron", "launch": {"template": "megatron_gpt",
                                            "python": dense.launch.python,
                                            "megatron_path": "/opt/Megatron-LM"},
    })  # fmt: skip
    cfg = ParallelConfig(tp=2, pp=2, dp=4, ep=8, etp=1, sequence_parallel=True,
                         micro_batch_size=1, global_batch_size=64,
                         distributed_optimizer=True)  # fmt: skip
    out = render(moe, cfg, tmp_path)
    check_golden("megatron_gpt-deepseek-moe-fp8-ep8-node0.sh", out.scripts[0])
    # the same with selective recompute of MoE modules: --recompute-granularity selective
    # --recompute-modules core_attn moe_act layernorm shared_experts (Megatron's order)
    modules = dataclasses.replace(cfg, recompute="selective", recompute_modules=(
        "shared_experts", "moe_act", "core_attn", "layernorm"))  # fmt: skip
    assert validate(modules, moe.model, moe.world_size, moe.framework, moe.training) == []
    out = render(moe, modules, tmp_path)
    check_golden("megatron_gpt-deepseek-moe-fp8-ep8-selective-modules-node0.sh", out.scripts[0])
