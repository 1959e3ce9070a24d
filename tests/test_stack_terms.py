"""The framework probe's composition (tuner.models.stack, tuner.profile.stack_terms): a stand-in
stack with a known per-layer surface, probed at 1 and 4 layers, must predict depth N (8) and
configs the probe never ran; the saved probe round-trips and a stale or foreign one is refused in
one line."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.standins.probe_log import probe_job_log
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.rates import Rates, catalog_rates
from tuner.models.stack import CATALOG, StackTerms
from tuner.models.time.estimate import estimate_time
from tuner.profile import probe
from tuner.profile.probe import ProbeResult, ProbeRow, probe_depths, probe_runs, split_points
from tuner.profile.probe_file import check_probe, load_probe, save_probe
from tuner.profile.run import MAX_AGE_DAYS, ProfileError
from tuner.profile.stack_terms import derive_terms, study_terms
from tuner.space.enumerate import iter_configs, study_gpu
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

STUDY: dict[str, Any] = {
    "name": "standin",
    "model": {"num_layers": 8, "hidden_size": 256, "num_attention_heads": 4,
              "ffn_hidden_size": 1024, "seq_length": 256, "vocab_size": 4096,
              "tied_embeddings": False, "dropout": False, "flash_attention": True},
    "training": {"global_batch_size": 8, "precision": "fp32"},
    "cluster": {"gpu": "cpu", "gpus_per_node": 2, "num_nodes": 1, "executor": "local",
                "gpu_memory_gib": 4.0},
    "framework": "deepspeed",
    "launch": {"template": "deepspeed_gpt", "script": "train.py", "python": "python"},
    "space": {"pp": [1, 2], "micro_batch_size": [1, 2, 4], "recompute": ["none", "full"],
              "recompute_method": ["uniform"], "recompute_num_layers": [1],
              "zero_stage": [0, 1]},
}  # fmt: skip
ACTIVATIONS, EXTRAS = {"none": 1.3, "full": 0.6}, 0.7
"""The stand-in's saved activations and extras against the catalog's: a stack that keeps more
per layer without recomputation (an unfused kernel's extra saved tensor), less with full
recomputation (a checkpoint that keeps its input alone and frees the rebuilt layer early), and a
loss that keeps less (a fused one)."""
STATES, SHARDED_WORK = {0: 1.0, 1: 1.15}, {0: 1.0, 1: 1.8}
"""Its model states and its step's sharding-dependent work (data-parallel traffic, optimizer
step) against the catalog's, by ZeRO stage: stage 1 keeps an extra fp32 gradient partition and
reduces in more, smaller messages; stage 0 is the catalog's (the probe's base point takes the
catalog's states)."""


STEP_OVERHEAD = 3.0
"""The stand-in's fixed work per optimizer step (its engine's step call, gradient norm, logging)
against the catalog's: what only two micro-batch counts at one depth tell apart from a
micro-batch's work."""
PIPE_MB = 0.03
"""Seconds the stand-in's pipeline engine spends on each micro-batch's schedule (instructions,
the activation's and gradient's send and receive set-up) on every stage, fill and drain included:
a cost the catalog and a data-parallel point know nothing of, which only a point with pipeline
stages measures."""


def spec_of(data: dict[str, Any] | None = None) -> StudySpec:
    return study_from_mapping(copy.deepcopy(data or STUDY), base_dir=Path.cwd())


def standin_rates(spec: StudySpec, hbm: float = 0.7, overhead: float = STEP_OVERHEAD) -> Rates:
    """The stand-in's true speeds: GEMMs at 60% of the catalog's, streaming kernels at ``hbm``
    of it, a per-micro-batch framework cost the catalog does not have, and ``overhead`` times
    the catalog's fixed work per step."""
    base = catalog_rates(study_gpu(spec), spec.training.precision)
    return dataclasses.replace(base, gemm=base.gemm * 0.6, gemm16=base.gemm16 * 0.6,
                               hbm=base.hbm * hbm, microbatch_overhead=0.004,
                               step_overhead=base.step_overhead * overhead)  # fmt: skip


def at_depth(spec: StudySpec, layers: int) -> Any:
    return dataclasses.replace(spec.model, num_layers=layers)


def true_step(
    spec: StudySpec, c: ParallelConfig, layers: int, rates: Rates | None = None
) -> float:
    gpn, rates = spec.cluster.gpus_per_node, rates or standin_rates(spec)
    model = at_depth(spec, layers)
    t = estimate_time(model, spec.training, c, study_gpu(spec), gpn, spec.framework, rates)
    pipe = (max(c.num_microbatches, 1) + c.pp - 1) * PIPE_MB if c.pp > 1 else 0.0
    return t.step + (SHARDED_WORK[c.zero_stage] - 1) * (t.dp_comm + t.optimizer) + pipe


