"""The exact memory breakdown of one config, computed when first read, with bounds on its peak
known before: what :class:`~tuner.space.candidates.MemoryJudge` keeps for a config its bounds
settled, and what the ranking narrows a stage at a time where tied steps need the peaks
(``tuner.space.candidates``)."""

from __future__ import annotations

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import stage_layers
from tuner.models.memory.bound import peak_between, stage_peak
from tuner.models.memory.breakdown import phase_sigma
from tuner.models.memory.estimate import (
    MemoryBreakdown,
    PhaseMemory,
    StagePlan,
    estimate_memory,
    stage_plan,
    with_slack,
)
from tuner.models.memory.stage_figures import stage_figures
from tuner.models.stack import StackTerms
from tuner.models.uncertainty import max_memory_sigma
from tuner.spec.study import Framework, ModelSpec, Precision

ANY_SIGMA = max_memory_sigma()
"""The most any catalog breakdown's sd can be (``uncertainty.max_memory_sigma``)."""


class DeferredMemory:
    """The exact memory breakdown of one config, computed on first use and then kept, with
    bounds on its peak known before (``low <= peak <= high``, ``tuner.models.memory.bound``)."""

    __slots__ = (
        "_args", "_loose", "_plans", "_stages", "_terms", "_value", "_worst", "high", "low",
        "sigma_high",
    )  # fmt: skip

    def __init__(
        self, model: ModelSpec, config: ParallelConfig, gpu: GPUSpec, framework: Framework,
        precision: Precision, low: float = 0.0, high: float = float("inf"),
        terms: StackTerms | None = None, sigma_high: float | None = None,
        stages: list[tuple[float, float]] | None = None, loose: list[int] | None = None,
    ) -> None:  # fmt: skip
        self._args = (model, config, gpu, framework, precision)
        self.sigma_high = ANY_SIGMA if sigma_high is None else sigma_high
        """At least the breakdown's ``sigma`` (``uncertainty.max_memory_sigma``)."""
        self._terms = terms
        self._value: MemoryBreakdown | None = None
        self.low, self.high = low, high
        self._plans: dict[int, StagePlan] = {}
        self._worst: PhaseMemory | None = None  # the worst phase, once peak_sigma finds it
        self._stages: list[tuple[float, float]] = stages or []
        """Per stage, (least, most) largest device figure (``bound.stage_bounds``; a stage
        simulated: its exact figure twice), given by the judge or made on first narrowing."""
        self._loose: set[int] = set(loose or ())
        """Stages whose upper bound is another stage's envelope, not their own
        (``MemoryJudge._bound_dominated``): narrowing bounds them before it simulates them."""

    def __call__(self) -> MemoryBreakdown:
        if self._value is None:
            self._value = estimate_memory(*self._args, terms=self._terms)
            self.low = self.high = self._value.peak
            self._plans, self._stages, self._loose = {}, [], set()
        return self._value

    @property
    def known(self) -> bool:
        """Whether the breakdown has been computed."""
        return self._value is not None

    def _plan(self, i: int) -> StagePlan:
        """Stage ``i``'s plan (kept until :meth:`forget`)."""
        plan = self._plans.get(i)
        if plan is None:
            plan = self._plans[i] = stage_plan(*self._args, i)
        return plan

    def narrow(self) -> bool:
        """Tighten the bounds on the peak by simulating the allocator of one more stage, the
        one with the largest upper bound (``tuner.models.memory.bound``), or by bounding it
        where its upper bound was another stage's envelope; False when that stage is exact
        already (the bounds are as tight as stages make them: within ``2 *
        PHASE_TIE_BYTES``). Plans only the stages it simulates (bounds come from their kept terms,
        ``stage_figures``); keeps the plans until :meth:`forget`."""
        if self._value is not None or self.low == self.high:  # the peak is known
            return False
        if self._terms is not None and not self._terms.is_catalog:  # plans hold no measured terms
            self()
            return False
        model, config, gpu, framework, precision = self._args
        if not self._stages:
            self._stages = [(least, most) for least, most, _ in self._bounds()]
        stages = self._stages
        i = max(range(len(stages)), key=lambda j: stages[j][1])
        if stages[i][0] == stages[i][1]:
            return False
        if i in self._loose:  # its own bounds first: its kept terms summed, no simulation
            self._loose.discard(i)
            layers = stage_layers(model, config, framework)[i]
            least, most, _, _ = stage_figures(model, config, i, layers, gpu, framework, precision)
            stages[i] = (least, min(most, stages[i][1]))
        else:
            figure = stage_peak(self._plan(i), gpu)
            stages[i] = (figure, figure)
        low, high = peak_between(stages)
        self.low, self.high = max(self.low, low), min(self.high, high)
        return True

    def peak(self) -> float:
        """The exact peak (``estimate_memory``'s), from the stage that sets it alone when
        narrowing has left that stage exact and every other stage's upper bound below its
        figure (:meth:`_worst_alone`); from the whole breakdown otherwise."""
        if self.low == self.high:  # bounds that meet hold only the peak
            return self.low
        worst = self._worst_alone()
        if worst is not None:
            self.low = self.high = worst.device  # kept for the next ranking
            return self.low
        return self().peak

    def peak_sigma(self) -> tuple[float, float]:
        """(the exact peak, its relative sd: the breakdown's ``peak`` and ``sigma``), both
        from the worst stage's worst phase, found by narrowing a stage at a time until one is
        exact and over every other stage's upper bound (:meth:`_worst_alone`); from the whole
        breakdown where narrowing stops short of that, or with measured terms (the sd reads
        their provenance; the plans hold none)."""
        if self._worst is not None:
            return self._worst.device, phase_sigma(self._worst)
        if self._terms is None or self._terms.is_catalog:
            while True:
                worst = self._worst_alone()
                if worst is not None:  # kept, and the peak too (as peak() does)
                    self._worst, self.low, self.high = worst, worst.device, worst.device
                    self.forget()
                    return worst.device, phase_sigma(worst)
                if not self.narrow():
                    break
        value = self()
        return value.peak, value.sigma

    def _worst_alone(self) -> PhaseMemory | None:
        """The breakdown's ``worst`` (stage, phase) from one stage, when narrowing has left the
        stage with the largest upper bound exact and every other stage's upper bound below its
        figure: that stage is then the worst (``MemoryBreakdown.worst_stage``, the largest
        device figure, no tie), and ``with_slack`` finishes each stage on its own; else None."""
        stages = self._stages
        if self._value is not None or not stages:
            return None
        i = max(range(len(stages)), key=lambda j: stages[j][1])
        if stages[i][0] != stages[i][1]:
            return None
        (top,) = with_slack((self._plan(i),), self._args[2])
        if all(hi < top.device for j, (_, hi) in enumerate(stages) if j != i):
            return top.worst
        return None

    def complete(self) -> None:
        """Bound every stage where the judge stopped at the first one over the limit: the
        peak's bounds and the sd bound from all of them, as :meth:`MemoryJudge.memory` makes
        them (``bound.stage_bound``)."""
        if self._value is not None or self._stages:
            return
        if self._terms is not None and not self._terms.is_catalog:  # plans hold no measured terms
            self()
            return
        bounds = self._bounds()
        self._stages = [(least, most) for least, most, _ in bounds]
        low, high = peak_between(self._stages)
        self.low, self.high = max(self.low, low), min(self.high, high)
        # the share's last bit may round down: a billionth more keeps it a bound (as the judge)
        share = max(most_share for _, _, most_share in bounds)
        self.sigma_high = min(self.sigma_high, max_memory_sigma(slack_share=share * (1 + 1e-9)))

    def _bounds(self) -> list[tuple[float, float, float]]:
        """Every stage's ``bound.stage_bound`` of its plan (``stage_figures``: from its kept
        terms, without the plan)."""
        model, config, gpu, framework, precision = self._args
        return [
            stage_figures(model, config, i, n, gpu, framework, precision)[:3]
            for i, n in enumerate(stage_layers(model, config, framework))
        ]

    def forget(self) -> None:
        """Drop the plans :meth:`narrow` keeps (the bounds, the stages' included, stay)."""
        self._plans = {}
