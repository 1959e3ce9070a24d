"""Calibration kept per cluster: saved observations, a second study that starts calibrated, the
memory model's last word, ``tune calibrate``, and the stop rule that uses the corrected model."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
import yaml

from tuner.calibrate import store
from tuner.calibrate.calibrated import Corrector, corrector_for, memory_notes
from tuner.calibrate.store import (
    TRANSFER_SD,
    Calibration,
    Observation,
    history,
    load_calibration,
    measured_startup_s,
    memory_fingerprint,
    observations_from_trials,
    record_study,
    save_calibration,
    setup_fingerprint,
)
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.layout import ClusterLayout
from tuner.models.memory.estimate import GIB
from tuner.outcome import Outcome
from tuner.search.sampler import MIN_ERROR_RUNS, ModelGuidedSampler
from tuner.search.stopping import Stopper
from tuner.space.cost import trial_cost, with_startup
from tuner.space.enumerate import enumerate_space, expand_axes, study_gpu
from tuner.space.trials import config_from_params, config_params, distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

BASE: dict[str, Any] = {
    "name": "first",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 2, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4],
              "recompute": ["none", "selective", "full"], "sequence_parallel": [True],
              "distributed_optimizer": [True]},
    "search": {"sampler": "model", "seed": 0},
}  # fmt: skip
NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def spec(name: str = "first", **search: Any) -> StudySpec:
    data = copy.deepcopy(BASE)
    data["name"] = name
    data["search"].update(search)
    return study_from_mapping(data)


def candidates(s: StudySpec) -> dict[str, Any]:
    """Every config the sampler may propose: those that fit and the memory probes."""
    report = enumerate_space(s)
    return {c.config.key(): c for c in report.ranked() + report.probes}


Truth = Callable[[ParallelConfig], float]


def run(
    s: StudySpec, truth: Truth, n: int, past: tuple[Observation, ...] = (),
    memory: Callable[[ParallelConfig], float] | None = None,
    stopper: bool = False, design: Sequence[ParallelConfig] = (),
) -> tuple[optuna.Study, list[ParallelConfig], str | None]:  # fmt: skip
    """Ask and tell up to ``n`` times as the study loop does (predictions recorded on the
    trial), measuring ``truth``; with ``stopper`` the stop rules are asked before each ask;
    the configs of ``design`` first (enqueued), then the sampler's."""
    sampler = ModelGuidedSampler(s, seed=s.search.seed, history=past)
    study = optuna.create_study(sampler=sampler)
    for config in design:
        study.enqueue_trial(config_params(config, expand_axes(s)))
    known = candidates(s)
    stop = Stopper(s, sampler)
    order: list[ParallelConfig] = []
    for _ in range(n):
        if stopper and (reason := stop(study.get_trials(deepcopy=False))):
            return study, order, reason
        trial = study.ask(distributions(s))
        config = config_from_params(s, trial.params)
        cand = known[config.key()]
        for key, value in {
            "key": config.key(), "config": dataclasses.asdict(config),
            "predicted_step_s": cand.time.step,
            "predicted_allocated_gib": cand.memory.allocated / GIB,
            "predicted_peak_gib": cand.memory.peak / GIB, "outcome": str(Outcome.OK),
            "predicted_activation_share": cand.memory.activation_share,
        }.items():  # fmt: skip
            trial.set_user_attr(key, value)
        if memory is not None:
            trial.set_user_attr("peak_memory_gib", memory(config))
        study.tell(trial, truth(config))
        order.append(config)
    return study, order, None


def off_model(s: StudySpec) -> Truth:
    """A machine on which pipelining is much cheaper and TP dearer than the model thinks."""
    pred = {k: c.time.step for k, c in candidates(s).items()}
    return lambda c: pred[c.key()] * (0.6 if c.pp == 4 else 1.0) * 1.6 ** math.log2(c.tp)


def observations(s: StudySpec, study: optuna.Study) -> tuple[Observation, ...]:
    gpu = study_gpu(s).memory_gib
    return tuple(observations_from_trials(s.name, setup_fingerprint(s), study.get_trials(), gpu))


# ----------------------------------------------------------------------------- files


