"""Screening a proposed config before any node is spent on it.

In order: the framework's own rules (``invalid``), the memory model (``pruned_memory`` with the
predicted peak, unless the config is one of the study's memory probes: ``tuner.space.probes``), the
OOMs measured so far (a config needing at least the memory of one that ran out), configs
already measured (answered from that trial), and configs another trial holds (finished with a
final outcome, or running: claimed through the config's lease).
"""

from __future__ import annotations

import time
from collections.abc import Collection

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.catalog import GPUSpec
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import GIB, estimate_memory, fits
from tuner.models.rates import Rates
from tuner.models.time.estimate import estimate_time
from tuner.outcome import Outcome
from tuner.space.cost import too_slow_reason, trial_cost
from tuner.space.enumerate import SharedSpace, study_violations
from tuner.space.probes import at_risk, fit_probability
from tuner.space.shorten import shortened_attrs, too_slow
from tuner.space.trials import SplitIndex
from tuner.spec.study import StudySpec
from tuner.study.digest import Digest
from tuner.study.leases import LeaseConflict, Leases
from tuner.study.record import Summary
from tuner.study.storage import set_user_attrs


class Screen:
    """Records a trial that must not run (and why); says which may."""

    def __init__(
        self, spec: StudySpec, study: optuna.Study, leases: Leases, gpu: GPUSpec,
        summary: Summary, *, worker: str, heartbeat_s: float, rerun: frozenset[Outcome],
        rates: Rates | None = None, space: SharedSpace | None = None,
    ) -> None:  # fmt: skip
        """``space``: the loop's shared enumeration (the model sampler's), which holds the
        memory probes; one of the study's own under ``rates`` when None."""
        self.rates = rates
        self.space = space or SharedSpace(spec, rates)
        self.spec, self.study, self.leases, self.gpu = spec, study, leases, gpu
        self.summary, self.worker, self.heartbeat_s, self.rerun = (
            summary,
            worker,
            heartbeat_s,
            rerun,
        )
        self._probes: frozenset[str] | None = None
        self._space_keys: dict[str, ParallelConfig] | None = None
        self._space_split: tuple[list[str], SplitIndex] | None = None  # the keys' configs by split
        self._dominated: dict[int, tuple[ParallelConfig, set[str]]] = {}  # see _dominated_by
        self._union: tuple[list[ParallelConfig], int, set[str]] = ([], 0, set())  # see exhausted
        self.digest = Digest(rerun)
        """The finished trials folded once each (:mod:`tuner.study.digest`)."""

    def _prune(self, trial: optuna.Trial, outcome: Outcome, reason: str) -> None:
        set_user_attrs(trial, {"outcome": str(outcome), "reason": reason})
        self.study.tell(trial, state=TrialState.PRUNED)
        self.summary.count(outcome)

    def __call__(self, trial: optuna.Trial, config: ParallelConfig,
                 trials: list[FrozenTrial]) -> bool:  # fmt: skip
        """Record ``trial`` without launching when it must not run; True when it may run."""
        spec = self.spec
        errors = study_violations(config, spec)
        if errors:
            self._prune(trial, Outcome.INVALID, "; ".join(e.message for e in errors))
            return False
        terms = self.space.terms
        memory = estimate_memory(spec.model, config, self.gpu, spec.framework,
                                 spec.training.precision, terms=terms)  # fmt: skip
        predicted = estimate_time(spec.model, spec.training, config, self.gpu,
                                  spec.cluster.gpus_per_node, spec.framework,
                                  self.rates, terms=terms)  # fmt: skip
        set_user_attrs(trial, {  # one transaction
            "predicted_peak_gib": round(memory.peak / GIB, 3),
            "predicted_allocated_gib": round(memory.allocated / GIB, 3),
            "predicted_reserved_gib": round(memory.reserved / GIB, 3),
            "predicted_activation_share": round(memory.activation_share, 4),
            "predicted_peak_stage": memory.stage, "predicted_peak_phase": memory.phase,
            "predicted_step_s": predicted.step, "predicted_mfu": predicted.mfu,
            # the stated relative sds (log-normal) the report draws each prediction's band from
            "predicted_step_sd": round(predicted.sigma, 4),
            "predicted_peak_sd": round(memory.sigma, 4),
        })  # fmt: skip
        slow = too_slow(spec, [config], [predicted.step], self.gpu, self.rates, terms)
        if config.key() in slow:  # it would only time out: fewer micro-batches, or the fix
            shorter = slow[config.key()]
            if shorter is None:
                cost = trial_cost(spec, predicted.step)
                self._prune(trial, Outcome.PRUNED_TIME, too_slow_reason(spec, cost, config.pp))
                return False
            set_user_attrs(trial, shortened_attrs(shorter))
        if not fits(memory, self.gpu, spec.search.memory_headroom):
            limit = spec.search.memory_headroom * self.gpu.memory_gib
            reason = f"predicted peak {memory.peak / GIB:.3g} GiB > {limit:.3g} GiB"
            if config.key() not in self._probe_keys():
                self._prune(trial, Outcome.PRUNED_MEMORY, reason)
                return False
            chance = fit_probability(memory.peak / GIB, self.gpu.memory_gib, memory.sigma)
            set_user_attrs(trial, {"memory_probe": True, "probe_reason": (
                f"{reason}, but {chance:.0%} likely within the GPU's {self.gpu.memory_gib:.3g} "
                "GiB and predicted faster than every config that fits"
            )})  # fmt: skip
        elif at_risk(memory.peak / GIB, self.gpu.memory_gib, memory.sigma):  # not a sure fit
            over = 1.0 - fit_probability(memory.peak / GIB, self.gpu.memory_gib, memory.sigma)
            set_user_attrs(trial, {"memory_risk": round(over, 3)})  # (Optuna's: 2 ms of CPU)
        return self._screen_history(trial, config, trials)

    def exhausted(self, trials: list[FrozenTrial], running: Collection[str]) -> bool:
        """Whether no config of the space may launch any more (``running``: the keys this worker
        runs now): every viable config and memory probe is held by a finished trial with a
        final outcome (:func:`tuner.study.digest.holds`), runs here, or needs at least
        the memory of a config that ran out. Asking the sampler again would only record
        refusals. Other workers' running trials hold nothing here: one may still end as a
        config to run again."""
        if self._space_keys is None:  # the space's configs by key, once (keys take a while)
            report = self.space.report()
            self._space_keys = {c.config.key(): c.config for c in (*report.viable, *report.probes)}
        left = dict(self._space_keys)
        digest = self.digest.of(trials)
        for key in (*running, *digest.held()):
            left.pop(key, None)
        finished, open_ = digest.finished_ooms(), digest.open_ooms()
        if len(self._dominated) > 4 * (len(finished) + len(open_)) + 1024:  # open: new each read
            self._dominated.clear()
        # the finished OOMs' union kept, each OOM added once (the list only grows; a digest
        # folded afresh makes a new one), the open ones' on top
        kept = self._union if self._union[0] is finished else (finished, 0, set())
        union = kept[2]
        for oom in finished[kept[1] :]:
            union |= self._dominated_by(oom)
        self._union = (finished, len(finished), union)
        dominated = union.union(*(self._dominated_by(oom) for oom in open_))
        return dominated.issuperset(left)

    def _dominated_by(self, oom: ParallelConfig) -> set[str]:
        """The keys of the space's configs that need at least the memory of ``oom``
        (``oom_dominates``), once per OOM config object (a finished trial's is one object from
        its digest on): :meth:`exhausted` compared every config left with every OOM on each
        decision (some 5,000 comparisons at 10,000 trials). An OOM is compared with the configs
        of its own split only (:class:`~tuner.space.trials.SplitIndex`)."""
        kept = self._dominated.get(id(oom))
        if kept is None or kept[0] is not oom:
            assert self._space_keys is not None
            if self._space_split is None:  # only configs of the OOM's split can be dominated
                names = list(self._space_keys)
                self._space_split = (names, SplitIndex(list(self._space_keys.values())))
            names, split = self._space_split
            keys = {names[i] for i in split.dominated(oom)}
            kept = self._dominated[id(oom)] = (oom, keys)
        return kept[1]

    def _probe_keys(self) -> frozenset[str]:
        """The study's memory probes (``tuner.space.probes``), from the shared enumeration."""
        if self._probes is None:
            self._probes = frozenset(c.config.key() for c in self.space.report().probes)
        return self._probes

    def _screen_history(self, trial: optuna.Trial, config: ParallelConfig,
                        trials: list[FrozenTrial]) -> bool:  # fmt: skip
        key = config.key()
        digest = self.digest.of(trials)
        number = digest.first_oom_over(config)
        if number is not None:
            reason = f"needs at least the memory of trial {number}, which ran out"
            self._prune(trial, Outcome.PRUNED_MEMORY, reason)
            return False
        done = digest.measured(key)
        if done is not None and done.value is not None:
            set_user_attrs(trial, {"duplicate_of": done.number, "outcome": str(Outcome.OK)})
            self.study.tell(trial, done.value)  # the sampler learns; nothing runs again
            return False
        return not self._claimed_elsewhere(trial, key, trials)

    def _claimed_elsewhere(self, trial: optuna.Trial, key: str, trials: list[FrozenTrial]) -> bool:
        """Whether another trial holds ``key``; if so ``trial`` yields.

        A finished trial holds it when its outcome is final; a running one through the
        config's lease (claimed atomically, released once its result is recorded).
        """
        number = self.digest.of(trials).holder(key)  # finished: never the trial asked
        if number is None:
            try:
                self.leases.claim([f"config:{key}"], self.worker, trial=trial.number)
                return False
            except LeaseConflict as conflict:
                lease = conflict.held[0] if conflict.held else None
                if lease is not None and lease.lost(time.time(), self.heartbeat_s):
                    self.leases.take_over(lease)  # its trial's nodes are cleaned separately
                    return self._claimed_elsewhere(trial, key, trials)
                number = lease.trial if lease is not None else None
        reason = f"same config as trial {number}"  # and not a trial of its own:
        set_user_attrs(trial, {"reason": reason, "duplicate_of": number})
        self.study.tell(trial, state=TrialState.FAIL)
        return True
