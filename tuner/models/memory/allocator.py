"""PyTorch's CUDA caching allocator, reduced to what sets its reserved bytes in a training step.

Rules (pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp``; the constants now live in
``c10/core/AllocatorConfig.h``):

- every request is rounded up to ``kMinBlockSize`` (512 B);
- requests up to ``kSmallSize`` (1 MiB) come from the small pool, whose segments are
  ``kSmallBuffer`` (2 MiB); larger ones from the large pool, where a new segment (one
  ``cudaMalloc``) is ``kLargeBuffer`` (20 MiB) for requests under ``kMinLargeAlloc`` (10 MiB), else
  the request rounded up to ``kRoundLarge`` (2 MiB) (``get_allocation_size``);
- a request takes the smallest cached free block of its pool that holds it (best fit,
  ``get_free_block``) and splits off the rest when the rest is over ``kSmallSize`` in the large
  pool, at least ``kMinBlockSize`` in the small one (``should_split``; ``max_split_size`` is
  unlimited by default);
- a freed block merges only with free neighbours of its own segment (``try_merge_blocks``);
  segments are never merged, and never returned unless ``empty_cache`` or a failed ``cudaMalloc``
  releases whole free segments.

So the reserved peak is the largest set of segments a step ever needs at once: the first
iteration's forward/backward creates one segment per large tensor (nothing is cached yet); the
first optimizer step then needs segments for what cannot be carved out of those freed blocks
(Adam creates its moments there: torch.optim.Adam and apex / DeepSpeed FusedAdam initialise their
state lazily, in the first ``step``); later iterations reuse the cache. The simulation works per
phase: inside a phase all its tensors are live together at the phase's peak (the model's peak
set), at its end they are freed and each segment merges back to its state before the phase.
"""

from __future__ import annotations

import bisect
import functools
from bisect import bisect_left, insort
from dataclasses import dataclass

MIB = 2**20
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = MIB  # kSmallSize
SMALL_BUFFER = 2 * MIB  # kSmallBuffer
LARGE_BUFFER = 20 * MIB  # kLargeBuffer
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge

# (bytes per tensor, number of such tensors), in allocation order.
Tensors = tuple[tuple[float, int], ...]


@dataclass(frozen=True, slots=True)
class StepTensors:
    """One rank's tensors in a training step, grouped by lifetime."""

    resident: Tensors  # allocated before the first step, live throughout (weights, grads, master)
    lazy: Tensors  # created by the first optimizer step and kept (Adam moments)
    fwd_bwd: Tensors  # live together at the forward/backward peak, freed by its end
    step: Tensors  # the optimizer step's temporaries


@dataclass(frozen=True, slots=True)
class Reserved:
    """Reserved bytes (``torch.cuda.memory_reserved``) of a step's steady state."""

    total: float  # the cache's peak: every segment the step ever needed (it never shrinks)
    fwd_bwd: float  # the segments the forward/backward's own tensors need
    step: float  # the segments the step's own tensors need beside the states


