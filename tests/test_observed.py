"""tuner.search.observed: the model sampler's facts, folded once per finished trial, are what a
pass over every trial of each read gives, in the same order, whatever order trials finish in."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import random
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.calibrate.store import launch_overhead_s
from tuner.config.parallel import ParallelConfig
from tuner.outcome import Outcome
from tuner.search.observed import Observed
from tuner.space.trials import RETRYABLE, oom_dominates, trial_outcome

GPU_GIB = 80.0
GRID = [
    ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=mbs, global_batch_size=64, recompute=rc)
    for tp, mbs, rc in itertools.product((1, 2), (1, 2, 4), ("none", "full"))
]
WIDE = [
    ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=mbs, global_batch_size=gbs, recompute=rc)
    for tp, mbs, rc, gbs in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), ("none", "full"),
                                              (64, 128, 256))
]  # fmt: skip
"""Configs enough for new ones to keep coming as a long study goes on."""
OUTCOMES = [None, Outcome.OK, Outcome.OK, Outcome.OOM, Outcome.INTERRUPTED, Outcome.NODE_ERROR,
            Outcome.PRUNED_MEMORY]  # fmt: skip


def trial(rng: random.Random, number: int, state: TrialState,
          grid: list[ParallelConfig] = GRID) -> FrozenTrial:  # fmt: skip
    config = rng.choice(grid)
    outcome = rng.choice(OUTCOMES)
    attrs: dict[str, Any] = {"config": dataclasses.asdict(config), "key": config.key(),
                             "predicted_allocated_gib": rng.uniform(20, 60)}  # fmt: skip
    if outcome is not None:
        attrs["outcome"] = str(outcome)  # also on a running trial: its verdict, not yet told
    if rng.random() < 0.8:
        attrs["predicted_peak_gib"] = rng.uniform(60, 90)
    if outcome == Outcome.OK and rng.random() < 0.8:
        attrs["peak_memory_gib"] = rng.uniform(20, 60)
    if rng.random() < 0.7:  # a start-up: wall time beyond the iterations (or none: a replay)
        attrs |= {"duration_s": rng.choice([None, 30.0, 200.0]), "iterations": 20,
                  "step_time_s": rng.uniform(1, 5)}  # fmt: skip
    if rng.random() < 0.05:
        del attrs["key"]  # asked, nothing recorded yet
    if rng.random() < 0.05:
        del attrs["config"]
    value = rng.uniform(1, 2) if state == TrialState.COMPLETE else None
    now = datetime.datetime(2026, 1, 1)
    return FrozenTrial(number=number, state=state, value=value, values=None, datetime_start=now,
                       datetime_complete=None if state == TrialState.RUNNING else now,
                       params={}, distributions={}, user_attrs=attrs, system_attrs={},
                       intermediate_values={}, trial_id=number + 7)  # fmt: skip


def one_pass(trials: list[FrozenTrial], gpu_gib: float = GPU_GIB) -> tuple[Any, ...]:
    """The pass the model sampler's belief made over every trial before the fold."""
    measured: dict[str, float] = {}
    pending: set[str] = set()
    tried: set[str] = set()
    ooms: dict[str, ParallelConfig] = {}
    memory: dict[str, float] = {}
    for t in trials:
        key = t.user_attrs.get("key")
        if key is None:
            continue
        outcome = trial_outcome(t)
        if t.state == TrialState.COMPLETE and t.value is not None:
            measured.setdefault(str(key), float(t.value))
        elif t.state == TrialState.RUNNING:
            pending.add(str(key))
        elif outcome in RETRYABLE:
            continue
        if outcome == Outcome.OOM and t.user_attrs.get("config") and str(key) not in ooms:
            ooms[str(key)] = ParallelConfig(**t.user_attrs["config"])
            peak = t.user_attrs.get("predicted_peak_gib")
            if peak is not None:
                memory[str(key)] = math.log(gpu_gib / float(peak))
        measured_gib = t.user_attrs.get("peak_memory_gib")
        predicted_gib = t.user_attrs.get("predicted_allocated_gib")
        if outcome == Outcome.OK and measured_gib and predicted_gib:
            memory[str(key)] = math.log(float(measured_gib) / float(predicted_gib))
        tried.add(str(key))
    own = {(t.number, t.user_attrs.get("key")) for t in trials}
    return list(measured.items()), pending, tried, ooms, list(memory.items()), own


