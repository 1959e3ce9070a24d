"""Full recomputation in the framework probe's composition (tuner.profile.stack_terms,
tuner.models.stack): on GPU ranks a full-recompute layer still keeps its input (2sbh bytes per
layer and micro-batch in flight) and rebuilds one layer's activations in its backward
(Korthikanti et al. 2022, sec. 5). A stand-in whose full-recompute surface keeps exactly those,
probed by a run whose peak left nothing for them, must still predict depth N: composing with
none (what the probe did) misses the deep stages; the catalog's term stands in and holds. A
positive measurement composes as measured; CPU ranks' tensor accounting keeps its nil."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from tests import test_stack_terms as standin
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.stack import UNRESOLVED, StackTerms
from tuner.profile import probe
from tuner.profile.probe import ProbeRow, probe_runs
from tuner.profile.stack_terms import derive_terms
from tuner.space.enumerate import iter_configs, study_gpu
from tuner.spec.study import StudySpec


def gpu_spec() -> StudySpec:
    """The stand-in's study on GPU ranks, 32 layers deep (16 per stage at pp 2)."""
    data: dict[str, Any] = copy.deepcopy(standin.STUDY)
    data["cluster"] = {**data["cluster"], "gpu": "a100-80gb", "gpu_memory_gib": 80.0}
    data["model"].update(num_layers=32, hidden_size=512, num_attention_heads=8,
                         ffn_hidden_size=2048, seq_length=1024)  # fmt: skip
    return standin.spec_of(data)


def true_allocated(spec: StudySpec, c: ParallelConfig, layers: int, full: float) -> float:
    """Peak allocated bytes of the stand-in on GPU ranks: the catalog's phases with its own
    activations (``full`` of the catalog's under full recomputation), extras and model states;
    the step phase's temporaries are the catalog's (an allocator's peak holds them)."""
    mem = estimate_memory(standin.at_depth(spec, layers), c, study_gpu(spec), spec.framework,
                          spec.training.precision)  # fmt: skip
    a = full if c.recompute == "full" else standin.ACTIVATIONS[c.recompute]
    k = standin.STATES[c.zero_stage]
    return max(
        p.allocated + (a - 1) * p.activations + (standin.EXTRAS - 1) * p.stage_extras
        + (k - 1) * (p.weights + p.grads + p.optimizer)
        + ((k - 1) * p.framework_buffers if p.phase == "fwd_bwd" else 0.0)
        for s in mem.stages for p in s.phases
    )  # fmt: skip


def probe_rows(spec: StudySpec, full_read: float) -> list[ProbeRow]:
    """What the probe reads at its own points: the stand-in's steps, and peaks whose
    full-recompute run held ``full_read`` of the catalog's activations."""
    rows = []
    for run in probe_runs(spec):
        layers = run.depth * run.config.pp * run.config.vp
        step = standin.true_step(spec, run.launched, layers)
        peak = true_allocated(spec, run.launched, layers, full_read)
        rows.append(ProbeRow(key=run.launched.key(), depth=run.depth, step_s=step,
                             samples_s=(step * 0.99, step, step * 1.01), peak_gib=peak / GIB,
                             reserved_gib=None))  # fmt: skip
    return rows


def allocated(spec: StudySpec, c: ParallelConfig, terms: StackTerms) -> float:
    return estimate_memory(spec.model, c, study_gpu(spec), spec.framework,
                           spec.training.precision, terms=terms).allocated  # fmt: skip


def as_before(terms: StackTerms) -> StackTerms:
    """The composition before the fix: a full-recompute point's nil activations composed as
    none."""
    return StackTerms(tuple(
        dataclasses.replace(p, activation_scale=0.0, activations_unresolved=False)
        if p.activations_unresolved else p for p in terms.points
    ))  # fmt: skip


@pytest.mark.parametrize("deepest", [4, 2])
def test_a_full_recompute_run_that_read_nothing_still_predicts_depth_n(
    monkeypatch: pytest.MonkeyPatch, deepest: int
) -> None:
    monkeypatch.setattr(probe, "DEEP_MAX", deepest)
    spec = gpu_spec()
    assert {r.depth for r in probe_runs(spec)} == {1, deepest}
    terms = derive_terms(spec, probe_rows(spec, full_read=0.0))
    full = [p for p in terms.points if p.recompute == "full"]
    assert full and all(p.activations_unresolved and p.activation_scale is None for p in full)
    before = as_before(terms)
    worst_new = worst_old = 0.0
    for c in iter_configs(spec):
        truth = true_allocated(spec, c, spec.model.num_layers, full=1.0)  # inputs kept
        worst_new = max(worst_new, abs(allocated(spec, c, terms) / truth - 1))
        if c.recompute == "full":
            worst_old = max(worst_old, abs(allocated(spec, c, before) / truth - 1))
    assert worst_new < 0.015 < 0.15 < worst_old, (worst_new, worst_old)
    # the deepest stage: 32 layers' inputs at 4 micro-batch samples each
    deep = next(c for c in iter_configs(spec) if c.recompute == "full" and c.pp == 1
                and c.micro_batch_size == 4 and c.zero_stage == 0)  # fmt: skip
    truth = true_allocated(spec, deep, spec.model.num_layers, full=1.0)
    assert allocated(spec, deep, before) / truth < 0.85
    assert allocated(spec, deep, terms) / truth == pytest.approx(1.0, rel=0.005)
    origin = {o.term: o for o in terms.sources(deep)}["activations"]
    assert origin.source == "catalog" and origin.note == UNRESOLVED and origin.point


def test_a_positive_full_recompute_figure_composes_as_measured() -> None:
    spec = gpu_spec()
    terms = derive_terms(spec, probe_rows(spec, full_read=0.6))
    (full,) = [p for p in terms.points if p.recompute == "full"]
    assert not full.activations_unresolved
    assert full.activation_scale == pytest.approx(0.6, rel=0.01)
    c = next(c for c in iter_configs(spec) if c.recompute == "full")
    assert {o.term: o.source for o in terms.sources(c)}["activations"] == "measured"


def test_cpu_ranks_keep_the_nil_of_their_tensor_accounting() -> None:
    """The CPU workloads' peak is a tensor accounting that does not see an input a checkpoint
    keeps outside autograd's saved tensors (DeepSpeed's ``ctx.deepspeed_saved_tensors``), in
    the probe's run and the trial's alike: its nil stands."""
    spec = standin.spec_of()
    saved = standin.ACTIVATIONS["full"]
    try:
        standin.ACTIVATIONS["full"] = 0.0
        terms = derive_terms(spec, standin.probe_rows(spec))
    finally:
        standin.ACTIVATIONS["full"] = saved
    (full,) = [p for p in terms.points if p.recompute == "full"]
    assert full.activation_scale == 0.0 and not full.activations_unresolved
