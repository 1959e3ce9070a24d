"""The cluster probe: one short job, started by torchrun on every node, using only torch.

``python -m torch.distributed.run ... profile_job.py PLAN.json`` on each node of the profile job
(:mod:`tuner.profile.run` writes the plan and builds the launch). It measures what the time model
needs, in the spirit of nccl-tests:

- **GEMM throughput**: every rank times ``torch.matmul`` on the plan's shapes (the model's
  per-layer GEMMs per micro-batch size and TP degree) in the study's dtype; warm-up, then the
  median of the repeats. Rank 0's figures are reported (every rank runs, as in training, so a
  node's shared memory bandwidth and clocks are loaded as in a real step).
- **Collectives**: all-reduce, all-gather, reduce-scatter and send/recv on groups of the plan's
  sizes, placed within one node and across nodes, at several message sizes; warm-up, then the
  median of the repeats (each timed between barriers, synchronised on the GPU). Bus bandwidth is
  the algorithm bandwidth (bytes / time) times nccl-tests' factor (``PERFORMANCE.md`` of
  NVIDIA/nccl-tests: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n with the size of
  the whole gathered buffer, send/recv 1), so figures compare with nccl-tests' ``busbw``.
- **Fused attention**: ``scaled_dot_product_attention`` with the causal mask on each planned
  ``(batch, heads, seq, head_dim)``, forward alone and forward + backward (``torch.autograd.grad``,
  so nothing accumulates); FLOPs counted as the time model counts them
  (``tuner.models.time.estimate``: forward 4 x b x s^2 x heads x d / 2 for the causal half,
  backward 2.5 times that: FlashAttention's five GEMMs to the forward's two). The plan's
  ``attention_backend`` ``cudnn`` asks for cuDNN's kernels (Transformer Engine's choice on Hopper);
  where they cannot run, the default kernels run and the sample says so.
- **Kernel launches**: a chain of ``launch_ops`` multiplications of a one-element tensor that
  requires grad, then its backward (as many multiplications again), one synchronisation at the
  end: what one eager training op costs when its work is nil (PyTorch's dispatch, autograd's
  bookkeeping and, on a GPU, the kernel launch), which a step's many small kernels pay beyond
  their bytes and FLOPs.
- **Memory streaming**: every rank at once times STREAM's "Add" kernel (McCalpin's STREAM
  benchmark: ``z = x + y``, two reads and a write per element) on buffers of the plan's
  ``stream_bytes`` each, far larger than the device's last-level cache, so the figure is the
  memory bandwidth that the norms, residual adds, dropouts and softmax of a step get. All ranks
  run it together because a node's CPU ranks share one memory system (a GPU's HBM is its own).

Rank 0 prints ``TUNER_PROFILE_PROGRESS <done> <total>`` lines while it works and one
``TUNER_PROFILE_RESULT <json>`` line at the end; nothing else is parsed. No tuner import: the nodes
need torch only.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

PROGRESS = "TUNER_PROFILE_PROGRESS"
RESULT = "TUNER_PROFILE_RESULT"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests PERFORMANCE.md: busbw = algbw * factor(n)."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # send/recv


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Any, device: torch.device, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    _sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return samples


def gemm(shape: dict[str, Any], dtype: torch.dtype, device: torch.device,
         warmup: int, repeats: int) -> dict[str, Any]:  # fmt: skip
    """Times ``[m, k] @ [k, n]``; 2mkn FLOPs per product."""
    m, k, n = int(shape["m"]), int(shape["k"]), int(shape["n"])
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    samples = _median_time(lambda: torch.matmul(a, b), device, warmup, repeats)
    median = statistics.median(samples)
    return {**shape, "samples_s": samples, "median_s": median,
            "tflops": 2.0 * m * k * n / median / 1e12}  # fmt: skip


def stream(nbytes: int, dtype: torch.dtype, device: torch.device,
           warmup: int, repeats: int) -> dict[str, Any]:  # fmt: skip
    """Times ``torch.add(x, y, out=z)`` on ``nbytes``-byte buffers: 3 x ``nbytes`` moved."""
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = max(int(nbytes) // elem, 1)
    x = torch.ones(numel, dtype=dtype, device=device)
    y = torch.ones(numel, dtype=dtype, device=device)
    z = torch.empty_like(x)
    samples = _median_time(lambda: torch.add(x, y, out=z), device, warmup, repeats)
    median = statistics.median(samples)
    moved = 3 * numel * elem
    return {"bytes": moved, "samples_s": samples, "median_s": median,
            "gbps": moved / median / 1e9}  # fmt: skip


FLASH_BACKWARD_RATIO = (
    2.5  # tuner.models.rates.FLASH_BACKWARD_RATIO (no tuner import on the nodes)
)


def _sdpa_context(backend: str) -> tuple[Any, str]:
    """A context manager that restricts SDPA to ``backend``'s kernels, and the name that ran."""
    import contextlib

    if backend == "cudnn":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            return sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), "cudnn"
        except (ImportError, AttributeError):  # a torch without cuDNN attention
            pass
    return contextlib.nullcontext(), "default"