def true_peak(spec: StudySpec, c: ParallelConfig, layers: int) -> float:
    """Bytes: the largest phase of any stage with the stand-in's activations, extras and states
    (the step phase's buffers are the optimizer's temporaries, not states). Its ranks are CPU
    ranks: the figure is a tensor accounting, which holds none of the step's temporaries."""
    mem = estimate_memory(at_depth(spec, layers), c, study_gpu(spec), spec.framework,
                          spec.training.precision)  # fmt: skip
    a, k = ACTIVATIONS[c.recompute], STATES[c.zero_stage]
    return max(
        p.allocated + (a - 1) * p.activations + (EXTRAS - 1) * p.stage_extras
        + (k - 1) * (p.weights + p.grads + p.optimizer)
        + (k if p.phase == "fwd_bwd" else 0.0) * p.framework_buffers - p.framework_buffers
        for s in mem.stages for p in s.phases
    )  # fmt: skip


def probe_rows(spec: StudySpec, rates: Rates | None = None) -> list[ProbeRow]:
    """What the probe would measure on the stand-in (at ``rates``, its own by default) at its
    own points."""
    rows = []
    for run in probe_runs(spec):
        layers = run.depth * run.config.pp * run.config.vp  # the depth is per stage
        step = true_step(spec, run.launched, layers, rates)
        rows.append(ProbeRow(key=run.launched.key(), depth=run.depth, step_s=step,
                             samples_s=(step * 0.99, step, step * 1.01),
                             peak_gib=true_peak(spec, run.launched, layers) / GIB,
                             reserved_gib=None))  # fmt: skip
    return rows


def predicted(spec: StudySpec, c: ParallelConfig, terms: StackTerms) -> tuple[float, float]:
    gpu, rates = study_gpu(spec), catalog_rates(study_gpu(spec), spec.training.precision)
    step = estimate_time(spec.model, spec.training, c, gpu, spec.cluster.gpus_per_node,
                         spec.framework, rates, terms=terms).step  # fmt: skip
    peak = estimate_memory(spec.model, c, gpu, spec.framework, spec.training.precision,
                           terms=terms).peak  # fmt: skip
    return step, peak


def test_probes_at_two_depths_predict_depth_n_and_unprobed_configs() -> None:
    spec = spec_of()
    # 1 layer and 4 (the most the probe runs), short of the stand-in's 8 and its pipeline
    # configs' 4 per stage: depth N is an extrapolation for every flat config
    assert probe_depths(spec) == (1, 4) and spec.model.num_layers == 8
    assert {r.depth for r in probe_runs(spec)} == {1, 4}
    terms = derive_terms(spec, probe_rows(spec))
    probed = {r.config.key() for r in probe_runs(spec)}
    checked = kept_out = 0
    catalog_off = 0.0
    for c in iter_configs(spec):
        step, peak = predicted(spec, c, terms)
        truth_step = true_step(spec, c, spec.model.num_layers)
        truth_peak = true_peak(spec, c, spec.model.num_layers)
        catalog_step, catalog_peak = predicted(spec, c, CATALOG)
        # the catalog alone is far off the stand-in, the composition is not
        assert catalog_step / truth_step < 0.8
        catalog_off = max(catalog_off, abs(catalog_peak / truth_peak - 1))
        # another micro-batch size changes the mix of GEMMs, streaming kernels and fixed costs
        # that the stand-in prices unlike the catalog: the model's own scaling carries most of it
        near = 0.02 if c.micro_batch_size == 2 else 0.06
        assert step / truth_step == pytest.approx(1.0, rel=near), c.key()
        assert peak / truth_peak == pytest.approx(1.0, rel=0.005), c.key()
        checked += 1
        kept_out += c.key() not in probed
        if c.key() in probed:  # the probed config itself, at 8 layers instead of 1 or 4
            assert step / truth_step == pytest.approx(1.0, rel=0.005)
            assert peak / truth_peak == pytest.approx(1.0, rel=0.005)
    assert catalog_off > 0.1
    assert checked >= 20 and kept_out == checked - len(probed)
    # the step's fixed rest, from the base point at two micro-batch counts (what it holds
    # besides the model's optimizer step, whose stand-in rate is off too)
    scales = {p.overhead_scale for p in terms.points}
    assert len(scales) == 1 and scales.pop() == pytest.approx(STEP_OVERHEAD, rel=0.05)
    sources = {s.term: s.source for s in terms.sources(next(iter_configs(spec)))}
    assert sources["step_overhead"] == "measured"  # tune estimate says where it came from
    # recomputation and ZeRO stage 1 together: no probed point has both, each effect comes from
    # its own neighbour
    both = [c for c in iter_configs(spec) if c.recompute == "full" and c.zero_stage == 1]
    assert both and not {c.key() for c in both} & probed


def test_the_deeper_depth_is_the_studys_own_up_to_four_layers() -> None:
    """The probe's second depth: the study's layers per stage where it has at most four (the
    deeper run is then the config as it trains), four past that, never one (no difference)."""
    for layers, depths in ((1, (1, 2)), (2, (1, 2)), (3, (1, 3)), (4, (1, 4)), (80, (1, 4))):
        data = copy.deepcopy(STUDY)
        data["model"]["num_layers"] = layers
        data["space"]["pp"] = [1]
        assert probe_depths(spec_of(data)) == depths, layers


