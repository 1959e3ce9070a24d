"""How long one call of the step-time and memory models takes, per config.

    python benchmarks/model_speed.py [--repeat 20]

A 70B-class GPT (80 layers, h 8192, 64 heads, 8 query groups, SwiGLU) on 512 H100s, global batch
1024, over 64 configs (TP x PP x micro-batch x recompute). Prints the mean microseconds per call of
``estimate_time`` and ``estimate_memory`` after one untimed pass. The figure used to be a timed
assertion in the tests (100 us per ``estimate_time`` call, ~10 us measured on an idle machine);
timings belong here, where a loaded machine only makes a printed number larger.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.catalog import get_gpu  # noqa: E402
from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.models.memory.estimate import estimate_memory  # noqa: E402
from tuner.models.time.estimate import estimate_time  # noqa: E402
from tuner.spec.study import ModelSpec, TrainingSpec  # noqa: E402

H100 = get_gpu("h100-sxm-80gb")
MODEL = ModelSpec(
    num_layers=80,
    hidden_size=8192,
    ffn_hidden_size=4 * 8192,
    num_attention_heads=64,
    num_query_groups=8,
    swiglu=True,
    vocab_size=51200,
    seq_length=2048,
)
TRAINING = TrainingSpec(global_batch_size=1024)
CONFIGS = [
    ParallelConfig(
        tp=tp, pp=pp, dp=512 // (tp * pp), micro_batch_size=b, global_batch_size=1024, recompute=rc
    )
    for tp in (1, 2, 4, 8)
    for pp in (1, 2, 4, 8)
    for b in (1, 2)
    for rc in ("none", "selective")
]


def per_call_us(call: Callable[[ParallelConfig], object], repeat: int) -> float:
    """Mean microseconds per call over ``repeat`` passes of every config, after one warm pass."""
    for c in CONFIGS:
        call(c)
    start = time.perf_counter()
    for _ in range(repeat):
        for c in CONFIGS:
            call(c)
    return (time.perf_counter() - start) / (repeat * len(CONFIGS)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rows = {
        "estimate_time": per_call_us(
            lambda c: estimate_time(MODEL, TRAINING, c, H100, 8).step, args.repeat
        ),
        # ``.peak`` forces the per-stage breakdown, which is computed when first read.
        "estimate_memory": per_call_us(
            lambda c: estimate_memory(MODEL, c, H100).peak, args.repeat
        ),
    }
    for name, us in rows.items():
        print(f"{name:16s} {us:9.1f} us per call ({len(CONFIGS)} configs x {args.repeat})")


if __name__ == "__main__":
    main()
