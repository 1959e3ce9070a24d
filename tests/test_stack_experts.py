"""The framework probe on an MoE stand-in (tuner.profile.stack_terms, tuner.models.stack): a stack
whose MoE layers cost a fixed part per local expert call per micro-batch, whatever the tokens
(DeepSpeed-MoE calls its local experts one after another), on top of a per-token part unlike the
catalog's. The probe runs the base's config at a second micro-batch size; from it the composition
must predict the configs it never ran: other micro-batch sizes, and the other EP degree (half the
local experts, so half the calls) at the sizes the probe ran it at none of."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from tests.test_stack_terms import spec_of, standin_rates
from tuner.config.parallel import ParallelConfig
from tuner.models.rates import Link, catalog_rates
from tuner.models.stack import expert_calls
from tuner.models.time.estimate import estimate_time
from tuner.profile.probe import ProbeRow, probe_depths, probe_runs
from tuner.profile.stack_terms import derive_terms
from tuner.space.enumerate import iter_configs, study_gpu
from tuner.spec.study import StudySpec

MOE: dict[str, Any] = {"num_experts": 4, "router_topk": 2, "capacity_factor": 1.0,
                       "aux_loss_coeff": 0.01, "grouped_gemm": False}  # fmt: skip
CALL_S = 0.01
"""The stand-in's seconds per local expert call per MoE layer per micro-batch (a module call,
its GEMM launches and autograd nodes), which the catalog counts at a few launches' latency."""


def moe_spec(**space: Any) -> StudySpec:
    from tests.test_stack_terms import STUDY

    data = copy.deepcopy(STUDY)
    data["name"] = "standin-moe"
    data["model"]["num_layers"] = 4
    data["model"]["moe"] = dict(MOE)
    data["space"] = {"ep": [1, 2], "micro_batch_size": [1, 2, 4], "zero_stage": [0, 1],
                     **space}  # fmt: skip
    return spec_of(data)


def true_step(spec: StudySpec, c: ParallelConfig, layers: int, call_s: float = CALL_S,
              links: dict[str, Link] | None = None) -> float:  # fmt: skip
    """The stand-in's step: the model's at its own rates (with ``links``), plus ``call_s`` per
    expert call."""
    model = dataclasses.replace(spec.model, num_layers=layers)
    rates = dataclasses.replace(standin_rates(spec), **(links or {}))
    t = estimate_time(model, spec.training, c, study_gpu(spec), spec.cluster.gpus_per_node,
                      spec.framework, rates).step  # fmt: skip
    m = max(c.num_microbatches, 1)
    return t + call_s * expert_calls(spec.model, c, spec.framework) * layers * m


def rows(spec: StudySpec, call_s: float = CALL_S,
         links: dict[str, Link] | None = None) -> list[ProbeRow]:  # fmt: skip
    out = []
    for run in probe_runs(spec):
        step = true_step(spec, run.launched, run.depth, call_s, links)
        out.append(ProbeRow(key=run.launched.key(), depth=run.depth, step_s=step,
                            samples_s=(step * 0.99, step, step * 1.01), peak_gib=0.5,
                            reserved_gib=None))  # fmt: skip
    return out


def predicted(spec: StudySpec, c: ParallelConfig, terms: Any,
              links: dict[str, Link] | None = None) -> float:  # fmt: skip
    rates = catalog_rates(study_gpu(spec), spec.training.precision)
    rates = dataclasses.replace(rates, **(links or {}))
    return estimate_time(spec.model, spec.training, c, study_gpu(spec),
                         spec.cluster.gpus_per_node, spec.framework, rates,
                         terms=terms).step  # fmt: skip


