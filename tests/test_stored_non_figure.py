"""A trial stored ``ok`` with a step time that is no figure (zero, negative, infinite: a storage
written before :func:`tuner.outcome.rankable`, or before the hardware bound
``tuner.models.time.breakdown.fastest_step_s``) is tried but unmeasured for the model sampler,
the stop rules and the calibration: the sampler took ``math.log`` of it and the run crashed."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState, create_trial

from tests.test_hostile_inputs import BASE
from tuner.config.parallel import ParallelConfig
from tuner.layout import ResultsLayout
from tuner.spec.file import load_study


def _study(tmp_path: Path, step: float, tokens: float, peak: float = 11.0) -> tuple[Path, str]:
    """BASE's study with one ``ok`` trial of ``step`` s/step (``tokens`` tokens/s, ``peak`` GiB)
    stored; its file and config key."""
    data = copy.deepcopy(BASE)
    data["launch"] |= {"train_args": ["--mock-data"], "megatron_path": "/opt/megatron"}
    data["search"] = {"early_stop_trials": 1}
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(data))
    layout = ResultsLayout(tmp_path / "results", data["name"])
    layout.storage_path.parent.mkdir(parents=True)
    stored = optuna.create_study(study_name=data["name"], storage=layout.storage_url)
    config = ParallelConfig(tp=2, micro_batch_size=1, global_batch_size=8)
    attrs = {"config": dataclasses.asdict(config), "key": config.key(), "launched": True,
             "hosts": ["n1"], "duration_s": 60.0, "predicted_step_s": 1.0, "outcome": "ok",
             "predicted_peak_gib": 10.0, "predicted_allocated_gib": 9.0, "step_time_s": step,
             "tokens_per_s": tokens, "peak_memory_gib": peak}  # fmt: skip
    stored.add_trial(create_trial(state=TrialState.COMPLETE, value=step, user_attrs=attrs))
    return study, config.key()


class _Executor:
    def preflight(self, *args: object) -> list[object]:
        return []

    def close(self) -> None:
        pass


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize(("step", "tokens", "peak"),
                         [(-1.0, -8192.0, 11.0), (0.0, float("inf"), -3.0)])  # fmt: skip
def test_the_run_goes_on_and_the_board_shows_it_unranked(
    tmp_path: Path, step: float, tokens: float, peak: float
) -> None:
    from tuner.calibrate.store import observations_from_trials
    from tuner.report.leaderboard import leaderboard, ranked
    from tuner.study.build import build_loop

    study, bad = _study(tmp_path, step, tokens, peak)
    spec = load_study(str(study))
    results = str(tmp_path / "results")
    loop = build_loop(spec, results=results, executor=_Executor())
    try:
        asked = []
        for _ in range(2):  # the model sampler's asks, the stored trial among the finished
            got = loop.next_config()
            assert got is not None
            asked.append(got[1].key())
        assert bad not in asked and len(set(asked)) == 2  # tried: not asked again
        trials = loop.trials()
    finally:
        loop.executor.close()
    assert observations_from_trials("hostile", "f", trials, 80.0) == []
    board = leaderboard(spec, results=results)
    rows = board.to_dict("records")
    assert [r["key"] for r in rows if r["outcome"] == "ok"] == [bad]
    assert not any(ranked(r) for r in rows)


def test_the_stop_rule_compares_measured_steps_alone(tmp_path: Path) -> None:
    """Rule 3 (no 1% improvement in the last k trials) read a stored -1 s step as the best so
    far, and stopped a run whose one real step was 2 s."""
    from tuner.search.stopping import Stopper

    study, _ = _study(tmp_path, -1.0, -8192.0)
    spec = load_study(str(study))
    attrs = {"launched": True, "tokens_per_s": 4096.0}
    trials = [create_trial(state=TrialState.COMPLETE, value=v, user_attrs=attrs)
              for v in (-1.0, 2.0)]  # fmt: skip
    for number, t in enumerate(trials):
        t.number = number
    assert Stopper(spec, None).no_improvement(trials) is None
