"""The cluster's saved calibration as the model sampler reads it on every ask.

The sampler's ask reads the saved observations (:func:`tuner.calibrate.store.history`) several
times: which are this study's own trials (those it reads from the study instead), each one's
config key (a config that ran is known to fit) and each one's time and memory features (rows of
the correction's fits). With a calibration of 10,000 observations, building a config and its
key per observation per question was most of an ask (hundreds of ms). An observation never
changes: :class:`Saved` makes each of those once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tuner.calibrate.correction import Features
from tuner.calibrate.store import Observation


class Saved:
    """The saved observations ``history`` of a sampler of study ``study`` (setup
    ``fingerprint``), each one's facts made once."""

    def __init__(self, history: Sequence[Observation], study: str, fingerprint: str) -> None:
        self.history = tuple(history)
        self._study, self._fingerprint = study, fingerprint
        self._own: list[tuple[int, str] | None] | None = None
        self._keys: dict[int, str] = {}  # id of an observation (the tuple holds it) -> key
        self._rows: dict[int, np.ndarray] = {}
        self._memory_rows: dict[int, np.ndarray] = {}
        self._last: tuple[list[bool], list[Observation]] | None = None

    def past(self, own: set[tuple[int, Any]]) -> list[Observation]:
        """The observations less this study's own trials (``own``: (number, key) of each trial
        of the study), in their order: the same list object as the last answer when it holds
        the same observations (the sampler keeps what it folds per list: :mod:`tuner.search.
        fold`)."""
        if self._own is None:
            self._own = [
                (o.trial, self.key(o))
                if o.study == self._study and o.fingerprint == self._fingerprint else None
                for o in self.history
            ]  # fmt: skip
        mask = [k is None or k not in own for k in self._own]
        if self._last is None or self._last[0] != mask:
            self._last = (mask, [o for o, m in zip(self.history, mask, strict=True) if m])
        return self._last[1]

    def key(self, o: Observation) -> str:
        """``o``'s config key (``o.parallel_config().key()``)."""
        key = self._keys.get(id(o))
        if key is None:
            key = self._keys[id(o)] = o.parallel_config().key()
        return key

    def row(self, o: Observation, features: Features) -> np.ndarray:
        """``o``'s time features (``features(o.parallel_config())``); ``features`` is the
        sampler's one, the same on every call."""
        row = self._rows.get(id(o))
        if row is None:
            row = self._rows[id(o)] = features(o.parallel_config())
        return row

    def memory_row(self, o: Observation, features: Features) -> np.ndarray:
        """``o``'s memory features (``features.memory_row``)."""
        row = self._memory_rows.get(id(o))
        if row is None:
            row = features.memory_row(o.parallel_config(), o.activation_share)
            self._memory_rows[id(o)] = row
        return row