def test_the_probe_runs_the_base_at_a_second_micro_batch_size_in_an_moe_study_only() -> None:
    spec = moe_spec()
    runs = probe_runs(spec)
    base = runs[0].config
    sizes = [r for r in runs if r.config.micro_batch_size != base.micro_batch_size]
    assert len(sizes) == 1  # the smallest other size, at the deeper depth, same other knobs
    assert sizes[0].config.micro_batch_size == 1 and sizes[0].depth == max(probe_depths(spec))
    assert dataclasses.replace(sizes[0].config, micro_batch_size=base.micro_batch_size) == base
    dense = spec_of()
    assert {r.config.micro_batch_size for r in probe_runs(dense)} == {2}
    one = moe_spec(micro_batch_size=[2])
    assert {r.config.micro_batch_size for r in probe_runs(one)} == {2}


def test_the_expert_calls_fixed_part_composes_to_sizes_and_ep_degrees_never_run() -> None:
    """Probed at micro-batch 2 (every point) and 1 (the base alone), at 1 and 4 layers: every
    config at full depth within 2% of the stand-in, the ep 2 configs at micro-batch 1 and 4 and
    ep 1 at 4 among them (none of them run); without the second size, the layer measured at 2
    alone stretches the fixed part with the tokens: 12% under at micro-batch 1, 9% over at 4.
    The fixed part read is 14% under the stand-in's: its GEMMs and streaming kernels run at
    other ratios to the catalog's, so its per-token part is no exact multiple of the model's,
    and the line through two sizes gives the intercept what that leaves."""
    spec = moe_spec()
    probed = {r.config.key() for r in probe_runs(spec)}
    size_key = next(r.config.key() for r in probe_runs(spec) if r.config.micro_batch_size == 1)
    measured = rows(spec)
    terms = derive_terms(spec, measured)
    without = derive_terms(spec, [r for r in measured if r.key != size_key])
    base = terms.points[0]
    assert base.expert_fixed_s == pytest.approx(CALL_S, rel=0.2)
    kept_out = worst = worst_without = 0.0
    for c in iter_configs(spec):
        truth = true_step(spec, c, spec.model.num_layers)
        error = abs(predicted(spec, c, terms) / truth - 1)
        worst = max(worst, error)
        if c.micro_batch_size != 2:
            worst_without = max(worst_without, abs(predicted(spec, c, without) / truth - 1))
        kept_out += c.key() not in probed
        assert error < 0.02, c.key()
    assert kept_out >= 6
    assert worst < 0.02 < 0.10 < worst_without


def test_no_fixed_part_reads_none() -> None:
    """A stand-in whose expert calls cost nothing beyond the model's: the probe reads about none
    (the catalog's layer is no exact line in the stand-in's either), and the fixed part is never
    negative."""
    spec = moe_spec()
    terms = derive_terms(spec, rows(spec, call_s=0.0))
    base = terms.points[0]
    assert base.expert_fixed_s is not None
    assert 0.0 <= base.expert_fixed_s < 0.1 * CALL_S


def test_the_ep_neighbour_takes_the_bases_slope_and_measures_its_own_fixed_part() -> None:
    """The ZeRO and micro-batch neighbours take the base's fixed part per call; the EP
    neighbour, run at the base's size alone, takes the base's slope (the same GEMM FLOPs on the
    same kernels) and keeps what its layer measured over it as its own part per micro-batch."""
    spec = moe_spec()
    terms = derive_terms(spec, rows(spec))
    base = terms.points[0]
    assert len({p.expert_fixed_s for p in terms.points if p.ep == 1}) == 1
    ep2 = [p for p in terms.points if p.ep == 2]
    assert ep2 and all(p.layer_scale == base.layer_scale for p in ep2)
    assert all(p.expert_fixed_s is not None and p.expert_fixed_s > 0 for p in ep2)


