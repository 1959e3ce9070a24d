"""Trials as the storage holds them: a config <-> Optuna parameters, and a trial's outcome.

Read by the sampler, the study loop and the leaderboard; imports none of them. A trial's user
attributes are the record of what happened to it (the ``ATTR_*`` names below are the ones
other modules read back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.config.parallel import ParallelConfig
from tuner.outcome import Outcome, rankable
from tuner.space.enumerate import Axes, expand_axes
from tuner.spec.frameworks import traits
from tuner.spec.pipeline_split import EVEN
from tuner.spec.recompute import parse_recompute, recompute_text
from tuner.spec.study import StudySpec
from tuner.spec.torchtitan import FSDP_DEFAULT, config_fields

RETRYABLE = (Outcome.INTERRUPTED, Outcome.NODE_ERROR)
"""Outcomes whose config runs again (once per trial): the trial said nothing about the config."""


class StoredTrial(Protocol):
    """What the leaderboard and the report read of a stored trial: Optuna's
    :class:`~optuna.trial.FrozenTrial` has it, and so has the read commands' lighter
    :class:`tuner.study.attrs_read.TrialAttrs`."""

    @property
    def number(self) -> int: ...
    @property
    def state(self) -> TrialState: ...
    @property
    def user_attrs(self) -> dict[str, Any]: ...


LEGACY_PARAM_NAMES = {"micro_batch_size": "micro_batch", "sequence_parallel": "sp"}
"""Parameter names studies stored before they took the leaderboard's column names; read back."""


def current_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with any legacy name replaced by today's (see :data:`LEGACY_PARAM_NAMES`)."""
    return {LEGACY_PARAM_NAMES.get(k, k): v for k, v in params.items()}


def distributions(spec: StudySpec, axes: Axes | None = None) -> dict[str, BaseDistribution]:
    """The Optuna search space: one categorical parameter per knob, named as the leaderboard's
    column (``micro_batch``, ``sp``, ``recompute`` spelled ``full:uniform:1``), so a dashboard
    reading the storage shows the same names and values as ``tune leaderboard``."""
    axes = axes or expand_axes(spec)
    rc = sorted({recompute_setting(*r) for r in axes.recompute})
    out: dict[str, BaseDistribution] = {
        "tp": CategoricalDistribution(list(axes.tp)),
        "pp": CategoricalDistribution(list(axes.pp)),
        "cp": CategoricalDistribution(list(axes.cp)),
        "vp": CategoricalDistribution(list(axes.vp)),
        "micro_batch": CategoricalDistribution(list(axes.micro_batch_size)),
        "sp": CategoricalDistribution(list(axes.sequence_parallel)),
        "recompute": CategoricalDistribution(rc),
        "distributed_optimizer": CategoricalDistribution(list(axes.distributed_optimizer)),
        "zero_stage": CategoricalDistribution(list(axes.zero_stage)),
    }
    if axes.pipeline_split != (EVEN,):
        # only a study that searches the split has the parameter (older studies stay the same)
        out["pipeline_split"] = CategoricalDistribution(list(axes.pipeline_split))
    if axes.moe:  # MoE knobs: only MoE studies have them (dense stay the same)
        out["ep"] = CategoricalDistribution(list(axes.ep))
        out["etp"] = CategoricalDistribution([_etp_param(e) for e in axes.etp])
        out["dispatcher"] = CategoricalDistribution(list(axes.moe_token_dispatcher))
    if axes.tp_comm_overlap != (False,):  # only a study that searches userbuffers has it
        out["tp_comm_overlap"] = CategoricalDistribution(list(axes.tp_comm_overlap))
    if axes.fsdp2:  # torchtitan's own knobs: only its studies have them
        for i, name in enumerate(FSDP_PARAMS):
            out[name] = CategoricalDistribution(list(dict.fromkeys(k[i] for k in axes.fsdp)))
    return out


FSDP_PARAMS = ("dp_shard", "dp_replicate", "pp_schedule", "reshard", "compile")
"""torchtitan's trial parameters, in the order of ``Axes.fsdp``'s tuples."""


def _fsdp_params(config: ParallelConfig, axes: Axes | None) -> dict[str, Any]:
    """torchtitan's knobs as trial parameters: dp_shard -1 when the axis lists -1 and not the
    resolved degree; at pp=1 the axis' first schedule (none runs there)."""
    knobs = axes.fsdp if axes is not None else ()
    shard = config.dp_shard
    if knobs and shard not in {k[0] for k in knobs}:
        shard = -1
    schedule = config.pp_schedule or (knobs[0][2] if knobs else FSDP_DEFAULT[2])
    values = (
        shard, config.dp_replicate, schedule, config.reshard_after_forward, config.compile
    )  # fmt: skip
    return dict(zip(FSDP_PARAMS, values, strict=True))