def attention(shape: dict[str, Any], dtype: torch.dtype, device: torch.device, backend: str,
              warmup: int, repeats: int) -> dict[str, Any] | None:  # fmt: skip
    """Times causal fused attention forward, and forward + backward, on one planned shape; None
    when its tensors do not fit the device (that shape's config could not train either)."""
    try:
        return _attention(shape, dtype, device, backend, warmup, repeats)
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return None


def _attention(shape: dict[str, Any], dtype: torch.dtype, device: torch.device, backend: str,
               warmup: int, repeats: int) -> dict[str, Any]:  # fmt: skip
    import torch.nn.functional as F

    b, n, s, d = (int(shape[k]) for k in ("batch", "heads", "seq", "head_dim"))
    q, k, v = (torch.randn(b, n, s, d, device=device).to(dtype).requires_grad_() for _ in "qkv")
    grad = torch.randn(b, n, s, d, device=device).to(dtype)

    def forward() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both() -> Any:
        return torch.autograd.grad(forward(), (q, k, v), grad)

    def timed() -> tuple[list[float], list[float]]:
        return (_median_time(forward, device, warmup, repeats),
                _median_time(both, device, warmup, repeats))  # fmt: skip

    context, ran = _sdpa_context(backend)
    try:
        with context:
            fwd, fb = timed()
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:  # no cuDNN kernel for this shape or GPU: the default ones
        ran = "default"
        fwd, fb = timed()
    flops = 0.5 * 4.0 * b * s * s * n * d
    f, fwd_bwd = statistics.median(fwd), statistics.median(fb)
    bwd = max(fwd_bwd - f, 1e-9)
    return {**shape, "backend": ran, "forward_samples_s": fwd, "forward_backward_samples_s": fb,
            "forward_s": f, "backward_s": bwd, "forward_tflops": flops / f / 1e12,
            "backward_tflops": FLASH_BACKWARD_RATIO * flops / bwd / 1e12}  # fmt: skip


