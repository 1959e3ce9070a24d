"""The one compact spelling of a config that people read: ``tp4 pp4 dp32 vp4 sp mbs1 ga32``.

:meth:`ParallelConfig.key` stays the machine key (JSON, CSV, the storage); every table, progress
line and heading a person reads spells a config with :func:`spell`. Across several configs,
:func:`split_constant` names the knobs that are the same in every row once, and each row shows
only the knobs that differ.

Each knob has a token: a value knob is its abbreviation glued to its value (``tp4``); an on/off
knob is its abbreviation when on (``sp``) and nothing when off; a knob at its default is left out
of a single config's spelling. :data:`GLOSSARY` explains every abbreviation; ``tune <cmd> --help``
and docs/output.md print it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tuner.config.parallel import ParallelConfig
from tuner.spec.frameworks import Traits, traits
from tuner.spec.pipeline_split import EVEN


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    """One knob of the spelling: how it reads and what it means."""

    name: str
    """The abbreviation (``tp``)."""
    meaning: str
    """What it stands for, for ``--help`` and docs/output.md."""
    token: Callable[[ParallelConfig], str]
    """The config's token (``tp4``; ``""`` for an on/off knob that is off)."""
    default: str
    """The token at the knob's default, left out of a single config's spelling ("" for none)."""
    off: str = ""
    """How the constant line names an on/off knob that is off in every row (``no sp``)."""
    offered: Callable[[Traits], bool] = lambda t: True
    """Whether a framework has the knob at all: a table of a framework without it does not say
    ``no sp`` (the rules that refuse it there: :mod:`tuner.config.rules` ``_check_framework``,
    :mod:`tuner.config.tp_overlap`, :mod:`tuner.config.torchtitan_rules`)."""


def _value(
    prefix: str, get: Callable[[ParallelConfig], object]
) -> Callable[[ParallelConfig], str]:
    return lambda c: f"{prefix}{get(c)}"


def _flag(word: str, get: Callable[[ParallelConfig], bool]) -> Callable[[ParallelConfig], str]:
    return lambda c: word if get(c) else ""


def _recompute(c: ParallelConfig) -> str:
    if c.recompute == "full" and c.recompute_method is None:  # a probed point's: no method
        return "full"
    return "" if c.recompute == "none" else c.recompute_setting


def _split(c: ParallelConfig) -> str:
    return "" if c.pipeline_split == EVEN else f"split:{c.pipeline_split}"


def _dispatcher(c: ParallelConfig) -> str:
    return "" if c.moe_token_dispatcher == "alltoall" else c.moe_token_dispatcher


RECOMPUTE_KNOB = "selective / full:METHOD:N"
"""The recompute knob's name in :data:`KNOBS`."""


KNOBS: tuple[Knob, ...] = (
    Knob(name="tp", meaning="tensor parallel size", token=_value("tp", lambda c: c.tp),
         default=""),
    Knob(name="pp", meaning="pipeline parallel size (stages)", token=_value("pp", lambda c: c.pp),
         default=""),
    Knob(name="dp", meaning="data parallel size (world / (tp x pp x cp))",
         token=_value("dp", lambda c: c.dp), default=""),
    Knob(name="cp", meaning="context parallel size", token=_value("cp", lambda c: c.cp),
         default="cp1"),
    Knob(name="vp", meaning="virtual pipeline chunks per stage (interleaved 1F1B)",
         token=_value("vp", lambda c: c.vp), default="vp1"),
    Knob(name="ep", meaning="expert parallel size (MoE)", token=_value("ep", lambda c: c.ep),
         default="ep1"),
    Knob(name="etp", meaning="expert tensor parallel size (MoE; default: tp)",
         token=lambda c: "" if c.etp is None else f"etp{c.etp}", default=""),
    Knob(name="sp", meaning="sequence parallelism over the TP group",
         token=_flag("sp", lambda c: c.sequence_parallel), default="", off="no sp",
         offered=lambda t: t.megatron_model or t.fsdp2),
    Knob(name="tpo", meaning="TP communication overlapped with the GEMMs",
         token=_flag("tpo", lambda c: c.tp_comm_overlap), default="", off="no tpo",
         offered=lambda t: t.megatron_core or t.fsdp2),
    Knob(name="mbs", meaning="micro-batch size (sequences)",
         token=_value("mbs", lambda c: c.micro_batch_size), default=""),
    Knob(name="ga", meaning="gradient accumulation steps (micro-batches per step)",
         token=_value("ga", lambda c: c.num_microbatches), default=""),
    Knob(name=RECOMPUTE_KNOB,
         meaning="activation recompute (selective: attention core; full: whole layers, "
         "uniform or block, N layers)", token=_recompute, default="", off="no recompute"),
    Knob(name="distopt", meaning="Megatron distributed optimizer (states sharded over dp)",
         token=_flag("distopt", lambda c: c.distributed_optimizer), default="",
         off="no distopt", offered=lambda t: t.megatron_core),
    Knob(name="zero", meaning="DeepSpeed ZeRO stage", token=_value("zero", lambda c: c.zero_stage),
         default="zero0"),
    Knob(name="split", meaning="how layers are assigned to pipeline stages (default: even)",
         token=_split, default=""),
    Knob(name="allgather / flex", meaning="MoE token dispatcher (default: alltoall)",
         token=_dispatcher, default=""),
    Knob(name="hsdp", meaning="torchtitan: HSDP replicas (FSDP2 shards over dp / hsdp)",
         token=_value("hsdp", lambda c: c.dp_replicate), default="hsdp1"),
    Knob(name="1F1B / GPipe / Interleaved1F1B", meaning="torchtitan: pipeline schedule",
         token=lambda c: c.pp_schedule or "", default=""),
    Knob(name="reshard-always / reshard-never",
         meaning="torchtitan: FSDP2 resharding after forward (default: by pipeline parallelism)",
         token=lambda c: "" if c.reshard_after_forward == "default"
         else f"reshard-{c.reshard_after_forward}", default=""),
    Knob(name="compile", meaning="torchtitan: torch.compile of the model and loss",
         token=_flag("compile", lambda c: c.compile), default=""),
)  # fmt: skip


