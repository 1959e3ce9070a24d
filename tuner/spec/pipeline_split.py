"""How a framework assigns transformer layers to pipeline stages, from a ``pipeline_split`` value.

Pure arithmetic over integers (no config objects), so the validity rules
(``tuner.config.parallel``), the study file's loader (``tuner.spec.study``) and the per-stage views
(``tuner.config.pipeline``) share it.

A ``pipeline_split`` is one text value (the only spelling in keys, tables and the storage):

- ``even``: the framework's default. Megatron-LM: ``num_layers / pp`` layers per stage (it
  refuses the rest). DeepSpeed: the repo workload's ``partition_method="type:Block"``;
  Megatron-DeepSpeed: ``GPTModelPipe``'s ``type:transformer`` (``tuner.spec.frameworks``).
- Megatron-LM (``megatron/core/transformer/transformer_config.py``, ``transformer_block.py``
  ``get_num_layers_to_build``):

  - ``first=F,last=L``, ``first=F``, ``last=L``: ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers``; the middle stages split the rest evenly.
  - ``embedding``, ``loss``, ``embedding+loss``: ``--account-for-embedding-in-pipeline-split``
    / ``--account-for-loss-in-pipeline-split``: the embedding (loss) counts as one layer of
    the first (last) stage.
  - ``layout:STRING``: ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` decoder
    layer, ``L`` loss, ``|`` stage boundary, ``(..)*n`` and ``x*n`` repeats, ``,`` cosmetic;
    ``megatron/core/transformer/pipeline_parallel_layer_layout.py``).
- DeepSpeed ``PipelineModule(partition_method=...)`` (``deepspeed/runtime/pipe/module.py``
  ``_partition_layers``): ``uniform``, ``parameters``, ``type:REGEX``; how DeepSpeed partitions
  a layer list is :mod:`tuner.spec.deepspeed_partition`.

A split a framework refuses raises :class:`~tuner.errors.SplitError` (a rule id and the
framework's message), which the validity rules report.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

from tuner.errors import ConfigError, SplitError
from tuner.spec.bounds import MAX_LAYERS
from tuner.spec.deepspeed_partition import PipeLayer, deepspeed_stages
from tuner.spec.frameworks import traits

SplitKind = Literal["even", "first_last", "account", "layout", "deepspeed"]
Chunks = tuple[tuple[int, ...], ...]
"""Decoder layers per pipeline rank (outer) and model chunk (inner, ``vp`` long)."""

EVEN = "even"
DEEPSPEED_DEFAULT_METHOD = str(traits("deepspeed").default_partition)
"""The repo's DeepSpeed workload (``workloads/gpt_deepspeed.py``) partitions by block type."""
_LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


@dataclass(frozen=True, slots=True)
class Split:
    """A parsed ``pipeline_split`` value."""

    kind: SplitKind
    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False
    layout: str | None = None
    method: str | None = None

    @property
    def text(self) -> str:
        """The canonical spelling (what :func:`parse_split` reads back to the same value)."""
        if self.kind == "first_last":
            parts = [f"first={self.first}"] if self.first is not None else []
            parts += [f"last={self.last}"] if self.last is not None else []
            return ",".join(parts)
        if self.kind == "account":
            return "+".join(
                n for n, on in (("embedding", self.embedding), ("loss", self.loss)) if on
            )
        if self.kind == "layout":
            return f"layout:{self.layout}"
        if self.kind == "deepspeed":
            return str(self.method)
        return EVEN

    @property
    def framework(self) -> str | None:
        """The framework the value belongs to (None: both)."""
        return (
            None
            if self.kind == "even"
            else "deepspeed"
            if self.kind == "deepspeed"
            else "megatron"
        )


