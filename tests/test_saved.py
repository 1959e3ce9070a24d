"""tuner.search.saved: the saved observations' keys and feature rows made once, the same as
made on every ask."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.test_calibration import observations, off_model, run, spec
from tuner.calibrate.store import Observation, setup_fingerprint
from tuner.search.sampler import ModelGuidedSampler
from tuner.search.saved import Saved


class Plain(Saved):
    """Each answer made afresh, as the sampler made them before they were kept."""

    def past(self, own: set[tuple[int, object]]) -> list[Observation]:
        return [
            o for o in self.history
            if not (o.study == self._study and o.fingerprint == self._fingerprint
                    and (o.trial, o.parallel_config().key()) in own)
        ]  # fmt: skip

    def key(self, o: Observation) -> str:
        return o.parallel_config().key()

    def row(self, o: Observation, features: object) -> np.ndarray:
        return features(o.parallel_config())  # type: ignore[operator, no-any-return]

    def memory_row(self, o: Observation, features: object) -> np.ndarray:
        return features.memory_row(o.parallel_config(), o.activation_share)  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def saved() -> tuple[object, tuple[Observation, ...]]:
    """A study of 6 trials and a calibration with its first 4 trials, 2 of the same numbers
    under other configs (a study run again under the same name), and 4 of another study."""
    s = spec()
    study, _, _ = run(s, off_model(s), 6, memory=lambda c: 20.0)
    own = observations(s, study)
    other = run(spec("other"), off_model(s), 4, memory=lambda c: 22.0)[0]
    shifted = tuple(dataclasses.replace(o, trial=o.trial + 1) for o in own[:2])
    return study, (*own[:4], *shifted, *observations(spec("other"), other))


def test_the_kept_answers_are_the_fresh_ones(saved: tuple[object, tuple[Observation, ...]]
                                             ) -> None:  # fmt: skip
    study, history = saved
    s = spec()
    sampler = ModelGuidedSampler(s, history=history)
    sampler._candidates()
    kept, plain = (cls(history, s.name, setup_fingerprint(s)) for cls in (Saved, Plain))
    trials = study.get_trials()  # type: ignore[attr-defined]
    owns = [set(), {(t.number, t.user_attrs["key"]) for t in trials[:3]},
            {(t.number, t.user_attrs["key"]) for t in trials}]  # fmt: skip
    for own in owns:
        assert kept.past(own) == plain.past(own)
    assert 0 < len(kept.past(owns[-1])) < len(history) == len(kept.past(set()))
    features = sampler._features
    for _ in range(2):  # made, then kept
        for o in history:
            assert kept.key(o) == plain.key(o)
            assert np.array_equal(kept.row(o, features), plain.row(o, features))
            assert np.array_equal(kept.memory_row(o, features), plain.memory_row(o, features))


def test_the_sampler_chooses_as_with_fresh_answers(saved: tuple[object, tuple[Observation, ...]]
                                                  ) -> None:  # fmt: skip
    study, history = saved
    s = spec()
    kept, plain = ModelGuidedSampler(s, history=history), ModelGuidedSampler(s, history=history)
    plain._saved = Plain(history, s.name, setup_fingerprint(s))
    trials = study.get_trials()  # type: ignore[attr-defined]
    for n in (2, 4, 6):  # reads of a growing study: the own trials change
        read = trials[:n]
        assert kept._past(read) == plain._past(read) and kept._past(read) is kept._past(read)
        a, b = kept.choose_why(read), plain.choose_why(read)
        assert a is not None and b is not None and a[0].key() == b[0].key() and a[1] == b[1]
        assert kept.measured_startup_s(read) == plain.measured_startup_s(read)
