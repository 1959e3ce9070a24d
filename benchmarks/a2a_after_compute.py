"""A two-rank gloo all-to-all timed as the cluster profile times it and as a training step does.

    python benchmarks/a2a_after_compute.py [--calls 60] [--kib 128] [--work-ms 6]

``barrier``: a barrier, then the call (``tuner.profile.job.collectives``: what the profile's
all-to-all line is fitted to). ``after compute``: each rank runs the same fixed work (small
matmuls, about ``--work-ms`` on an idle core) and then enters the call with no barrier, as the
ranks of an expert-parallel step enter DeepSpeed-MoE's dispatch and combine (``_AllToAll``,
deepspeed/moe/sharded_moe.py). Each call's entry and exit on both ranks (one clock,
``time.monotonic_ns``) give its *own* time (the later rank's time inside it) and the *wait*
(the difference of the arrivals). gloo's TCP transport sends an unbound buffer only once the
peer has said it is ready to receive (``handleRemotePendingRecv``, gloo/transport/tcp/pair.cc),
so the exchange needs both ranks' threads running: on a machine whose cores other work shares,
a rank that slept in the call waits to be scheduled again. CPU ranks, torch's gloo backend.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any


def _work(n: int, a: Any, b: Any) -> None:
    for _ in range(n):
        a @ b


def _rank(rank: int, args: argparse.Namespace, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    numel = args.kib * 1024 // 4 // 2 * 2
    x, y = torch.ones(numel), torch.empty(numel)
    a, b = torch.randn(128, 128), torch.randn(128, 512)
    t0 = time.perf_counter()
    _work(200, a, b)
    per = (time.perf_counter() - t0) / 200
    n = torch.tensor([max(1, round(args.work_ms / 1e3 / per))])
    dist.all_reduce(n, op=dist.ReduceOp.MIN)  # both ranks run the same work
    found: dict[str, list[tuple[int, int]]] = {"barrier": [], "after compute": []}
    for _ in range(5):
        dist.all_to_all_single(y, x)
    for mode in found:
        for _ in range(args.calls):
            if mode == "barrier":
                dist.barrier()
            else:
                _work(int(n), a, b)
            enter = time.monotonic_ns()
            dist.all_to_all_single(y, x)
            found[mode].append((enter, time.monotonic_ns()))
        dist.barrier()
    everyone: list[Any] = [None, None]
    dist.all_gather_object(everyone, found)
    if rank == 0:
        out.put((everyone, int(n) * per * 1e3))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--kib", type=int, default=128, help="each rank's buffer (the demo's: 128-256)")
    p.add_argument("--work-ms", type=float, default=6.0)
    p.add_argument("--port", type=int, default=29871)
    args = p.parse_args(argv)
    import torch.multiprocessing as mp  # after the parse: --help needs no torch

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args, args.port, queue)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    everyone, work_ms = queue.get()
    for proc in procs:
        proc.join()
    print(f"all_to_all_single, 2 gloo ranks, {args.kib} KiB each, {args.calls} calls per mode; "
          f"work between calls {work_ms:.1f} ms (idle-core estimate); load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'mode':<14} {'own med':>8} {'own mean':>8} {'wait med':>8} {'wait mean':>9}  (ms)")
    for mode in everyone[0]:
        own, wait = [], []
        for (e0, x0), (e1, x1) in zip(everyone[0][mode], everyone[1][mode], strict=True):
            late = (e0, x0) if e0 >= e1 else (e1, x1)
            own.append((late[1] - late[0]) / 1e6)
            wait.append(abs(e0 - e1) / 1e6)
        print(f"{mode:<14} {statistics.median(own):8.3f} {statistics.fmean(own):8.3f} "
              f"{statistics.median(wait):8.3f} {statistics.fmean(wait):9.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