def test_any_two_depths_compose_the_same_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The derivation reads the depths from the rows: probed at 1 and 2 layers (a study whose
    probe may run no more), the stand-in's terms are the ones probed at 1 and 4 (to the model's
    own departures from a line in depth: its gradient buckets and messages are not per layer)."""
    spec = spec_of()
    deep = derive_terms(spec, probe_rows(spec))
    monkeypatch.setattr(probe, "DEEP_MAX", 2)
    assert {r.depth for r in probe_runs(spec)} == {1, 2}
    shallow = derive_terms(spec, probe_rows(spec))
    assert len(deep.points) == len(shallow.points)
    for a, b in zip(deep.points, shallow.points, strict=True):
        assert a.label == b.label
        for name in ("layer_scale", "fixed_scale", "activation_scale", "extras_scale",
                     "states_scale", "step_scale", "overhead_scale"):  # fmt: skip
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert x == pytest.approx(y, rel=0.005), (a.label, name)


def test_the_pipeline_point_measures_the_pipeline_engines_own_rest() -> None:
    """Configs with pipeline stages take their layers from the flat points and their
    per-micro-batch rest from the one pipeline point the probe ran (1 layer per stage): the
    stand-in's pipeline engine costs :data:`PIPE_MB` per schedule slot, which no flat point sees.
    Every pipeline config, at another micro-batch size, recomputation or ZeRO stage than the
    point and at 4 layers per stage, comes out within 2%; without the point, up to 8% off."""
    spec = spec_of()
    runs = probe_runs(spec)
    pipes = [r for r in runs if r.config.pp > 1]
    assert len(pipes) == 1 and pipes[0].depth == 1
    rows = probe_rows(spec)
    with_pipe = derive_terms(spec, rows)
    without = derive_terms(spec, [r for r in rows if r.key != pipes[0].config.key()])
    worst_with = worst_without = 0.0
    configs = [c for c in iter_configs(spec) if c.pp > 1]
    assert len(configs) >= 6
    for c in configs:
        truth = true_step(spec, c, spec.model.num_layers)
        worst_with = max(worst_with, abs(predicted(spec, c, with_pipe)[0] / truth - 1))
        worst_without = max(worst_without, abs(predicted(spec, c, without)[0] / truth - 1))
        origin = {o.term: o for o in with_pipe.sources(c)}["fixed_time"]
        assert origin.source == "measured" and origin.point is not None
        assert "pp2" in origin.point
    assert worst_with < 0.02 < 0.05 < worst_without
    # a flat config never takes the pipeline point's rest
    flat = next(c for c in iter_configs(spec) if c.pp == 1)
    assert "pp2" not in str({o.term: o for o in with_pipe.sources(flat)}["fixed_time"].point)


def test_the_step_temporaries_are_nil_on_cpu_ranks_and_the_catalogs_on_gpus() -> None:
    """CPU ranks report a tensor accounting (no transient of the step): the probe records the
    step's temporaries at nil there, and a ZeRO-1 config whose catalog peak is its step phase
    (a flattened reduce bucket) is then composed from its forward and backward phase; GPU ranks
    report the allocator's peak, which holds them, and keep the catalog's."""
    spec = spec_of()
    c = next(c for c in iter_configs(spec) if c.zero_stage == 1 and c.recompute == "full"
             and c.micro_batch_size == 1 and c.pp == 1)  # fmt: skip
    gpu = study_gpu(spec)
    catalog = estimate_memory(spec.model, c, gpu, spec.framework, spec.training.precision)
    assert catalog.stages[0].worst.phase == "step"
    terms = derive_terms(spec, probe_rows(spec))
    assert {p.temps_scale for p in terms.points} == {0.0}
    composed = estimate_memory(spec.model, c, gpu, spec.framework, spec.training.precision,
                               terms=terms)  # fmt: skip
    assert composed.stages[0].worst.phase == "fwd_bwd"
    assert {s.term: s.source for s in terms.sources(c)}["optimizer_temps"] == "measured"
    on_gpu = copy.deepcopy(STUDY)
    on_gpu["cluster"] = {**on_gpu["cluster"], "gpu": "a100-80gb", "gpu_memory_gib": 80.0}
    gpu_spec = spec_of(on_gpu)
    gpu_terms = derive_terms(gpu_spec, probe_rows(gpu_spec))
    assert {p.temps_scale for p in gpu_terms.points} == {None}
    assert {s.term: s.source for s in gpu_terms.sources(c)}["optimizer_temps"] == "catalog"


def test_a_probe_without_a_measured_point_leaves_the_catalog() -> None:
    spec = spec_of()
    terms = derive_terms(spec, probe_rows(spec))
    c = next(iter_configs(spec))
    sources = {s.term: s for s in terms.sources(c)}
    assert sources["layer_time"].source == "measured" and sources["layer_time"].spread
    assert sources["slack"].source == "catalog"  # CPU ranks report no allocator cache
    assert sources["optimizer_step"].source == "catalog"
    other_tp = dataclasses.replace(c, tp=2, dp=1)
    assert {s.source for s in terms.sources(other_tp)} == {"catalog"}
    assert CATALOG.is_catalog and not terms.is_catalog


def test_the_warm_up_is_detected_not_assumed() -> None:
    """The first step is always warm-up; a next one well above the median of those after it
    is too; a slow step later on is load, not warm-up, and stays in; a few steps all stay."""
    from tuner.profile.probe import steady_samples

    assert steady_samples([3.0, 1.0, 1.1, 0.9, 1.0, 1.0]) == (1.0, 1.1, 0.9, 1.0, 1.0)
    assert steady_samples([3.0, 2.0, 1.6, 1.0, 1.1, 0.9]) == (1.0, 1.1, 0.9)
    assert steady_samples([3.0, 1.0, 1.0, 2.0, 1.0, 1.0]) == (1.0, 1.0, 2.0, 1.0, 1.0)
    assert steady_samples([2.0, 1.0]) == (2.0, 1.0)


def test_a_script_that_runs_the_points_itself_starts_once_per_node() -> None:
    """``launch.probe_one_process``: one launch per node (the first point's, given
    ``--probe-points``), the file listing each point's own arguments (its ds_config, its depth,
    the probe's iterations); without it, one launch per point."""
    import json

    from tuner.profile.probe import PROBE_ITERS, bundle

    data = copy.deepcopy(STUDY)
    spec = spec_of(data)
    runs = probe_runs(spec)
    ports = [29500 + k for k in range(len(runs))]
    scripts, files = bundle(spec, runs, ("localhost",), "127.0.0.1", ports, "/probe")
    # one launch per point in the first pass, then each point's second run, which runs only
    # when the probe's verdict names it (tuner.profile.recheck)
    first, verdict = scripts[0].split(f"cat {probe.RECHECK}", 1)
    assert len(scripts) == 1 and first.count("exec torchrun") == len(runs)
    assert verdict.count("exec torchrun") == len(runs) and verdict.count(";;") == len(runs)
    data["launch"]["probe_one_process"] = True
    scripts, files = bundle(spec_of(data), runs, ("localhost",), "127.0.0.1", ports, "/probe")
    assert len(scripts) == 1 and scripts[0].count("exec torchrun") == 1
    assert "--probe-points /probe/probe-points.json" in " ".join(scripts[0].split())
    plan = json.loads(files["probe-points.json"])
    assert [p["point"] for p in plan["points"]] == list(range(len(runs)))
    for k, (run, point) in enumerate(zip(runs, plan["points"], strict=True)):
        argv = point["argv"]
        assert argv[argv.index("--deepspeed_config") + 1] == f"/probe/p{k}/ds_config.json"
        assert f"p{k}.ds_config.json" in files
        assert argv[argv.index("--num-layers") + 1] == str(run.depth * run.config.pp)
        assert argv[argv.index("--train-iters") + 1] == str(PROBE_ITERS)
    assert plan["marker"] == "TUNER_STACK_POINT"