@functools.lru_cache(maxsize=1024)
def parse_split(text: str) -> Split:
    """Read one ``pipeline_split`` value; raise :class:`ConfigError` (``path``: the field)."""
    raw = text.strip()
    if raw == EVEN:
        return Split("even")
    if raw.startswith("layout:"):
        layout = raw[len("layout:") :].strip()
        if not layout:
            raise ConfigError("layout: needs a layout string, e.g. layout:Et|tt|tL", path="")
        parse_layout(layout)  # syntax only; the counts are checked against the model later
        return Split("layout", layout=layout)
    if raw in ("uniform", "parameters") or raw.startswith("type:"):
        if raw.startswith("type:"):
            pattern = raw[len("type:") :]
            try:
                re.compile(pattern)
            except re.error as e:
                raise ConfigError(f"type:{pattern} is not a regular expression ({e})") from None
            if not pattern:
                raise ConfigError("type: needs a layer class name pattern, e.g. type:Block")
        return Split("deepspeed", method=raw)
    if raw.startswith(("first=", "last=")):
        return _parse_first_last(raw)
    names = raw.split("+")
    if names and all(n in ("embedding", "loss") for n in names) and len(set(names)) == len(names):
        return Split("account", embedding="embedding" in names, loss="loss" in names)
    raise ConfigError(
        f"{text!r} is not a pipeline split: even, first=N,last=N (Megatron), embedding, loss, "
        "embedding+loss, layout:STRING, or a DeepSpeed partition method (uniform, parameters, "
        "type:REGEX)"
    )


def _parse_first_last(raw: str) -> Split:
    values: dict[str, int] = {}
    for part in raw.split(","):
        name, _, number = part.partition("=")
        name = name.strip()
        if name not in ("first", "last") or name in values:
            raise ConfigError(f"{raw!r}: expected first=N and/or last=N, once each")
        try:
            values[name] = int(number)
        except ValueError:
            raise ConfigError(f"{raw!r}: {name} must be a whole number of layers") from None
        if values[name] < 0:
            raise ConfigError(f"{raw!r}: {name} must be >= 0 layers, got {values[name]}")
        if values[name] > MAX_LAYERS:  # its stage was simulated layer by layer: a hang
            raise ConfigError(
                f"{raw[:60]!r}: {name} is more layers than any model has ({MAX_LAYERS:,})"
            )
    return Split("first_last", first=values.get("first"), last=values.get("last"))


def canonical_split(text: str) -> str:
    """The canonical spelling of ``text`` (``last=7,first=7`` -> ``first=7,last=7``)."""
    return parse_split(text).text


# ----------------------------------------------------------------------------- Megatron-LM


@functools.lru_cache(maxsize=256)
def parse_layout(layout: str) -> tuple[tuple[str, ...], ...]:
    """The stages of a ``--pipeline-model-parallel-layout`` string, each a tuple of layer kinds.

    Same grammar as ``PipelineParallelLayerLayout.parse_str_to_list``: commas are dropped,
    ``(...)*n`` is unrolled first, then ``x*n``, then the text is split at ``|``.
    """
    text = layout.replace(",", "")
    text = _unrolled(r"\(([^)]+)\)\*(\d+)", text, layout)
    text = _unrolled(r"(.)\*(\d+)", text, layout)
    stages = []
    for stage in text.split("|"):
        for ch in stage:
            if ch not in _LAYOUT_CHARS:
                raise ConfigError(
                    f"Invalid layer character: {ch} (stage={stage!r}, layout_str={text!r}), "
                    f"known layer characters: {list(_LAYOUT_CHARS)}"
                )
        stages.append(tuple(_LAYOUT_CHARS[ch] for ch in stage))
    return tuple(stages)


MAX_LAYOUT_CHARS = 4 * MAX_LAYERS
"""The longest a layout may unroll to: every layer of the deepest model the study file takes
(:data:`~tuner.spec.bounds.MAX_LAYERS`), its embedding, loss and stage marks, with room to
spare. ``(t|)*99999999999`` ran the machine out of memory unrolling it."""


def _unrolled(pattern: str, text: str, layout: str) -> str:
    """``text`` with each repeat ``pattern`` finds (the repeated text, then its count)
    unrolled; a :class:`ConfigError` before it grows past :data:`MAX_LAYOUT_CHARS`."""
    room = MAX_LAYOUT_CHARS - len(text)

    def repeat(m: re.Match[str]) -> str:
        nonlocal room
        digits = m.group(2)  # int() of thousands of digits is refused, and slow before that
        n = int(digits) if len(digits) <= 9 else MAX_LAYOUT_CHARS + 1
        room -= len(m.group(1)) * n - len(m.group(0))
        if room < 0:
            raise ConfigError(
                f"layout {layout[:60]!r} unrolls to over {MAX_LAYOUT_CHARS:,} characters (a "
                f"model has at most {MAX_LAYERS:,} layers)"
            )
        return m.group(1) * n

    return re.sub(pattern, repeat, text)


