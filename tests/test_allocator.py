"""The caching-allocator model's rules (PyTorch CUDACachingAllocator constants), worked by hand."""

from __future__ import annotations

import random

import pytest

from tuner.models.memory.allocator import (
    MIB,
    NO_TENSORS,
    Reserved,
    StepTensors,
    Tensors,
    extended_sums,
    group_sums,
    reserved_bounds,
    reserved_bytes,
    round_size,
    segment_size,
    segments_at_most,
    total_per_request,
)
from tuner.models.memory.estimate import stage_plans
from tuner.space.enumerate import iter_configs, study_gpu, study_violations
from tuner.spec.file import load_study


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


# ----------------------------------------------------------------------------- the simulation
# against a plain one: the allocator's rules request by request, no run of requests served at
# once, nothing shared between simulations (what reserved_bytes computes faster)


def _plain_serve(free: list[dict[int, int]], tensors: Tensors) -> list[tuple[int, int]]:
    """Allocate ``tensors`` request by request from ``free`` (per pool [large, small]: block
    size -> free blocks of it; changed in place), best fit; the new segments (pool, bytes)."""
    new: list[tuple[int, int]] = []
    for size, count in tensors:
        r = round_size(size)
        small = int(r <= MIB)
        pool = free[small]
        for _ in range(count):
            fits = [b for b in pool if b >= r]
            if fits:
                block = min(fits)
                pool[block] -= 1
                if not pool[block]:
                    del pool[block]
            else:
                block = segment_size(r)
                new.append((small, block))
            rest = block - r
            if (rest >= 512) if small else (rest > MIB):  # should_split
                pool[rest] = pool.get(rest, 0) + 1
    return new


def _plain_reserved(t: StepTensors) -> Reserved:
    free: list[dict[int, int]] = [{}, {}]

    def keep(tensors: Tensors) -> int:
        return sum(seg for _, seg in _plain_serve(free, tensors))

    def transient(tensors: Tensors) -> int:  # freed at the phase's end: new segments whole
        before = [dict(pool) for pool in free]
        new = _plain_serve(free, tensors)
        free[:] = before
        for small, seg in new:
            free[small][seg] = free[small].get(seg, 0) + 1
        return sum(seg for _, seg in new)

    states = keep(t.resident)
    with_moments = states + transient(t.fwd_bwd) + keep(t.lazy)
    first_step = transient(t.step)
    second_fwd = transient(t.fwd_bwd)
    total = with_moments + first_step + second_fwd + transient(t.step)
    free[:] = [{}, {}]
    alone = keep(t.lazy) + keep(t.step)
    return Reserved(float(total), float(with_moments + second_fwd), float(states + alone))


def _random_tensors(rng: random.Random) -> Tensors:
    """A few request sizes of each pool and segment rule (small, 1-10 MiB, large), counts from
    1 to 40, some sizes repeated."""
    sizes = [rng.uniform(0, MIB), rng.uniform(MIB, 10 * MIB), rng.uniform(10 * MIB, 300 * MIB),
             rng.choice([2 * MIB, 3 * MIB, 16 * MIB, 0.0])]  # fmt: skip
    return tuple((rng.choice(sizes), rng.randint(1, 40)) for _ in range(rng.randint(0, 8)))


def test_the_simulation_is_the_plain_one_on_random_steps() -> None:
    rng = random.Random(36)
    for _ in range(400):
        t = StepTensors(*(_random_tensors(rng) for _ in range(4)))
        assert reserved_bytes.__wrapped__(t) == _plain_reserved(t)


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b"])
def test_the_simulation_is_the_plain_one_on_every_stage_of_a_study(name: str) -> None:
    spec = load_study(name)
    gpu = study_gpu(spec)
    seen: set[StepTensors] = set()
    for config in list(iter_configs(spec))[::3]:
        if study_violations(config, spec):
            continue
        plans = stage_plans(spec.model, config, gpu, spec.framework, spec.training.precision)
        seen.update(tensors for _, tensors in plans)
    assert len(seen) > 100
    for t in seen:
        assert reserved_bytes.__wrapped__(t) == _plain_reserved(t)


# ----------------------------------------------------------------------------- the bounds


