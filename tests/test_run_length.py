"""The run's length is tune's: ``launch.train_iters`` for a trial, ``tune best --train-iters``
for the full run. A length in the study's own argument lists is refused at load, naming the
field: Megatron takes the last ``--train-iters`` it is given, so one in ``launch.train_args``
silently overrode the length the full run's header states (one in ``extra_args``, every
trial's), and a recipe override or torchtitan option before tune's own was silently dropped."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.test_spec import GOOD
from tests.test_study_torchtitan import study_data as titan_data
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.spec.file import study_from_mapping
from tuner.spec.frameworks import FRAMEWORKS, traits

TEMPLATES = Path(__file__).resolve().parents[1] / "tuner" / "templates"


def study(framework: str, **launch: Any) -> dict[str, Any]:
    """A study of ``framework`` that loads, with ``launch`` added to its launch section."""
    if framework == "torchtitan":
        data = titan_data()
    else:
        data = copy.deepcopy(GOOD)
        data["framework"] = framework
        data["launch"] = {
            "megatron": {"template": "megatron_gpt"},
            "megatron-deepspeed": {"template": "megatron_deepspeed_gpt"},
            "deepspeed": {"template": "deepspeed_gpt", "script": "train.py"},
            "megatron-bridge": {"template": "megatron_bridge",
                                "recipe": "llama3_8b_pretrain_config"},
        }[framework]  # fmt: skip
        data["space"] = {"tp": [1, 2]}
    data["launch"].update(launch)
    return data


REFUSED = [
    ("megatron", "train_args", ["--data-path", "x", "--train-iters", "500"], 2),
    ("megatron", "extra_args", ["--train-iters=500"], 0),
    ("megatron", "train_args", ["--train-samples", "1000"], 0),
    ("megatron-deepspeed", "train_args", ["--train-iters", "9"], 0),
    ("deepspeed", "script_args", ["--train-iters", "9"], 0),
    ("megatron-bridge", "train_args", ["checkpoint.save=/ckpt", "train.train_iters=100"], 1),
    ("megatron-bridge", "extra_args", ["++train.train_iters=100"], 0),
    ("torchtitan", "train_args", ["--training.steps", "100"], 0),
    ("torchtitan", "extra_args", ["--training.steps=100"], 0),
]  # fmt: skip


@pytest.mark.parametrize(("framework", "field", "words", "index"), REFUSED)
def test_a_length_in_the_studys_arguments_is_refused_naming_it(
    framework: str, field: str, words: list[str], index: int
) -> None:
    with pytest.raises(ConfigError) as exc:
        study_from_mapping(study(framework, **{field: words}))
    assert exc.value.path == f"launch.{field}[{index}]"
    first = traits(framework).length_flags[0]
    assert str(exc.value.reason) == (
        f"{words[index]!r}: tune sets the run's length ({first}): launch.train_iters for a "
        "trial, tune best --train-iters N for the full run"
    )


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_arguments_that_only_look_alike_load(framework: str) -> None:
    words = ["--lr-warmup-iters", "10", "--train-iters-note", "train.train_iters_x=1",
             "--training.steps-extra"]  # fmt: skip
    study_from_mapping(study(framework, train_args=words))


def test_the_refused_length_is_the_one_each_launch_passes() -> None:
    """The first of each framework's ``length_flags`` is the argument its trials' launch sets
    from ``launch.train_iters`` (a rename there would leave the refusal guarding nothing)."""
    from tuner.launch.bridge import run_overrides
    from tuner.launch.megatron_flags import deepspeed_script_flags
    from tuner.launch.torchtitan_flags import torchtitan_flags

    for name in ("megatron_gpt", "megatron_deepspeed_gpt"):
        text = (TEMPLATES / f"{name}.sh.j2").read_text()
        assert "  --train-iters {{ launch.train_iters | shq }}" in text, name
    assert traits("megatron").length_flags[0] == "--train-iters"
    assert traits("megatron-deepspeed").length_flags[0] == "--train-iters"
    c = ParallelConfig(tp=1, dp=8, global_batch_size=64)
    ds = study_from_mapping(study("deepspeed", train_iters=7))
    assert (traits("deepspeed").length_flags[0], "7") in deepspeed_script_flags(ds.model, c, 7)
    bridge = study_from_mapping(study("megatron-bridge", train_iters=7))
    assert (traits("megatron-bridge").length_flags[0], 7) in run_overrides(bridge)
    titan = study_from_mapping(study("torchtitan", train_iters=7))
    c = ParallelConfig(tp=1, dp=2, global_batch_size=8)
    assert (traits("torchtitan").length_flags[0], "7") in torchtitan_flags(titan, c)
