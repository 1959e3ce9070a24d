"""One parallel configuration and the frameworks' rules that judge it.

Owns :class:`ParallelConfig` (tp/pp/cp/dp/vp, micro and global batch, recompute, sharding) and
the rules of Megatron-LM and DeepSpeed it must obey (:mod:`.parallel`), the layers each pipeline
stage holds (:mod:`.pipe_layers`, :mod:`.pipeline`) and the rules of TP communication overlap.

May import: :mod:`tuner.spec` and below. Never a model, the search, the loop, launchers or the CLI.
"""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.config.rules import RuleViolation, check, validate

__all__ = ["ParallelConfig", "RuleViolation", "check", "validate"]
