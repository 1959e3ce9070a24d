"""The training loop and the lines it prints.

Printed lines (besides DeepSpeed's own log, which is switched to INFO level):

- every optimizer step, from every rank::

    tuner-step: iter=N time_s=S samples_per_s=X max_allocated_gib=A max_reserved_gib=R rank=K

  (MoE runs add ``aux_loss=L`` before ``rank``: the summed ``l_aux`` of the step's last
  micro-batch, unscaled.)

  ``time_s`` is the wall clock of all micro-steps of the global batch, between two barriers;
  ``samples_per_s`` is the global batch size divided by it.
- once, after the first step, from every rank::

    tuner-memory: rank=K params=B grads=B optimizer=B activations=B

- at the end: ``tuner-done: iters=N rank=K``.

Memory. On CUDA ``max_allocated_gib`` / ``max_reserved_gib`` are
``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()``. On CPU torch keeps no allocator
statistics, so:

- ``max_allocated_gib`` is the tensor accounting of the ``tuner-memory`` line, summed:
  params + grads + optimizer + activations. It is the analogue of ``max_memory_allocated`` (live
  tensor bytes at the peak, no allocator slack) and it isolates what the memory model predicts.
  Each part is counted by storage, deduplicated, so flat buffers and views count once:
  ``params`` are the module's parameter storages resident on this rank (ZeRO-3: the partition
  ``ds_tensor`` plus any gathered or persistent full parameter); ``grads`` are the gradient
  storages alive when the inner optimizer's ``step`` starts (``.grad`` of module and optimizer
  parameters, and the ZeRO / bf16 wrapper's gradient buffers); ``optimizer`` is the inner torch
  optimizer's state plus its parameters that are not module storages (fp32 master copies);
  ``activations`` is the peak of the bytes saved for backward (``saved_tensors_hooks``; parameter
  storages excluded; deduplicated by storage; tracked through backward, so recomputation under
  activation checkpointing is included) during the first optimizer step.
- ``max_reserved_gib`` is the growth of the process's resident set: peak RSS (``VmHWM``) minus
  the RSS taken after imports, process-group start and a warm-up collective, before the model is
  built. It includes allocator slack, DeepSpeed's communication buffers and library pages, so it
  is noisy for small models and always larger than the accounting.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gpt_deepspeed_args import ModelShape, RunPlan
from gpt_deepspeed_memory import (
    MemoryAccount,
    SavedTensorMeter,
    grad_storages,
    optimizer_storages,
    param_storages,
    rss_kib,
)

GIB = 2**30


@dataclass(slots=True)
class Session:
    """The live run: engine, plan and where this rank sits."""

    engine: Any
    inner: Any  # the torch optimizer that DeepSpeed wraps
    plan: RunPlan
    shape: ModelShape
    rank: int
    dp_rank: int
    device: Any
    seed: int
    rss_base_kib: int
    account: MemoryAccount | None = None


def batches(s: Session, step: int) -> Iterator[tuple[Any, Any]]:
    """The micro-batches of one optimizer step: seeded by (seed, data-parallel rank, step)."""
    gen = torch.Generator().manual_seed(s.seed * 1_000_003 + s.dp_rank * 7919 + step)
    for _ in range(s.plan.grad_accum):
        shape = (s.plan.micro_batch, s.shape.seq_length + 1)
        tokens = torch.randint(0, s.shape.vocab_size, shape, generator=gen).to(s.device)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def train_step(s: Session, step: int) -> None:
    """One optimizer step: all micro-steps of the global batch."""
    if s.plan.pipeline_stages > 1:
        s.engine.train_batch(data_iter=batches(s, step))
        return
    for ids, labels in batches(s, step):
        loss = s.engine(ids, labels)
        s.engine.backward(loss)
        s.engine.step()


def measured_first_step(s: Session) -> MemoryAccount:
    """Run step 1 with the saved-tensor meter and gradient probes.

    Gradient bytes are sampled after each parameter's gradient is accumulated (ZeRO 0/1 hold
    full gradients until the boundary reduction) and when the inner optimizer's step starts
    (ZeRO 2/3 and bf16 hold partitions or fp32 buffers by then); the largest sample is kept.
    """
    module = s.engine.module
    account = MemoryAccount()
    real_step = s.inner.step

    def sample() -> None:
        grads = grad_storages(module, s.inner, s.engine.optimizer)
        account.grads = max(account.grads, sum(grads.values()))

    def probed_step(*args: Any, **kwargs: Any) -> Any:
        sample()
        return real_step(*args, **kwargs)

    meter = SavedTensorMeter(module)
    hooks = [
        p.register_post_accumulate_grad_hook(lambda _: sample())
        for p in module.parameters()
        if p.requires_grad
    ]
    s.inner.step = probed_step
    try:
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            train_step(s, 1)
    finally:
        del s.inner.step  # back to the class's method
        for hook in hooks:
            hook.remove()
    params = param_storages(module)
    account.params = sum(params.values())
    account.optimizer = sum(optimizer_storages(s.inner, params).values())
    account.activations = meter.peak
    return account


def memory_gib(s: Session) -> tuple[float, float]:
    """(max_allocated, max_reserved) in GiB; see the module docstring for CPU."""
    if s.device.type == "cuda":
        return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB
    allocated = s.account.total if s.account else 0
    grown_kib = max(rss_kib("VmHWM"), rss_kib("VmRSS")) - s.rss_base_kib
    return allocated / GIB, max(grown_kib, 0) * 1024 / GIB


def emit(line: str) -> None:
    """Write one whole line with a single write(2), so ranks sharing a pipe never interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def run_steps(s: Session, iters: int) -> None:
    for step in range(1, iters + 1):
        one_step(s, step)
    done(s, iters)


def done(s: Session, iters: int) -> None:
    """The run's last line."""
    emit(f"tuner-done: iters={iters} rank={s.rank}")


def one_step(s: Session, step: int) -> None:
    """Optimizer step ``step`` between two barriers, timed, and its printed lines (step 1 with
    the memory accounting: :func:`measured_first_step`)."""
    dist.barrier()
    start = time.perf_counter()
    if step == 1:
        s.account = measured_first_step(s)
    else:
        train_step(s, step)
    dist.barrier()
    elapsed = time.perf_counter() - start
    if step == 1:
        a = s.account
        emit(
            f"tuner-memory: rank={s.rank} params={a.params} grads={a.grads} "
            f"optimizer={a.optimizer} activations={a.activations}"
        )
    allocated, reserved = memory_gib(s)
    # MoE runs add the last micro-batch's summed gate loss (a key the parser skips)
    aux = f" aux_loss={s.engine.module.last_aux_loss:.6f}" if s.plan.moe else ""
    emit(
        f"tuner-step: iter={step} time_s={elapsed:.6f} "
        f"samples_per_s={s.plan.global_batch / elapsed:.3f} "
        f"max_allocated_gib={allocated:.6f} max_reserved_gib={reserved:.6f}{aux} "
        f"rank={s.rank}"
    )
