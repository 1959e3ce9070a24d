"""A config's torchtitan overrides, spelled as the pinned release's parser reads them.

torchtitan 0.3.0 (``tuner.spec.frameworks.TORCHTITAN_RELEASE``) parses ``--section.option VALUE``
with tyro onto the ``Trainer.Config`` its ``--module/--config`` function returns; tyro's own
spelling is with hyphens (``--training.local-batch-size``; underscores are accepted too),
booleans are ``--section.flag`` / ``--section.no-flag``, and activation checkpointing is a
subcommand (``activation-checkpoint:full``) that must come after every other option. Each
override is set explicitly, also where it equals the release's default, so a trial never runs a
default that later releases change (activation checkpointing defaults to ``selective`` there).
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.spec.study import StudySpec
from tuner.spec.torchtitan import AC_MODES, local_batch

Flag = tuple[str, ...]

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
"""tune's precision -> ``training.mixed_precision_param`` (``training.dtype`` stays float32: the
fp32 shard is what the optimizer steps)."""


def _switch(name: str, on: bool) -> Flag:
    section, _, option = name.rpartition(".")
    return (f"--{name}",) if on else (f"--{section}.no-{option}",)


def torchtitan_flags(spec: StudySpec, c: ParallelConfig, gc_freq: int | None = None) -> list[Flag]:
    """The overrides of one trial, in order; the activation-checkpoint subcommand is last.
    ``gc_freq``: ``training.gc_freq`` (the release's default, 50, when None)."""
    flags: list[Flag] = [
        ("--training.local-batch-size",
         str(local_batch(c.global_batch_size, c.micro_batch_size, c.dp, c.pp))),
        ("--training.global-batch-size", str(c.global_batch_size)),
        ("--training.seq-len", str(spec.model.seq_length)),
        ("--training.steps", str(spec.launch.train_iters)),
        ("--training.mixed-precision-param", DTYPES[spec.training.precision]),
        ("--training.gc-freq", str(gc_freq or 50)),
        # 0.3.0 captures CUDA graphs by default and refuses them with PP (Trainer.Config
        # _validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet")
        _switch("training.disable-cuda-graphs", c.pp > 1),
        ("--parallelism.data-parallel-replicate-degree", str(c.dp_replicate)),
        ("--parallelism.data-parallel-shard-degree", str(c.dp_shard)),
        ("--parallelism.fsdp-reshard-after-forward", c.reshard_after_forward),
        ("--parallelism.tensor-parallel-degree", str(c.tp)),
        _switch("parallelism.enable-sequence-parallel", c.sequence_parallel),
        ("--parallelism.pipeline-parallel-degree", str(c.pp)),
        ("--parallelism.context-parallel-degree", str(c.cp)),
    ]  # fmt: skip
    if c.pp > 1:
        flags += [
            ("--parallelism.pipeline-parallel-schedule", str(c.pp_schedule)),
            ("--parallelism.pipeline-parallel-microbatch-size", str(c.micro_batch_size)),
        ]
    flags += [
        _switch("compile.enable", c.compile),
        _switch("compile.enable-async-tensor-parallel", c.tp_comm_overlap),
        ("--metrics.log-freq", "1"),  # every step logged: the parser needs each step's line
    ]
    return flags + [(f"activation-checkpoint:{AC_MODES[c.recompute]}",)]


def torchtitan_args(spec: StudySpec, c: ParallelConfig, *, full_run: bool = False) -> list[str]:
    """What ``python -m torchtitan.train`` gets after torchrun's options, in the launch
    template's order: the config selection (``launch.script_args``), the full run's own
    ``launch.train_args`` (``full_run``: ``tune best``; a trial has none), the overrides,
    ``launch.extra_args``, the activation-checkpoint subcommand last."""
    flags = torchtitan_flags(spec, c)
    launch = spec.launch
    return [*launch.script_args, *(launch.train_args if full_run else ()),
            *(a for f in flags[:-1] for a in f), *launch.extra_args, *flags[-1]]  # fmt: skip


def _option(word: str) -> str | None:
    """The option ``word`` sets, as tyro matches it (``--section.opt`` with underscores or
    hyphens, ``--section.no-opt``, ``--opt=value``), or None for a value."""
    if not word.startswith("--"):
        return None
    section, _, name = word[2:].split("=", 1)[0].replace("_", "-").rpartition(".")
    name = name.removeprefix("no-")
    return f"{section}.{name}" if section else name


def inexpressible(spec: StudySpec, c: ParallelConfig) -> tuple[str, str] | None:
    """(the field, why) for a word of ``launch.train_args`` or ``launch.extra_args`` that the
    trainer's command line for ``c`` cannot hold beside tune's own, None if every word fits.
    tyro keeps the last value of an option given twice, so a word setting an option the
    selection or the overrides set either loses to them (``train_args``, before them) or
    changes the config (``extra_args``, after them); and it takes one subcommand, whose options
    it reads only after it, while tune's ``activation-checkpoint:MODE`` (``recompute``) is the
    last word."""
    flags = torchtitan_flags(spec, c)
    ours = {_option(f[0]): " ".join(f) for f in flags[:-1]}
    ours.update({o: o for w in spec.launch.script_args if (o := _option(w))})
    for name in ("train_args", "extra_args"):
        for i, word in enumerate(getattr(spec.launch, name)):
            option = _option(word)
            if word.startswith("activation-checkpoint") or (
                option or "").startswith("activation-checkpoint."):  # fmt: skip
                return (f"launch.{name}[{i}]",
                        f"{word!r}: tune renders the config's activation checkpointing "
                        f"(recompute: {c.recompute}) as the one subcommand torchtitan takes, "
                        f"{flags[-1][0]}, last; the export cannot hold this word")  # fmt: skip
            if option in ours:
                return (f"launch.{name}[{i}]",
                        f"{word!r}: tune sets it for the config ({ours[option]}); the export "
                        "cannot hold both")  # fmt: skip
    return None
