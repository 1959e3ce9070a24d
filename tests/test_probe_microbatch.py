"""benchmarks/probe_microbatch.py reads a fixed cost per layer per micro-batch where a stand-in
has one, and none where it has none (the measurement that tested the guess behind the demo's
micro-batch-1 configs running above their prediction)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tuner.models.rates import catalog_rates
from tuner.models.time.estimate import estimate_time
from tuner.profile import probe
from tuner.profile.probe import ProbeRow
from tuner.space.enumerate import study_gpu
from tuner.spec.file import load_study

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("probe_microbatch", BENCHMARKS /
                                                  "probe_microbatch.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _rows(fixed_s: float) -> list[ProbeRow]:
    """The demo's runs on a stand-in whose step is the model's (catalog rates) plus ``fixed_s``
    per layer per micro-batch, as interleaved rows (every round alike)."""
    spec = load_study("demo")
    rates = catalog_rates(study_gpu(spec), spec.training.precision)
    bench = _bench()
    rows = []
    for c in bench.sizes(spec):
        for depth in probe.probe_depths(spec):
            small = probe.reduced(spec, c, depth)
            t = estimate_time(small.model, small.training, c, study_gpu(spec),
                              spec.cluster.gpus_per_node, spec.framework, rates).step  # fmt: skip
            t += max(c.num_microbatches, 1) * depth * fixed_s
            row = ProbeRow(key=c.key(), depth=depth, step_s=t, samples_s=(t,) * 4,
                           peak_gib=0.1, reserved_gib=None, rounds=(2, 3, 4, 5))  # fmt: skip
            rows.append(row)
    return rows


@pytest.mark.parametrize("fixed_s", [0.0, 0.004])
def test_reads_the_fixed_cost_per_layer_per_microbatch(fixed_s: float) -> None:
    bench = _bench()
    spec = load_study("demo")
    rates = catalog_rates(study_gpu(spec), spec.training.precision)
    per, _ = bench.per_size(spec, rates, _rows(fixed_s))
    assert sorted(per) == [1, 2, 4]
    for f in per.values():
        assert f.layer - f.layer_model == pytest.approx(fixed_s, abs=1e-9)
    measured, model = bench.fixed_part(per)[1], bench.fixed_part(per, model=True)[1]
    assert measured - model == pytest.approx(fixed_s, abs=1e-9)


def test_composition_from_one_size_misses_a_fixed_cost_as_guessed() -> None:
    """With such a cost, the composition from the base's size (2) under-predicts size 1 (more
    micro-batches, each paying it) and over-predicts size 4; without it, it is exact."""
    bench = _bench()
    spec = load_study("demo")
    lines = {0.0: bench.report(spec, "no-such-results", _rows(0.0)),
             0.004: bench.report(spec, "no-such-results", _rows(0.004))}  # fmt: skip
    ratio = {k: {int(ln.split()[1]): float(ln.split()[-1]) for ln in v if " layers: " in ln}
             for k, v in lines.items()}  # fmt: skip
    assert ratio[0.0] == {1: 1.0, 2: 1.0, 4: 1.0}
    assert ratio[0.004][1] > 1.01 and ratio[0.004][4] < 0.99 and ratio[0.004][2] == 1.0
