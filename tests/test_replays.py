"""The replays of measured clusters (benchmarks/replays.py, search_efficiency.py --surfaces
replays): a replay reads its group's rows, restricts the study's space to the measured configs,
runs them through the Megatron-DeepSpeed stand-in at their published figures, and is charged as
the synthetic surfaces are."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import replays  # noqa: E402
from benchmarks.search_efficiency import (  # noqa: E402
    Truth,
    launch_node_hours,
    search,
    study_data,
    truth,
)
from tuner.space.enumerate import SharedSpace, enumerate_space  # noqa: E402
from tuner.spec.file import study_from_mapping  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402

Replay = tuple[StudySpec, Truth]

NAME = "bloom-181b-0225"
BEST = "tp=4,pp=12,cp=1,dp=8,vp=1,sp=0,mbs=2,gbs=2048,recompute=full:uniform:1,distopt=0,zero=1"


@pytest.fixture(scope="module")
def replay() -> Replay:
    spec = study_from_mapping(study_data(NAME, "tune", 0, 1))
    return spec, truth(spec, NAME)


def test_a_replay_reads_its_groups_rows_and_the_sources_ooms(replay: Replay) -> None:
    spec, t = replay
    assert (spec.world_size, spec.nodes_per_trial) == (384, 48)
    assert spec.training.global_batch_size == 2048
    assert spec.framework == "megatron-deepspeed" and spec.training.precision == "fp16"
    rows = replays.rows_of(NAME)
    assert len(rows) == 11  # the 02-25 rows at global batch 2048; 1568 and 2016 are apart
    assert sorted(t.space.step.values()) == sorted(float(r["value"]) for r in rows)
    assert len(t.oom) == 2 and all(",pp=6," in k and "tp=2," in k for k in t.oom)
    assert t.best_key == BEST and t.best_step == 110.48  # the published figure, as is
    assert t.keep == frozenset(t.space.configs) and len(t.keep) == 13


def test_a_replay_searches_the_measured_configs_and_no_other(replay: Replay) -> None:
    spec, t = replay
    whole = enumerate_space(spec, keep_oom=True, with_time=False)
    assert len(whole.viable) + len(whole.oom) == 27  # tp 2/4/8 x pp 6/12/24 x mbs 1/2/4
    kept = SharedSpace(spec, keep=t.keep).report()
    assert {c.config.key() for c in kept.viable} == set(t.step)  # the two OOM rows screened
    assert kept.counts()["total"] == 13 and kept.counts()["predicted_oom"] == 2
    assert kept.counts()["invalid"] == 0


def test_the_standins_table_holds_the_measured_configs_alone(replay: Replay) -> None:
    spec, t = replay
    table = json.loads(replays.surface_table(NAME).read_text())
    assert table["kind"] == "table"  # the stand-in fails a config missing from it
    standin = replays.standin_module()
    entries = {key: table["configs"][replays.standin_key(spec, c, standin)]
               for key, c in t.space.configs.items()}  # fmt: skip
    assert len(table["configs"]) == 13
    for key, entry in entries.items():
        if key in t.oom:
            assert entry["behaviour"] == {"kind": "oom", "after_iterations": 0}
        else:
            assert entry["step_s"] == t.space.step[key] and "behaviour" not in entry
    surface = standin.base.Surface(table)
    unmeasured = next(c for c in enumerate_space(spec).viable if c.config.key() not in t.keep)
    args = replays.standin_key(spec, unmeasured.config, standin)
    with pytest.raises(RuntimeError, match="no entry"):
        surface.point(_variables(args))


def _variables(key: str) -> dict[str, object]:
    """The stand-in's surface variables as far as its table key reads them."""
    return dict(part.split("=", 1) for part in key.split(","))


def test_a_launch_is_charged_start_up_and_its_iterations_on_the_groups_nodes(
    replay: Replay,
) -> None:
    spec, t = replay
    minutes = spec.search.startup_min + 13 * 110.48 / 60  # warm-up 5 + 4 batches of 2 records
    assert launch_node_hours(spec, t, BEST) == pytest.approx(minutes / 60 * 48)
    oom = next(iter(t.oom))
    assert launch_node_hours(spec, t, oom) == pytest.approx(spec.search.startup_min / 60 * 48)


def test_tune_on_a_replay_launches_measured_configs_at_their_figures(
    replay: Replay, tmp_path: Path
) -> None:
    _, t = replay
    spec = study_from_mapping(study_data(NAME, "tune", 0, t.valid))
    out = search(spec, t, tmp_path, until_stop=True)
    assert out.keys and set(out.keys) <= t.keep and out.found
    for key, value in zip(out.keys, out.values, strict=True):  # the stand-in's +-1 % noise
        assert value is not None and value == pytest.approx(t.space.step[key], rel=0.01)


def test_a_replay_states_its_cluster_as_its_profile_would_measure_it(
    replay: Replay, tmp_path: Path
) -> None:
    """The cited measured link (network_measured_gbps_per_node) reaches the model through the
    saved cluster profile and study_rates, as tune profile's does, and gives the rates
    time_accuracy.py predicts the rows with; only the inter-node link changes."""
    from benchmarks.time_rows import measured_network_rates
    from tuner.models.rates import catalog_rates
    from tuner.profile.rates import study_rates
    from tuner.space.enumerate import study_gpu

    spec, t = replay
    assert t.profile is not None and t.profile.cluster == spec.cluster_name
    assert study_rates(spec, tmp_path) is None  # nothing saved: the catalog
    replays.save_measured_profile(spec, t.profile, tmp_path)
    rates = study_rates(spec, tmp_path)
    gpu = study_gpu(spec)
    cited = measured_network_rates(replays.rows_of(NAME)[0], gpu, spec.cluster.gpus_per_node)
    base = catalog_rates(gpu, spec.training.precision)
    assert rates is not None and cited is not None
    assert rates.inter.bandwidth == pytest.approx(135 / 8 * 1e9 / 8)  # 2.1 GB/s per GPU
    assert rates.inter.bandwidth == pytest.approx(cited.inter.bandwidth)
    assert rates.inter.latency == pytest.approx(cited.inter.latency)
    assert rates.inter.bandwidth < base.inter.bandwidth
    assert (rates.intra, rates.gemm, rates.hbm, rates.gemm_samples) == (
        base.intra, base.gemm, base.hbm, base.gemm_samples)  # fmt: skip
    catalog = truth(spec, NAME, "catalog")
    assert catalog.profile is None and catalog.step == t.step  # the same measured configs


def test_the_search_on_a_replay_reads_the_profiled_link(replay: Replay, tmp_path: Path) -> None:
    """A replay's search starts with the profile saved (open_loop): the loop's rates are the
    measured link, and under the catalog variant the catalog's."""
    from benchmarks.search_efficiency import open_loop
    from tuner.search.sampler import ModelGuidedSampler

    spec, t = replay
    measured = open_loop(spec, t, tmp_path / "profile")
    catalog = open_loop(spec, truth(spec, NAME, "catalog"), tmp_path / "catalog")
    try:
        rates = []
        for loop in (measured, catalog):
            sampler = loop.study.sampler
            assert isinstance(sampler, ModelGuidedSampler)
            rates.append(sampler._shared.rates)
        assert rates[0] is not None
        assert rates[0].inter.bandwidth == pytest.approx(135 / 8 * 1e9 / 8)
        assert rates[1] is None  # the catalog's
    finally:
        measured.executor.close()
        catalog.executor.close()
