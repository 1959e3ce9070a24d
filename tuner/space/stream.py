"""A space too large to hold: its counts, its memory probes and its ``top`` fastest, streamed.

:func:`~tuner.space.enumerate.enumerate_space` keeps a :class:`Candidate` per viable config (and
per out-of-memory one with ``keep_oom``), which a 10^6-config space cannot afford.
:func:`stream_space` walks the same candidates (``enumerate.judged``: the same order, the same
verdicts) and keeps only what can still be among the ``top`` first of the ranking, so its
memory grows with ``top``, not with the space.
"""

from __future__ import annotations

from tuner.models.rates import Rates
from tuner.space.candidates import Candidate, SpaceReport, step_of
from tuner.space.collection import paused_collection
from tuner.space.enumerate import fastest_fit, judged, probes_of, study_gpu
from tuner.spec.study import StudySpec


class TopK:
    """The candidates that can still be among the ``k`` first of
    :meth:`SpaceReport.ranked` (step, then peak, then key).

    Why it is exact: the ranking orders by step first, so a candidate whose step is over the
    ``k``-th smallest step seen so far has ``k`` candidates before it already and cannot come
    back. Every candidate at or under that step is kept (ties on the step included: the peak
    breaks them, and it is read only at the end), so :meth:`report`'s ranking starts with
    exactly the ``k`` the whole space's would.
    """

    __slots__ = ("_kept", "k")

    def __init__(self, k: int) -> None:
        self.k = max(k, 1)
        self._kept: list[Candidate] = []

    def add(self, c: Candidate) -> None:
        """Offer one viable candidate (its time predicted)."""
        self._kept.append(c)
        if len(self._kept) >= 4 * self.k + 64:
            self._prune()

    def _prune(self) -> None:
        self._kept.sort(key=step_of)
        bar = step_of(self._kept[self.k - 1]) if len(self._kept) >= self.k else float("inf")
        self._kept = [c for c in self._kept if step_of(c) <= bar]

    def fastest(self) -> float:
        """The smallest step offered so far (inf: none)."""
        return min(map(step_of, self._kept), default=float("inf"))

    def candidates(self) -> list[Candidate]:
        """The kept candidates (the ``k`` first of the ranking and their step ties)."""
        self._prune()
        return list(self._kept)


def stream_space(
    spec: StudySpec, top: int = 20, rates: Rates | None = None, fast: bool = True
) -> SpaceReport:
    """The space's counts and memory probes as :func:`~tuner.space.enumerate.enumerate_space`
    gives them, with ``viable`` holding only the ``top`` first of its ranking (and configs that
    tie the last of them on the step), in the ranking's order; nothing else is held.
    ``report.counts()["viable"]`` counts only those: the number of viable configs of the space
    is ``total - invalid - predicted_oom``."""
    report, best = SpaceReport(), TopK(top)
    near: list[Candidate] = []  # judged appends to this list: changed in place below
    limit, gib = spec.search.memory_probes, study_gpu(spec).memory_gib
    with paused_collection():  # it makes no cycles (tuner.space.collection)
        for candidate in judged(spec, report, True, rates, fast, near):
            if candidate.fits:
                best.add(candidate)
            if len(near) > 4 * limit + 64:
                # the fastest fit so far only falls, and probes_of keeps a prefix of its order,
                # so what it drops now it would drop at the end
                near[:] = probes_of(near, best.fastest(), limit, gib)
        report.viable = best.candidates()
        report.viable = report.ranked()
        report.probes = probes_of(near, fastest_fit(report), limit, gib)
    return report
