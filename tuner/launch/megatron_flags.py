"""The Megatron-LM arguments a :class:`ParallelConfig` stands for: the one place they are spelt.

The ``megatron_gpt`` launch template receives them as ``megatron_flags`` and ``tune best --emit
args`` prints the same words (:func:`tuner.results.megatron_args`), so the script a trial ran and
the exported arguments can't drift apart.
"""

from __future__ import annotations

from tuner.parallel import ParallelConfig

Flag = tuple[str, ...]
"""One flag and its values, e.g. ``("--tensor-model-parallel-size", "8")``."""


def megatron_parallel_flags(config: ParallelConfig, num_layers: int) -> list[Flag]:
    """Parallel sizes, batch sizes, recomputation and optimizer sharding in Megatron's flag names.

    ``num_layers`` is the model's: ``vp`` is passed as layers per virtual pipeline stage. Precision
    and the model's shape are not included (the template adds them from the study).
    """
    c = config
    flags: list[Flag] = [
        ("--tensor-model-parallel-size", str(c.tp)),
        ("--pipeline-model-parallel-size", str(c.pp)),
        ("--context-parallel-size", str(c.cp)),
    ]
    if c.vp > 1:
        flags.append(("--num-layers-per-virtual-pipeline-stage", str(num_layers // (c.pp * c.vp))))
    if c.sequence_parallel:
        flags.append(("--sequence-parallel",))
    flags.append(("--micro-batch-size", str(c.micro_batch_size)))
    flags.append(("--global-batch-size", str(c.global_batch_size)))
    if c.recompute != "none":
        flags.append(("--recompute-granularity", c.recompute))
    if c.recompute == "full":
        flags.append(("--recompute-method", str(c.recompute_method)))
        flags.append(("--recompute-num-layers", str(c.recompute_num_layers)))
    if c.distributed_optimizer:
        flags.append(("--use-distributed-optimizer",))
    return flags


def megatron_parallel_args(config: ParallelConfig, num_layers: int) -> list[str]:
    """:func:`megatron_parallel_flags` as one list of words (an argv fragment)."""
    return [word for flag in megatron_parallel_flags(config, num_layers) for word in flag]
