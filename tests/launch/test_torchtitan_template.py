"""The ``torchtitan_llama`` template: golden scripts for an HSDP + TP + interleaved-PP config and
an FSDP-only one, hostile values kept as data, and the rendered arguments read by the stand-in.

Re-record the golden files after an intended change with ``TUNER_REGOLD=1 pytest tests/launch``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.launch.test_templates import check_golden
from tests.standins import torchtitan_train as standin
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.launch.templates import render_launch
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

HOSTS = ["gpu001", "gpu002"]


def study(**launch: Any) -> StudySpec:
    return study_from_mapping(
        {
            "name": "golden",
            "model": {"preset": "llama3-8b"},
            "training": {"global_batch_size": 64, "precision": "bf16"},
            "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": HOSTS,
                        "executor": "ssh"},
            "framework": "torchtitan",
            "launch": {"template": "torchtitan_llama", "python": "/opt/venv/bin/python",
                       "script_args": ["--module", "llama3", "--config", "llama3_8b"],
                       "env": {"NCCL_DEBUG": "WARN"}, **launch},
        }
    )  # fmt: skip


CONFIGS = {
    "hsdp2-tp2-pp2-interleaved-sac": ParallelConfig(
        tp=2, pp=2, dp=4, dp_replicate=2, vp=2, pp_schedule="Interleaved1F1B",
        sequence_parallel=True, micro_batch_size=1, global_batch_size=64, recompute="selective",
        compile=True, tp_comm_overlap=True,
    ),
    "fsdp16-full-never": ParallelConfig(
        dp=16, micro_batch_size=2, global_batch_size=64, recompute="full",
        recompute_method="uniform", recompute_num_layers=1, reshard_after_forward="never",
    ),
}  # fmt: skip


def render(spec: StudySpec, c: ParallelConfig, tmp_path: Path) -> list[str]:
    out = render_launch(
        spec, c, hosts=HOSTS, master_addr="10.0.0.1", master_port=29501,
        trial_dir="/results/golden/trials/3", cwd=tmp_path,
    )  # fmt: skip
    return list(out.scripts)


def args_of(script: str) -> list[str]:
    return shlex.split(script.split("args=(")[1].split("\n)")[0])


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_golden_and_read_by_the_stand_in(case: str, tmp_path: Path) -> None:
    spec, c = study(), CONFIGS[case]
    assert validate(c, spec.model, spec.world_size, spec.framework) == []
    scripts = render(spec, c, tmp_path)
    for k, script in enumerate(scripts):
        check_golden(f"torchtitan_llama-{case}-node{k}.sh", script)
    values, module, config, ac = standin.parse(args_of(scripts[0]))
    assert (module, config) == ("llama3", "llama3_8b")
    dims = standin.check(values, spec.world_size)
    assert (dims["r"], dims["s"], dims["tp"], dims["pp"]) == (
        c.dp_replicate, c.dp_shard, c.tp, c.pp,
    )  # fmt: skip
    assert dims["gbs"] == 64 and ac == {"selective": "selective", "full": "full"}[c.recompute]


def test_hostile_values_stay_data(tmp_path: Path) -> None:
    evil = "a'; echo pwned; '"
    spec = study(script_args=["--module", evil, "--config", "x y"], extra_args=["$(id)"])
    script = render(spec, CONFIGS["fsdp16-full-never"], tmp_path)[0]
    args = args_of(script)
    assert args[:4] == ["--module", evil, "--config", "x y"] and "$(id)" in args
    assert args[-1] == "activation-checkpoint:full"  # the subcommand stays last


def test_script_args_are_required(tmp_path: Path) -> None:
    from tuner.errors import ConfigError

    with pytest.raises(ConfigError, match="launch.script_args"):
        study(script_args=[])
    with pytest.raises(ConfigError, match="launch.script_args"):
        study(script_args=["--config", "llama3_8b"])