def test_points_are_framed_per_run_in_the_node_logs() -> None:
    log = ("noise\nTUNER_STACK_POINT 0 start\na\nb\nTUNER_STACK_POINT 0 end rc=0\n"
           "TUNER_STACK_POINT 1 start\nc\nTUNER_STACK_POINT 1 end rc=1\ntail\n")  # fmt: skip
    assert split_points(log) == {0: "a\nb\n", 1: "c\n"}
    again = log + "TUNER_STACK_POINT 0 start\nd\nTUNER_STACK_POINT 0 end rc=0\n"
    assert split_points(again) == {0: "d\n", 1: "c\n"}  # a later probe's run, not both


def saved(tmp_path: Path, spec: StudySpec, now: dt.datetime) -> Path:
    from tuner.layout import ClusterLayout

    path = ClusterLayout(tmp_path, spec.cluster_name).stack_yaml(spec.name)
    result = ProbeResult(rows=tuple(probe_rows(spec)), wall_s=61.0, nodes=1,
                         versions={"torch": "0.0-not-this-one", "deepspeed": "0.1"})  # fmt: skip
    save_probe(spec, result, path, now)
    return path


def test_a_saved_probe_round_trips(tmp_path: Path) -> None:
    spec = spec_of()
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    path = saved(tmp_path, spec, now)
    data = load_probe(path, spec)
    assert data["rows"] == tuple(probe_rows(spec))
    assert data["cost"] == {"wall_s": 61.0, "nodes": 1, "node_hours": round(61 / 3600, 5),
                            "recheck_s": 0.0}  # fmt: skip
    check_probe(data, spec, now=now, versions={"torch": "0.0-not-this-one"})
    assert derive_terms(spec, data["rows"]) == derive_terms(spec, probe_rows(spec))