def _layout_chunks(num_layers: int, pp: int, vp: int, layout: str) -> Chunks:
    stages = parse_layout(layout)
    if len(stages) % pp:
        # megatron/training/arguments.py validate_args
        raise SplitError(
            "layout_pp",
            f"The length of pipeline_model_parallel_layout must be divisible by "
            f"pipeline_model_parallel_size (num_stages={len(stages)}, "
            f"args.pipeline_model_parallel_size={pp})",
        )
    if len(stages) // pp != vp:
        raise SplitError(
            "layout_vp",
            f"pipeline_model_parallel_layout has {len(stages)} stages = pp({pp}) x "
            f"{len(stages) // pp} virtual stages per rank, but vp is {vp} (Megatron takes the "
            f"virtual pipeline size from the layout)",
        )
    flat = [kind for stage in stages for kind in stage]
    # pipeline_parallel_layer_layout.py validate_layer_layout, in its order
    checks = [
        (bool(flat) and flat[0] == "embedding", f"The first layer must be embedding, but got "
         f"{flat[0] if flat else None}"),
        (bool(flat) and flat[-1] == "loss", f"The last layer must be loss, but got "
         f"{flat[-1] if flat else None}"),
        (flat.count("embedding") == 1, "Embedding must be specified exactly once"),
        (flat.count("loss") == 1, "Loss must be specified exactly once"),
        (flat.count("decoder") == num_layers, f"Number of decoder layers "
         f"{flat.count('decoder')}must match num_layers {num_layers}"),
        ("mtp" not in flat, "Number of mtp layers in layout must match mtp_num_layers"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            raise SplitError("layout_layers", message)
    # layout[vpp_rank * pp + pp_rank] is the vpp_rank-th chunk of pp rank pp_rank
    return tuple(tuple(stages[v * pp + r].count("decoder") for v in range(vp)) for r in range(pp))


def _first_last_counts(num_layers: int, pp: int, vp: int, s: Split) -> list[int]:
    """Layers per pp rank (transformer_config.py ``__post_init__``'s uneven-PP checks)."""
    rest, stages = num_layers, pp
    for name, value in (("first", s.first), ("last", s.last)):
        if value is None:
            continue
        if value <= 0:
            raise SplitError(
                "split_first_last", f"num_layers_in_{name}_pipeline_stage must be larger than 0"
            )
        if vp > 1 and value % vp:
            raise SplitError(
                "split_vp",
                f"number of layers at {name} stage: {value}must be divisible by virtual "
                f"pipelineparallel degree {vp}",
            )
        rest -= value
        stages -= 1
    if rest < 0:  # Megatron's checks take it when the negative rest divides the middle stages
        raise SplitError(
            "split_first_last",
            f"the first and last stages hold {num_layers - rest} layers, more than the model's "
            f"{num_layers}",
        )
    if bool(rest) != bool(stages):
        raise SplitError(
            "split_first_last",
            f"Mismatch: {rest} middle layers remaining but {stages} middle PP stages available.",
        )
    if stages and rest % stages:
        raise SplitError(
            "split_first_last",
            f"number of layers at middle stage: {rest} must be divisible bythe middle pipeline "
            f"model parallel size {stages}",
        )
    middle = rest // stages if stages else 0
    if stages and vp > 1 and middle % vp:
        raise SplitError(
            "split_vp",
            f"number of layers on each middle pipeline rank:{middle} must be divisible by "
            f"virtualpipeline parallel degree {vp}",
        )
    counts = [middle] * pp
    if s.first is not None:
        counts[0] = s.first
    if s.last is not None:
        counts[-1] = s.last
    return counts


def _account_chunks(num_layers: int, pp: int, vp: int, s: Split) -> Chunks:
    """Embedding / loss counted as layers (arguments.py and transformer_block.py)."""
    total = num_layers + int(s.embedding) + int(s.loss)
    if total % pp:
        raise SplitError(
            "split_account",
            "Number of layers should be divisible by the pipeline-model-parallel size"
            if vp == 1
            else f"num_layers: {total} after enableaccount_for_embedding_in_pipeline_split or "
            f"account_for_loss_in_pipeline_split must be divisibleby pipeline_model_parallel_size "
            f"{pp}",
        )
    per_rank = total // pp
    if vp > 1 and per_rank % vp:
        raise SplitError(
            "split_vp",
            f"number of layers on each pipeline rank: {per_rank}(after enable "
            f"account_for_embedding_in_pipeline_split or account_for_loss_in_pipeline_split) "
            f"must be divisible byvirtual_pipeline_model_parallel_size{vp}",
        )
    chunks = [[per_rank // vp] * vp for _ in range(pp)]
    if s.embedding:
        chunks[0][0] -= 1
    if s.loss:
        chunks[-1][-1] -= 1
    for where, count in (("first", chunks[0][0]), ("last", chunks[-1][-1])):
        if count < 0:
            raise SplitError(
                "split_account", f"Not enough layers in the {where} virtual pipeline stage"
            )
    return tuple(tuple(c) for c in chunks)


def megatron_chunks(num_layers: int, pp: int, vp: int, split: str) -> Chunks:
    """Decoder layers Megatron-LM builds on each pp rank and model chunk, or :class:`SplitError`
    with its own message. ``even`` with a remainder is left to ``tuner.config.parallel``'s
    rules."""
    s = parse_split(split)
    if s.kind == "deepspeed":
        raise SplitError(
            "split_framework", f"pipeline_split {split} is a DeepSpeed partition method"
        )
    if s.kind == "layout":
        return _layout_chunks(num_layers, pp, vp, str(s.layout))
    if s.kind == "account":
        return _account_chunks(num_layers, pp, vp, s)
    if s.kind == "first_last":
        counts = _first_last_counts(num_layers, pp, vp, s)
    else:
        counts = [num_layers // pp] * pp
    return tuple((c // vp,) * vp for c in counts)


# ----------------------------------------------------------------------------- auto


def auto_splits(
    num_layers: int, pp: int, vp: int, framework: str, layers: tuple[PipeLayer, ...]
) -> tuple[str, ...]:
    """The splits ``pipeline_split: auto`` tries at one (pp, vp), each a distinct assignment.

    Megatron-LM: ``even`` where it is allowed, then every first/last-stage pair within two
    layers below and one above ``ceil(num_layers / pp)`` that the framework accepts and that
    keeps the first and last stage no heavier than a middle one (they also hold the embedding
    and the LM head), then the embedding/loss accounting. DeepSpeed's pipeline (``deepspeed``,
    ``megatron-deepspeed``): ``even`` (the framework's own partition method), ``parameters``
    and ``uniform``. A split giving the same layers per chunk as an earlier one is
    left out (the framework would build the same stages).
    """
    if pp == 1:
        return (EVEN,)
    seen: set[object] = set()
    out: list[str] = []

    def add(text: str, assignment: object) -> None:
        if assignment not in seen:
            seen.add(assignment)
            out.append(text)

    default = traits(framework).default_partition
    if traits(framework).deepspeed_pipeline and default is not None:
        for method in (default, "parameters", "uniform"):
            try:
                stages = deepspeed_stages(method, layers, pp)
            except SplitError:
                continue
            add(EVEN if method == default else method, stages)
        return tuple(out)
    if num_layers % (pp * vp) == 0:
        add(EVEN, megatron_chunks(num_layers, pp, vp, EVEN))
    top = -(-num_layers // pp)
    counts = range(max(1, top - 2), top + 2)
    candidates = [f"first={f},last={last}" for f in counts for last in counts]
    candidates += ["embedding", "loss", "embedding+loss"]
    for text in candidates:
        try:
            chunks = megatron_chunks(num_layers, pp, vp, text)
        except SplitError:
            continue
        totals = [sum(c) for c in chunks]
        if pp > 2 and max(totals[0], totals[-1]) > min(totals[1:-1]):
            continue
        add(text, chunks)
    return tuple(out)
