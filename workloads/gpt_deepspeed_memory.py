"""Per-rank tensor accounting for the ``tuner-memory`` line: parameter, gradient, optimizer
and saved-activation bytes, each counted by storage and deduplicated (what each part holds:
the docstring of ``gpt_deepspeed_train``), and the process's resident set from /proc.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    """{storage address: bytes the tensors reference in it}, overlaps counted once.

    Views are measured, not whole storages: DeepSpeed hands out gradients as views into
    communication buckets (``reduce_bucket_size`` elements, mostly untouched), and its flat
    buffers are viewed both whole and per parameter.
    """
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        base = t.untyped_storage().data_ptr()
        if not base:
            continue
        start = t.data_ptr() - base
        extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        spans.setdefault(base, []).append((start, start + extent * t.element_size()))
    return {base: _union_length(intervals) for base, intervals in spans.items()}


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, -1
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _walk_tensors(obj: Any, depth: int = 3) -> Iterator[Any]:
    """Tensors inside nested lists, tuples and dicts (DeepSpeed's buffer containers)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0 and isinstance(obj, list | tuple):
        for item in obj:
            yield from _walk_tensors(item, depth - 1)
    elif depth > 0 and isinstance(obj, dict):
        for item in obj.values():
            yield from _walk_tensors(item, depth - 1)


def param_storages(module: Any) -> dict[int, int]:
    """Parameter bytes resident on this rank: ZeRO-3 partitions plus any full (gathered) data."""
    tensors: list[Any] = []
    for p in module.parameters():
        tensors.append(p.data)
        if hasattr(p, "ds_tensor"):
            tensors.append(p.ds_tensor)
    return _storages(tensors)


def optimizer_storages(inner: Any, params: dict[int, int]) -> dict[int, int]:
    """The torch optimizer's state plus its parameters that are not module storages."""
    state = [t for s in inner.state.values() for t in _walk_tensors(s)]
    masters = [p for g in inner.param_groups for p in g["params"]]
    out = _storages(state)
    out.update({k: v for k, v in _storages(masters).items() if k not in params})
    return out


def grad_storages(module: Any, inner: Any, wrapper: Any) -> dict[int, int]:
    """Gradient storages: .grad of module and optimizer params and the wrapper's grad buffers."""
    tensors = [p.grad for p in module.parameters()]
    tensors += [p.grad for g in inner.param_groups for p in g["params"]]
    if wrapper is not inner:
        for name, value in vars(wrapper).items():
            if "grad" in name.lower():
                tensors.extend(_walk_tensors(value))
    return _storages(tensors)


class SavedTensorMeter:
    """Peak bytes saved for backward, deduplicated by storage, parameters excluded."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.refs: dict[int, list[int]] = {}  # storage address -> [references, bytes]
        self.live = 0
        self.peak = 0

    def pack(self, t: Any) -> Any:
        key = t.untyped_storage().data_ptr()
        if not key or key in param_storages(self.module):
            return t
        entry = self.refs.setdefault(key, [0, t.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Saved(t, self, key)

    def unpack(self, packed: Any) -> Any:
        return packed.tensor if isinstance(packed, _Saved) else packed

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.refs[key]


class _Saved:
    """A saved tensor whose destruction (graph freed) lowers the meter's live count."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: Any, meter: SavedTensorMeter, key: int) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter.release(self.key)


@dataclass(slots=True)
class MemoryAccount:
    """Per-rank tensor bytes by kind, filled during the first optimizer step."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations


def rss_kib(field: str) -> int:
    """VmRSS / VmHWM of this process in KiB (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
