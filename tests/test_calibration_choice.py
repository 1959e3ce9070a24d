"""The step-time correction applied is the one whose leave-one-out error is lowest: a per-knob
fit that chases run-to-run noise is not applied when it predicts held-out trials worse than the
model alone (``tuner.calibrate.calibrated.choose_time``)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.test_calibration import NOW, candidates, spec
from tuner.calibrate.calibrated import Corrector
from tuner.calibrate.correction import TIME_CHOICES
from tuner.calibrate.store import Calibration, Observation, save_calibration, setup_fingerprint
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.layout import ClusterLayout
from tuner.search.sampler import ModelGuidedSampler

Ratio = Callable[[int, ParallelConfig], float]


def observations(ratio: Ratio, n: int = 8) -> tuple[Observation, ...]:
    """``n`` measured trials of distinct configs, measured = predicted x ``ratio``."""
    s = spec()
    picked = sorted(candidates(s).values(), key=lambda c: c.config.key())[::7][:n]
    return tuple(
        Observation(study=s.name, fingerprint=setup_fingerprint(s), trial=i,
                    config=dataclasses.asdict(c.config), outcome="ok",
                    predicted_step_s=c.time.step if c.time else 1.0,
                    measured_step_s=(c.time.step if c.time else 1.0) * ratio(i, c.config))
        for i, c in enumerate(picked)
    )  # fmt: skip


def noisy(i: int, _config: ParallelConfig) -> float:
    """Run-to-run noise of +-25 % around the model, unrelated to any knob: what a loaded CPU
    machine gives, ten times the 3 % the prior expects."""
    return float(math.exp(np.random.default_rng(7).normal(0.0, 0.25, 64)[i]))


def off_on_tp(_i: int, config: ParallelConfig) -> float:
    """A machine on which each doubling of tp costs 60 % more than the model thinks."""
    return float(1.6 ** math.log2(config.tp))


def test_a_correction_that_overfits_is_not_applied() -> None:
    obs = observations(noisy)
    corrector = Corrector(obs, fingerprint=obs[0].fingerprint)
    loo = corrector.leave_one_out("per-knob factors")
    before = np.mean([abs(r.before - 1) for r in loo])
    after = np.mean([abs(r.after - 1) for r in loo])
    assert after > before  # the fake does overfit: the per-knob fit is worse held out
    choice = corrector.time_choice
    assert choice is not None and choice.applied == "the model alone"
    assert choice.errors[2] == pytest.approx(after)  # one fit's identity = the refits
    assert choice.errors[0] == pytest.approx(before)
    assert corrector.time is None and corrector.factors() == []
    c = candidates(spec())[obs[0].parallel_config().key()]
    assert corrector.correct(c).calibrated_step_s == c.time.step if c.time else False


def test_a_correction_that_predicts_is_applied() -> None:
    obs = observations(off_on_tp)
    corrector = Corrector(obs, fingerprint=obs[0].fingerprint)
    choice = corrector.time_choice
    assert choice is not None and choice.applied == "per-knob factors"
    assert choice.errors[2] < min(choice.errors[:2])
    assert corrector.factors()


def uniform(i: int, c: ParallelConfig) -> float:
    """30 % slow everywhere, 2.5 % noise."""
    return float(1.3 * noisy(i, c) ** 0.1)


def test_a_shared_factor_alone_when_the_model_is_off_by_one_factor() -> None:
    corrector = Corrector(observations(uniform), fingerprint=observations(uniform)[0].fingerprint)
    choice = corrector.time_choice
    assert choice is not None and choice.applied == "one shared factor"
    assert [name for name, _ in corrector.factors()] == ["all configs"]


def test_tune_calibrate_says_which_correction_it_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = spec()
    layout = ClusterLayout(tmp_path, s.cluster_name)
    saved = Calibration(
        cluster=s.cluster_name, updated=NOW.isoformat(), observations=observations(noisy)
    )
    save_calibration(saved, layout.calibration_yaml)
    args = ["calibrate", "--cluster", s.cluster_name, "--results", str(tmp_path)]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "none applied: the model alone" in out
    assert "step-time correction applied: the model alone, the lowest leave-one-out error" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["time_correction"]["applied"] == "the model alone"
    errors = data["time_correction"]["loo_error"]
    assert errors["per-knob factors"] > errors["the model alone"]


@pytest.mark.parametrize(("ratio", "folded"), [(noisy, False), (off_on_tp, True)])
def test_the_search_folds_in_a_saved_calibration_only_where_it_predicts(
    ratio: Ratio, folded: bool
) -> None:
    s = spec(name="second")  # another study on the cluster: every saved row is past
    sampler = ModelGuidedSampler(s, seed=0, history=observations(ratio))
    sampler.belief([])  # builds the candidates and folds the saved rows
    assert sampler._folded(sampler._past([])).bases[0].folded is folded


@pytest.mark.parametrize(("ratio", "applied"), [(noisy, 0), (uniform, 1), (off_on_tp, 2)])
def test_tune_calibrate_shows_the_trials_by_the_correction_it_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ratio: Ratio, applied: int
) -> None:
    """The trials table's measured/... column and the error line are the leave-one-out of the
    correction applied, named: they showed the per-knob fit's where the model alone or one
    shared factor was applied."""
    obs = observations(ratio)
    corrector = Corrector(obs, fingerprint=obs[0].fingerprint)
    choice = corrector.time_choice
    assert choice is not None and choice.applied == TIME_CHOICES[applied]
    loo = corrector.leave_one_out()
    assert np.mean([abs(r.after - 1) for r in loo]) == pytest.approx(choice.errors[applied])
    s = spec()
    saved = Calibration(cluster=s.cluster_name, updated=NOW.isoformat(), observations=obs)
    save_calibration(saved, ClusterLayout(tmp_path, s.cluster_name).calibration_yaml)
    assert main(["calibrate", "--cluster", s.cluster_name, "--results", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    line = out[out.index("step-time error: ") :]
    assert f"correction applied: {choice.applied})" in out
    if applied:
        named = f"{choice.errors[applied]:.1%} with {choice.applied} (the correction applied;"
        assert named in line, line
    else:
        assert "no correction applied" in line and "measured/ calibrated" not in out