def test_a_calibration_round_trips_and_merges(tmp_path: Path) -> None:
    s = spec()
    study, _, _ = run(s, off_model(s), 4, memory=lambda c: 20.0)
    copied = study.get_trials()[0]
    study.add_trial(optuna.trial.create_trial(  # answered from trial 0: not a measurement
        value=copied.value, params=copied.params, distributions=copied.distributions,
        user_attrs={**copied.user_attrs, "duplicate_of": 0},
    ))  # fmt: skip
    obs = observations(s, study)
    assert len(obs) == 4 and all(o.time_ratio is not None for o in obs)
    assert all(o.measured_gib == 20.0 and o.memory_ratio is not None for o in obs)
    known = candidates(s)  # each keeps the share of its predicted peak that is activations
    assert all(
        o.activation_share == known[o.parallel_config().key()].memory.activation_share for o in obs
    )
    path = tmp_path / "c.calibration.yaml"
    cal = Calibration(cluster="c").merged(obs[:3], NOW)
    save_calibration(cal, path)
    store._LOADED.clear()  # read from the file, not the one this process kept when saving it
    assert load_calibration(path, "c") == cal
    again = load_calibration(path, "c").merged(obs[2:], NOW)  # trial 2 is replaced, 3 added
    assert [o.trial for o in again.observations] == [0, 1, 2, 3]
    assert load_calibration(tmp_path / "none.yaml", "c") == Calibration(cluster="c")


def test_the_plain_data_is_asdicts_and_a_file_read_again_unchanged_is_not_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = spec()
    study, _, _ = run(s, off_model(s), 3, memory=lambda c: 20.0)
    modules = {**dict(observations(s, study)[0].config), "recompute_modules": ["mlp", "core"]}
    obs = (*observations(s, study), dataclasses.replace(observations(s, study)[0], trial=7,
                                                         config=modules))  # fmt: skip
    cal = Calibration(cluster="c").merged(obs, NOW)
    reference = dataclasses.asdict(cal)
    for o in reference["observations"]:
        o["config"] = dict(o["config"])
    plain = cal.to_dict()
    assert plain == reference and list(plain) == list(reference)
    assert all(
        list(p) == list(r)
        for p, r in zip(plain["observations"], reference["observations"], strict=True)
    )
    text = yaml.dump(plain, Dumper=store._DUMPER, sort_keys=False)
    assert text == yaml.dump(reference, Dumper=store._DUMPER, sort_keys=False)
    assert "&id" not in text  # nothing shared between observations: no anchors

    parsed: list[int] = []
    real_load = yaml.load
    monkeypatch.setattr(yaml, "load", lambda *a, **k: parsed.append(1) or real_load(*a, **k))
    path = tmp_path / "c.calibration.yaml"
    save_calibration(cal, path)
    assert load_calibration(path, "c") is cal and not parsed  # what this process wrote
    store._LOADED.clear()
    fresh = load_calibration(path, "c")
    assert fresh == cal and parsed == [1]
    assert load_calibration(path, "c") is fresh and parsed == [1]  # unchanged: kept
    other = Calibration(cluster="c").merged(obs[:1], NOW)  # another worker's save
    path.write_text(yaml.dump(other.to_dict(), Dumper=store._DUMPER, sort_keys=False))
    assert load_calibration(path, "c") == other and parsed == [1, 1]
    path.unlink()
    assert load_calibration(path, "c") == Calibration(cluster="c")


def test_a_log_with_reserved_memory_only_feeds_the_correction_by_reserved() -> None:
    """torchtitan logs the printing rank's max reserved, no allocated peak: the observation
    compares it with the predicted reserved figure (a Megatron trial keeps allocated)."""
    s = spec()
    study, _, _ = run(s, off_model(s), 2, memory=lambda c: 20.0)
    first, second = study.get_trials()
    attrs = {k: v for k, v in first.user_attrs.items() if k != "peak_memory_gib"}
    attrs |= {"peak_reserved_gib": 30.0, "predicted_reserved_gib": 24.0}
    titan = optuna.study.create_study()
    titan.add_trial(optuna.trial.create_trial(
        value=first.value, params=first.params, distributions=first.distributions,
        user_attrs=attrs,
    ))  # fmt: skip
    titan.add_trial(second)
    reserved, allocated = observations(s, titan)
    assert (reserved.predicted_gib, reserved.measured_gib) == (24.0, 30.0)
    assert reserved.memory_ratio == pytest.approx(math.log(30.0 / 24.0))
    assert allocated.measured_gib == 20.0
    assert allocated.predicted_gib == second.user_attrs["predicted_allocated_gib"]


