"""The DeepSpeed Autotuning emulation (benchmarks/anchors.py) starts where it is told: its grid's
first experiment by default, or ``first``, and then follows its cost model from there."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.anchors import Space, deepspeed  # noqa: E402
from tuner.config.parallel import ParallelConfig  # noqa: E402


def small_space() -> Space:
    """Four configs on 8 GPUs: tp 1 and 2 x micro-batch 1 and 2; the larger micro-batch at tp 1
    is the fastest, tp 2 is slower."""
    configs = {
        f"tp{tp}-mbs{m}": ParallelConfig(tp=tp, dp=8 // tp, micro_batch_size=m)
        for tp in (1, 2)
        for m in (1, 2)
    }
    step = {"tp1-mbs1": 2.0, "tp1-mbs2": 1.0, "tp2-mbs1": 4.0, "tp2-mbs2": 3.0}
    return Space(configs=configs, peak_gib=dict.fromkeys(configs, 10.0), admitted=set(configs),
                 gpu_gib=80.0, step=step)  # fmt: skip


def test_deepspeed_starts_at_its_grids_first_unless_told() -> None:
    space = small_space()
    assert deepspeed(space, random.Random(0))[0] == "tp1-mbs1"  # tp, then micro-batch, ascending
    told = deepspeed(space, random.Random(0), first="tp2-mbs2")
    assert told[0] == "tp2-mbs2"
    assert sorted(told) == sorted(space.configs)  # the early stop needs 5 runs: all 4 run
