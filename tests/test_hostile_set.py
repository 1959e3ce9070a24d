"""``tune estimate --set`` of a knob the study's framework has no use for: one line naming the
key, exit status 2, rather than a config shown (and predicted) that no launch of it would run."""

from __future__ import annotations

import copy

import pytest

from tests.test_hostile_inputs import BASE
from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.spec.file import study_from_mapping
from tuner.spec.moe import DENSE_DISPATCHER, DENSE_EP, DENSE_ETP

FOREIGN = [
    # torchtitan's knobs were taken by a Megatron or DeepSpeed study and shown in its config
    ("gpt-70b", "compile=on", "--set compile: is a torchtitan knob; this study's framework is "
     "megatron"),
    ("gpt-70b", "pp_schedule=GPipe", "--set pp_schedule: is a torchtitan knob"),
    ("demo", "dp_replicate=2", "--set dp_replicate: is a torchtitan knob; this study's "
     "framework is deepspeed"),
    # dp_shard was dropped without a word
    ("demo", "dp_shard=2", "--set dp_shard: is a torchtitan knob"),
    ("gpt-70b", "reshard_after_forward=always", "--set reshard_after_forward: is a torchtitan"),
    # torchtitan's vp follows its schedule: vp=2 was dropped without a word
    ("demo-fsdp", "vp=2", "--set vp: torchtitan's stages per rank follow pp_schedule"),
    ("demo-fsdp", "split=embedding", "--set split: torchtitan splits stages by its own rule"),
]  # fmt: skip


@pytest.mark.parametrize(("study", "item", "words"), FOREIGN)
def test_a_knob_of_another_framework_is_refused_naming_it(
    study: str, item: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--study", study, "--set", item]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"tune: error: {words}"), captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


@pytest.mark.parametrize("item", ["compile=on", "dp_replicate=1", "vp=1", "split=even"])
def test_a_torchtitan_study_still_takes_its_own_knobs(
    item: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--study", "demo-fsdp", "--set", item]) == 0, capsys.readouterr().err


VALUES = [
    # full:block:0 was taken as "no layer count given" and became full:block:1
    ("recompute=full:block:0", "--set recompute: 'full:block:0': N must be > 0, got 0"),
    # a first stage of 10^20 layers passed Megatron's checks (the negative rest divides the two
    # middle stages) and the memory model simulated it layer by layer: a hang
    ("split=first=99999999999999999999,last=1",
     "--set split: 'first=99999999999999999999,last=1': first is more layers than any model "
     "has (4,096)"),
    # and 100 + 2 of 80 layers left -11 layers on each middle stage, and negative GiB
    ("split=first=100,last=2", "breaks 1 rule: the first and last stages hold 102 layers, more "
     "than the model's 80"),
]  # fmt: skip


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("item", "words"), VALUES)
def test_a_value_out_of_its_model_is_refused_naming_it(
    item: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--study", "gpt-70b", "--set", "pp=4", "--set", item]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("tune: error: ") and words in captured.err, captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""


# a fullwidth, an Arabic-Indic and a Devanagari 4
@pytest.mark.parametrize("value", ["\uff14", "\u0664", "\u096a"])
def test_a_unicode_digit_is_refused_as_the_study_file_refuses_it(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``int`` reads any Unicode digit: ``--set tp=４`` was tp 4, while the study file's
    ``space.tp: [４]`` is "expected an integer, got '４'"."""
    assert main(["estimate", "--study", "gpt-70b", "--set", f"tp={value}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"tune: error: --set tp: expected an integer, got {value!r}\n"
    assert captured.out == ""


@pytest.mark.parametrize("value", ["flex", "allgather"])
def test_a_dispatcher_of_a_dense_model_is_refused_as_in_its_study_file(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--set dispatcher=flex`` on a dense model was taken and shown in its config ("... distopt
    flex"), and so was the study file's ``space.moe_token_dispatcher: [flex]``: a dense model
    has no experts to send tokens to."""
    assert main(["estimate", "--study", "gpt-70b", "--set", f"dispatcher={value}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"tune: error: --set dispatcher: {DENSE_DISPATCHER}\n"
    assert captured.out == ""
    data = copy.deepcopy(BASE)
    data["space"]["moe_token_dispatcher"] = [value]
    with pytest.raises(ConfigError) as refused:
        study_from_mapping(data)
    assert (refused.value.path, refused.value.reason) == (
        "space.moe_token_dispatcher",
        DENSE_DISPATCHER,
    )


@pytest.mark.parametrize(
    ("items", "key", "space", "words"),
    [
        (["ep=2"], "ep", [1, 2], DENSE_EP),
        (["etp=2"], "etp", [2], DENSE_ETP),
        # etp equal to tp broke no rule: taken, and shown in the config as "etp2"
        (["tp=2", "etp=2"], "etp", [1], DENSE_ETP),
    ],
)  # fmt: skip
def test_an_expert_knob_of_a_dense_model_is_refused_as_in_its_study_file(
    items: list[str], key: str, space: list[int], words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--set ep=2`` on a dense model was "tp1 pp1 dp512 ep2 ... breaks 1 rule", and the study
    file's ``space.ep: [1, 2]`` was taken; the dispatcher's refusal, for ep and etp."""
    sets = [word for item in items for word in ("--set", item)]
    assert main(["estimate", "--study", "gpt-70b", *sets]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"tune: error: --set {key}: {words}\n"
    assert captured.out == ""
    data = copy.deepcopy(BASE)
    data["space"][key] = space
    with pytest.raises(ConfigError) as refused:
        study_from_mapping(data)
    assert (refused.value.path, refused.value.reason) == (f"space.{key}", words)
    data["space"][key] = [1] if key == "ep" else None  # the defaults: taken
    study_from_mapping(data)
