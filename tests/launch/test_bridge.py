"""Megatron-Bridge overrides: real fields of the right type, the same meaning as the Megatron-LM
flags of the same config, a recipe function that sets them, and the stand-in's strictness.

The oracle for the field names and types is the table of Bridge v0.6.0's config dataclasses the
stand-in recipe script checks against (``tests/standins/megatron_bridge/fields.json``, written
from the pinned source by ``tools/bridge_fields.py``): ``megatron-bridge`` 0.6.x needs Python
>= 3.12 and CUDA-only packages, so its classes do not import here. The Megatron-LM-to-Bridge
meaning of each flag is Bridge's own translator's (scripts/translate_mlm_to_bridge.py ``ARG_MAP``
and ``BRIDGE_TO_MLM_EXTRA`` at v0.6.0); with ``TUNER_BRIDGE_TRANSLATOR`` pointing at that script,
the translator itself is run on the exported flags too.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.launch.test_megatron_flags import CONFIGS
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.errors import ConfigError
from tuner.launch import bridge
from tuner.launch.megatron_flags import megatron_moe_flags, megatron_parallel_flags
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

REPO = Path(__file__).resolve().parents[2]
RECIPE_SCRIPT = REPO / "tests" / "standins" / "megatron_bridge" / "scripts" / "training"
sys.path.insert(0, str(RECIPE_SCRIPT))
import run_recipe  # noqa: E402  (the stand-in: its field table and type check)

MOE_CONFIGS = {
    "moe-ep4-flex": ParallelConfig(
        tp=2, dp=8, ep=4, sequence_parallel=True, micro_batch_size=1, global_batch_size=64,
        moe_token_dispatcher="flex", distributed_optimizer=True,
    ),
    "moe-ep2-etp1-alltoall": ParallelConfig(
        tp=2, dp=8, ep=2, etp=1, sequence_parallel=True, micro_batch_size=1,
        global_batch_size=64, moe_token_dispatcher="alltoall",
    ),
    "moe-plain": ParallelConfig(dp=16, micro_batch_size=1, global_batch_size=64),
}  # fmt: skip

# Megatron-LM flag -> Bridge field (translate_mlm_to_bridge.py v0.6.0 ARG_MAP; the first/last
# stage counts from its BRIDGE_TO_MLM_EXTRA; --tp-comm-overlap, --recompute-modules and the
# expert flags are the same-named TransformerConfig fields Megatron-LM copies its args into,
# core_transformer_config_from_args). Megatron-LM's default where a flag is left out.
FLAG_FIELD: dict[str, tuple[str, Any]] = {
    "--tensor-model-parallel-size": ("model.tensor_model_parallel_size", 1),
    "--pipeline-model-parallel-size": ("model.pipeline_model_parallel_size", 1),
    "--context-parallel-size": ("model.context_parallel_size", 1),
    "--num-virtual-stages-per-pipeline-rank": ("model.virtual_pipeline_model_parallel_size", None),
    "--decoder-first-pipeline-num-layers": ("model.num_layers_in_first_pipeline_stage", None),
    "--decoder-last-pipeline-num-layers": ("model.num_layers_in_last_pipeline_stage", None),
    "--account-for-embedding-in-pipeline-split":
        ("model.account_for_embedding_in_pipeline_split", False),
    "--account-for-loss-in-pipeline-split": ("model.account_for_loss_in_pipeline_split", False),
    "--pipeline-model-parallel-layout": ("model.pipeline_model_parallel_layout", None),
    "--sequence-parallel": ("model.sequence_parallel", False),
    "--tp-comm-overlap": ("model.tp_comm_overlap", False),
    "--micro-batch-size": ("train.micro_batch_size", None),
    "--global-batch-size": ("train.global_batch_size", None),
    "--recompute-granularity": ("model.recompute_granularity", None),
    "--recompute-method": ("model.recompute_method", None),
    "--recompute-num-layers": ("model.recompute_num_layers", None),
    "--overlap-grad-reduce": ("ddp.overlap_grad_reduce", False),
    "--use-distributed-optimizer": ("ddp.use_distributed_optimizer", False),
    "--overlap-param-gather": ("ddp.overlap_param_gather", False),
    "--expert-model-parallel-size": ("model.expert_model_parallel_size", 1),
    "--expert-tensor-parallel-size": ("model.expert_tensor_parallel_size", None),
    "--moe-token-dispatcher-type": ("model.moe_token_dispatcher_type", "allgather"),
}  # fmt: skip
MOE_PARALLEL = {"--expert-model-parallel-size", "--expert-tensor-parallel-size",
                "--moe-token-dispatcher-type", "--moe-enable-deepep"}  # fmt: skip


def _spec(moe: bool) -> StudySpec:
    return study_from_mapping({
        "name": "bridge-flags",
        "model": {"preset": "mixtral-8x7b" if moe else "llama3-8b"},
        "training": {"global_batch_size": 64, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2,
                    "executor": "local"},
        "framework": "megatron-bridge",
        "launch": {"template": "megatron_bridge", "bridge_path": "/opt/Megatron-Bridge",
                   "recipe": "llama3_8b_pretrain_config"},
    })  # fmt: skip


CASES = {
    **{k: (c, False) for k, c in CONFIGS.items()},
    **{k: (c, True) for k, c in MOE_CONFIGS.items()},
}


def _typed(word: str) -> tuple[str, Any]:
    key, _, text = word.partition("=")
    return key, run_recipe.hydra_value(text)


def mlm_meaning(config: ParallelConfig, spec: StudySpec) -> dict[str, Any]:
    """The Megatron-LM flags of ``config`` as Bridge field values, defaults filled in."""
    flags = megatron_parallel_flags(config, spec.model.num_layers)
    flags += [f for f in megatron_moe_flags(spec.model, config) if f[0] in MOE_PARALLEL]
    given = {f[0]: f[1:] for f in flags}
    out: dict[str, Any] = {}
    for flag, (field, default) in FLAG_FIELD.items():
        if flag == "--moe-token-dispatcher-type" and spec.model.moe is None:
            continue
        if flag not in given:
            out[field] = default
        elif not given[flag]:
            out[field] = True
        else:
            values = [run_recipe.hydra_value(v) for v in given[flag]]
            out[field] = values[0]
    if "--num-layers-per-virtual-pipeline-stage" in given:  # translator's vpp_from_layers
        per = int(given["--num-layers-per-virtual-pipeline-stage"][0])
        out["model.virtual_pipeline_model_parallel_size"] = spec.model.num_layers // (
            config.pp * per
        )
    if "--recompute-modules" in given:
        out["model.recompute_modules"] = list(given["--recompute-modules"])
    elif config.recompute == "selective":
        out["model.recompute_modules"] = None  # TransformerConfig's default (core_attn)
    if "--moe-enable-deepep" in given:
        out["model.moe_flex_dispatcher_backend"] = "deepep"
    if spec.model.moe is None:
        for flag in MOE_PARALLEL - {"--moe-enable-deepep"}:
            out.pop(FLAG_FIELD[flag][0], None)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_overrides_mean_what_the_megatron_flags_mean(case: str) -> None:
    config, moe = CASES[case]
    spec = _spec(moe)
    assert validate(config, spec.model, spec.world_size, spec.framework) == []
    words = bridge.override_words(bridge.parallel_overrides(config, spec.model))
    ours = dict(_typed(w) for w in words)
    assert len(ours) == len(words), "a field is overridden twice"
    # Bridge syncs the distributed optimizer and the param gather overlap between the DDP and
    # the optimizer configs (either on turns both on): they must agree
    for name in ("use_distributed_optimizer", "overlap_param_gather"):
        assert ours.pop(f"optimizer.{name}") == ours[f"ddp.{name}"]
    assert ours == mlm_meaning(config, spec)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_every_trial_override_names_a_real_field_of_the_right_type(
    case: str, precision: str
) -> None:
    config, moe = CASES[case]
    spec = _spec(moe)
    spec = dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, precision=precision)
    )
    for word in bridge.override_words(bridge.trial_overrides(spec, config)):
        key, value = _typed(word)
        if key == "mixed_precision":
            assert value in ("bf16_mixed", "fp16_mixed", None)
            continue
        section, _, field = key.partition(".")
        annotation = run_recipe.FIELDS[section].get(field)
        assert annotation is not None, f"{key} is not a field of Bridge v0.6.0's {section}"
        assert run_recipe.accepts(annotation, value), f"{word}: field is {annotation}"


def test_hostile_strings_are_quoted_for_the_override_grammar() -> None:
    assert bridge.hydra_value("Et*7|t*9|t*9|t*7L") == "'Et*7|t*9|t*9|t*7L'"
    assert bridge.hydra_value("a'; echo pwned") == "'a\\'; echo pwned'"
    assert bridge.hydra_value("true") == "'true'" and bridge.hydra_value(None) == "null"
    for text in ("Et*7|t*9|t*9|t*7L", "a'; echo pwned", "true", "x y"):
        assert run_recipe.hydra_value(bridge.hydra_value(text)) == text


def test_recipe_function_sets_the_same_values() -> None:
    config = CONFIGS["pp4-vp2-first6-last6"]
    spec = _spec(False)
    overrides = bridge.parallel_overrides(config, spec.model)
    text = bridge.recipe_function(overrides, recipe="llama3_8b_pretrain_config", note="n")
    tree = ast.parse(text)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "<recipe>", "exec"), namespace)
    sections = {name.split(".")[0] for name, _ in overrides}
    cfg = SimpleNamespace(**{s: SimpleNamespace() for s in sections})
    namespace["apply_tuned"](cfg)
    for name, value in overrides:
        section, field = name.split(".")
        expected = list(value) if isinstance(value, tuple) else value
        assert getattr(getattr(cfg, section), field) == expected
    assert "apply_tuned(llama3_8b_pretrain_config())" in text


def test_export_refuses_a_framework_megatron_core_cannot_express() -> None:
    spec = dataclasses.replace(_spec(False), framework="megatron-deepspeed")
    with pytest.raises(ConfigError, match="framework"):
        bridge.emit(spec, ParallelConfig(dp=16, global_batch_size=64), "bridge-overrides")
    megatron = dataclasses.replace(_spec(False), framework="megatron")
    text = bridge.emit(megatron, CONFIGS["dp16-plain"], "bridge-overrides")
    assert "train.global_batch_size=64" in text.split()


def test_the_exported_overrides_pasted_in_a_shell_are_the_trials_words(tmp_path: Path) -> None:
    """The bridge-overrides line, run by bash, gives the recipe script the words a trial's
    template passed: the Hydra quotes of a layout (unquoted, its ',' is a sweep and its '(' a
    syntax error) and a '[...]' list (a glob: here it matched a file) reach Bridge as written."""
    config = dataclasses.replace(
        CONFIGS["pp4-layout"], pipeline_split="layout:Et*7|(t*9|)*2,t*7L", recompute="selective",
        recompute_modules=("mlp", "core_attn"),
    )  # fmt: skip
    spec = _spec(False)
    (tmp_path / "model.recompute_modules=m").touch()
    line = bridge.emit(spec, config, "bridge-overrides")
    done = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], cwd=tmp_path, check=True,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    words = bridge.override_words(bridge.parallel_overrides(config, spec.model))
    assert done.stdout.split("\0")[:-1] == words
    assert "model.pipeline_model_parallel_layout='Et*7|(t*9|)*2,t*7L'" in words


def test_a_bridge_study_needs_its_recipe() -> None:
    data = {
        "name": "x", "model": {"preset": "llama3-8b"}, "training": {"global_batch_size": 64},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 1,
                    "executor": "local"},
        "framework": "megatron-bridge",
        "launch": {"template": "megatron_bridge", "bridge_path": "/opt/Megatron-Bridge"},
    }  # fmt: skip
    with pytest.raises(ConfigError, match="launch.recipe"):
        study_from_mapping(data)


@pytest.mark.skipif(
    not os.environ.get("TUNER_BRIDGE_TRANSLATOR"),
    reason="TUNER_BRIDGE_TRANSLATOR (Megatron-Bridge v0.6.0 scripts/translate_mlm_to_bridge.py) "
    "not set",
)
@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_bridges_own_translator_agrees(case: str) -> None:
    config, spec = CONFIGS[case], _spec(False)
    args = " ".join(w for f in megatron_parallel_flags(config, spec.model.num_layers) for w in f)
    args += f" --num-layers {spec.model.num_layers}"
    done = subprocess.run(
        [sys.executable, os.environ["TUNER_BRIDGE_TRANSLATOR"], "--args", args],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    theirs = dict(
        _typed(line.strip().rstrip("\\").strip())
        for line in done.stdout.splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    )
    ours = dict(
        _typed(w) for w in bridge.override_words(bridge.parallel_overrides(config, spec.model))
    )
    compared = [k for k in theirs if k in ours]
    assert len(compared) >= 6, theirs
    assert {k: theirs[k] for k in compared} == {k: ours[k] for k in compared}


@pytest.mark.parametrize("case", ["tp2-pp2-vp2-sp-full-uniform-1-distopt", "moe-ep4-flex"])
def test_bridge_is_modelled_as_megatron(case: str) -> None:
    """The rules, memory and time models read Megatron-Core's traits from the framework table:
    a Bridge study of a config predicts what the Megatron-LM study of it predicts."""
    from tuner.api import estimate

    config, moe = CASES[case]
    ours = _spec(moe)
    megatron = dataclasses.replace(ours, framework="megatron")
    a, b = estimate(ours, config), estimate(megatron, config)
    assert a.errors == b.errors == ()
    assert a.memory is not None and a.time is not None
    assert a.memory == b.memory and a.time == b.time


def test_the_script_passes_the_overrides_intact_with_hostile_paths(tmp_path: Path) -> None:
    """Node 0's script, run under bash with a fake torchrun: the recipe script, the recipe and
    every override reach it word for word, after the extra arguments, whatever the quoting."""
    from tests.launch.test_megatron_flags import FAKE_TORCHRUN
    from tuner.launch.templates import render_launch

    bin_dir = tmp_path / "venv dir" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN.format(python=sys.executable))
    (bin_dir / "torchrun").chmod(0o755)
    spec = _spec(False)
    hostile = "/opt/Bridge 'x'; echo pwned"
    launch = dataclasses.replace(
        spec.launch, python=str(bin_dir / "python"), bridge_path=hostile,
        recipe="llama3_8b'; touch pwned", extra_args=("--deterministic",),
    )  # fmt: skip
    spec = dataclasses.replace(spec, launch=launch)
    config = CONFIGS["pp4-layout"]
    out = render_launch(spec, config, hosts=["n1"], master_addr="n1", master_port=29500,
                        trial_dir="/results/t/0", cwd=tmp_path)  # fmt: skip
    (tmp_path / "launch.sh").write_text(out.scripts[0])
    dump = tmp_path / "argv.json"
    env = {"PATH": "/usr/bin:/bin", "FAKE_TORCHRUN_OUT": str(dump), "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(tmp_path / "launch.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = json.loads(dump.read_text())
    script = argv.index(hostile + "/scripts/training/run_recipe.py")
    assert argv[script + 1 :] == [
        "--recipe", "llama3_8b'; touch pwned", "--mode", "pretrain", "--dataset", "mock",
        "--deterministic", *bridge.override_words(bridge.trial_overrides(spec, config)),
    ]  # fmt: skip
    assert "model.pipeline_model_parallel_layout='Et*7|t*9|t*9|t*7L'" in argv
    assert not (tmp_path / "pwned").exists()


def test_a_recipe_name_with_a_line_break_stays_in_its_comment() -> None:
    """The recipe function's usage line is a comment: a study's recipe value holding a line
    break must not put code into the file a user imports."""
    spec = _spec(False)
    evil = "llama3_8b\nopen('pwned', 'w')"
    spec = dataclasses.replace(spec, launch=dataclasses.replace(spec.launch, recipe=evil))
    text = bridge.emit(spec, ParallelConfig(dp=16, global_batch_size=64), "bridge-recipe")
    module = ast.parse(text)
    assert [type(n).__name__ for n in module.body] == ["ImportFrom", "FunctionDef"], text
    assert "# usage: cfg = apply_tuned(llama3_8b\\nopen('pwned', 'w')())" in text


def test_a_qkv_bias_reaches_the_recipe_as_its_field() -> None:
    """A Qwen-style QKV bias (modelled as a bias on Q, K and V) is TransformerConfig's
    ``add_qkv_bias``; left unset, the recipe's own value stays."""
    spec = _spec(False)
    config = ParallelConfig(tp=2, dp=8, global_batch_size=64)
    plain = bridge.override_words(bridge.trial_overrides(spec, config))
    assert not any(w.startswith("model.add_qkv_bias=") for w in plain)
    model = dataclasses.replace(spec.model, add_qkv_bias=True)
    words = bridge.override_words(bridge.trial_overrides(dataclasses.replace(spec, model=model),
                                                         config))  # fmt: skip
    assert [w for w in words if w not in plain] == ["model.add_qkv_bias=true"]
    key, value = _typed("model.add_qkv_bias=true")
    assert run_recipe.accepts(run_recipe.FIELDS["model"]["add_qkv_bias"], value) and value is True
