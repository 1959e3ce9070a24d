"""tuner.space.trials.SplitIndex: an OOM config compared with the configs of its own split
only gives the comparison with every config."""

from __future__ import annotations

import itertools

from tuner.config.parallel import ParallelConfig
from tuner.space.trials import SplitIndex, memory_split, oom_dominates

CONFIGS = [
    ParallelConfig(
        tp=tp,
        pp=pp,
        dp=8 // (tp * pp),
        vp=vp,
        sequence_parallel=sp and tp > 1,
        micro_batch_size=mbs,
        global_batch_size=64,
        recompute=rc,
        distributed_optimizer=do,
    )  # fmt: skip
    for tp, pp, vp, sp, mbs, rc, do in itertools.product(
        (1, 2),
        (1, 2),
        (1, 2),
        (False, True),
        (1, 2, 4),
        ("none", "selective", "full"),
        (False, True),
    )
    if vp == 1 or pp > 1
]


def test_dominated_is_every_config_compared() -> None:
    index = SplitIndex(CONFIGS)
    hits = 0
    for oom in CONFIGS:
        plain = [i for i, c in enumerate(CONFIGS) if oom_dominates(oom, c)]
        assert index.dominated(oom) == plain
        hits += len(plain)
    assert len({memory_split(c) for c in CONFIGS}) > 8  # splits of several sizes were compared
    assert len(CONFIGS) < hits < len(CONFIGS) ** 2 / 4  # neither only itself nor everything
