"""The framework probe's fixed costs (tuner.profile.stack_terms): the base point's 1-layer run at
``m`` and at twice the micro-batches per step tell the step's fixed rest from a micro-batch's work,
after the model's own step rest at each micro-batch count (what grows with the micro-batches
there, DeepSpeed's per-micro-batch gradient accumulation) is taken out of each run; its 1-layer
run at another micro-batch size tells the framework's fixed work per micro-batch from the part of
the rest that grows with the micro-batch."""

from __future__ import annotations

import dataclasses

import pytest

from tests.test_stack_terms import predicted, probe_rows, spec_of, standin_rates, true_step
from tuner.models.rates import catalog_rates
from tuner.models.time.estimate import estimate_time
from tuner.profile.probe import BATCH_SCALE, probe_depths, probe_runs
from tuner.profile.stack_terms import derive_terms
from tuner.space.enumerate import iter_configs, study_gpu


@pytest.mark.parametrize("overhead", [1.0, 3.0])
def test_the_step_overhead_reads_the_stacks_fixed_rest(overhead: float) -> None:
    """A stand-in whose step rest besides the fixed part (the optimizer step, autograd's
    gradient accumulation from the second micro-batch on, the data-parallel traffic) runs at the
    model's own rates, and whose fixed part is ``overhead`` times the catalog's: the probe reads
    exactly that. Read from the two runs' raw difference, the accumulation that the wider run
    adds per micro-batch counts as a micro-batch's work, so the fixed rest read 0.82 where it is
    1.00."""
    spec = spec_of()
    rates = standin_rates(spec, hbm=1.0, overhead=overhead)
    terms = derive_terms(spec, probe_rows(spec, rates))
    scales = {p.overhead_scale for p in terms.points}
    assert len(scales) == 1
    assert scales.pop() == pytest.approx(overhead, abs=1e-6)


def test_the_composed_model_gives_the_base_points_steps_at_both_micro_batch_counts() -> None:
    """Whatever the stack's rates (here the stand-in's own, whose optimizer step and gradient
    accumulation run slower than the model's): the composed model, at the base point's 1-layer
    depth, gives the step the probe measured with ``m`` micro-batches and the one with
    :data:`BATCH_SCALE` times as many, so a config with more or fewer micro-batches per step
    than the base scales by what was measured per micro-batch."""
    spec = spec_of()
    terms = derive_terms(spec, probe_rows(spec))
    catalog = catalog_rates(study_gpu(spec), spec.training.precision)
    wide = [r for r in probe_runs(spec) if r.batch_scale == BATCH_SCALE]
    assert wide
    lo = probe_depths(spec)[0]
    for run in wide:
        for c in (run.config, run.launched):
            model = dataclasses.replace(spec.model, num_layers=lo)
            training = dataclasses.replace(spec.training, global_batch_size=c.global_batch_size)
            step = estimate_time(model, training, c, study_gpu(spec), spec.cluster.gpus_per_node,
                                 spec.framework, catalog, terms=terms).step  # fmt: skip
            assert step == pytest.approx(true_step(spec, c, lo), rel=1e-6), c.key()


@pytest.mark.parametrize("hbm", [0.7, 1.0])
def test_the_rest_per_micro_batch_is_split_by_the_base_at_another_size(hbm: float) -> None:
    """The per-micro-batch rest holds the LM head, loss and embedding (in proportion to the
    micro-batch's tokens) and the framework's fixed call per micro-batch (not): one scale on the
    sum, measured at the base's micro-batch size, misplaces the stand-in's configs at the other
    sizes (its fixed call, 4 ms, is not the catalog's). The base's 1-layer run at another size
    measures the two apart: every config without pipeline stages at another micro-batch size
    comes at most half as far from the stand-in, and within 1.5%. A saved probe without that
    run keeps the one scale."""
    spec = spec_of()
    rates = standin_rates(spec, hbm=hbm)
    rows = probe_rows(spec, rates)
    other = {r.launched.key() for r in probe_runs(spec) if r.config.micro_batch_size != 2}
    assert len(other) == 1 and all(r.depth == 1 for r in probe_runs(spec)
                                   if r.launched.key() in other)  # fmt: skip
    split = derive_terms(spec, rows)
    lumped = derive_terms(spec, [r for r in rows if r.key not in other])
    assert {p.head_scale for p in lumped.points} == {None}
    flat_points = [p for p in split.points if p.pp == 1]
    assert all(p.head_scale and p.microbatch_s for p in flat_points)
    assert len(split.points) == len(lumped.points)  # the run is no neighbour point of its own
    for c in iter_configs(spec):
        if c.pp > 1 or c.micro_batch_size == 2:
            continue
        truth = true_step(spec, c, spec.model.num_layers, rates)
        near, far = (abs(predicted(spec, c, t)[0] / truth - 1) for t in (split, lumped))
        assert near <= far / 2 and near < 0.015, c.key()
