"""tuner.study.digest: folded once per finished trial, it answers what a pass over every trial
of each read answers, whatever order the trials finish in."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import random
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.config.parallel import ParallelConfig
from tuner.outcome import Outcome
from tuner.space.trials import counts_as_run, measured, oom_dominates, trial_config, trial_outcome
from tuner.study.digest import Digest, holds

GRID = [
    ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=mbs, global_batch_size=64, recompute=rc)
    for tp, mbs, rc in itertools.product((1, 2), (1, 2, 4), ("none", "selective", "full"))
]
OUTCOMES = [None, Outcome.OK, Outcome.OOM, Outcome.INTERRUPTED, Outcome.NODE_ERROR,
            Outcome.LAUNCH_ERROR, Outcome.PRUNED_MEMORY]  # fmt: skip
FINAL = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL]


def trial(rng: random.Random, tid: int, finished: bool) -> FrozenTrial:
    config = rng.choice(GRID)
    outcome = rng.choice(OUTCOMES)
    attrs: dict[str, Any] = {"config": dataclasses.asdict(config), "key": config.key()}
    if outcome is not None:
        attrs["outcome"] = str(outcome)  # also on a running trial: its verdict, not yet told
    for name, p in (("launched", 0.6), ("duplicate_of", 0.2), ("proxy", 0.2)):
        if rng.random() < p:
            attrs[name] = True if name != "duplicate_of" else 0
    if rng.random() < 0.05:
        del attrs["key"], attrs["config"]  # asked, nothing recorded yet
    state = rng.choice(FINAL) if finished else TrialState.RUNNING
    value = rng.random() if state == TrialState.COMPLETE else None
    now = datetime.datetime(2026, 1, 1)
    return FrozenTrial(number=tid, state=state, value=value, values=None, datetime_start=now,
                       datetime_complete=now if finished else None, params={},
                       distributions={}, user_attrs=attrs, system_attrs={},
                       intermediate_values={}, trial_id=tid + 100)  # fmt: skip


def first(trials: list[FrozenTrial], ok: Any) -> int | None:
    return next((t.number for t in trials if ok(t)), None)


def check(d: Digest, trials: list[FrozenTrial], rerun: frozenset[Outcome]) -> None:
    """Every answer of the digest against a pass over ``trials``."""
    assert d.of(trials) is d
    assert d.runs == sum(counts_as_run(t, rerun) for t in trials)
    assert d.open == [t for t in trials if not t.state.is_finished()]
    assert d.held() == {str(t.user_attrs["key"]) for t in trials
                        if "key" in t.user_attrs and holds(t, rerun)}  # fmt: skip
    ooms = [(t, trial_config(t)) for t in trials if trial_outcome(t) == Outcome.OOM]
    assert set(d.oom_configs()) == {c for _, c in ooms if c is not None}
    assert len(d.oom_configs()) == len(set(d.oom_configs()))
    by_key = measured(trials)
    for c in GRID:
        key = c.key()
        assert d.holder(key) == first(
            trials, lambda t, k=key: t.user_attrs.get("key") == k and holds(t, rerun)
        )
        assert d.first_oom_over(c) == next(
            (t.number for t, o in ooms if o is not None and oom_dominates(o, c)), None
        )
        assert d.measured(key) is by_key.get(key)


def test_answers_what_a_pass_over_every_trial_answers() -> None:
    for seed, rerun in ((0, frozenset()), (1, frozenset({Outcome.OOM})), (2, frozenset())):
        rng = random.Random(seed)
        n = 120
        ends = [rng.randint(k // 4, k // 4 + 12) for k in range(n)]  # out of order
        finals = [trial(rng, k, True) for k in range(n)]
        digest = Digest(rerun)
        for read in range(n // 4 + 14):
            # a read: the trials created so far, the finished ones as finished (the same
            # objects each read, as the reader keeps them), the others as running
            trials = [finals[k] if ends[k] <= read else trial(rng, k, False)
                      for k in range(min(n, 4 * read + 1))]  # fmt: skip
            check(digest, trials, rerun)
        assert digest.runs > 0 and digest.held() and digest.oom_configs()


def test_a_list_that_is_not_a_later_read_is_folded_afresh() -> None:
    rng = random.Random(5)
    trials = [trial(rng, k, True) for k in range(40)]
    digest = Digest()
    check(digest, trials, frozenset())
    check(digest, trials[:10], frozenset())  # fewer trials: not the same study read later
    check(digest, [], frozenset())
    other = [trial(rng, k + 1, True) for k in range(5)]
    for t, o in zip(trials, other, strict=False):
        o._trial_id = t._trial_id  # the same ids, other trials (another storage)
    check(digest, trials[:5], frozenset())
    check(digest, other, frozenset())
