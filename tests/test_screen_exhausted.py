"""tuner.study.screen.Screen.exhausted: each OOM config's dominated configs kept, the answer
the plain comparison of every config left with every OOM gives."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from optuna.trial import TrialState

from tests.test_observed import GRID, trial
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
    answers = set()
    for seed in range(6):
        rng = random.Random(seed)
        screen: Any = SimpleNamespace(_space_keys={c.key(): c for c in GRID}, _dominated={},
                                      _space_split=None,
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
    assert answers == {True, False}
