"""tuner.study.screen.Screen.exhausted: each OOM config's dominated configs kept, the answer
the plain comparison of every config left with every OOM gives."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace
from typing import Any

from optuna.trial import TrialState

from tests.test_observed import GRID, trial
from tuner.outcome import Outcome
from tuner.space.trials import oom_dominates
from tuner.study.digest import Digest
from tuner.study.screen import Screen


def _plain(digest: Digest, running: set[str]) -> bool:
    left = {c.key(): c for c in GRID}
    for key in (*running, *digest.held()):
        left.pop(key, None)
    ooms = digest.oom_configs()
    return all(any(oom_dominates(o, c) for o in ooms) for c in left.values())


def test_exhausted_is_the_plain_comparison() -> None:
    answers, shrunk = set(), set()
    for seed in range(6):
        rng = random.Random(seed)
        screen: Any = SimpleNamespace(_space_keys={c.key(): c for c in GRID}, _dominated={},
                                      _space_split=None, _union=([], 0, set()),
                                      digest=Digest())  # fmt: skip
        screen._dominated_by = lambda oom, s=screen: Screen._dominated_by(s, oom)
        finals = [trial(rng, k, rng.choice([TrialState.COMPLETE, TrialState.PRUNED]))
                  for k in range(60)]  # fmt: skip
        for n in range(0, 60, 3):
            trials = finals[:n] + [trial(rng, n, TrialState.RUNNING)]
            running = {c.key() for c in rng.sample(GRID, 2)}
            got = Screen.exhausted(screen, trials, running)
            assert got == _plain(Digest().of(trials), running)
            answers.add(got)
        assert screen._dominated  # kept
        for n in range(60, 0, -6):  # each not a later read: the digest made afresh
            got = Screen.exhausted(screen, finals[:n], set())
            assert got == _plain(Digest().of(finals[:n]), set())
            shrunk.add(got)
    assert shrunk == {True, False}
    assert answers == {True, False}


def test_the_kept_union_is_made_afresh_with_the_digest() -> None:
    """A list that is not a later read (here: the same measurements without the OOMs) folds
    the digest afresh; the OOMs' union kept for the earlier list must go with it."""
    rng = random.Random(0)

    def ended(number: int, config: Any, outcome: Outcome) -> Any:
        t = trial(rng, number, TrialState.COMPLETE if outcome == Outcome.OK else TrialState.PRUNED)
        t.user_attrs.update(config=dataclasses.asdict(config), key=config.key(),
                            outcome=str(outcome))  # fmt: skip
        return t

    ok = [ended(k, c, Outcome.OK) for k, c in enumerate(c for c in GRID if c.recompute == "full")]
    ooms = [ended(len(ok) + k, c, Outcome.OOM) for k, c in enumerate(
        c for c in GRID if c.recompute == "none" and c.micro_batch_size == 1)]  # fmt: skip
    screen: Any = SimpleNamespace(_space_keys={c.key(): c for c in GRID}, _dominated={},
                                  _space_split=None, _union=([], 0, set()),
                                  digest=Digest())  # fmt: skip
    screen._dominated_by = lambda oom, s=screen: Screen._dominated_by(s, oom)
    assert Screen.exhausted(screen, ok + ooms, set()) is True
    assert Screen.exhausted(screen, ok, set()) is False  # the OOMs are gone: nothing dominated
    assert _plain(Digest().of(ok), set()) is False
