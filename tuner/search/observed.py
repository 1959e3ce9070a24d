"""What the model sampler reads from a study's trials, folded once per finished trial.

Each ask of :class:`tuner.search.sampler.ModelGuidedSampler` (and each stop-rule check) went
over every trial of the study for the same few facts: the measured step time of each config,
the configs running, tried or out of memory, and the measured-over-predicted peak of each. At
10,000 trials that pass was milliseconds per question, several questions per decision. A
finished trial never changes: :class:`Observed` folds each once, the first time a read holds
it finished, and merges the unfinished trials of each read (the trials in flight: tens).

The facts are the ones a pass in trial-id order gives (every read is in that order), in the
same order: the first measurement of a config wins, its key takes its place in
``measured`` at that trial; a config's peak ratio is the last one recorded, in the place of
the first; only a config's first OOM says how much it needed. Where the trials finished in
another order than their ids, the fold keeps ids, not arrival.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.calibrate.store import launch_overhead_s
from tuner.config.parallel import ParallelConfig
from tuner.outcome import Outcome, figure
from tuner.space.trials import RETRYABLE, SplitIndex, measured_value, trial_outcome


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """What the trials of one read say (:meth:`Observed.of`); read-only."""

    measured: dict[str, float]
    """Config key -> its first measured step time (a COMPLETE trial's value), first-measured
    order."""
    pending: set[str]
    """Keys of the running trials."""
    tried: set[str]
    """Keys of every trial that is not a finished one to run again."""
    ooms: dict[str, ParallelConfig]
    """Key -> config of every config that ran out of memory."""
    memory: dict[str, float]
    """Key -> log(measured / predicted) peak (for an OOM: log(GPU memory / predicted), a lower
    bound), in the order a pass over the trials first sets each."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Facts:
    """One trial's part in :class:`Seen`."""

    tid: int
    key: str
    value: float | None  # its measured step time (COMPLETE)
    running: bool
    skip: bool  # a trial to run again: not tried, no memory
    oom: ParallelConfig | None  # the config, when it ran out of memory
    oom_peak: float | None  # its predicted peak, GiB
    ok_memory: float | None  # log(measured / predicted allocated) of an ok run


def _facts(t: FrozenTrial) -> _Facts | None:
    key = t.user_attrs.get("key")
    if key is None:
        return None
    outcome = trial_outcome(t)
    value = measured_value(t)  # a stored figure that is no measurement: tried, unmeasured
    running = t.state == TrialState.RUNNING
    skip = value is None and not running and outcome in RETRYABLE
    raw = t.user_attrs.get("config")
    oom = ParallelConfig(**raw) if outcome == Outcome.OOM and raw and not skip else None
    peak: Any = t.user_attrs.get("predicted_peak_gib") if oom is not None else None
    measured_gib: Any = t.user_attrs.get("peak_memory_gib")
    predicted_gib: Any = t.user_attrs.get("predicted_allocated_gib")
    ok = outcome == Outcome.OK and not skip
    gib, predicted = figure(measured_gib), figure(predicted_gib)
    ok_memory = math.log(gib / predicted) if ok and gib and predicted else None
    return _Facts(t._trial_id, str(key), value, running, skip, oom,
                  None if peak is None else float(peak), ok_memory)  # fmt: skip


def folded_prefix(
    trials: Sequence[FrozenTrial], last: tuple[Sequence[FrozenTrial], int] | None
) -> int:  # fmt: skip
    """How many leading trials of a read ``trials`` a fold need not look at: ``last`` is the
    fold's previous read and how many of its leading trials it held folded (finished); when
    ``trials`` begins with those same trials (the reader keeps finished trials as objects, so
    the comparison is mostly of identities, in C), that many; else 0 (a full pass)."""
    if last is None or not last[1] or len(trials) < last[1]:
        return 0
    previous, n = last
    return n if trials[:n] == previous[:n] else 0


def leading(trials: Sequence[FrozenTrial], start: int, folded: dict[int, int]) -> int:
    """``start`` plus the trials from ``start`` on that are folded, up to the first that is
    not: the prefix :func:`folded_prefix` may skip in the next read."""
    n = start
    for t in trials[start:]:
        if t._trial_id not in folded:
            break
        n += 1
    return n


class Observed:
    """The trials of one study, folded for the model sampler; :meth:`of` a read."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._folded: dict[int, int] = {}  # trial id -> number
        self._measured: dict[str, tuple[int, float]] = {}  # key -> lowest id, its value
        self._tried: set[str] = set()
        self._oom: dict[str, _Facts] = {}  # key -> its lowest-id OOM
        self._ok: dict[str, tuple[int, int, float]] = {}  # key -> lowest id, highest, its ratio
        self._own: set[tuple[int, Any]] = set()
        self._startups: list[float] = []  # launch_overhead_s of each COMPLETE trial that has one
        self._last: tuple[Sequence[FrozenTrial], float, Seen] | None = None
        self._open: tuple[Sequence[FrozenTrial], list[_Facts], set[tuple[int, Any]]] | None = None
        self._prefix: tuple[Sequence[FrozenTrial], int] | None = None  # see folded_prefix
        self._dominated: tuple[SplitIndex, dict[str, set[int]]] | None = None
        self._union: tuple[Sequence[ParallelConfig], list[str], set[int]] | None = None
        self._order: dict[str, float] | None = {}  # measured, first-measured order; None: redo
        self._top = -1  # the highest trial id in ``_order``
        self._memory: dict[str, float] = {}  # the finished trials' memory facts (see _merge)
        self._firsts: dict[str, int] = {}  # key -> the lowest trial id of its memory events
        self._touched: set[str] = set()  # keys whose memory events changed since _merge
        self._memory_gib = math.nan  # the GPU memory ``_memory`` was made for
        self._redone = 0  # how many times ``_memory`` was made from every key (tests read it)
        self._keys_of: dict[int, tuple[ParallelConfig, str]] = {}  # see oom_keys
        self._oom_view: dict[str, ParallelConfig] | None = None  # see _finished_ooms
        self._oom_keys: tuple[dict[str, ParallelConfig], set[str]] | None = None  # see oom_keys

    def of(self, trials: Sequence[FrozenTrial], gpu_gib: float) -> Seen:
        """What ``trials`` (a whole read, in trial-id order) say; ``gpu_gib``: the GPU's
        memory (an OOM needed at least that)."""
        if self._last is not None and self._last[0] is trials and self._last[1] == gpu_gib:
            return self._last[2]
        open_, _ = self._update(trials)
        seen = self._merge(open_, gpu_gib)
        self._last = (trials, gpu_gib, seen)
        return seen

    def dominated(self, ooms: dict[str, ParallelConfig],
                  configs: Sequence[ParallelConfig]) -> set[int]:  # fmt: skip
        """Indices of ``configs`` that need at least the memory of one of ``ooms`` (by key:
        ``oom_dominates``), each OOM config compared with ``configs`` of its split once (the
        candidates are fixed; an OOM config never changes)."""
        if self._dominated is None or self._dominated[0].configs is not configs:
            self._dominated = (SplitIndex(configs), {})
        split, known = self._dominated
        keys = list(ooms)
        if self._union is not None and self._union[0] is configs and self._union[1] == keys:
            return set(self._union[2])  # the same OOMs as the last ask: the same union
        out: set[int] = set()
        for key, oom in ooms.items():
            if key not in known:
                known[key] = set(split.dominated(oom))
            out |= known[key]
        self._union = (configs, keys, set(out))
        return out

    def oom_keys(self, ooms: dict[str, ParallelConfig]) -> set[str]:
        """``{c.key() for c in ooms.values()}``, each config's key made once: a finished
        trial's OOM config is one object from its fold on (an ask had some 600 keys to make
        at 10,000 trials); the same set again for the same ``ooms`` object."""
        if self._oom_keys is not None and self._oom_keys[0] is ooms:
            return set(self._oom_keys[1])
        kept, out = self._keys_of, set()
        if len(kept) > 4 * len(ooms) + 1024:  # open trials' configs are new objects each read
            kept.clear()
        for c in ooms.values():
            known = kept.get(id(c))
            if known is None or known[0] is not c:
                known = kept[id(c)] = (c, c.key())
            out.add(known[1])
        self._oom_keys = (ooms, set(out))
        return out

    def own(self, trials: Sequence[FrozenTrial]) -> set[tuple[int, Any]]:
        """(number, key) of every trial of ``trials`` (a whole read)."""
        return self._own | self._update(trials)[1]

    def startups(self, trials: Sequence[FrozenTrial]) -> list[float]:
        """The start-up (:func:`~tuner.calibrate.store.launch_overhead_s`) of every COMPLETE
        trial of ``trials`` (a whole read) that has one, in no particular order (the caller
        takes their median). Only finished trials are COMPLETE, so this is the fold's alone."""
        self._update(trials)
        return self._startups

    def _update(self, trials: Sequence[FrozenTrial]) -> tuple[list[_Facts], set[tuple[int, Any]]]:
        """Fold the trials finished since the last read; the unfinished ones' facts and
        (number, key) pairs. A list that lacks a trial folded before (or holds another under
        its id) is not a later read of the same study: folded afresh."""
        if self._open is not None and self._open[0] is trials:
            return self._open[1], self._open[2]
        open_: list[_Facts] = []
        own_open: set[tuple[int, Any]] = set()
        folded, known = self._folded, len(self._folded)
        start = folded_prefix(trials, self._prefix)  # the last read's folded trials, as read
        rest = trials[start:] if start else trials
        # one pass in C-level comprehensions over the thousands already folded
        hits = start + sum([folded.get(t._trial_id) == t._number for t in rest])
        for t in [t for t in rest if t._trial_id not in folded]:
            facts = _facts(t)
            if t.state.is_finished():
                folded[t._trial_id] = t.number
                self._own.add((t.number, t.user_attrs.get("key")))
                if t.state == TrialState.COMPLETE and (s := launch_overhead_s(t.user_attrs)):
                    self._startups.append(s)
                if facts is not None:
                    self._fold(facts)
            else:
                own_open.add((t.number, t.user_attrs.get("key")))
                if facts is not None:
                    open_.append(facts)
        if hits != known:  # not a later read of the same trials: start again from this one
            self._reset()
            return self._update(trials)
        self._open = (trials, open_, own_open)
        self._prefix = (trials, leading(trials, start, folded))
        return open_, own_open

    def _fold(self, f: _Facts) -> None:
        if f.value is not None:
            if f.key not in self._measured or f.tid < self._measured[f.key][0]:
                new = f.key not in self._measured
                self._measured[f.key] = (f.tid, f.value)
                if self._order is not None and new and f.tid > self._top:  # goes last
                    self._order[f.key], self._top = f.value, f.tid
                else:  # a config measured again by an earlier trial: ordered afresh
                    self._order = None
        if f.skip:
            return
        self._tried.add(f.key)
        if f.oom is not None or f.ok_memory is not None:
            self._touched.add(f.key)
        if f.oom is not None and (f.key not in self._oom or f.tid < self._oom[f.key].tid):
            self._oom[f.key] = f
            self._oom_view = None
        if f.ok_memory is not None:
            lo, hi, ratio = self._ok.get(f.key, (f.tid, f.tid, f.ok_memory))
            self._ok[f.key] = (min(lo, f.tid), max(hi, f.tid),
                               f.ok_memory if f.tid >= hi else ratio)  # fmt: skip

    def _merge(self, open_: list[_Facts], gpu_gib: float) -> Seen:
        """What the folded trials and the unfinished ones ``open_`` say. The finished trials'
        part is kept up to date fold by fold (a decision folds a trial or two: the maps were
        rebuilt from some 600 configs on every ask at 10,000 trials); the unfinished trials
        are merged on top, and where one of them already says something of memory (its
        verdict written, not yet told) the whole is merged afresh (:meth:`_merge_all`)."""
        if any(f.oom is not None or f.ok_memory is not None for f in open_):
            return self._merge_all(open_, gpu_gib)
        return Seen(
            measured=dict(self._measured_in_order()),
            pending={f.key for f in open_ if f.running},
            tried=self._tried | {f.key for f in open_ if not f.skip},
            ooms=self._finished_ooms(),
            memory=dict(self._finished_memory(gpu_gib)),
        )

    def _finished_ooms(self) -> dict[str, ParallelConfig]:
        """``ooms`` of the finished trials alone: one object while no OOM is folded, so that
        what is kept per OOM list (:meth:`oom_keys`, :meth:`dominated`) is found at once."""
        if self._oom_view is None:
            self._oom_view = {k: f.oom for k, f in self._oom.items() if f.oom is not None}
        return self._oom_view

    def _measured_in_order(self) -> dict[str, float]:
        """Each measured config's first measurement, in the order of the trials that made
        them: appended as trials finish in id order, sorted afresh when one did not."""
        if self._order is None:
            ordered = sorted(self._measured.items(), key=lambda kv: kv[1][0])
            self._order = {k: v for k, (_, v) in ordered}
            self._top = max((tid for tid, _ in self._measured.values()), default=-1)
        return self._order

    def _events(self, key: str, gpu_gib: float) -> list[tuple[int, float]]:
        """The finished trials' memory events of ``key``: (trial id, log ratio) of its first
        and last ok run (the last one's ratio), and of its first OOM (a lower bound)."""
        events = []
        if key in self._ok:
            lo, hi, ratio = self._ok[key]
            events += [(lo, ratio), (hi, ratio)]
        oom = self._oom.get(key)
        if oom is not None and oom.oom_peak is not None:
            events.append((oom.tid, math.log(gpu_gib / oom.oom_peak)))
        return events

    def _finished_memory(self, gpu_gib: float) -> dict[str, float]:
        """``memory`` of the finished trials alone: each key's last event, the keys in the
        order of their first. A key folded since the last call is updated in place, or
        appended when its first event is the latest of all; else (a trial that finished out
        of order moved a key's place) the whole is made again."""
        fresh = gpu_gib != self._memory_gib
        if not fresh:
            found = sorted(
                (min(e)[0], max(e)[1], k) for k in self._touched if (e := self._events(k, gpu_gib))
            )  # fmt: skip
            top = max(self._firsts.values(), default=-1)
            for first, last, key in found:
                known = self._firsts.get(key)
                if first != known and (known is not None or first < top):
                    fresh = True
                    break
                self._memory[key], self._firsts[key], top = last, first, max(top, first)
        if fresh:
            events = {k: self._events(k, gpu_gib) for k in (*self._ok, *self._oom)}
            self._firsts = {k: min(e)[0] for k, e in events.items() if e}
            self._memory = {
                k: max(events[k])[1] for k in sorted(self._firsts, key=self._firsts.__getitem__)
            }  # fmt: skip
            self._memory_gib, self._redone = gpu_gib, self._redone + 1
        self._touched = set()
        return self._memory

    def _merge_all(self, open_: list[_Facts], gpu_gib: float) -> Seen:
        """:meth:`_merge` from every folded fact, the unfinished trials' among them."""
        measured = dict(self._measured_in_order())
        first_oom = dict(self._oom)
        events: dict[str, list[tuple[int, float]]] = {  # key -> (trial id, ratio) that set it
            k: [(lo, ratio), (hi, ratio)] for k, (lo, hi, ratio) in self._ok.items()
        }  # fmt: skip
        for f in open_:
            if f.oom is not None and (f.key not in first_oom or f.tid < first_oom[f.key].tid):
                first_oom[f.key] = f
            if f.ok_memory is not None:
                events.setdefault(f.key, []).append((f.tid, f.ok_memory))
        for k, f in first_oom.items():
            if f.oom_peak is not None:
                events.setdefault(k, []).append((f.tid, math.log(gpu_gib / f.oom_peak)))
        memory = {
            k: max(e)[1] for k, e in sorted(events.items(), key=lambda kv: min(kv[1])[0])
        }  # fmt: skip
        return Seen(
            measured=measured,
            pending={f.key for f in open_ if f.running},
            tried=self._tried | {f.key for f in open_ if not f.skip},
            ooms={k: f.oom for k, f in first_oom.items() if f.oom is not None},
            memory=memory,
        )