def launch(ops: int, dtype: torch.dtype, device: torch.device,
           warmup: int, repeats: int) -> dict[str, Any]:  # fmt: skip
    """Times ``ops`` multiplications of a one-element tensor with autograd, forward then backward
    (``2 * ops`` ops in all); seconds per op."""
    x = torch.ones(1, dtype=dtype, device=device, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(ops):
            y = y * 1.0
        torch.autograd.grad(y, x, torch.ones_like(y))  # each MulBackward: one kernel apiece

    samples = _median_time(chain, device, warmup, repeats)
    median = statistics.median(samples)
    return {"ops": 2 * ops, "samples_s": samples, "median_s": median,
            "per_op_s": median / (2 * ops)}  # fmt: skip


def _collective(op: str, group: Any, ranks: list[int], numel: int, dtype: torch.dtype,
                device: torch.device) -> Any:  # fmt: skip
    n = len(ranks)
    me = dist.get_rank()
    if op == "all_reduce":
        x = torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":  # numel: the whole gathered buffer, as nccl-tests counts it
        part = torch.ones(numel // n, dtype=dtype, device=device)
        out = torch.empty(part.numel() * n, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(out, part, group=group)
    if op == "reduce_scatter":
        full = torch.ones(numel // n * n, dtype=dtype, device=device)
        out = torch.empty(numel // n, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, full, group=group)
    if op == "all_to_all":  # numel: each rank's whole buffer, (n - 1) / n of it sent
        x, y = (torch.ones(numel // n * n, dtype=dtype, device=device) for _ in range(2))
        return lambda: dist.all_to_all_single(y, x, group=group)
    x = torch.ones(numel, dtype=dtype, device=device)  # send_recv: ranks[0] -> ranks[1]
    if me == ranks[0]:
        return lambda: dist.send(x, ranks[1], group=group)
    return lambda: dist.recv(x, ranks[0], group=group)


def collectives(plan: dict[str, Any], dtype: torch.dtype, device: torch.device,
                progress: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Every (op, group, size) of the plan; all ranks create every group, in the same order."""
    out = []
    me = dist.get_rank()
    elem = torch.tensor([], dtype=dtype).element_size()
    for entry in plan["groups"]:
        ranks = [int(r) for r in entry["ranks"]]
        group = dist.new_group(ranks)
        for op in entry["ops"]:
            for nbytes in plan["message_bytes"]:
                numel = max(int(nbytes) // elem // len(ranks) * len(ranks), len(ranks))
                samples: list[float] = []
                if me in ranks:
                    fn = _collective(op, group, ranks, numel, dtype, device)
                    for i in range(plan["warmup"] + plan["repeats"]):
                        dist.barrier(group=group)
                        _sync(device)
                        t0 = time.perf_counter()
                        fn()
                        _sync(device)
                        if i >= plan["warmup"]:
                            samples.append(time.perf_counter() - t0)
                dist.barrier()
                progress()
                if me != ranks[0]:
                    continue
                median = statistics.median(samples)
                size = numel * elem
                busbw = size / median * bus_factor(op, len(ranks))
                out.append({"op": op, "link": entry["link"], "group_size": len(ranks),
                            "ranks": ranks, "bytes": size, "samples_s": samples,
                            "median_s": median, "busbw_gbps": busbw / 1e9})  # fmt: skip
    return out


def _gather_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows measured by each group's first rank, collected on rank 0."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rows)
    return [row for part in everyone for row in part]


def versions(device: torch.device, backend: str) -> dict[str, Any]:
    """Software and hardware of this node, as the profile records them."""
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "backend": backend}  # fmt: skip
    if device.type == "cuda":
        info["cuda"] = torch.version.cuda
        nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        info["gpu_name"] = torch.cuda.get_device_name(device)
        # the lazy-loading switch as this process ran with it: the launch's, or the one torch
        # (1.13 on) sets when it is unset (pytorch/pytorch#86509); unset: the CUDA default
        if os.environ.get("CUDA_MODULE_LOADING"):
            info["module_loading"] = os.environ["CUDA_MODULE_LOADING"]
        try:  # the kernel module's version line; no NVML binding needed
            with open("/proc/driver/nvidia/version") as f:
                info["driver"] = f.readline().split("Kernel Module")[-1].split()[0]
        except (OSError, IndexError):
            info["driver"] = None
    else:
        info["gpu_name"] = "cpu"
        info["cpu"] = platform.processor() or platform.machine()
    return info


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        plan = json.load(f)
    cuda = torch.cuda.is_available() and plan.get("device", "cuda") == "cuda"
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    me = dist.get_rank()
    dtype = DTYPES[plan["dtype"]] if cuda else torch.float32  # CPU GEMMs: fp32
    total = (
        len(plan["gemms"])
        + len(plan.get("attention", ()))
        + 2
        + sum(len(g["ops"]) * len(plan["message_bytes"]) for g in plan["groups"])
    )
    done = [0]

    def progress() -> None:
        done[0] += 1
        if me == 0:
            print(f"{PROGRESS} {done[0]} {total}", flush=True)

    gemms = []
    for shape in plan["gemms"]:
        gemms.append(gemm(shape, dtype, device, plan["warmup"], plan["repeats"]))
        progress()
    attn = []
    for shape in plan.get("attention", ()):
        row = attention(shape, dtype, device, plan.get("attention_backend", "default"),
                        plan["warmup"], plan["repeats"])  # fmt: skip
        if row is not None:  # out of memory: left out, the others still measured
            attn.append(row)
        progress()
    dist.barrier()  # every rank streams at once (shared memory on CPU nodes)
    memory = stream(plan["stream_bytes"], dtype, device, plan["warmup"], plan["repeats"])
    progress()
    ops = launch(int(plan.get("launch_ops", 1000)), dtype, device, plan["warmup"], plan["repeats"])
    progress()
    dist.barrier()
    rows = _gather_rows(collectives(plan, dtype, device, progress))
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    if me == 0:
        result = {"versions": versions(device, backend), "dtype": str(dtype).split(".")[-1],
                  "world_size": dist.get_world_size(), "hosts": len(set(hosts)),
                  "gemm": gemms, "attention": attn, "stream": memory, "launch": ops,
                  "collectives": rows}  # fmt: skip
        print(f"{RESULT} {json.dumps(result)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