def startups(trials: list[FrozenTrial]) -> list[float]:
    """What the sampler's cost read from every trial before the fold: each COMPLETE trial's
    start-up, where it has one."""
    found = (launch_overhead_s(t.user_attrs) for t in trials if t.state == TrialState.COMPLETE)
    return sorted(s for s in found if s)


def test_folds_to_what_one_pass_over_every_trial_gives() -> None:
    for seed in range(4):
        rng = random.Random(seed)
        n = 150
        ends = [rng.randint(k // 5, k // 5 + 15) for k in range(n)]  # out of order
        finals = [trial(rng, k, rng.choice([TrialState.COMPLETE, TrialState.PRUNED,
                                            TrialState.FAIL])) for k in range(n)]  # fmt: skip
        observed = Observed()
        for read in range(n // 5 + 17):
            trials = [
                finals[k] if ends[k] <= read
                else trial(rng, k, TrialState.WAITING if k % 9 == 0 else TrialState.RUNNING)
                for k in range(min(n, 5 * read + 1))
            ]  # fmt: skip
            seen = observed.of(trials, GPU_GIB)
            got = (list(seen.measured.items()), seen.pending, seen.tried, seen.ooms,
                   list(seen.memory.items()), observed.own(trials))  # fmt: skip
            assert got == one_pass(trials)
            assert sorted(observed.startups(trials)) == startups(trials)
            assert observed.of(trials, GPU_GIB) is seen  # the same read: asked once
            assert observed.dominated(seen.ooms, GRID) == {
                i
                for i, c in enumerate(GRID)
                if any(oom_dominates(o, c) for o in seen.ooms.values())
            }
            for _ in range(2):  # made, then kept
                assert observed.oom_keys(seen.ooms) == {c.key() for c in seen.ooms.values()}
        assert len(seen.measured) > 3 and len(seen.memory) > 3 and seen.ooms
        assert len(startups(trials)) > 3


def test_a_list_that_is_not_a_later_read_is_folded_afresh() -> None:
    rng = random.Random(9)
    trials = [trial(rng, k, TrialState.COMPLETE) for k in range(40)]
    observed = Observed()
    for read in (trials, trials[:10], [], trials):
        seen = observed.of(read, GPU_GIB)
        got = (list(seen.measured.items()), seen.pending, seen.tried, seen.ooms,
               list(seen.memory.items()), observed.own(read))  # fmt: skip
        assert got == one_pass(read)
        assert sorted(observed.startups(read)) == startups(read)


def test_the_finished_part_kept_fold_by_fold_is_one_pass_over_every_trial() -> None:
    """The loop's steady state: the trials in flight say nothing yet (no verdict), a few
    finish between two reads, mostly in id order, sometimes not. The finished trials' maps
    are then updated fold by fold rather than made again, and every read still gives what
    one pass over its trials gives, for two GPU sizes in turn."""
    for seed in range(4):
        rng = random.Random(100 + seed)
        n = 240
        ends = [k // 4 + 16 + (rng.randint(0, 12) if rng.random() < 0.1 else 0) for k in range(n)]
        finals = [trial(rng, k, rng.choice([TrialState.COMPLETE, TrialState.PRUNED]), WIDE)
                  for k in range(n)]  # fmt: skip
        observed = Observed()
        reads = 0
        for read in range(n // 4 + 30):
            trials = []
            for k in range(min(n, 4 * read + 1)):
                if ends[k] <= read:
                    trials.append(finals[k])
                    continue
                t = trial(rng, k, TrialState.RUNNING, WIDE)
                for name in ("outcome", "peak_memory_gib"):  # in flight: no verdict yet
                    t.user_attrs.pop(name, None)
                trials.append(t)
            gpu = GPU_GIB if read % 40 < 30 else GPU_GIB / 2
            seen = observed.of(trials, gpu)
            got = (list(seen.measured.items()), seen.pending, seen.tried, seen.ooms,
                   list(seen.memory.items()), observed.own(trials))  # fmt: skip
            assert got == one_pass(trials, gpu)
            assert observed.oom_keys(seen.ooms) == {c.key() for c in seen.ooms.values()}
            reads += 1
        assert len(seen.memory) > 20 and len(seen.measured) > 20
        assert 2 <= observed._redone < reads / 4  # mostly kept fold by fold, not made again
