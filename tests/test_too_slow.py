"""One definition of the configs measured at fewer micro-batches per step
(:func:`tuner.space.shorten.too_slow`): the dry run, the model sampler's prices and the study's
screen read it, on issue 33's Llama-3-70B / 16 x 8 H100 scenario under a limit that some
configs fit only shortened and one not even so."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from tests.test_cost import scenario
from tuner.cli.cost import cost_json
from tuner.outcome import Outcome
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.proxy_cost import launch_scales
from tuner.space.shorten import too_slow
from tuner.spec.file import study_from_mapping
from tuner.study.record import Summary
from tuner.study.screen import Screen


def test_the_dry_run_the_sampler_and_the_screen_read_one_definition() -> None:
    spec = study_from_mapping(scenario(trial_timeout_min=6))
    gpu = study_gpu(spec)
    ranked = enumerate_space(spec).ranked()
    configs, steps = [c.config for c in ranked], [c.time.step if c.time else None for c in ranked]
    found = too_slow(spec, configs, steps, gpu)
    fewer = {k: s.microbatches for k, s in found.items() if s is not None}
    refused = {k for k, s in found.items() if s is None}
    assert fewer and refused  # both kinds, in this scenario
    assert not too_slow(study_from_mapping(scenario()), configs, steps)  # no limit: none
    # the dry run: what it lists as adapted and as refused
    cost = cost_json(spec, ranked, ranked[:3], 8)
    assert {i["config"]: i["microbatches"] for i in cost["fewer_microbatches"]} == fewer
    assert {i["config"] for i in cost["too_slow"]} == refused
    # the sampler's price of each launch: the step at its fewer micro-batches
    rows = launch_scales(spec, gpu, configs, steps)
    for config, step, (_, ratio) in zip(configs, steps, rows, strict=True):
        shorter = found.get(config.key())
        assert step and ratio == pytest.approx(shorter.step_s / step if shorter else 1.0)
    # the screen: what each trial is launched at, or why it is not
    study = optuna.create_study()
    leases = SimpleNamespace(claim=lambda *a, **k: None)
    screen = Screen(spec, study, leases, gpu, Summary(), worker="w",
                    heartbeat_s=30.0, rerun=frozenset())  # fmt: skip
    for config in configs:
        screen(study.ask(), config, [])
    by = {c.key(): t.user_attrs for c, t in zip(configs, study.trials, strict=True)}
    assert {k for k, a in by.items() if a.get("outcome") == str(Outcome.PRUNED_TIME)} == refused
    assert {k: a["measured_microbatches"] for k, a in by.items()
            if "measured_microbatches" in a} == fewer  # fmt: skip
