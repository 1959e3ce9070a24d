"""What the loop's decisions read from the finished trials, folded once per finished trial.

Each decision of the study loop asked several questions of every trial of the study: how many
runs count against ``n_trials``, which configs a finished trial holds for good, which configs
ran out of memory, which trial measured a config, which trials are running. At 10,000 trials
each of these passes took milliseconds, several per decision. A finished trial never changes,
so :class:`Digest` folds each one once, the first time a read holds it finished, and answers
from what it folded plus the unfinished trials of the read (the trials in flight: tens).

Every answer is the one a pass over the whole list gives, ties included: where a pass takes
the first trial in trial-id order (the order every read returns), the digest keeps the lowest
trial id, whatever order the trials finished in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.config.parallel import ParallelConfig
from tuner.outcome import Outcome
from tuner.search.observed import folded_prefix, leading
from tuner.space.trials import (
    counts_as_run,
    is_duplicate,
    memory_split,
    oom_dominates,
    runs_again,
    trial_config,
    trial_outcome,
)


def holds(t: FrozenTrial, rerun: frozenset[Outcome]) -> bool:
    """Whether finished trial ``t`` holds its config for good: a result of its own (not a
    duplicate) that is not to run again."""
    return t.state.is_finished() and not is_duplicate(t) and not runs_again(t, rerun)


class Digest:
    """The finished trials of one study as the loop's decisions need them; :meth:`of` brings
    it up to a read of the trials (a list in trial-id order, as
    :class:`tuner.study.reader.TrialReader` returns them)."""

    def __init__(self, rerun: frozenset[Outcome] = frozenset()) -> None:
        self.rerun = rerun
        self._reset()

    def _reset(self) -> None:
        self.runs = 0
        """Finished launched trials that count against ``n_trials`` (``counts_as_run``)."""
        self.open: list[FrozenTrial] = []
        """The unfinished trials of the last read, in its order."""
        self._folded: dict[int, int] = {}  # trial id -> number
        self._holders: dict[str, tuple[int, int]] = {}  # key -> (trial id, number), lowest id
        self._ooms: dict[ParallelConfig, tuple[int, int]] = {}  # config -> lowest (id, number)
        self._split_ooms: dict[tuple[Any, ...], list[ParallelConfig]] = {}  # _ooms by split
        self._oom_list: list[ParallelConfig] = []  # _ooms' configs in fold order
        self._full: dict[str, tuple[int, FrozenTrial]] = {}  # key -> first full-scale measure
        self._proxy: dict[str, tuple[int, FrozenTrial]] = {}  # key -> last proxy measure
        self._read: Sequence[FrozenTrial] | None = None
        self._prefix: tuple[Sequence[FrozenTrial], int] | None = None  # see folded_prefix

    def of(self, trials: Sequence[FrozenTrial]) -> Digest:
        """This digest, brought up to ``trials`` (nothing to do for the list it last saw). A
        list that lacks a trial folded before (or holds another under its id) is not a later
        read of the same study: folded afresh."""
        if trials is self._read:
            return self
        folded, known, out = self._folded, len(self._folded), []
        start = folded_prefix(trials, self._prefix)  # the last read's folded trials, as read
        hits = start
        for t in trials[start:] if start else trials:
            if t._trial_id in folded:
                hits += folded[t._trial_id] == t.number
                continue
            if t.state.is_finished():
                folded[t._trial_id] = t.number
                self._fold(t)
            else:
                out.append(t)
        if hits != known:
            self._reset()
            return self.of(trials)
        self.open, self._read = out, trials
        self._prefix = (trials, leading(trials, start, folded))
        return self

    def _fold(self, t: FrozenTrial) -> None:
        self.runs += counts_as_run(t, self.rerun)
        tid = t._trial_id
        key = t.user_attrs.get("key")
        k = str(key)
        if key is not None and holds(t, self.rerun):
            if k not in self._holders or tid < self._holders[k][0]:
                self._holders[k] = (tid, t.number)
        oom = trial_config(t) if trial_outcome(t) == Outcome.OOM else None
        if oom is not None and (oom not in self._ooms or tid < self._ooms[oom][0]):
            if oom not in self._ooms:
                self._split_ooms.setdefault(memory_split(oom), []).append(oom)
                self._oom_list.append(oom)
            self._ooms[oom] = (tid, t.number)
        if t.state == TrialState.COMPLETE and not is_duplicate(t):
            if t.user_attrs.get("proxy"):  # a pass keeps the last proxy, or any full scale
                if k not in self._proxy or tid > self._proxy[k][0]:
                    self._proxy[k] = (tid, t)
            elif k not in self._full or tid < self._full[k][0]:
                self._full[k] = (tid, t)

    # -- the answers ----------------------------------------------------------------------------

    def holder(self, key: str) -> int | None:
        """The number of the first finished trial holding ``key`` for good (:func:`holds`)."""
        found = self._holders.get(key)
        return None if found is None else found[1]

    def held(self) -> set[str]:
        """Every config key a finished trial holds for good."""
        return set(self._holders)

    def oom_configs(self) -> list[ParallelConfig]:
        """The configs that ran out of memory (each once), finished trials' and open ones'."""
        return list(dict.fromkeys([*self._ooms, *(c for _, c in self._open_ooms())]))

    def finished_ooms(self) -> list[ParallelConfig]:
        """The configs that ran out of memory in finished trials (each once), in the order
        they were folded: one list that only grows, until the digest is folded afresh (then a
        new one). Read-only."""
        return self._oom_list

    def open_ooms(self) -> list[ParallelConfig]:
        """The configs of the unfinished trials already recording an OOM."""
        return [c for _, c in self._open_ooms()]

    def first_oom_over(self, config: ParallelConfig) -> int | None:
        """The number of the first trial (in trial-id order) that ran out of memory on a
        config ``config`` needs at least the memory of (``oom_dominates``); None if none."""
        best: tuple[int, int] | None = None
        for oom in self._split_ooms.get(memory_split(config), ()):  # no other split's OOM can
            found = self._ooms[oom]
            if (best is None or found < best) and oom_dominates(oom, config):
                best = found
        for t, oom in self._open_ooms():
            found = (t._trial_id, t.number)
            if (best is None or found < best) and oom_dominates(oom, config):
                best = found
        return None if best is None else best[1]

    def measured(self, key: str) -> FrozenTrial | None:
        """The trial that measured ``key`` (``tuner.space.trials.measured``): the first
        full-scale one, else the last proxy."""
        found = self._full.get(key) or self._proxy.get(key)
        return None if found is None else found[1]

    def _open_ooms(self) -> list[tuple[FrozenTrial, Any]]:
        """Unfinished trials already recording an OOM (their verdict written, not yet told)."""
        out = []
        for t in self.open:
            oom = trial_config(t) if trial_outcome(t) == Outcome.OOM else None
            if oom is not None:
                out.append((t, oom))
        return out
