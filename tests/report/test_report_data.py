"""The report's data and page over small studies written by hand (no browser, no processes)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import optuna
import pytest

from tests.test_results import SPEC, config, record
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError, StudyError
from tuner.layout import ResultsLayout
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.time.estimate import estimate_time
from tuner.outcome import Outcome
from tuner.report.build import build_report
from tuner.report.data import MEMORY_PARTS, TIME_PARTS, gather
from tuner.report.page import payback_plan
from tuner.space.enumerate import study_gpu
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def new_study(tmp_path: Path) -> optuna.Study:
    layout = ResultsLayout(tmp_path, SPEC.name)
    return optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout))


def test_one_measured_trial_builds_and_says_why_optuna_views_are_missing(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0, launched=True, duration_s=60.0)
    path, parts = build_report(SPEC, results=str(tmp_path))
    assert path == tmp_path / SPEC.name / "report.html"
    optuna_section = next(s for s in parts if s.id == "optuna")
    assert optuna_section.figures == []
    assert "at least 2 completed trials (1 so far)" in optuna_section.note
    text = path.read_text()
    assert text.count('id="plotly-js"') == 1 and "<script src=" not in text
    assert config(2, 1).key() in text


def test_an_empty_study_still_makes_a_page(tmp_path: Path) -> None:
    new_study(tmp_path)
    path, parts = build_report(SPEC, results=str(tmp_path), out=tmp_path / "x" / "r.html")
    assert path.exists() and "No trial has measured a step time yet." in path.read_text()
    assert payback_plan(gather(SPEC, results=str(tmp_path))) is None
    with pytest.raises(StudyError, match="no results"):
        build_report(SPEC, results=str(tmp_path / "nothing"))


def test_payback_against_a_baseline(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 4.0, launched=True, duration_s=3600.0)
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0, launched=True, duration_s=3600.0)
    data = gather(SPEC, results=str(tmp_path), train_tokens=1e9)
    assert data.baseline is not None and data.baseline.number == 0  # the model's first pick
    assert data.gpu_hours == pytest.approx(2 * 8.0)  # two trials, one node of 8 GPUs, 1 h each
    plan = payback_plan(data)
    assert plan is not None
    per_gpu = 64 * SPEC.model.seq_length / 8  # tokens per step per GPU
    assert plan["found_gpu_hours"] == pytest.approx(1e9 / (per_gpu / 2.0) / 3600)
    assert plan["baseline_gpu_hours"] == pytest.approx(2 * plan["found_gpu_hours"])
    saved_per_token = plan["saved_gpu_hours"] / 1e9
    assert plan["break_even_tokens"] == pytest.approx(16.0 / saved_per_token)
    same = payback_plan(gather(SPEC, results=str(tmp_path), baseline="tp=4", train_tokens=1e9))
    assert (
        same is not None and same["saved_gpu_hours"] == 0 and math.isinf(same["break_even_tokens"])
    )


@pytest.mark.parametrize(("baseline", "tokens"), [("tp=4", 1e9), ("tp=2", 1e308)])
def test_the_payback_table_shows_figures_not_inf_or_300_digits(
    tmp_path: Path, baseline: str, tokens: float
) -> None:
    """The baseline as the found config read "break-even after inf training tokens", and
    ``--train-tokens 1e308`` a cell of 300 digits."""
    from tuner.report.page import sections

    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 4.0, launched=True, duration_s=3600.0)
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0, launched=True, duration_s=3600.0)
    data = gather(SPEC, results=str(tmp_path), baseline=baseline, train_tokens=tokens)
    (payback,) = (s for s in sections(data) if s.id == "progress")
    cells = [c for table in payback.tables for c in re.findall(r"<td>(.*?)</td>", str(table))]
    assert len(cells) == 7 and not any("inf" in c or len(c) > 60 for c in cells), cells
    if baseline == "tp=4":
        assert "never: the found config saves nothing over the baseline" in cells


def test_no_payback_without_the_training_length(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 4.0, launched=True, duration_s=3600.0)
    record(study, SPEC, config(4, 2), Outcome.OK, 2.0, launched=True, duration_s=3600.0)
    assert payback_plan(gather(SPEC, results=str(tmp_path))) is None
    path, parts = build_report(SPEC, results=str(tmp_path))
    progress = next(s for s in parts if s.id == "progress")
    assert [n for n, _ in progress.figures] == ["progress"]
    assert "--train-tokens N" in progress.note and "1e+12" not in path.read_text()


def test_baseline_must_name_one_measured_trial(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 1), Outcome.OK, 3.0)
    record(study, SPEC, config(2, 2), Outcome.OK, 2.0)
    with pytest.raises(ConfigError, match="matches 2 measured trials"):
        gather(SPEC, results=str(tmp_path), baseline="tp=2")
    with pytest.raises(ConfigError, match="matches no measured trial"):
        gather(SPEC, results=str(tmp_path), baseline="7")
    assert gather(SPEC, results=str(tmp_path), baseline="tp=2,mbs=2").baseline is not None


def test_breakdowns_add_up_to_the_models_totals(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    c = config(2, 2)
    record(study, SPEC, c, Outcome.OK, 3.0)
    data = gather(SPEC, results=str(tmp_path))
    stages, parts = data.breakdowns(data.rows[0])
    gpu = study_gpu(SPEC)
    memory = estimate_memory(SPEC.model, c, gpu, SPEC.framework, SPEC.training.precision)
    time = estimate_time(SPEC.model, SPEC.training, c, gpu, 8, SPEC.framework)
    assert len(stages) == 1 and list(stages[0].parts) == list(MEMORY_PARTS)
    assert stages[0].total == pytest.approx(memory.peak / GIB)
    assert f"stage {memory.stage}" in stages[0].label
    assert list(parts) == list(TIME_PARTS) and sum(parts.values()) == pytest.approx(time.step)


def test_a_config_measured_again_shares_its_breakdowns(tmp_path: Path) -> None:
    """The predicted breakdowns are the models' of the config, so a config measured twice is
    computed once (a long study re-measures configs) and both rows show the same."""
    study = new_study(tmp_path)
    record(study, SPEC, config(2, 2), Outcome.OK, 3.0)
    record(study, SPEC, config(2, 2), Outcome.OK, 3.1)
    record(study, SPEC, config(2, 1), Outcome.OK, 2.0)
    data = gather(SPEC, results=str(tmp_path))
    first, again, other = (data.breakdowns(r) for r in data.rows)
    assert first is again and first == again
    assert other != first  # another config: its own figures


def test_the_reports_trials_copy_without_their_attributes(tmp_path: Path) -> None:
    """Optuna's in-memory storage (the report's Optuna views) deep-copies trials on every add
    and read; the report's read-only trials copy as shallow ones, and the plots see the same.
    They are read with what Optuna's views read (values, parameters, times), no attributes."""
    import copy

    study = new_study(tmp_path)
    record(study, SPEC, config(2, 2), Outcome.OK, 3.0)
    record(study, SPEC, config(2, 1), Outcome.OK, 2.0)
    data = gather(SPEC, results=str(tmp_path))
    stored = study.get_trials()
    for t, kept in zip(stored, data.trials, strict=True):
        assert kept.params == t.params and kept.distributions == t.distributions
        assert (kept.number, kept.state, kept.values, kept.datetime_start,
                kept.datetime_complete) == (t.number, t.state, t.values, t.datetime_start,
                                            t.datetime_complete)  # fmt: skip
        assert kept.user_attrs == {} and t.user_attrs
        twin = copy.deepcopy(kept)
        assert twin is not kept and twin == kept and twin.user_attrs is kept.user_attrs
        shallow = copy.copy(kept)  # the generic protocol's copy: the same class and entries
        assert type(twin) is type(shallow) and twin.__dict__ == shallow.__dict__
        assert all(twin.__dict__[k] is v for k, v in shallow.__dict__.items())
        twin.number = 99  # what the in-memory storage does to what it adds
        assert kept.number == t.number
    memory = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    memory.add_trials(data.trials)
    assert [t.params for t in memory.trials] == [t.params for t in stored]
    assert [t.values for t in memory.trials] == [t.values for t in stored]