def _fsdp_fields(spec: StudySpec, params: dict[str, Any], tp: int, pp: int, cp: int) -> Any:
    """(dp, vp, ParallelConfig fields) from a trial's parameters (``config_fields``)."""
    if not traits(spec.framework).fsdp2:
        return max(spec.world_size // (tp * pp * cp), 1), int(params["vp"]), {}
    d = FSDP_DEFAULT
    knobs = (
        int(params.get("dp_shard", d[0])), int(params.get("dp_replicate", d[1])),
        str(params.get("pp_schedule", d[2])), str(params.get("reshard", d[3])),
        bool(params.get("compile", d[4])),
    )  # fmt: skip
    return config_fields(knobs, spec.world_size, tp, pp, cp, 1, knobs[2])


def _etp_param(etp: int | None) -> int:
    """Optuna categoricals hold no None: 0 stands for "etp = tp"."""
    return 0 if etp is None else etp


def recompute_setting(
    rc: str, method: str | None, n: int | None, modules: tuple[str, ...] | None = None
) -> str:
    """The text of a recompute setting from its knobs (``tuner.spec.recompute``, as
    :attr:`ParallelConfig.recompute_setting` spells it)."""
    return recompute_text(rc, method, n, modules)


def recompute_knobs(setting: str) -> tuple[str, str | None, int | None, tuple[str, ...] | None]:
    """The inverse of :func:`recompute_setting`: ``full:uniform:1`` -> (full, uniform, 1, None),
    ``selective:core_attn+moe_act`` -> (selective, None, None, (core_attn, moe_act))."""
    k = parse_recompute(setting)
    return k.granularity, k.method, k.num_layers, k.modules


def config_params(config: ParallelConfig, axes: Axes | None = None) -> dict[str, Any]:
    """The Optuna parameters of a config (inverse of :func:`config_from_params`).

    At tp=1 SP is off whatever the parameter says, so with ``axes`` a tp=1 config takes the
    axis' first SP value (``sequence_parallel: [true]`` has no ``false`` to enqueue).
    """
    sp = config.sequence_parallel
    if axes is not None and config.tp == 1 and sp not in axes.sequence_parallel:
        sp = axes.sequence_parallel[0]
    split = config.pipeline_split
    if axes is not None and config.pp == 1 and split not in axes.pipeline_split:
        split = axes.pipeline_split[0]  # at pp=1 the split is even whatever the parameter says
    extra: dict[str, Any] = (
        {}
        if split == EVEN and (axes is None or axes.pipeline_split == (EVEN,))
        else {"pipeline_split": split}
    )
    if axes.moe if axes is not None else bool(config.moe_key):
        extra |= {"ep": config.ep, "etp": _etp_param(config.etp),
                  "dispatcher": config.moe_token_dispatcher}  # fmt: skip
    if axes.fsdp2 if axes is not None else bool(config.fsdp_key):
        extra |= _fsdp_params(config, axes)
    if axes.tp_comm_overlap != (False,) if axes is not None else config.tp_comm_overlap:
        tpo = config.tp_comm_overlap  # without SP it is off whatever the parameter says
        if axes is not None and tpo not in axes.tp_comm_overlap:
            tpo = axes.tp_comm_overlap[0]
        extra["tp_comm_overlap"] = tpo
    return extra | {
        "tp": config.tp, "pp": config.pp, "cp": config.cp,
        "vp": axes.vp[0] if axes is not None and axes.fsdp2 else config.vp,  # from the schedule
        "micro_batch": config.micro_batch_size,
        "sp": sp,
        "recompute": config.recompute_setting,
        "distributed_optimizer": config.distributed_optimizer, "zero_stage": config.zero_stage,
    }  # fmt: skip


def config_from_params(spec: StudySpec, params: dict[str, Any]) -> ParallelConfig:
    """Build the config a trial's parameters describe (DP derived from the world size)."""
    params = current_params(params)
    rc, method, n, mods = recompute_knobs(str(params["recompute"]))
    tp, pp, cp = int(params["tp"]), int(params["pp"]), int(params["cp"])
    sp = bool(params["sp"]) and tp > 1  # Megatron: off at tp=1
    dp, vp, titan = _fsdp_fields(spec, params, tp, pp, cp)
    return ParallelConfig(
        tp=tp, pp=pp, cp=cp, dp=dp, vp=vp,
        sequence_parallel=sp,
        micro_batch_size=int(params["micro_batch"]),
        global_batch_size=spec.training.global_batch_size, recompute=rc,  # type: ignore[arg-type]
        recompute_method=method,  # type: ignore[arg-type]
        recompute_num_layers=n, recompute_modules=mods,
        distributed_optimizer=bool(params["distributed_optimizer"]),
        zero_stage=int(params["zero_stage"]),
        pipeline_split=str(params.get("pipeline_split", EVEN)) if pp > 1 else EVEN,
        ep=int(params.get("ep", 1)), etp=int(params.get("etp", 0)) or None,
        moe_token_dispatcher=str(params.get("dispatcher", "alltoall")),
        tp_comm_overlap=bool(params.get("tp_comm_overlap", False)) and sp,  # needs SP
        **titan,
    )  # fmt: skip


def trial_config(t: StoredTrial) -> ParallelConfig | None:
    """The config a trial recorded, if any."""
    raw = t.user_attrs.get("config")
    return ParallelConfig(**raw) if raw else None


def trial_outcome(t: StoredTrial) -> Outcome | None:
    """A trial's recorded outcome, if any. A launched trial failed without one lost its worker
    (heartbeats stopped: the storage failed it), so it counts as interrupted and runs again."""
    value = t.user_attrs.get("outcome")
    if value:
        return Outcome(value)
    if t.state == TrialState.FAIL and t.user_attrs.get("launched"):
        return Outcome.INTERRUPTED
    return None


def measured_value(t: FrozenTrial) -> float | None:
    """A finished trial's measured step time where it may be ranked and modelled, else None:
    a COMPLETE trial whose value and stored tokens/s pass :func:`tuner.outcome.rankable`. A
    storage written before that rule (or before the hardware bound
    ``tuner.models.time.breakdown.fastest_step_s``) can hold an ``ok`` trial of a zero,
    negative or infinite figure; the sampler, the stop rules and the calibration take logs and
    minima of these values, so such a trial is tried but unmeasured there."""
    if t.state != TrialState.COMPLETE or not rankable(t.value, t.user_attrs.get("tokens_per_s")):
        return None
    return float(t.value)  # type: ignore[arg-type]  # rankable: a finite number


def is_duplicate(t: StoredTrial) -> bool:
    """A trial answered from an earlier one (or yielded to it): not a trial of its own."""
    return "duplicate_of" in t.user_attrs


def counts_as_run(t: FrozenTrial, rerun: frozenset[Outcome] = frozenset()) -> bool:
    """A finished launched trial that counts against ``n_trials`` (not to be re-run)."""
    return (
        bool(t.user_attrs.get("launched")) and t.state.is_finished() and not runs_again(t, rerun)
    )


def memory_split(c: ParallelConfig) -> tuple[Any, ...]:
    """What two configs share when one's OOM says something of the other's memory
    (:func:`oom_dominates`): the model's split and the sharding of its state."""
    return (c.tp, c.pp, c.cp, c.vp, c.sequence_parallel, c.distributed_optimizer, c.zero_stage)


_RECOMPUTE_LEVEL = {"none": 0, "selective": 1, "full": 2}


def oom_dominates(oom: ParallelConfig, other: ParallelConfig) -> bool:
    """Whether ``other`` needs at least as much memory as ``oom`` (same split, a micro-batch at
    least as large, no more recomputation)."""
    level = _RECOMPUTE_LEVEL
    if memory_split(oom) != memory_split(other) or other.micro_batch_size < oom.micro_batch_size:
        return False
    if level[other.recompute] != level[oom.recompute]:
        return level[other.recompute] < level[oom.recompute]
    if other.recompute == "selective":  # recomputing fewer modules keeps more
        return set(other.recomputed_modules) <= set(oom.recomputed_modules)
    if other.recompute != "full":
        return True
    return (other.recompute_method, other.recompute_num_layers) == (
        oom.recompute_method, oom.recompute_num_layers
    )  # fmt: skip


class SplitIndex:
    """The positions of ``configs`` by :func:`memory_split`: an OOM config dominates only
    configs of its own split, so :meth:`dominated` compares it with those alone (the 761
    viable configs of the gpt-70b benchmark fall into 142 splits; comparing each of the 608
    OOM configs of its 10,000 trials with every candidate was 460,000 calls)."""

    def __init__(self, configs: Sequence[ParallelConfig]) -> None:
        self.configs = configs
        self._groups: dict[tuple[Any, ...], list[int]] = {}
        for i, c in enumerate(configs):
            self._groups.setdefault(memory_split(c), []).append(i)

    def dominated(self, oom: ParallelConfig) -> list[int]:
        """The positions ``i`` (ascending) with ``oom_dominates(oom, configs[i])``."""
        group = self._groups.get(memory_split(oom), [])
        return [i for i in group if oom_dominates(oom, self.configs[i])]


def runs_again(t: FrozenTrial, rerun: frozenset[Outcome] = frozenset()) -> bool:
    """Whether a finished trial's config is to run again: it said nothing about the config
    (:data:`RETRYABLE`), or the user asked to re-run its outcome (``tune run --rerun``)."""
    outcome = trial_outcome(t)
    if outcome in RETRYABLE:
        return True
    return outcome in rerun and bool(t.user_attrs.get("launched"))


def measured(trials: list[FrozenTrial]) -> dict[str, FrozenTrial]:
    """Config key -> the trial that measured it (ok outcome, not a duplicate)."""
    out: dict[str, FrozenTrial] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE and not is_duplicate(t):
            key = str(t.user_attrs.get("key"))
            if key not in out or out[key].user_attrs.get("proxy"):  # full scale over a proxy
                out[key] = t
    return out
