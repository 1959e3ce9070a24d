"""Repeated measurements of one config saved as one row with its repeats
(:func:`tuner.calibrate.store._grouped`): the file reads back to the same observations, in the
same order, as the file written row by row, so that each reader of the observations (the
sampler's own-trial filter, the start-up median, the corrector, ``tune calibrate``) answers as
it did; a file written before repeats reads each row as one observation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.calibrate import store
from tuner.calibrate.calibrated import Corrector
from tuner.calibrate.store import (
    Calibration,
    Observation,
    load_calibration,
    measured_startup_s,
    save_calibration,
)
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.layout import ClusterLayout
from tuner.search.saved import Saved

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
CONFIGS = [
    json.loads(json.dumps(dataclasses.asdict(c)))  # as a trial's attributes hold it
    for c in (
        ParallelConfig(tp=2, pp=1, dp=4, micro_batch_size=1, global_batch_size=64),
        ParallelConfig(tp=4, pp=2, dp=1, micro_batch_size=2, global_batch_size=64,
                       recompute="selective", recompute_modules=("mlp", "core_attn")),
        ParallelConfig(tp=1, pp=4, dp=2, micro_batch_size=1, global_batch_size=64,
                       recompute="full", recompute_method="uniform", recompute_num_layers=1),
    )
]  # fmt: skip


def observation(study: str, trial: int, **figures: Any) -> Observation:
    """Trial ``trial`` of ``study``: config ``trial % 3``, an OOM every fourth trial of the
    third config, the predicted figures of its config and measured ``figures`` (defaults: the
    same every time)."""
    which = trial % 3
    common: dict[str, Any] = {
        "study": study, "fingerprint": f"fp-{study}", "trial": trial,
        "config": CONFIGS[which], "memory_setup": "m", "activation_share": 0.25 * (which + 1),
    }  # fmt: skip
    if which == 2 and trial % 4 == 0:
        return Observation(**common, outcome="oom", predicted_gib=70.0, measured_gib=80.0)
    return Observation(
        **common, outcome="ok", predicted_step_s=1.0 + which, predicted_gib=30.0 + which,
        **{"measured_step_s": 1.3 + which, "measured_gib": 33.0 + which, "startup_s": 40.0,
           **figures},
    )  # fmt: skip


def repeated() -> Calibration:
    """Two studies measuring three configs again and again: most repeats the same to the
    last digit, some with another step time, peak or start-up (or none, or -0.0 after 0.0)."""
    obs = [observation("a", n) for n in range(30)]
    obs[4] = observation("a", 4, measured_step_s=2.31, startup_s=None)
    obs[7] = observation("a", 7, measured_gib=34.5, startup_s=55.0)
    obs[10] = observation("a", 10, startup_s=60.0)
    obs[13] = observation("a", 13, measured_step_s=2.3000000000000003)  # a repr apart
    obs += [observation("b", n, startup_s=30.0 + n) for n in range(12)]
    obs += [observation("z", 0, startup_s=0.0), observation("z", 3, startup_s=-0.0)]  # == 0.0
    cal = Calibration(cluster="c").merged(obs, NOW)
    return dataclasses.replace(cal, observations=cal.observations[::-1]).merged((), NOW)


def row_by_row(cal: Calibration) -> str:
    """``cal`` as the file was written before repeats: one row per observation."""
    plain = dataclasses.asdict(cal)
    for o in plain["observations"]:
        o["config"] = dict(o["config"])
    return yaml.dump(plain, Dumper=store._DUMPER, sort_keys=False)


def both(tmp_path: Path, cal: Calibration) -> tuple[Calibration, Calibration, Path, Path]:
    """``cal`` saved with its repeats and row by row, each read back from its file, and the
    two results folders."""
    grouped, plain = tmp_path / "grouped", tmp_path / "plain"
    save_calibration(cal, ClusterLayout(grouped, "c").calibration_yaml)
    old = ClusterLayout(plain, "c").calibration_yaml
    old.parent.mkdir(parents=True)
    old.write_text(row_by_row(cal))
    store._LOADED.clear()
    new = load_calibration(ClusterLayout(grouped, "c").calibration_yaml, "c")
    return new, load_calibration(old, "c"), grouped, plain


def test_repeats_are_one_row_each_and_read_back_as_they_were(tmp_path: Path) -> None:
    cal = repeated()
    new, old, grouped, _ = both(tmp_path, cal)
    text = ClusterLayout(grouped, "c").calibration_yaml.read_text()
    rows = yaml.safe_load(text)["observations"]
    assert len(rows) == 4 + 4 + 1  # a and b: configs 0 and 1, config 2 measured and its OOM
    assert rows[-1]["repeats"] == [{"trial": 3, "startup_s": -0.0}]
    assert sum(len(r.get("repeats", ())) for r in rows) == len(cal.observations) - len(rows)
    assert {"trial": 4, "measured_step_s": 2.31, "startup_s": None} in rows[1]["repeats"]
    assert {"trial": 13, "measured_step_s": 2.3000000000000003} in rows[1]["repeats"]
    assert {"trial": 3} in rows[0]["repeats"]  # the same figures: only its number
    assert repr(new) == repr(cal) == repr(old)  # same observations, order, types and digits
    assert len(text) < len(row_by_row(cal)) / 3


def test_a_tuple_out_of_order_is_written_row_by_row(tmp_path: Path) -> None:
    cal = repeated()
    shuffled = dataclasses.replace(cal, observations=cal.observations[::-1])
    path = tmp_path / "c.calibration.yaml"
    save_calibration(shuffled, path)
    assert "repeats" not in path.read_text()
    store._LOADED.clear()
    assert repr(load_calibration(path, "c")) == repr(shuffled)


def test_the_own_trial_filter_answers_as_for_the_rows(tmp_path: Path) -> None:
    new, old, _, _ = both(tmp_path, repeated())
    own = {(n, ParallelConfig(**CONFIGS[n % 3]).key()) for n in (0, 3, 4, 5, 9, 29)}
    own.add((7, ParallelConfig(**CONFIGS[0]).key()))  # trial 7 ran config 1: not this one
    past_new = Saved(new.observations, "a", "fp-a").past(own)
    past_old = Saved(old.observations, "a", "fp-a").past(own)
    assert repr(past_new) == repr(past_old)
    kept = [(o.study, o.trial) for o in past_new]
    assert ("a", 7) in kept and ("a", 3) not in kept and ("a", 29) not in kept
    assert len(kept) == len(new.observations) - 6
    assert Saved(new.observations, "b", "fp-a").past(own) == list(old.observations)


def test_the_start_up_median_answers_as_for_the_rows(tmp_path: Path) -> None:
    cal = repeated()
    new, old, _, _ = both(tmp_path, cal)
    for fingerprint in ("fp-a", "fp-b"):
        raw = [o.startup_s for o in cal.observations if o.fingerprint == fingerprint
               and o.startup_s]  # fmt: skip
        expected = statistics.median([*raw, 45.0])
        assert measured_startup_s(new.observations, fingerprint, [45.0]) == expected
        assert measured_startup_s(old.observations, fingerprint, [45.0]) == expected
    assert measured_startup_s(new.observations, "fp-a") == 40.0  # 16 of 18 repeats say 40 s


def test_the_corrector_answers_as_for_the_rows(tmp_path: Path) -> None:
    new, old, _, _ = both(tmp_path, repeated())
    for fingerprint in ("fp-a", "fp-b", ""):
        a = Corrector(new.observations, fingerprint=fingerprint, memory_setup="m")
        b = Corrector(old.observations, fingerprint=fingerprint, memory_setup="m")
        assert a.factors() == b.factors() and a.memory_factors() == b.memory_factors()
        assert a.ran == b.ran
        assert repr(a.leave_one_out()) == repr(b.leave_one_out())
        assert repr(a.memory_leave_one_out()) == repr(b.memory_leave_one_out())


def test_tune_calibrate_answers_as_for_the_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = repeated()
    _, _, grouped, plain = both(tmp_path, cal)
    outputs = []
    for results in (grouped, plain):
        for extra in ([], ["--json"]):
            store._LOADED.clear()
            assert main(["calibrate", "--cluster", "c", "--results", str(results), *extra]) == 0
            outputs.append(capsys.readouterr().out.replace(str(results), "RESULTS"))
    assert outputs[0] == outputs[2] and outputs[1] == outputs[3]
    assert f"{len(cal.observations)} trials from a, b, z" in outputs[0]
    assert len(json.loads(outputs[1])["trials"]) == sum(
        o.time_ratio is not None for o in cal.observations
    )


@pytest.mark.parametrize(
    ("repeats", "why"),
    [
        ("3", "expected a list of repeats"),
        ("[{trial: -1}]", "must be >= 0"),
        ("[{trial: 5, measured_gib: -2.0}]", "must be >= 0"),
        ("[{trial: 5, outcome: oom}]", "unknown key 'outcome'"),
        ("[{measured_gib: 2.0}]", "required field is missing"),
        ("[{trial: 5, startup_s: .nan}]", "observations[0].repeats[0].startup_s"),
    ],
)
def test_a_bad_repeat_is_refused_with_where(tmp_path: Path, repeats: str, why: str) -> None:
    cal = Calibration(cluster="c").merged([observation("a", 0)], NOW)
    path = tmp_path / "c.calibration.yaml"
    path.write_text(row_by_row(cal).rstrip("\n") + f"\n  repeats: {repeats}\n")
    store._LOADED.clear()
    with pytest.raises(ConfigError, match="not a calibration file") as info:
        load_calibration(path, "c")
    assert why in str(info.value)