def round_size(size: float) -> int:
    """The block size a request of ``size`` bytes takes (``round_size``)."""
    n = max(int(-(-size // 1)), 1)
    return -(-n // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment a new ``cudaMalloc`` makes for a rounded request (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Pool:
    """Free blocks of one pool: a multiset of sizes with its sizes kept sorted (best fit)."""

    __slots__ = ("count", "sizes")

    def __init__(self, count: dict[int, int] | None = None) -> None:
        self.count: dict[int, int] = dict(count or {})
        self.sizes: list[int] = sorted(self.count)

    def copy(self) -> _Pool:
        out = _Pool.__new__(_Pool)  # the sizes are sorted already: no sort again
        out.count, out.sizes = dict(self.count), list(self.sizes)
        return out

    def add(self, size: int, n: int) -> None:
        if size in self.count:
            self.count[size] += n
        else:
            self.count[size] = n
            bisect.insort(self.sizes, size)

    def take(self, size: int, n: int) -> None:
        left = self.count[size] - n
        if left:
            self.count[size] = left
        else:
            del self.count[size]
            del self.sizes[bisect.bisect_left(self.sizes, size)]

    def best_fit(self, size: int) -> int | None:
        i = bisect.bisect_left(self.sizes, size)
        return self.sizes[i] if i < len(self.sizes) else None


class _Cache:
    """Free blocks per pool, and the reserved total."""

    def __init__(self) -> None:
        self.free: list[_Pool] = [_Pool(), _Pool()]  # [large pool, small pool]
        self.reserved = 0

    @classmethod
    def after(cls, resident: Tensors) -> _Cache:
        """A fresh cache once ``resident`` is kept (:func:`_kept`, a copy of its state)."""
        cache = cls()
        cache.reserved, pools = _kept(resident)
        cache.free = [_Pool(dict(blocks)) for blocks in pools]
        return cache

    def snapshot(self) -> list[_Pool]:
        return [pool.copy() for pool in self.free]

    def alloc(self, size: float, count: int, new: list[tuple[int, int, int]]) -> None:
        """Serve ``count`` requests of ``size``; new segments are appended to ``new``.

        The rest of a block splits off when it is at least ``MIN_BLOCK`` in the small pool,
        over ``SMALL_SIZE`` in the large one (``should_split``; block sizes are whole bytes, so
        that is ``rest >= least``)."""
        r, seg = _block(size)
        small = r <= SMALL_SIZE
        pool = self.free[small]
        cnt, sizes = pool.count, pool.sizes  # the pool's own, changed in place (take / add)
        least = MIN_BLOCK if small else SMALL_SIZE + 1
        # a block at least r + floor splits again after serving r (floor: max(r, least))
        floor = r if r > least else least
        # (builtin min / max calls and len() are a fifth of a simulation's cost: the loop
        # takes about six turns per call, so it compares inline and finds "no block" by the
        # index past the end)
        while count > 0:
            i = bisect_left(sizes, r)  # best fit: the smallest free block that holds r
            try:
                block = sizes[i]
            except IndexError:
                # None: new segments serve every request left. A fresh segment is split while
                # its rest holds another request, so it serves seg // r of them before the
                # next is made (the rests it leaves are smaller than r, no fit for the rest of
                # this call's requests), and the last may serve fewer, leaving its rest free.
                per = seg // r
                whole, last = divmod(count, per)
                if whole:
                    self.reserved += whole * seg
                    new.append((int(small), seg, whole))
                    if seg - per * r >= least:
                        pool.add(seg - per * r, whole)
                if last:
                    self.reserved += seg
                    new.append((int(small), seg, 1))
                    pool.add(seg - last * r, 1)  # at least r: it holds another request
                return
            rest = block - r
            left = cnt[block]
            if rest >= floor:
                # Split again and again: each remainder is the next best fit (nothing free lies
                # between r and the block), so serve the whole run of splits at once: the one
                # block is taken and what the run leaves goes back.
                n = (block - floor) // r  # at most count of them
                if n > count:
                    n = count
                take, rest = 1, block - n * r
            else:  # each block taken whole, its rest split off
                n = take = count if count < left else left  # min(count, left)
            if left > take:  # _Pool.take(block, take), inline
                cnt[block] = left - take
            else:
                del cnt[block]
                del sizes[i]
            if rest >= least:  # _Pool.add(rest, take), inline
                if rest in cnt:
                    cnt[rest] += take
                else:
                    cnt[rest] = take
                    insort(sizes, rest)
            count -= n

    def transient(self, tensors: Tensors) -> None:
        """Allocate ``tensors`` together, then free them: every segment merges back."""
        before = self.snapshot()
        new: list[tuple[int, int, int]] = []
        for size, count in tensors:
            self.alloc(size, count, new)
        self.free = before
        for small, seg, n in new:
            self.free[small].add(seg, n)

    def keep(self, tensors: Tensors) -> None:
        """Allocate ``tensors`` for good."""
        new: list[tuple[int, int, int]] = []
        for size, count in tensors:
            self.alloc(size, count, new)


GroupSums = tuple[float, int, int, int]
""":func:`group_sums`' four figures of one group of tensors."""
NO_TENSORS: GroupSums = (0, 0, 0, 0)
""":func:`group_sums` of no tensors."""


@functools.lru_cache(maxsize=1 << 16)
def group_sums(tensors: Tensors) -> GroupSums:
    """(bytes of ``tensors`` as requested; bytes of the blocks they take at the least: each
    request rounded; bytes of the segments they can make at the most: ``ceil(n / (seg //
    r))`` new segments for a call of ``n`` requests of block ``r`` and segment ``seg``
    (:func:`segments_at_most`); the same at one new segment per request, the looser figure
    ``bound.stage_envelope`` reads). Cached, one lookup for the four: the same groups of
    tensors recur across the stages and configs of a space (configs that differ in knobs a
    group does not depend on), and a tuple hashes faster than it sums."""
    return extended_sums(NO_TENSORS, tensors)


def extended_sums(sums: GroupSums, tensors: Tensors) -> GroupSums:
    """:func:`group_sums` of a group whose first tensors have ``sums`` and whose last are
    ``tensors``: each figure a fold from the left, request by request, so a group's sums are
    its first part's extended by the rest, to the bit (the requested bytes are floats, summed
    in order: Python 3.11's ``sum``; 3.12's compensates, which no prefix can carry on)."""
    requested, least, most, each = sums
    for size, count in tensors:
        r, seg = _block(size)
        requested += size * count
        least += r * count
        most += seg * segments_at_most(count, r, seg)
        each += seg * count
    return requested, least, most, each


Sums = tuple[GroupSums, ...]
""":func:`group_sums` of a :class:`StepTensors`' four groups (resident, lazy, fwd_bwd, step)."""


def step_sums(t: StepTensors) -> Sums:
    """:func:`group_sums` of each of ``t``'s groups, in field order."""
    return group_sums(t.resident), group_sums(t.lazy), group_sums(t.fwd_bwd), group_sums(t.step)


def segments_at_most(count: int, r: int, seg: int) -> int:
    """New segments one ``_Cache.alloc`` call of ``count`` requests of block ``r`` makes at the
    most, ``seg`` bytes each: ``ceil(count / (seg // r))``. Why: the call makes segments only
    once no free block holds ``r`` (every request before that is served from free blocks),
    and from there on it makes them for the ``n <= count`` requests left, each fresh segment
    serving ``seg // r`` of them before the next is made (it is split while its rest holds
    another request, and only this call's requests touch the pool meanwhile), the last one
    fewer: ``ceil(n / (seg // r))``, which is at most the figure for ``count``."""
    return -(-count // (seg // r))


@functools.lru_cache(maxsize=1 << 14)
def _block(size: float) -> tuple[int, int]:
    """(the block, the new segment) of one request of ``size`` bytes; tensor sizes repeat
    across the stages and configs of a space."""
    r = round_size(size)
    return r, segment_size(r)


def reserved_bounds(t: StepTensors, sums: Sums | None = None) -> tuple[Reserved, Reserved]:
    """Two :class:`Reserved`, each figure of the first at most and of the second at least
    :func:`reserved_bytes`'s, from a sum per phase (no simulation).

    Lower: every live request holds its own block of at least ``round_size`` bytes inside a
    segment, blocks do not overlap, and no segment is ever given back. So ``total`` is at least
    the blocks live at iteration 2's forward/backward peak (resident, moments, activations) and
    at its step's (resident, moments, temporaries); ``fwd_bwd`` is at least the cache once the
    moments exist, which held the resident blocks with the activations (iteration 1's peak) and
    then with the moments; ``step`` is the resident segments plus a fresh cache that holds the
    moments and temporaries together.

    Upper: a request that finds no free block makes a segment of ``segment_size``, and one
    ``alloc`` call of ``n`` requests makes at most ``ceil(n / (seg // r))`` of them
    (:func:`segments_at_most`), so a phase adds at most that per call: ``total`` at most the
    resident, moments and both iterations' activations and temporaries each in segments of
    their own; ``fwd_bwd`` is at most ``total``; ``step`` at most the resident, moments and one
    step's temporaries so. ``sums``: :func:`step_sums` of ``t``, where the caller has them.
    """
    (_, res, res_hi, _), (_, lazy, lazy_hi, _), (_, fwd, fwd_hi, _), (_, step, step_hi, _) = (
        sums or step_sums(t)
    )
    low = Reserved(float(res + lazy + max(fwd, step)), float(res + max(fwd, lazy)),
                   float(res + lazy + step))  # fmt: skip
    total = res_hi + lazy_hi + 2 * (fwd_hi + step_hi)
    return low, Reserved(float(total), float(total), float(res_hi + lazy_hi + step_hi))


def total_per_request(t: StepTensors, sums: Sums | None = None) -> float:
    """An upper bound on :func:`reserved_bytes`' ``total``, at least :func:`reserved_bounds`'
    upper one: one new segment per request (not per ``seg // r`` of a call). Its increase per
    added request of ``x`` bytes is at least ``2 * segment(x) >= 2 * x``, what
    ``bound.stage_envelope``'s monotonicity reads; the tighter figure grows in steps."""
    res, lazy, fwd, step = (each for _, _, _, each in sums or step_sums(t))
    return float(res + lazy + 2 * (fwd + step))


@functools.lru_cache(maxsize=1 << 14)
def reserved_bytes(t: StepTensors) -> Reserved:
    """The cache's peak and each phase's own share of it.

    Cached: a pure function of its (hashable, frozen) argument, and the stages of many configs
    of one space cut into the same tensors (configs that differ only in knobs the tensors do
    not depend on).

    Order: the resident states; iteration 1's forward/backward (fresh segments); its step (the
    lazy moments, kept, then the temporaries, which get new segments for what the freed
    activation blocks cannot hold); iteration 2's forward/backward and step (a third finds the
    same cache).
    """
    cache = _Cache.after(t.resident)
    states = cache.reserved
    cache.transient(t.fwd_bwd)
    cache.keep(t.lazy)  # resident from here on: charged to the states
    with_moments = cache.reserved
    cache.transient(t.step)
    first_step = cache.reserved
    cache.transient(t.fwd_bwd)
    fwd_bwd = with_moments + cache.reserved - first_step
    cache.transient(t.step)
    return Reserved(float(cache.reserved), float(fwd_bwd), float(states + _alone(t.lazy, t.step)))


@functools.lru_cache(maxsize=1 << 12)
def _kept(tensors: Tensors) -> tuple[int, tuple[tuple[tuple[int, int], ...], ...]]:
    """(reserved bytes, each pool's free blocks) of a fresh cache after keeping ``tensors``.
    Cached: a stage's resident states recur across the configs that differ only in what the
    activations read (micro-batch, recompute, ...), and the simulation is deterministic."""
    cache = _Cache()
    cache.keep(tensors)
    return cache.reserved, tuple(tuple(pool.count.items()) for pool in cache.free)


@functools.lru_cache(maxsize=1 << 12)
def _alone(lazy: Tensors, step: Tensors) -> int:
    """Reserved bytes of a fresh cache that keeps ``lazy`` and then ``step`` (cached, as
    :func:`_kept`)."""
    alone = _Cache()
    alone.keep(lazy)
    alone.keep(step)
    return alone.reserved
