"""Per-call collective trace of the DeepSpeed workload's ranks, for ``benchmarks/moe_skew.py``.

Put this folder on ``PYTHONPATH`` with ``TUNER_COLLECTIVE_TRACE=<folder>`` set: every process
whose script is ``gpt_deepspeed.py`` then writes ``<folder>/rank<R>-<pid>.txt``, one line per
collective call (``torch.distributed.all_to_all_single``, ``all_reduce``, ``barrier`` and the
ZeRO collectives) and per timed step (``gpt_deepspeed_train.one_step``)::

    c <op> <enter_ns> <exit_ns> <bytes>
    s <ep> <micro_batch> <grad_accum> <layers> <iter> <start_ns> <end_ns>

Times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every process of the
machine), so the ranks' entries into one collective can be compared: the later one is the
collective's own time, the earlier one waited the difference (the ranks' skew). Each line is
written as it happens (the workload leaves by ``os._exit``, without flushing at exit). Nothing
is loaded in any other process, nor without the variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from typing import Any

_FOLDER = os.environ.get("TUNER_COLLECTIVE_TRACE", "")
_OPS = (
    "all_to_all_single",
    "all_reduce",
    "barrier",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "reduce",
)


def _nbytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    for a in (*args, *kwargs.values()):
        if hasattr(a, "element_size") and hasattr(a, "numel"):
            return int(a.element_size() * a.numel())
    return 0


def _patch_dist(out: Any) -> None:
    import torch.distributed as dist

    for name in _OPS:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def traced(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            enter = time.monotonic_ns()
            result = _real(*args, **kwargs)
            out.write(f"c {_name} {enter} {time.monotonic_ns()} {_nbytes(args, kwargs)}\n")
            return result

        setattr(dist, name, traced)


def _patch_train(module: Any, out: Any) -> None:
    real = module.one_step

    def one_step(s: Any, step: int) -> None:
        start = time.monotonic_ns()
        real(s, step)
        moe = s.shape.moe
        out.write(
            f"s {moe.ep_size if moe else 0} {s.plan.micro_batch} {s.plan.grad_accum} "
            f"{s.shape.num_layers} {step} {start} {time.monotonic_ns()}\n"
        )

    module.one_step = one_step


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps ``gpt_deepspeed_train.one_step`` right after that module runs (before
    ``gpt_deepspeed`` imports the name)."""

    def __init__(self, out: Any) -> None:
        self.out = out

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "gpt_deepspeed_train":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, out = spec.loader, self.out
        real_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            _patch_train(module, out)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _FOLDER and sys.argv and sys.argv[0].endswith("gpt_deepspeed.py"):
    _out = open(  # noqa: SIM115  (kept open for the process's life, line-buffered)
        os.path.join(_FOLDER, f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.txt"), "a",
        buffering=1)  # fmt: skip
    _patch_dist(_out)
    sys.meta_path.insert(0, _Finder(_out))