def _knobs(only: Collection[str]) -> tuple[Knob, ...]:
    """The knobs named ``only``, in :data:`KNOBS` order; every knob when ``only`` is empty."""
    unknown = set(only) - {knob.name for knob in KNOBS}
    if unknown:
        raise ValueError(f"no knob named {sorted(unknown)} in the spelling")
    return tuple(k for k in KNOBS if not only or k.name in only)


def tokens(config: ParallelConfig, only: Collection[str] = ()) -> list[str]:
    """Each knob's token (of those named ``only``, else all), in :data:`KNOBS` order (``""`` for
    an on/off knob that is off)."""
    return [knob.token(config) for knob in _knobs(only)]


def spell(config: ParallelConfig, only: Collection[str] = ()) -> str:
    """One config on its own: every knob not at its default (``tp4 pp4 dp32 vp4 sp mbs1 ga32``);
    ``only``: the knobs a partial config has (a framework probe's point: no dp, no ga)."""
    knobs = _knobs(only)
    words = [t for knob, t in zip(knobs, tokens(config, only), strict=True)
             if t and t != knob.default]  # fmt: skip
    return " ".join(words)


def split_constant(
    configs: Sequence[ParallelConfig], framework: str | None = None, only: Collection[str] = ()
) -> tuple[str, list[str]]:
    """Several configs (a table's rows): the knobs equal in every row, spelled once and separated
    by commas (``tp1, no sp, distopt``), and each row's spelling of the knobs that differ. One row:
    nothing constant, the row spelled whole. With the rows' ``framework``, an on/off knob it does
    not have is not named as off (a DeepSpeed table said ``no sp, no tpo, no distopt``);
    ``only``: as for :func:`spell`."""
    t = traits(framework) if framework is not None else None
    if len(configs) < 2:
        return "", [spell(c, only) for c in configs]
    knobs = _knobs(only)
    # each config object's tokens made once (a leaderboard's rows share a config's object
    # between the trials that measured it: thousands of rows, a few hundred configs)
    made: dict[int, list[str]] = {}
    rows = [made.get(id(c)) or made.setdefault(id(c), tokens(c, only)) for c in configs]
    distinct = list(made.values())
    varying = [len({row[i] for row in distinct}) > 1 for i in range(len(knobs))]
    constant = []
    for i, knob in enumerate(knobs):
        if varying[i]:
            continue
        token = rows[0][i]
        if token and token != knob.default:
            constant.append(token)
        elif not token and knob.off and (t is None or knob.offered(t)):
            constant.append(knob.off)
    words = {id(row): " ".join(t for t, v in zip(row, varying, strict=True) if v and t)
             for row in distinct}  # fmt: skip
    spelled = [words[id(row)] for row in rows]
    # Commas between the constant knobs: "sp no tpo no recompute distopt" read as if no recompute
    # applied to distopt; "sp, no tpo, no recompute, distopt" cannot be misread.
    return ", ".join(constant), spelled


def glossary() -> str:
    """Every abbreviation of the spelling, one per line, for ``--help`` and docs/output.md: its
    meaning in a column of its own, on the next line under a name too long for the first."""
    return "\n".join(
        f"  {knob.name:<{NAME_WIDTH}} {knob.meaning}" if len(knob.name) <= NAME_WIDTH
        else f"  {knob.name}\n  {'':<{NAME_WIDTH}} {knob.meaning}"
        for knob in KNOBS
    )  # fmt: skip


NAME_WIDTH = 26
"""The glossary's name column (its longest names, ``1F1B / GPipe / Interleaved1F1B``, run past
it onto a line of their own)."""
