"""The caching-allocator model's rules (PyTorch CUDACachingAllocator constants), worked by hand."""

from __future__ import annotations

from tuner.models.memory.allocator import (
    MIB,
    StepTensors,
    reserved_bytes,
    round_size,
    segment_size,
)


def test_rounding_and_segment_sizes() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(round_size(0.5 * MIB)) == 2 * MIB  # small pool: 2 MiB segments
    assert segment_size(round_size(3 * MIB)) == 20 * MIB  # 1-10 MiB: 20 MiB segments
    assert segment_size(round_size(11 * MIB)) == 12 * MIB  # >= 10 MiB: rounded to 2 MiB


def test_step_tensors_larger_than_freed_activation_blocks_get_new_segments() -> None:
    # 8 freed 64 MiB activation blocks cannot hold a 256 MiB step temporary: a new segment.
    big = StepTensors(resident=(), lazy=(), fwd_bwd=((64 * MIB, 8),), step=((256 * MIB, 1),))
    assert reserved_bytes(big).total == (8 * 64 + 256) * MIB
    # A 32 MiB temporary is carved out of one freed block: the cache does not grow.
    small = StepTensors(resident=(), lazy=(), fwd_bwd=((64 * MIB, 8),), step=((32 * MIB, 1),))
    assert reserved_bytes(small).total == 8 * 64 * MIB


def test_three_mib_tensors_share_a_twenty_mib_segment() -> None:
    t = StepTensors(resident=((3 * MIB, 6),), lazy=(), fwd_bwd=(), step=())
    assert reserved_bytes(t).total == 20 * MIB  # 6 x 3 MiB = 18 MiB split from one segment