def timed(study: optuna.Study, timings: list[tuple[float, int, float]]) -> optuna.Study:
    """``study``'s trials again, each with a wall time, an iteration count and a log's step
    time (``duration_s``, ``iterations``, ``step_time_s``) from ``timings`` in order."""
    out = optuna.create_study()
    for t, (duration, iterations, step) in zip(study.get_trials(), timings, strict=True):
        out.add_trial(optuna.trial.create_trial(
            value=t.value, params=t.params, distributions=t.distributions,
            user_attrs={**t.user_attrs, "duration_s": duration, "iterations": iterations,
                        "step_time_s": step},
        ))  # fmt: skip
    return out


def test_a_trials_start_up_is_measured_and_saved(tmp_path: Path) -> None:
    """The start-up a launch took is its wall time less its iterations at its step time; a log
    whose iterations outlast the wall time (a paced stand-in) measures none."""
    s = spec()
    study, _, _ = run(s, off_model(s), 3)
    obs = observations(s, timed(study, [(100.0, 10, 2.0), (50.0, 12, 2.5), (1.0, 10, 2.0)]))
    assert [o.startup_s for o in obs] == [pytest.approx(80.0), pytest.approx(20.0), None]
    path = tmp_path / "c.calibration.yaml"
    save_calibration(Calibration(cluster="c").merged(obs, NOW), path)
    kept = load_calibration(path, "c").observations
    assert [o.startup_s for o in kept] == [o.startup_s for o in obs]
    # the median of the setup's launches, a running study's own among them
    fp = setup_fingerprint(s)
    assert measured_startup_s(kept, fp) == pytest.approx(50.0)
    assert measured_startup_s(kept, fp, [30.0, None]) == pytest.approx(30.0)
    assert measured_startup_s(kept, "another setup") is None  # its model build is another's
    assert measured_startup_s(kept, "another setup", [30.0]) == pytest.approx(30.0)


def test_the_sampler_charges_the_start_up_its_launches_measured() -> None:
    """The default start-up (3 minutes) is the user's estimate; once launches of the setup ran
    (this study's, or a saved study's), a trial costs the start-up they took."""
    s = spec()
    study, _, _ = run(s, off_model(s), 3)
    took = timed(study, [(30.0 + 10 * 2.0, 10, 2.0)] * 3).get_trials()
    step = np.log([1.5])
    guessed = ModelGuidedSampler(s).trial_node_hours(step)[0]
    assert guessed == pytest.approx(trial_cost(s, 1.5).node_hours)
    measured = trial_cost(with_startup(s, 30.0), 1.5).node_hours
    assert measured < guessed
    assert ModelGuidedSampler(s).trial_node_hours(step, took)[0] == pytest.approx(measured)
    saved = observations(s, timed(study, [(30.0 + 10 * 2.0, 10, 2.0)] * 3))
    later = ModelGuidedSampler(spec("second"), history=saved)  # the same setup, another name
    assert later.trial_node_hours(step)[0] == pytest.approx(measured)
    # the run the answer is for is valued at the same start-up as the trials weighed against it
    assert later.run_node_hours() < ModelGuidedSampler(s).run_node_hours()


def test_record_study_saves_under_the_cluster_name(tmp_path: Path) -> None:
    s = spec()
    study, _, _ = run(s, off_model(s), 3)
    record_study(s, study.get_trials(), 80.0, tmp_path, now=NOW)
    layout = ClusterLayout(tmp_path.resolve(), "a100-80gb-local-2x8")
    assert s.cluster_name == layout.name and layout.calibration_yaml.is_file()
    assert len(history(s, tmp_path)) == 3
    named = study_from_mapping({**BASE, "cluster": {**BASE["cluster"], "name": "lab-a"}})
    assert named.cluster_name == "lab-a" and history(named, tmp_path) == ()
    assert setup_fingerprint(named) == setup_fingerprint(s)  # the name changes no measurement
    assert setup_fingerprint(spec("second")) == setup_fingerprint(s)