def test_one_call_makes_at_most_its_segments_bound_from_any_cache() -> None:
    """``segments_at_most`` holds every request-by-request call from a random cache, and a
    call on an empty pool makes exactly that many (the bound is reached)."""
    rng = random.Random(3636)
    reached = 0
    for _ in range(2000):
        free: list[dict[int, int]] = [{}, {}]
        _plain_serve(free, _random_tensors(rng))  # a random cache: some free blocks
        size, count = rng.choice(_random_tensors(rng) or ((rng.uniform(0, MIB), 3),))
        r = round_size(size)
        seg = segment_size(r)
        new = _plain_serve(free, ((size, count),))
        assert len(new) <= segments_at_most(count, r, seg)
        assert all(s == seg for _, s in new)
        fresh = _plain_serve([{}, {}], ((size, count),))
        assert len(fresh) == segments_at_most(count, r, seg)
        reached += len(fresh) < count  # a call whose requests share segments
    assert reached > 100


def test_the_bounds_enclose_the_simulation_on_random_steps() -> None:
    """``reserved_bounds`` per call of requests (not per request) and ``total_per_request``
    hold the plain simulation; the per-call upper bound is below the per-request one on
    steps whose small or 1-10 MiB requests share segments."""
    rng = random.Random(36)
    tighter = 0
    for _ in range(400):
        t = StepTensors(*(_random_tensors(rng) for _ in range(4)))
        low, high = reserved_bounds(t)
        exact = _plain_reserved(t)
        for field in ("total", "fwd_bwd", "step"):
            assert getattr(low, field) <= getattr(exact, field) <= getattr(high, field)
        assert high.total <= total_per_request(t)
        tighter += high.total < total_per_request(t)
    assert tighter > 200


def test_a_groups_sums_are_its_first_tensors_sums_extended_by_the_rest() -> None:
    """``extended_sums`` of a group's first tensors' sums over the rest is ``group_sums`` of the
    whole group, to the bit (what ``stage_figures`` builds a stage's sums from); the requested
    bytes are a fold from the left, as Python 3.11's ``sum``: 1e16 + 1 + 1 stays 1e16, where a
    sum of the rest first or a compensated sum gives 1e16 + 2."""
    rng = random.Random(36)
    sizes = (1e16, 1.0, 3.3, 2.0**20 + 0.5, 7 * 2.0**30 / 3)
    for _ in range(2_000):
        group = tuple(
            (rng.choice((*sizes, rng.uniform(0, 2e9))), rng.randrange(1, 64))
            for _ in range(rng.randrange(0, 10))
        )  # fmt: skip
        cut = rng.randrange(0, len(group) + 1)
        whole = group_sums(group)
        assert extended_sums(group_sums(group[:cut]), group[cut:]) == whole
        assert extended_sums(NO_TENSORS, group) == whole
    ones = ((1e16, 1), (1.0, 1), (1.0, 1))
    assert group_sums(ones)[0] == 1e16
    assert extended_sums(group_sums(ones[:1]), ones[1:])[0] == 1e16


def test_extended_sums_is_the_plain_fold() -> None:
    """``extended_sums`` from any starting sums adds what a fold written here request by
    request adds, in the same order, to the bit: the requested bytes ``size * count``, the
    rounded blocks, the per-call segments at the most (a ceiling) and one segment per request
    (``group_sums`` is that fold from nothing, so this is its definition too)."""
    rng = random.Random(3636)
    sizes = (1e16, 1.0, 3.3, 2.0**20 + 0.5, 7 * 2.0**30 / 3, 512.0, 10 * 2.0**20)
    for _ in range(2_000):
        group = tuple(
            (rng.choice((*sizes, rng.uniform(0, 2e9))), rng.randrange(1, 64))
            for _ in range(rng.randrange(0, 10))
        )  # fmt: skip
        start = (rng.uniform(0, 1e10), rng.randrange(0, 1 << 40), rng.randrange(0, 1 << 40),
                 rng.randrange(0, 1 << 40))  # fmt: skip
        requested, least, most, each = start
        for size, count in group:
            r = round_size(size)
            seg = segment_size(r)
            requested += size * count
            least += r * count
            most += seg * -(-count // (seg // r))
            each += seg * count
        assert extended_sums(start, group) == (requested, least, most, each)