LAUNCH = {
    "megatron": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
    "deepspeed": {"template": "deepspeed_gpt", "script": "train.py"},
    "megatron-deepspeed": {"template": "megatron_deepspeed_gpt", "megatron_path": "/opt/mds"},
    "torchtitan": {
        "template": "torchtitan_llama",
        "script_args": ["--module", "llama3", "--config", "llama3_8b"],
    },
}


def framework_spec(framework: str) -> StudySpec:
    return study_from_mapping({
        "name": f"launch-{framework}", "model": {"preset": "llama2-7b"},
        "training": {"global_batch_size": 64},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
        "framework": framework, "launch": LAUNCH[framework],
        "space": {"micro_batch_size": [1, 2]},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("framework", "shown"),
    [("megatron", ["Megatron arguments"]), ("deepspeed", ["ds_config.json"]),
     ("megatron-deepspeed", ["Megatron arguments", "ds_config.json"]),
     ("torchtitan", ["torchtitan arguments"])],
)  # fmt: skip
def test_the_launch_line_follows_what_the_framework_takes(
    tmp_path: Path, framework: str, shown: list[str]
) -> None:
    """megatron-deepspeed runs Megatron's model code under DeepSpeed's engine: its launch
    needs the fork's arguments and the ds_config (ZeRO stage, batch sizes) both."""
    spec = framework_spec(framework)
    layout = ResultsLayout(tmp_path, spec.name)
    study = optuna.create_study(study_name=spec.name, storage=open_storage(None, layout))
    c = config(1, 2)
    record(study, spec, c, Outcome.OK, 3.0, launched=True, duration_s=60.0)
    data = gather(spec, results=str(tmp_path))
    assert data.best is not None
    got = dict(data.launch_args(data.best))
    assert list(got) == shown
    if "ds_config.json" in got:
        assert json.loads(got["ds_config.json"])["zero_optimization"] == {"stage": c.zero_stage}
    if "Megatron arguments" in got:
        assert "--micro-batch-size 2" in got["Megatron arguments"]
    if "torchtitan arguments" in got:  # what `tune best --emit torchtitan` writes
        assert got["torchtitan arguments"].startswith("--module llama3 --config llama3_8b")
        assert "--training.local-batch-size 2" in got["torchtitan arguments"]
    text = build_report(spec, results=str(tmp_path))[0].read_text()
    assert all(what in text for what in shown)


def test_the_megatron_arguments_paste_into_a_shell_as_they_are(tmp_path: Path) -> None:
    """An uneven pipeline split's layout holds '|' and '*': the report's line is shell-quoted
    (as ``tune best --emit args`` writes it), so pasting it runs no pipe."""
    from tuner.report.leaderboard import megatron_args

    spec = framework_spec("megatron")
    c = ParallelConfig(tp=1, pp=4, dp=2, micro_batch_size=1, global_batch_size=64,
                       pipeline_split="layout:Et*7|t*9|t*9|t*7L")  # fmt: skip
    storage = open_storage(None, ResultsLayout(tmp_path, spec.name))
    study = optuna.create_study(study_name=spec.name, storage=storage)
    record(study, spec, c, Outcome.OK, 3.0, launched=True, duration_s=60.0)
    data = gather(spec, results=str(tmp_path))
    assert data.best is not None
    line = dict(data.launch_args(data.best))["Megatron arguments"]
    pasted = subprocess.run(["bash", "-c", f"printf '%s\\n' {line}"], capture_output=True,
                            text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert pasted.stdout.splitlines() == megatron_args(spec, c), pasted.stderr or line


def test_the_report_reads_storage_and_never_the_loop() -> None:
    from tests.test_structure import _graph

    graph = _graph()
    loop = {"tuner.study.loop", "tuner.cli.main", "tuner.cli.commands", "tuner.study.screen",
            "tuner.study.schedule", "tuner.study.record", "tuner.study.recovery",
            "tuner.study.leases", "tuner.cli.progress"}  # fmt: skip
    report = [name for name in graph if name.startswith("tuner.report")]
    assert "tuner.report.data" in report
    for name in report:
        assert not graph[name] & loop, (name, graph[name] & loop)


def test_the_memory_bars_are_one_per_pipeline_stage() -> None:
    from tuner.catalog import get_gpu
    from tuner.config.parallel import ParallelConfig
    from tuner.models.memory.estimate import estimate_memory
    from tuner.report.data import stage_memory
    from tuner.spec.study import ModelSpec

    model = ModelSpec(num_layers=30, hidden_size=1024, num_attention_heads=16,
                      ffn_hidden_size=4096, vocab_size=32000, seq_length=1024)  # fmt: skip
    c = ParallelConfig(pp=4, dp=2, micro_batch_size=1, global_batch_size=16,
                       pipeline_split="first=7,last=7")  # fmt: skip
    memory = estimate_memory(model, c, get_gpu("a100-80gb"))
    bars = stage_memory(memory)
    assert [b.label.split(" (")[0] for b in bars] == ["stage 0", "stage 1", "stage 2", "stage 3"]
    assert [b.label.count("most loaded") for b in bars].count(1) == 1
    assert "7 layers" in bars[0].label and "8 layers" in bars[1].label
    worst = max(bars, key=lambda b: b.total)
    assert "most loaded" in worst.label
    assert worst.total * 2**30 <= memory.peak * (1 + 1e-9)


def test_moe_and_fp8_parts_are_their_own_bars_and_dense_studies_leave_them_out() -> None:
    from tuner.catalog import get_gpu
    from tuner.report.data import MOE_FP8_TIME_PARTS, time_parts
    from tuner.spec.moe import MoESpec
    from tuner.spec.study import ModelSpec, TrainingSpec

    h100 = get_gpu("h100-sxm-80gb")
    moe = ModelSpec(
        num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        vocab_size=1024, seq_length=128, swiglu=True,
        moe=MoESpec(num_experts=4, router_topk=2),
    )  # fmt: skip
    c = ParallelConfig(dp=2, ep=2, micro_batch_size=1, global_batch_size=8)
    t = estimate_time(moe, TrainingSpec(global_batch_size=8, precision="fp8"), c, h100, 2)
    parts = time_parts(t)
    assert parts["EP comm"] == t.ep_comm > 0
    assert parts["FP8 casts, MoE routing"] == t.fp8_cast + t.moe_routing > t.moe_routing > 0
    assert sum(parts.values()) == pytest.approx(t.step) and parts["other"] >= 0
    dense = time_parts(estimate_time(SPEC.model, SPEC.training, config(2, 2), study_gpu(SPEC), 8))
    assert all(dense[p] == 0 for p in MOE_FP8_TIME_PARTS)