def test_two_studies_ending_together_both_keep_their_observations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two studies (or two workers) on one cluster ending at the same moment each read the
    cluster's calibration, added their trials and wrote it: the second write dropped the first
    study's observations (and their one .tmp name let one rename the other's half-written
    file). The read, merge and write are one step under a lock now."""
    import threading

    first, second = spec("first"), spec("second")
    trials = {s.name: run(s, off_model(s), 3)[0].get_trials() for s in (first, second)}
    merging, go = threading.Event(), threading.Event()
    real = Calibration.merged

    def held(self: Calibration, new: Any, now: dt.datetime) -> Calibration:
        new = tuple(new)
        if new[0].study == "first":  # the first study stops between its read and its write
            merging.set()
            go.wait(5)
        return real(self, new, now)

    monkeypatch.setattr(Calibration, "merged", held)

    def end(s: StudySpec) -> threading.Thread:
        t = threading.Thread(target=record_study, args=(s, trials[s.name], 80.0, tmp_path))
        t.start()
        return t

    a = end(first)
    assert merging.wait(30)
    b = end(second)
    b.join(1)  # waits on the lock the first study holds (it wrote meanwhile before)
    go.set()
    a.join(30)
    b.join(30)
    store._LOADED.clear()
    assert {o.study for o in history(first, tmp_path)} == {"first", "second"}
    assert len(history(first, tmp_path)) == 6
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []


# ----------------------------------------------------------------------------- a second study


def test_a_second_study_on_the_same_cluster_starts_calibrated() -> None:
    first = spec()
    truth = off_model(first)
    study, _, _ = run(first, truth, 10)
    past = observations(first, study)
    measured_best = min(truth(o.parallel_config()) for o in past)
    true_best = min(truth(c.config) for c in candidates(first).values())
    assert measured_best <= true_best * 1.02, "the first study must have found the best"

    second = spec("second")
    (cold,) = run(second, truth, 1)[1]
    (warm,) = run(second, truth, 1, past=past)[1]
    assert truth(cold) > true_best * 1.2  # the model alone starts far off
    assert truth(warm) <= true_best * 1.02  # the saved calibration starts at the answer


def test_own_trials_in_the_saved_calibration_are_not_counted_twice() -> None:
    s = spec()
    study, _, _ = run(s, off_model(s), 4)
    sampler = ModelGuidedSampler(s, history=observations(s, study))
    assert sampler._past(study.get_trials()) == []  # its own: already in the study


def test_another_studys_observations_count_as_noisier() -> None:
    s = spec()
    study, _, _ = run(s, off_model(s), 4)
    obs = observations(s, study)
    assert obs[0].transfer_sd(setup_fingerprint(s)) == 0.0
    assert obs[0].transfer_sd("other model") == TRANSFER_SD


# ----------------------------------------------------------------------------- memory


def test_calibration_never_launches_what_the_memory_model_rejects(tmp_path: Path) -> None:
    """Saved peaks a third of the predictions would let predicted-OOM configs fit; they are
    still never proposed, and ``tune space`` says so."""
    s = spec()
    report = enumerate_space(s, keep_oom=True)
    assert report.oom, "the test needs configs the memory model rejects"
    viable = {c.config.key() for c in report.viable}
    study, _, _ = run(s, off_model(s), 6, memory=lambda c: 0.0)
    small = tuple(dataclasses.replace(o, measured_gib=(o.predicted_gib or 1.0) / 3)
                  for o in observations(s, study))  # fmt: skip
    corrector = Corrector(small, fingerprint=setup_fingerprint(s),
                          configs=[c.config for c in report.viable + report.oom],
                          limit_gib=s.search.memory_headroom * 80.0)  # fmt: skip
    notes = memory_notes(corrector, report.viable, report.oom)
    assert any("still never launched" in n for n in notes), notes
    # Beyond what fits only the study's declared memory probes (tuner.space.probes: from the
    # model's own stated error, at most search.memory_probes, marked as such), never what the
    # calibration alone would let fit.
    probes = {c.config.key() for c in report.probes}
    assert len(probes) <= s.search.memory_probes
    _, order, _ = run(spec("second"), off_model(s), len(viable) + len(probes), past=small)
    assert {c.key() for c in order} <= viable | probes
    assert len({c.key() for c in order}) == len(viable | probes)  # then it proposes nothing new


def test_calibrated_memory_over_the_limit_is_tried_last_and_said(tmp_path: Path) -> None:
    s = spec()
    report = enumerate_space(s, keep_oom=True)
    study, _, _ = run(s, off_model(s), 6, memory=lambda c: 0.0)
    big = tuple(dataclasses.replace(o, measured_gib=(o.predicted_gib or 1.0) * 3)
                for o in observations(s, study))  # fmt: skip
    limit = s.search.memory_headroom * 80.0
    corrector = Corrector(
        big,
        fingerprint=setup_fingerprint(s),
        configs=[c.config for c in report.viable],
        limit_gib=limit,
    )
    notes = memory_notes(corrector, report.viable, report.oom)
    assert any("tried only when nothing else is left" in n for n in notes), notes
    over = {c.config.key() for c in report.viable
            if corrector.correct(c).calibrated_peak_gib > limit}  # fmt: skip
    assert 0 < len(over) < len(report.viable)
    (first,) = run(spec("second"), off_model(s), 1, past=big)[1]
    assert first.key() not in over


def test_a_config_that_ran_on_the_cluster_is_known_to_fit() -> None:
    """However the calibrated memory extrapolates, a config that ran under the same model and GPU
    is not pushed back as a likely OOM (the calibrated best of a first study comes first)."""
    s = spec()
    study, _, _ = run(s, off_model(s), 6, memory=lambda c: 0.0)
    ran = tuple(dataclasses.replace(o, measured_gib=(o.predicted_gib or 1.0) * 3,
                                    memory_setup=memory_fingerprint(s))
                for o in observations(s, study))  # fmt: skip
    other = tuple(dataclasses.replace(o, memory_setup="another model") for o in ran)
    keys = {o.parallel_config().key() for o in ran}
    kept = {}
    for name, past in (("ran", ran), ("other", other)):
        sampler = ModelGuidedSampler(spec("second"), history=past)
        configs = sampler._candidates()
        index = {c.key(): i for i, c in enumerate(configs)}
        fitting = set(sampler._fitting(list(range(len(configs))), {}, index, set(), list(past)))
        kept[name] = {k for k in keys if index[k] in fitting}
    assert kept["ran"] == keys
    assert kept["other"] < keys  # under another model the same peaks would push some back


# ----------------------------------------------------------------------------- stopping


def test_stops_when_no_untried_config_has_a_real_chance() -> None:
    """The model is right about this machine: after a few runs the untried configs together
    have less than a 10 % chance of beating the best by 1 %, long before the space is used up.
    (A training run worth a million node-hours keeps the cost rule, which fires first at the
    default exchange rate, from answering:
    :func:`test_stops_sooner_when_a_launch_is_not_worth_its_cost`.)"""
    s = spec(train_node_hours=1e6)
    pred = {k: c.time.step for k, c in candidates(s).items()}
    study, order, reason = run(s, lambda c: pred[c.key()], len(pred), stopper=True)
    assert reason is not None and reason.startswith("the answer is known"), reason
    assert len(order) < len(pred) // 2
    # and it has the best of what fits (no run reports a peak here, so no memory probe runs)
    fitting = [c.time.step for c in enumerate_space(s).ranked() if c.time]
    assert min(pred[c.key()] for c in order) == min(fitting)


def test_stops_sooner_when_a_launch_is_not_worth_its_cost() -> None:
    """The same right model at the default exchange rate (a launch must be expected to gain
    0.5 % of the step) ends the search no later, with the best already run; with the chance
    rule all but off, on a run worth only a few trials, the cost rule alone ends it as soon."""
    s = spec()
    pred = {k: c.time.step for k, c in candidates(s).items()}
    _, known, _ = run(spec(train_node_hours=1e6), lambda c: pred[c.key()], len(pred),
                      stopper=True)  # fmt: skip
    _, order, reason = run(s, lambda c: pred[c.key()], len(pred), stopper=True)
    assert reason is not None and reason.startswith(("not worth", "the answer is known")), reason
    assert len(order) <= len(known)
    fitting = [c.time.step for c in enumerate_space(s).ranked() if c.time]
    assert min(pred[c.key()] for c in order) == min(fitting)
    trial = ModelGuidedSampler(s).trial_node_hours(np.log([min(fitting)]))[0]
    cheap_run = spec(train_node_hours=5 * trial, stop_chance=1e-9)
    _, cheap, reason = run(cheap_run, lambda c: pred[c.key()], len(pred), stopper=True)
    assert reason is not None and reason.startswith("not worth another launch"), reason
    assert MIN_ERROR_RUNS <= len(cheap) <= len(order)


def test_keeps_searching_while_a_config_has_a_chance() -> None:
    s = spec()
    truth = off_model(s)
    sampler = ModelGuidedSampler(s, seed=0)
    few, _, _ = run(s, truth, MIN_ERROR_RUNS - 1)
    assert sampler.chance_to_beat(few.get_trials(), 0.01) is None  # too few to know its error
    study, _, _ = run(s, truth, MIN_ERROR_RUNS)
    found = sampler.chance_to_beat(study.get_trials(), 0.01)
    assert found is not None and found[0] > 0.1  # a model off by 2x, 4 runs: no answer yet
    assert Stopper(s, sampler).known(study.get_trials()) is None
    assert Stopper(spec(stop_chance=None), sampler).known(study.get_trials()) is None


def test_count_rule_is_the_fallback() -> None:
    s = spec(sampler="random", early_stop_trials=3)
    study = optuna.create_study()
    for value in (1.0, 2.0, 2.0, 2.0):
        trial = study.ask()
        trial.set_user_attr("launched", True)
        study.tell(trial, value)
    assert Stopper(s, study.sampler)(study.get_trials()) == (
        "no 1% improvement in the last 3 trials (early stop)"
    )


# ----------------------------------------------------------------------------- the CLI


def test_tune_calibrate_shows_and_resets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = spec()
    known = candidates(s)

    def peak(c: ParallelConfig) -> float:  # without recomputation: 1.4 x the activations
        m = known[c.key()].memory
        return (m.allocated + (0.4 * m.activation_share * m.allocated if c.recompute == "none"
                               else 0.0)) / GIB  # fmt: skip

    # A fixed design: each knob value the machine departs on (tp, pp 4) measured on two
    # configs, so that leave-one-out can predict each config from another; which configs the
    # sampler picks is not what this test is about.
    shapes = [(1, 1, 1, "none"), (2, 1, 4, "none"), (1, 1, 1, "selective"),
              (1, 1, 2, "selective"), (1, 4, 1, "none"), (4, 4, 1, "selective"),
              (1, 2, 1, "none"), (1, 4, 1, "selective")]  # fmt: skip
    by_shape = {(c.config.tp, c.config.pp, c.config.micro_batch_size, c.config.recompute):
                c.config for c in known.values()}  # fmt: skip
    design = [by_shape[shape] for shape in shapes]
    study, _, _ = run(s, off_model(s), 8, memory=peak, design=design)
    assert [config_from_params(s, t.params) for t in study.trials] == design
    kinds = {config_from_params(s, t.params).recompute for t in study.trials}
    assert "none" in kinds and len(kinds) > 1  # the miss shows against another setting
    record_study(s, study.get_trials(), 80.0, tmp_path, now=NOW)
    args = ["calibrate", "--cluster", s.cluster_name, "--results", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "8 trials from first" in out and "fitted step-time corrections" in out
    assert "step-time error:" in out and "leave-one-out" in out
    assert "fitted memory corrections" in out and "peak-memory error:" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["error"]["mape_after"] < data["error"]["mape_before"]
    assert len(data["trials"]) == 8
    assert data["memory_error"]["mape_after"] < data["memory_error"]["mape_before"]
    assert data["memory_factors"]["activations, recompute=none"] > 1.05
    assert len(data["memory_trials"]) == 8
    # a name nothing was saved for (a typo) is an error naming those that have something; it
    # read "no calibration saved yet", exit 0, as for a cluster not yet calibrated
    assert main(["calibrate", "--cluster", "nope", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing saved for cluster 'nope'" in err
    assert f"(saved there: {s.cluster_name});" in err
    assert main([*args, "--reset"]) == 0
    assert "cleared" in capsys.readouterr().out
    assert history(s, tmp_path) == ()
    assert main(["calibrate", "--cluster", "../x", "--results", str(tmp_path)]) == 2


def test_space_and_estimate_show_the_calibrated_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = spec()
    path = tmp_path / "first.yaml"
    path.write_text(yaml.safe_dump(BASE))
    study, _, _ = run(s, off_model(s), 8)
    record_study(s, study.get_trials(), 80.0, tmp_path / "results", now=NOW)
    results = ["--results", str(tmp_path / "results")]
    assert main(["space", "--study", str(path), "--top", "3", *results]) == 0
    out = capsys.readouterr().out
    assert "by calibrated step time (cluster a100-80gb-local-2x8, 8 saved trials)" in out
    assert main(["space", "--study", str(path), *results]) == 0  # no --top: no empty "top 0"
    assert "by calibrated step time" not in capsys.readouterr().out
    assert main(["estimate", "--study", str(path), "--set", "tp=2", "--set", "pp=4",
                 *results]) == 0  # fmt: skip
    assert "calibrated (cluster a100-80gb-local-2x8, 8 saved trials): step" in (
        capsys.readouterr().out
    )
    assert main(["run", "--study", str(path), "--dry-run", "--json", *results]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["calibrated"]["saved_trials"] == 8
    corrector = corrector_for(s, tmp_path / "results")
    assert corrector.factors()[0][0] == "all configs"


@pytest.mark.slow
def test_a_study_saves_its_trials_and_the_next_one_reads_them(tmp_path: Path) -> None:
    """The real loop (local executor, the Megatron stand-in): ``run`` ends by saving its
    measured trials for the cluster; the next study's sampler starts from them."""
    from tests.test_study import SURFACE, study_data
    from tuner.study.build import build_loop

    data = study_data(tmp_path, SURFACE, n_trials=3)
    first = study_from_mapping(data)
    results = tmp_path / "results"
    loop = build_loop(first, results=str(results))
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    ok = summary.outcomes.get("ok", 0)
    assert ok >= 1
    saved = history(first, results)
    assert len([o for o in saved if o.outcome == "ok"]) == ok
    assert all(o.study == "e2e" and o.predicted_step_s for o in saved if o.outcome == "ok")
    second = study_from_mapping({**data, "name": "e2e-again"})
    again = build_loop(second, results=str(results))
    try:
        sampler = again.study.sampler
        assert isinstance(sampler, ModelGuidedSampler) and sampler._history == saved
        assert len(sampler._past([])) == len(saved)  # another study's: all of them count
    finally:
        again.executor.close()


def test_a_file_given_as_the_results_folder_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--results FILE`` (or a path through a file) made the calibration's stat fail: exit 1
    and "Not a directory", naming neither the file nor the option. Refused with the option
    now (``tuner.cli.options.folder``), before any command reads the folder."""
    from tests.test_hostile_inputs import BASE

    (tmp_path / "study.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "afile").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    for results, why in (("afile", "a file"), ("afile/sub", f"{tmp_path / 'afile'} is a file")):
        for command in ("space", "estimate", "calibrate"):
            with pytest.raises(SystemExit) as exit_:
                main(["--results", results, command, "--study", "study.yaml"])
            assert exit_.value.code == 2
            err = capsys.readouterr().err
            assert err == f"tune: error: argument --results: {results}: {why}, not a folder " \
                          "(see tune --help)\n"  # fmt: skip
    layout = ClusterLayout(tmp_path / "afile" / "sub", "c")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'afile'} is a file, not a folder "
                       r"\(--results must"):  # fmt: skip
        load_calibration(layout.calibration_yaml, "c")  # the library's own refusal, kept
