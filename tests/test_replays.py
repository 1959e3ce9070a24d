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