def one_line(exc: pytest.ExceptionInfo[ProfileError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_stale_or_foreign_probe_is_refused_in_one_line(tmp_path: Path) -> None:
    spec = spec_of()
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    data = load_probe(saved(tmp_path, spec, now), spec)
    later = now + dt.timedelta(days=MAX_AGE_DAYS + 1)
    with pytest.raises(ProfileError) as exc:
        check_probe(data, spec, now=later)
    assert "stale probe" in one_line(exc)
    with pytest.raises(ProfileError) as exc:
        check_probe(data, spec, now=now, versions={"torch": "9.9"})
    assert "stale probe: measured with torch 0.0-not-this-one" in one_line(exc)
    other = copy.deepcopy(STUDY)
    other["model"]["hidden_size"] = 512
    with pytest.raises(ProfileError) as exc:
        check_probe(data, spec_of(other), now=now)
    assert "foreign probe" in one_line(exc)
    # the local executor's own torch is compared on load: this probe's is not it
    with pytest.raises(ProfileError) as exc:
        study_terms(spec, tmp_path, now=now)
    assert "stale probe" in one_line(exc) and "--probe" in one_line(exc)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"created": "yesterday"}, "Invalid isoformat"),
        ({"created": "2026-01-02T00:00:00"}, "has no time zone"),
        ({"step_s": float("nan")}, "finite number"),
        ({"peak_gib": -1.0}, "finite number"),
        ({"samples_s": ["fast"]}, "could not convert"),
    ],
)
def test_a_hand_edited_probe_is_one_malformed_error(
    tmp_path: Path, edit: dict[str, Any], words: str
) -> None:
    """A saved probe someone edited: one ProfileError naming the file, never a traceback."""
    spec = spec_of()
    path = saved(tmp_path, spec, dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    data = yaml.safe_load(path.read_text())
    for key, value in edit.items():
        if key == "created":
            data[key] = value
        else:
            data["rows"][0][key] = value
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as exc:
        load_probe(path, spec)
    assert "malformed framework probe" in one_line(exc) and words in one_line(exc)
    assert exc.value.file == str(path)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_probe_check_prints_measured_over_predicted_per_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """tools/probe_check.py, as the demos run it: a trial measured at exactly what the models
    with the probe predict reads 1.000, and a config the probe never ran is marked kept out."""
    import yaml

    from tests.report.test_exports import record_measured
    from tools.probe_check import main as probe_check

    data = copy.deepcopy(STUDY)
    data["launch"]["python"] = "python3"  # local executor: versions compared with this torch
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "standin.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    from tuner.layout import ClusterLayout
    from tuner.profile.run import local_versions
    from tuner.spec.file import load_study

    spec = load_study("standin")  # as the tool loads it: the script's path is the study file's
    now = dt.datetime.now(dt.UTC)
    torch = str(local_versions().get("torch", "none"))
    result = ProbeResult(rows=tuple(probe_rows(spec)), wall_s=61.0, nodes=1,
                         versions={"torch": torch})  # fmt: skip
    save_probe(spec, result, ClusterLayout(tmp_path / "results", spec.cluster_name)
               .stack_yaml(spec.name), now)  # fmt: skip
    terms = study_terms(spec, tmp_path / "results")
    probed, kept_out = probe_runs(spec)[0].config, next(c for c in iter_configs(spec) if c.pp == 2)
    record_measured(spec, tmp_path / "results", [(c, predicted(spec, c, terms)[0])
                                                   for c in (probed, kept_out)])  # fmt: skip
    assert probe_check(["--study", "standin", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "step measured / predicted: 1.000-1.000 (kept out: 1.000-1.000)" in out
    assert " yes " in out and "   - " in out
    # what `make demo` prints last: its depths as the probe ran them (it said "1-2 layers" of a
    # probe at 1 and 4), and at 80 columns a table that fits (its rows were 96 wide)
    assert "at {} and {} layers".format(*probe_depths(spec)) in out
    # a CPU study: why its peaks read 1.000, said once (a newcomer took it for a fitted figure)
    assert out.count("peak on CPU: both sides are one tensor accounting") == 1
    monkeypatch.setenv("COLUMNS", "80")
    assert probe_check(["--study", "standin", "--results", str(tmp_path / "results")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if len(line) > 80] == [] and any("yes" in x for x in lines)


def _standin_with_a_saved_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StudySpec:
    """The stand-in study as ``studies/standin.yaml`` under ``tmp_path`` (the working folder),
    with its probe saved as the stand-in's surface gives it, for the tools that read both."""
    from tuner.layout import ClusterLayout
    from tuner.profile.run import local_versions
    from tuner.spec.file import load_study

    data = copy.deepcopy(STUDY)
    data["launch"]["python"] = "python3"
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "standin.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    spec = load_study("standin")
    torch = str(local_versions().get("torch", "none"))
    result = ProbeResult(rows=tuple(probe_rows(spec)), wall_s=1.0, nodes=1,
                         versions={"torch": torch})  # fmt: skip
    save_probe(spec, result, ClusterLayout(tmp_path / "results", spec.cluster_name)
               .stack_yaml(spec.name), dt.datetime.now(dt.UTC))  # fmt: skip
    return spec


def answer_probe_jobs(monkeypatch: pytest.MonkeyPatch, job: Any) -> None:
    """tools/probe_truth.py's jobs answered by ``job`` (in place of ``run_stack_probe``), on an
    executor that runs nothing."""
    import tuner.profile.probe as probe_module
    import tuner.study.launchers as launchers

    class Executor:
        def preflight(self, hosts: Any, checks: Any) -> list[Any]:
            return []  # nodes that run nothing hold no build lock

        def close(self) -> None:
            pass

    monkeypatch.setattr(probe_module, "run_stack_probe", job)
    monkeypatch.setattr(launchers, "make_executor", lambda spec: Executor())


def standin_truth_jobs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """tools/probe_truth.py's jobs answered with the stand-in's surface at the full 8 layers, on
    an executor that runs nothing; the runs each job was asked for are added to the list
    returned."""

    asked: list[Any] = []

    def job(spec: StudySpec, executor: Any, paths: Any, runs: Any = None) -> ProbeResult:
        asked.extend(runs)
        rows = [ProbeRow(key=r.config.key(), depth=r.depth, step_s=true_step(spec, r.config, 8),
                         samples_s=(1.0,), peak_gib=true_peak(spec, r.config, 8) / GIB,
                         reserved_gib=None) for r in runs]  # fmt: skip
        return ProbeResult(rows=tuple(rows), wall_s=1.0, nodes=1, versions={})

    answer_probe_jobs(monkeypatch, job)
    return asked


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_probe_truth_measures_every_config_at_full_depth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """tools/probe_truth.py: every valid config at its full depth in one job through the probe's
    machinery (here a fake job answering with the stand-in's surface), against the models with
    the saved probe; the composed peak holds every config within 5%."""
    from tools.probe_truth import main as probe_truth

    _standin_with_a_saved_probe(tmp_path, monkeypatch)
    asked = standin_truth_jobs(monkeypatch)
    assert probe_truth(["--study", "standin", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert {r.depth * r.config.pp for r in asked} == {8}  # each config at its full depth
    n = len(asked)
    assert n >= 20 and f"{n} of {n} within 5%" in out
    assert "load (1-minute average)" in out  # the load the step times were measured under


def test_probe_truth_interleaved_reads_each_config_against_the_first_by_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """tools/probe_truth.py --interleave: the job is asked to interleave the configs' steps, and
    a load that doubles through it (each config's rounds at another level) leaves every config's
    measured / predicted where it is without that load: each is read as the first config's
    level times their paired ratio."""
    import tuner.profile.probe as probe_module
    from tools.probe_truth import measure

    _standin_with_a_saved_probe(tmp_path, monkeypatch)
    asked: list[bool] = []

    def job(spec: StudySpec, executor: Any, paths: Any, runs: Any = None,
            load: float = 1.0) -> ProbeResult:  # fmt: skip
        asked.append(probe_module.INTERLEAVE)
        rows = []
        for k, r in enumerate(runs):
            step = true_step(spec, r.config, 8)
            rounds: tuple[int, ...] = ()
            if probe_module.INTERLEAVE:
                # the load doubles in the second block of rounds, and every other config kept
                # that block alone (a longer warm-up): its own median is all at the double load
                rounds = (4, 5) if k % 2 else (2, 3, 4, 5)
                samples = tuple(step * (2.0 if n >= 4 else 1.0) for n in rounds)
            else:  # one after another: the load grows with each config's place in the job
                samples = (step * (1.0 + (load - 1.0) * k / len(runs)),) * 3
            rows.append(ProbeRow(key=r.config.key(), depth=r.depth,
                                 step_s=statistics.median(samples), samples_s=samples,
                                 peak_gib=true_peak(spec, r.config, 8) / GIB, reserved_gib=None,
                                 rounds=rounds))  # fmt: skip
        return ProbeResult(rows=tuple(rows), wall_s=1.0, nodes=1, versions={})

    answer_probe_jobs(monkeypatch, job)
    results = str(tmp_path / "results")
    quiet = measure("standin", results, 4)
    monkeypatch.setattr(probe_module, "run_stack_probe", functools.partial(job, load=2.0))
    loaded = measure("standin", results, 4)
    paired = measure("standin", results, 6, interleave=True)
    assert asked == [False, False, True] and probe_module.INTERLEAVE  # set back after the job
    first = paired[0]["step"] / quiet[0]["step"]
    ratios = [b["step"] / a["step"] for a, b in zip(quiet, loaded, strict=True)]
    assert max(ratios) / min(ratios) > 1.5  # one after another, the load is in the ratios
    for a, b in zip(quiet, paired, strict=True):
        assert b["step"] / a["step"] == pytest.approx(first, rel=1e-9), a["config"]


def test_measured_terms_carry_their_provenance_into_the_stated_sd() -> None:
    """A config composed from a probed point states a narrower step-time sd than the catalog
    (its compute terms measured, at the probe's spread or the compute floor), lists the measured
    memory terms in its breakdown's provenance; a config without a point keeps the catalog's."""
    from tuner.models.uncertainty import CATALOG_TIME_SIGMA, TIME_SIGMA_FLOORS

    spec = spec_of()
    terms = derive_terms(spec, probe_rows(spec))
    c = next(iter_configs(spec))
    gpu, rates = study_gpu(spec), catalog_rates(study_gpu(spec), spec.training.precision)
    gpn = spec.cluster.gpus_per_node
    measured = estimate_time(spec.model, spec.training, c, gpu, gpn, spec.framework, rates,
                             terms=terms)  # fmt: skip
    catalog = estimate_time(spec.model, spec.training, c, gpu, gpn, spec.framework, rates)
    given = dict(measured.provenance)
    assert given["compute"].source == "measured"
    assert given["compute"].sigma >= TIME_SIGMA_FLOORS["compute"]
    assert given["compute"].sigma < CATALOG_TIME_SIGMA["compute"]
    assert measured.sigma < catalog.sigma and not catalog.provenance
    memory = estimate_memory(spec.model, c, gpu, spec.framework, spec.training.precision,
                             terms=terms)  # fmt: skip
    assert dict(memory.provenance)["activations"].source == "measured"
    assert "slack" not in dict(memory.provenance)  # CPU ranks report no allocator cache
    other_tp = dataclasses.replace(c, tp=2, dp=1)
    assert not estimate_time(spec.model, spec.training, other_tp, gpu, gpn, spec.framework,
                             rates, terms=terms).provenance  # fmt: skip


def drifting_log(spec: StudySpec, interleaved: bool) -> str:
    """The node log of the probe's points on the stand-in while the machine's load ramps up (each
    step 2% slower than the one before it ran, whichever point it was: another job starting),
    with a first step 2x slow and the 2-layer base point's second step 3x slow (warm-up, which
    ``steady_samples`` leaves out of that point only: the ramp over ten rounds of eight points
    doubles the load, so a warm-up under 1.25x that would pass unseen). ``interleaved``: the
    points' steps as the workload interleaves them on CPU ranks (each point's first step in
    turn, then one step of each per round, in reverse on odd rounds, each framed by
    resume/pause); else one point after the other, as a script that runs its points in turn."""
    runs = probe_runs(spec)
    done = 0

    def step(k: int, it: int) -> str:
        nonlocal done
        warm = 2.0 if it == 1 else 3.0 if (it == 2 and k == 1) else 1.0
        layers = runs[k].depth * runs[k].config.pp * runs[k].config.vp  # per stage
        took = true_step(spec, runs[k].launched, layers) * warm * (1 + 0.02 * done)
        done += 1
        peak = true_peak(spec, runs[k].launched, layers) / GIB
        return (f"tuner-step: iter={it} time_s={took:.6f} samples_per_s=1.0 "
                f"max_allocated_gib={peak:.9f} max_reserved_gib={peak:.9f} rank=0")  # fmt: skip

    return probe_job_log(len(runs), interleaved, step)


def test_interleaved_steps_and_paired_ratios_cancel_a_drifting_load() -> None:
    """Under a load that drifts through the probe, every config at the probe's micro-batch size
    is predicted off the stand-in's truth by one common factor (the load level the probe saw,
    which no probe can know for the trials to come), not by a per-config error that the
    per-layer difference amplifies: the points' steps interleaved and each row taken as the
    reference's median times its paired ratio. The estimator before (each row's own median)
    puts them 10% apart on the same interleaved log (a warm-up left out of one row moves its
    median to another load), and 25% apart measured one point after another; other
    micro-batch sizes add the model's own scaling under that load (a few percent)."""
    from tuner.profile.probe import rows_from_logs

    spec = spec_of()
    runs = probe_runs(spec)
    flat = [c for c in iter_configs(spec) if c.pp == 1 and c.micro_batch_size == 2]

    def ratios(rows: list[ProbeRow], configs: list[ParallelConfig]) -> list[float]:
        terms = derive_terms(spec, rows)
        return [predicted(spec, c, terms)[0] / true_step(spec, c, spec.model.num_layers)
                for c in configs]  # fmt: skip

    rows = rows_from_logs(spec, runs, [drifting_log(spec, interleaved=True)])
    assert all(r.rounds for r in rows) and len({len(r.samples_s) for r in rows}) > 1
    paired = ratios(rows, flat)
    level = statistics.median(paired)
    assert 1.0 < level < 1.0 + 0.02 * len(runs) * 7  # the load the probe saw
    assert max(paired) / min(paired) < 1.005, paired
    everything = ratios(rows, list(iter_configs(spec)))
    assert max(everything) / min(everything) < 1.1, (min(everything), max(everything))
    own_medians = ratios([dataclasses.replace(r, rounds=()) for r in rows], flat)
    assert max(own_medians) / min(own_medians) > 1.08, own_medians
    sequential = rows_from_logs(spec, runs, [drifting_log(spec, interleaved=False)])
    assert not any(r.rounds for r in sequential)
    one_by_one = ratios(sequential, flat)
    assert max(one_by_one) / min(one_by_one) > 1.2, one_by_one


def test_the_paired_estimator_is_the_median_of_same_block_ratios() -> None:
    """Over the rounds both rows ran (a warm-up left out of one drops that round), the median
    over blocks of two rounds (in order, then reversed) of the rows' ratio, and the ratios'
    median absolute deviation over their median; a round without its pair is a block alone; a
    row of a probe that did not interleave (no rounds) has none, and the terms then use the
    rows' own medians."""
    from tuner.profile.paired import paired_ratio, paired_ratios

    def row(samples: tuple[float, ...], rounds: tuple[int, ...]) -> ProbeRow:
        return ProbeRow(key="k", depth=1, step_s=statistics.median(samples), samples_s=samples,
                        peak_gib=1.0, reserved_gib=None, rounds=rounds)  # fmt: skip

    # the load goes 1, 1.5, 1.1, 2.0, 1.2, 1.3 through rounds 2-7; ``two`` is 1.5x ``ref``
    ref = row((1.0, 1.5, 1.1, 2.0, 1.2, 1.3), (2, 3, 4, 5, 6, 7))
    two = row((2.25, 1.65, 3.0, 1.8, 2.6), (3, 4, 5, 6, 7))  # round 2 was its warm-up; 7: burst
    blocks = paired_ratios(two, ref)
    assert [r for r, _ in blocks] == [3, 4, 6]
    assert [q for _, q in blocks] == pytest.approx([1.5, 1.5, 4.4 / 2.5])
    assert paired_ratio(two, ref) == pytest.approx((1.5, 0.0))
    assert paired_ratio(two, ref, within={4, 5, 6, 7}) == pytest.approx((1.63, 0.13 / 1.63))
    # the rows' own medians: 2.25 / 1.25, the load of the rounds each kept
    assert two.step_s / ref.step_s == pytest.approx(1.8)
    assert paired_ratio(row(two.samples_s, ()), ref) is None


def test_interleaved_parts_of_a_point_are_joined_and_their_rounds_saved(tmp_path: Path) -> None:
    """A point's steps framed by resume/pause between other points' are one point's lines; the
    rows' rounds survive the saved file."""
    log = ("TUNER_STACK_POINT 0 start\na\nTUNER_STACK_POINT 0 pause\nTUNER_STACK_POINT 1 start\n"
           "b\nTUNER_STACK_POINT 1 pause\nTUNER_STACK_POINT 1 resume\nc\n"
           "TUNER_STACK_POINT 1 pause\n"
           "x\nTUNER_STACK_POINT 0 resume\nd\nTUNER_STACK_POINT 0 end rc=0\n"
           "TUNER_STACK_POINT 1 end rc=0\n")  # fmt: skip
    assert split_points(log) == {0: "a\nd\n", 1: "b\nc\n"}
    spec = spec_of()
    rows = tuple(dataclasses.replace(r, rounds=tuple(range(2, 2 + len(r.samples_s))))
                 for r in probe_rows(spec))  # fmt: skip
    path = tmp_path / "probe.yaml"
    save_probe(spec, ProbeResult(rows=rows, wall_s=1.0, nodes=1, versions={}), path,
               dt.datetime(2026, 1, 2, tzinfo=dt.UTC))  # fmt: skip
    assert load_probe(path, spec)["rows"] == rows


def test_the_points_file_asks_for_interleaving_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe asks a one-process script to interleave its points; ``tools/probe_truth.py``,
    which runs every config of the space, turns it off (``probe.INTERLEAVE``)."""
    import json

    from tuner.profile import probe

    data = copy.deepcopy(STUDY)
    data["launch"]["probe_one_process"] = True
    spec = spec_of(data)
    runs = probe_runs(spec)
    ports = [29500 + k for k in range(len(runs))]

    def asked() -> bool:
        _, files = probe.bundle(spec, runs, ("localhost",), "127.0.0.1", ports, "/probe")
        return bool(json.loads(files["probe-points.json"])["interleave"])

    assert asked() is True
    monkeypatch.setattr(probe, "INTERLEAVE", False)
    assert asked() is False


def test_the_saved_probe_prints_whole_in_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune profile --probe --show`` in an 80-column terminal: each run's config key was cut
    to the fields every run shares and the terms to ``catal…``/``x0.5…``; the tables go through
    the fitted renderer (what every run shares said once) and no figure is cut."""
    from tuner.cli.main import main

    spec = _standin_with_a_saved_probe(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["profile", "--study", "standin", "--probe", "--show"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    terms = study_terms(spec, tmp_path / "results")
    for p in terms.points:  # every measured layer time and rest, whole
        assert f"x{p.layer_scale:.3f}" in out and f"x{p.fixed_scale:.3f}" in out
    assert " zero1" in out and "pp2 " in out and "=" not in out  # what tells the runs apart
    assert "-: not measured at that point, the catalog's figure" in out
