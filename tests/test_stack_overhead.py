"""The framework probe's step overhead (tuner.profile.stack_terms): the base point's 1-layer run at
``m`` and at twice the micro-batches per step tell the step's fixed rest from a micro-batch's work,
after the model's own step rest at each micro-batch count (what grows with the micro-batches
there, DeepSpeed's per-micro-batch gradient accumulation) is taken out of each run."""

from __future__ import annotations

import dataclasses

import pytest

from tests.test_stack_terms import probe_rows, spec_of, standin_rates, true_step
from tuner.models.rates import catalog_rates
from tuner.models.time.estimate import estimate_time
from tuner.profile.probe import BATCH_SCALE, probe_depths, probe_runs
from tuner.profile.stack_terms import derive_terms
from tuner.space.enumerate import study_gpu


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


def test_a_rest_the_runs_put_under_nil_is_nil_not_the_catalogs() -> None:
    """The base point's deeper run slowed by noise (the MoE demo's probe, idle: its two depths
    left the rest per micro-batch at -4.5 ms against 22.8 ms a layer). The rest is nil, not "not
    measured", which fell back to the catalog's rest (18.8 ms there) and put the composed model
    over every run the probe made by that much. The layer stays the runs' difference, so the
    composed model is over each run by the rest's clipped part alone (and the per-micro-batch
    overhead goes to nil with it, not only the head)."""
    spec = spec_of()
    rates = catalog_rates(study_gpu(spec), spec.training.precision)
    rows = probe_rows(spec, rates)
    lo, hi = probe_depths(spec)[:2]
    runs = {(r.launched.key(), r.depth): r.launched for r in probe_runs(spec)}
    base = next(c for (key, depth), c in runs.items() if depth == hi and (key, lo) in runs)
    at = {(r.key, r.depth): r for r in rows}
    one, deep = at[(base.key(), lo)], at[(base.key(), hi)]
    # the deep run slower by twice the model's rest per micro-batch per layer added
    v = [estimate_time(dataclasses.replace(spec.model, num_layers=d), spec.training, base,
                       study_gpu(spec), spec.cluster.gpus_per_node, spec.framework, rates)
         for d in (lo, hi)]  # fmt: skip
    m = base.num_microbatches
    per_layer = (v[1].compute - v[0].compute) / (hi - lo)
    rest = v[0].compute - lo * per_layer + m * rates.microbatch_overhead
    assert rest > 0
    slower = deep.step_s + 2.0 * rest * (hi - lo) / lo
    under = 2.0 * rest - rest  # what the clipped rest leaves over each run, all micro-batches
    rows = [dataclasses.replace(r, step_s=slower) if r is deep else r for r in rows]
    terms = derive_terms(spec, rows, rates)
    point = terms.point(base)
    assert point is not None and point.fixed_scale == 0.0
    for depth, measured in ((lo, one.step_s), (hi, slower)):
        model = dataclasses.replace(spec.model, num_layers=depth)
        step = estimate_time(model, spec.training, base, study_gpu(spec),
                             spec.cluster.gpus_per_node, spec.framework, rates,
                             terms=terms).step  # fmt: skip
        assert step - measured == pytest.approx(under, rel=1e-6), depth
