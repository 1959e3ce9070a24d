"""A study's own argument lists may not set an option tune sets for the config under trial
(``tuner.spec.controlled``): the trial would measure the user's value while the study recorded
the config's. Refused when the study loads, naming the field and the option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_run_length import study
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.spec.controlled import CONTROLLED, option_name
from tuner.spec.file import study_from_mapping
from tuner.spec.frameworks import FRAMEWORKS

REFUSED = [
    ("megatron", "extra_args", ["--lr", "1e-4", "--tensor-model-parallel-size", "4"], 2,
     "--tensor-model-parallel-size"),
    ("megatron", "train_args", ["--data-path", "x", "--micro-batch-size=2"], 2,
     "--micro-batch-size"),
    ("megatron", "script_args", ["--recompute-granularity", "full"], 0, "--recompute-granularity"),
    ("megatron", "extra_args", ["--use_distributed_optimizer"], 0, "--use-distributed-optimizer"),
    ("megatron-deepspeed", "extra_args", ["--zero-stage", "3"], 0, "--zero-stage"),
    ("megatron-deepspeed", "train_args", ["--pipeline-parallel"], 0, "--no-pipeline-parallel"),
    ("deepspeed", "extra_args", ["--deepspeed-config", "mine.json"], 0, "--deepspeed_config"),
    ("megatron-bridge", "extra_args", ["++model.tensor_model_parallel_size=4"], 0,
     "model.tensor_model_parallel_size"),
    ("megatron-bridge", "train_args", ["train.micro_batch_size=2"], 0, "train.micro_batch_size"),
    ("torchtitan", "extra_args", ["--parallelism.tensor_parallel_degree=2"], 0,
     "--parallelism.tensor-parallel-degree"),
    ("torchtitan", "train_args", ["--parallelism.no-enable-sequence-parallel"], 0,
     "--parallelism.enable-sequence-parallel"),
    ("torchtitan", "extra_args", ["activation-checkpoint:full"], 0, "activation-checkpoint"),
    ("torchtitan", "train_args", ["--activation-checkpoint.debug"], 0, "activation-checkpoint"),
]  # fmt: skip


@pytest.mark.parametrize(("framework", "field", "words", "index", "flag"), REFUSED)
def test_an_option_tune_sets_is_refused_naming_the_field_and_option(
    framework: str, field: str, words: list[str], index: int, flag: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        study_from_mapping(study(framework, **{field: words}))
    assert exc.value.path == f"launch.{field}[{index}]"
    assert str(exc.value.reason).startswith(f"{words[index]!r} sets {flag}, which tune sets")


UNRELATED = {
    "megatron": ["--data-path", "x", "--lr", "1e-4", "--no-gradient-accumulation-fusion"],
    "megatron-deepspeed": ["--data-path", "x", "--tensor-model-parallel-size-note"],
    "deepspeed": ["--lr", "1e-4", "--deepspeed"],
    "megatron-bridge": ["checkpoint.save=/ckpt", "model.tensor_model_parallel_size_x=1"],
    "torchtitan": ["--job.dump-folder", "out", "--parallelism.tensor-parallel"],
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_unrelated_arguments_load(framework: str) -> None:
    words = UNRELATED[framework]
    study_from_mapping(study(framework, train_args=words, extra_args=words))


def _options(words: list[Any]) -> set[str]:
    return {o for w in words if isinstance(w, str) and (o := option_name(w))}


CONFIGS = [
    ParallelConfig(tp=2, dp=4, global_batch_size=64, sequence_parallel=True, tp_comm_overlap=True,
                   recompute="selective", recompute_modules=("core_attn", "mlp"),
                   distributed_optimizer=True),
    ParallelConfig(tp=1, pp=2, vp=2, dp=4, global_batch_size=64, recompute="full",
                   recompute_method="uniform", recompute_num_layers=1),
    ParallelConfig(pp=4, dp=2, global_batch_size=64, pipeline_split="first=6,last=6"),
    ParallelConfig(pp=4, dp=2, global_batch_size=64, pipeline_split="embedding+loss", vp=2),
    ParallelConfig(pp=2, dp=4, global_batch_size=64, pipeline_split="type:transformer|embed",
                   zero_stage=1),
]  # fmt: skip


def test_every_option_the_launches_set_is_controlled() -> None:
    """The list the refusal reads holds every option the flag and override functions write
    for a range of configs (a new flag there left out here would go unguarded)."""
    from tuner.launch.bridge import parallel_overrides
    from tuner.launch.megatron_flags import (
        megatron_deepspeed_parallel_flags,
        megatron_parallel_flags,
    )
    from tuner.launch.torchtitan_flags import torchtitan_flags

    megatron = study_from_mapping(study("megatron"))
    titan = study_from_mapping(study("torchtitan"))
    layers = megatron.model.num_layers
    for c in CONFIGS:
        got = _options([w for f in megatron_parallel_flags(c, layers) for w in f])
        assert got <= _options(list(CONTROLLED["megatron"])), c
        got = _options([w for f in megatron_deepspeed_parallel_flags(c, "uniform") for w in f])
        assert got <= _options(list(CONTROLLED["megatron-deepspeed"])), c
        bridge = {name for name, _ in parallel_overrides(c, megatron.model)}
        assert bridge <= set(CONTROLLED["megatron-bridge"]), c
    for c in (ParallelConfig(tp=2, dp=1, global_batch_size=8, sequence_parallel=True),
              ParallelConfig(pp=2, dp=1, global_batch_size=8, recompute="full")):  # fmt: skip
        got = _options([w for f in torchtitan_flags(titan, c) for w in f])
        assert got - {"training.steps"} <= _options(list(CONTROLLED["torchtitan"])), c


@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"]])
def test_the_commands_refuse_it_in_one_line_before_anything_runs(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli.main import main

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study("megatron", extra_args=["--micro-batch-size", "2"])))
    assert main([command[0], "--study", str(path), *command[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "launch.extra_args[0]" in err and "--micro-batch-size" in err, err