def test_an_ep_cost_per_micro_batch_composes_to_sizes_never_run_at_that_ep() -> None:
    """A stack whose EP exchange costs WAIT_S per all-to-all beyond the collective profile's
    price (four per MoE layer per micro-batch at ep 2: dispatch and combine, forward and
    backward; on the CPU demo's two busy ranks the wait for the slower rank at each blocking
    collective, which the profile, timing each collective alone, leaves out): the ep 2 configs
    at micro-batch 1 and 4, never run, within 2%. Read as a ratio of the per-token work, that
    cost shrank with the micro-batch at ep 2: micro-batch 1 read 2.4% low."""
    spec = moe_spec()
    wait_s = 0.002

    def truth(c: ParallelConfig, layers: int) -> float:
        exchanges = 4 * (c.ep > 1) * layers * max(c.num_microbatches, 1)
        return true_step(spec, c, layers) + wait_s * exchanges

    measured = []
    for run in probe_runs(spec):
        step = truth(run.launched, run.depth)
        measured.append(ProbeRow(key=run.launched.key(), depth=run.depth, step_s=step,
                                 samples_s=(step, step), peak_gib=0.5,
                                 reserved_gib=None))  # fmt: skip
    terms = derive_terms(spec, measured)
    probed = {r.config.key() for r in probe_runs(spec)}
    kept_out = [c for c in iter_configs(spec) if c.ep == 2 and c.micro_batch_size != 2]
    assert kept_out and not {c.key() for c in kept_out} & probed
    for c in iter_configs(spec):
        assert abs(predicted(spec, c, terms) / truth(c, spec.model.num_layers) - 1) < 0.02


def test_the_probes_terms_table_states_the_fixed_part() -> None:
    from tests import test_stack_terms
    from tuner.cli.probe import terms_grid

    spec = moe_spec()
    notes = " ".join(terms_grid(derive_terms(spec, rows(spec)).points).notes)
    assert "expert calls: ep 1 8." in notes  # 8.6 ms read of the stand-in's 10 (see above)
    assert "ep 2 " in notes  # the ep 2 neighbour's own, over the base's slope
    dense = spec_of()
    plain = terms_grid(derive_terms(dense, test_stack_terms.probe_rows(dense)).points)
    assert "expert calls" not in " ".join(plain.notes)


def test_the_all_to_all_is_priced_at_its_own_measured_link_not_the_all_reduces() -> None:
    """A stack whose all-reduce costs a millisecond a call (the latency fitted to gloo's on the
    CPU demo's two ranks: 0.22-1.63 ms) and whose all-to-all costs 20 us (one exchange with the
    one peer; gloo's measured 0.13-0.29 ms up to 256 KiB there): the profile measured both.
    Priced at the all-to-all's own link, every config comes within 2%, ep 2 at micro-batch 1 and
    4 among them (never run); priced at the all-reduce's, the ep 2 neighbour's own part per
    micro-batch takes the surplus latency in at micro-batch 2 and carries it per micro-batch, so
    ep 2 at micro-batch 1 comes within 2% as well (it read about 3% high when the surplus went
    into a ratio of the per-token work)."""
    spec = moe_spec()
    bw = catalog_rates(study_gpu(spec), spec.training.precision).intra.bandwidth
    links = {"intra": Link(bw, 1e-3), "all_to_all": Link(bw, 2e-5)}
    borrowed = {"intra": links["intra"]}  # a profile that measured no all-to-all
    terms = derive_terms(
        spec,
        rows(spec, links=links),
        dataclasses.replace(catalog_rates(study_gpu(spec), "fp32"), **links),
    )
    old = derive_terms(
        spec,
        rows(spec, links=links),
        dataclasses.replace(catalog_rates(study_gpu(spec), "fp32"), **borrowed),
    )
    probed = {r.config.key() for r in probe_runs(spec)}
    worst_old = 0.0
    for c in iter_configs(spec):
        truth = true_step(spec, c, spec.model.num_layers, links=links)
        assert abs(predicted(spec, c, terms, links) / truth - 1) < 0.02, c.key()
        if c.ep == 2 and c.micro_batch_size == 1:
            assert c.key() not in probed
            worst_old = max(worst_old, abs(predicted(spec, c, old, borrowed) / truth - 1))
    assert worst_old < 0.02
