"""A small GPT trained with PyTorch's FSDP2 on CPU ranks, read like torchtitan 0.3.0's trainer.

Launch it where ``python -m torchtitan.train`` would go (``launch.script`` of a torchtitan study)::

    torchrun --nproc_per_node 2 workloads/gpt_fsdp2.py --module gpt --config demo \\
        --training.local-batch-size 1 ... activation-checkpoint:full

It takes the torchtitan 0.3.0 options tune renders (tyro's spelling, ``--x`` / ``--no-x``
switches, the activation-checkpoint subcommand last) and refuses the parallelism it does not
build (cp, SP, async TP, per-op SAC, looped pipeline schedules) with a one-line error, exit 2.
What it builds on gloo: ``fully_shard`` on every block and the root over the dp_shard mesh (HSDP
over dp_replicate x dp_shard; none at a data-parallel degree of 1, as torchtitan applies FSDP only
when dp_shard or cp > 1), ``reshard_after_forward`` per torchtitan's policy, pipeline stages with
``torch.distributed.pipelining`` (``PipelineStage`` per rank, torchtitan's layer split with the
embedding and the output weighing one layer each, ``Schedule1F1B`` or ``ScheduleGPipe`` over
``local_batch / pipeline_parallel_microbatch_size`` micro-batches, one flush per step; the
non-last stages print loss -1 as torchtitan's do), tensor parallelism with
``parallelize_module`` (colwise / rowwise in the blocks, the embedding by rows and the output by
columns as torchtitan's llama3 plan, no sequence parallelism),
``checkpoint_wrapper`` around every block for full activation checkpointing, gradient
accumulation as torchtitan does it (sync every micro-step), AdamW over the sharded fp32
parameters. Tokens are synthetic and seeded.

It prints torchtitan's metric line every ``log_freq`` steps and at step 1, from rank 0:
``step: N  loss: X  grad_norm: G  memory: X.XXGiB(P%)  tps: N  tflops: X  mfu: X%``. On CPU there
is no caching allocator, so ``memory`` is the peak of live tensor bytes on the rank during step 2
(:class:`PeakBytes`: the parameter shards, gradients and optimizer states, plus every storage an
op creates): an allocated figure, not reserved; the lines before step 2 show 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CONFIGS = {"demo": (4, 256, 4, 1024, 4096)}
"""--config -> (layers, hidden, heads, ffn, vocab): the demo study's model (studies/demo-fsdp)."""
INTS = {
    "training.local-batch-size": 8, "training.global-batch-size": -1, "training.seq-len": 2048,
    "training.steps": 10, "training.gc-freq": 50, "metrics.log-freq": 10,
    "parallelism.data-parallel-replicate-degree": 1, "parallelism.data-parallel-shard-degree": -1,
    "parallelism.tensor-parallel-degree": 1, "parallelism.pipeline-parallel-degree": 1,
    "parallelism.context-parallel-degree": 1, "parallelism.pipeline-parallel-microbatch-size": 1,
}  # fmt: skip
STRS = {
    "training.mixed-precision-param": "bfloat16", "parallelism.fsdp-reshard-after-forward":
    "default", "parallelism.pipeline-parallel-schedule": "1F1B",
}  # fmt: skip
SWITCHES = {
    "training.disable-cuda-graphs": False, "parallelism.enable-sequence-parallel": True,
    "compile.enable": False, "compile.enable-async-tensor-parallel": False,
    "metrics.disable-color-printing": False,
}  # fmt: skip
PROG = "gpt_fsdp2.py"
SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}
"""The single-stage schedules this workload runs (torchtitan's names)."""


def fail(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def parse(argv: list[str]) -> tuple[dict[str, object], str, str]:
    """(options, --config, activation-checkpoint mode)."""
    opts: dict[str, object] = {**INTS, **STRS, **SWITCHES}
    config, ac, i = "", "selective", 0
    while i < len(argv):
        arg = argv[i].replace("_", "-") if argv[i].startswith("--") else argv[i]
        if arg.replace("_", "-").startswith("activation-checkpoint:"):
            ac = arg.split(":", 1)[1]
            i += 1
            continue
        name = arg[2:]
        if name in ("module", "config"):
            config = argv[i + 1] if name == "config" else config
            i += 2
        elif name.replace(".no-", ".") in SWITCHES:
            opts[name.replace(".no-", ".")] = ".no-" not in name
            i += 1
        elif name in INTS or name in STRS:
            opts[name] = int(argv[i + 1]) if name in INTS else argv[i + 1]
            i += 2
        else:
            fail(f"unrecognized arguments: {argv[i]}")
    if config not in CONFIGS:
        fail(f"--config {config!r}: one of {sorted(CONFIGS)}")
    return opts, config, ac


@dataclass(frozen=True)
class Plan:
    replicate: int
    shard: int
    tp: int
    local: int
    accum: int
    seq: int
    steps: int
    log_freq: int
    reshard: bool
    full_ac: bool
    pp: int = 1
    micro: int = 1
    schedule: str = "1F1B"


def plan(opts: dict[str, object], ac: str, world: int) -> Plan:
    """The run's layout, with torchtitan's checks; what this workload does not build, refused."""
    n = {k.split(".")[-1]: int(str(v)) for k, v in opts.items() if k in INTS}
    r, s, tp = (
        n["data-parallel-replicate-degree"],
        n["data-parallel-shard-degree"],
        n["tensor-parallel-degree"],
    )
    pp, micro = n["pipeline-parallel-degree"], n["pipeline-parallel-microbatch-size"]
    if n["context-parallel-degree"] > 1:
        fail("context parallelism is not built by this CPU workload")
    schedule = str(opts["parallelism.pipeline-parallel-schedule"])
    if pp > 1 and schedule not in SCHEDULES:
        fail(f"pipeline schedule {schedule}: this workload builds {sorted(SCHEDULES)}")
    if ac not in ("none", "full"):
        fail(f"activation-checkpoint:{ac}: this workload checkpoints whole blocks or nothing")
    sp = opts["parallelism.enable-sequence-parallel"] and tp > 1
    if sp or opts["compile.enable-async-tensor-parallel"]:
        fail("sequence parallelism and async TP are not built by this CPU workload")
    s = world // (r * tp * pp) if s < 0 else s
    assert r * s * tp * pp == world, (
        f"Invalid parallel dims: dp_replicate({r}) * dp_shard({s}) * cp(1) * tp({tp}) * pp({pp}) "
        f"!= WORLD_SIZE({world})"
    )
    local, dp = n["local-batch-size"], r * s
    gbs = n["global-batch-size"] if n["global-batch-size"] > 0 else local * dp
    assert gbs % (local * dp) == 0, (
        "global batch size must be multiple of local batch size times data-parallel degree "
        f"({gbs} % ({local} * {dp}) != 0)"
    )
    if pp > 1 and local % micro:
        fail(f"local batch size {local} is not divisible by the pipeline microbatch size {micro}")
    policy = opts["parallelism.fsdp-reshard-after-forward"]
    return Plan(
        replicate=r, shard=s, tp=tp, local=local, accum=gbs // (local * dp), seq=n["seq-len"],
        steps=n["steps"], log_freq=n["log-freq"],
        reshard=policy == "always" or (policy == "default" and pp == 1), full_ac=ac == "full",
        pp=pp, micro=micro, schedule=schedule,
    )  # fmt: skip


class Block(nn.Module):
    def __init__(self, h: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, h // heads
        self.norm1, self.norm2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.wq, self.wk, self.wv = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.wo = nn.Linear(h, h)
        self.w1, self.w2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.norm1(x)
        q, k, v = (
            w(y).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, h: int, heads: int, ffn: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(Block(h, heads, ffn) for _ in range(layers))
        self.norm, self.out = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class Stage(nn.Module):
    """One pipeline stage of the GPT: its blocks, with the embedding on the first and the norm
    and output layer on the last; the last returns logits (the schedule applies the loss)."""

    def __init__(self, model: GPT, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.embed = model.embed if first else None
        self.layers = nn.ModuleList(model.layers[i] for i in blocks)
        self.norm, self.out = (model.norm, model.out) if last else (None, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x)) if self.out is not None and self.norm is not None else x


def stage_blocks(layers: int, stages: int, index: int) -> range:
    """torchtitan 0.3.0's default split (``_generate_llm_fqn_per_model_part``): the embedding and
    the norm + output weigh one layer each; ``L + 2`` dealt out evenly, the remainder first."""
    per, extra = divmod(layers + 2, stages)
    start = 0
    for i in range(stages):
        take = per + (1 if i < extra else 0) - (1 if i in (0, stages - 1) else 0)
        take = min(max(take, 0), layers - start)
        if i == index:
            return range(start, start + take)
        start += take
    return range(0)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def build(config: str, p: Plan, world: int) -> tuple[nn.Module, int, Any]:
    """(the rank's model or stage, the whole model's parameter count, the pipeline schedule or
    None)."""
    layers, h, heads, ffn, vocab = CONFIGS[config]
    torch.manual_seed(0)
    model = GPT(layers, h, heads, ffn, vocab)
    params = sum(x.numel() for x in model.parameters())
    names = ("pp", "dp_replicate", "dp_shard", "tp")
    mesh = init_device_mesh("cpu", (p.pp, p.replicate, p.shard, p.tp), mesh_dim_names=names)
    if p.tp > 1:
        plan_ = {n: ColwiseParallel() for n in ("wq", "wk", "wv", "w1")}
        plan_ |= {n: RowwiseParallel() for n in ("wo", "w2")}
        for block in model.layers:
            parallelize_module(block, mesh["tp"], plan_)
        # as torchtitan's llama3 TP plan (without SP or loss parallelism): the embedding split
        # by rows, the output layer by columns, its logits gathered whole
        parallelize_module(model, mesh["tp"], {
            "embed": RowwiseParallel(input_layouts=Replicate()),
            "out": ColwiseParallel(output_layouts=Replicate()),
        })  # fmt: skip
    module: nn.Module = model
    index = mesh["pp"].get_local_rank() if p.pp > 1 else 0
    if p.pp > 1:
        module = Stage(model, stage_blocks(layers, p.pp, index), index == 0, index == p.pp - 1)
    blocks = module.layers
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block) if p.full_ac else block
    if p.replicate * p.shard > 1:  # torchtitan applies FSDP only to a data-parallel mesh
        dp_mesh = mesh["dp_replicate", "dp_shard"] if p.replicate > 1 else mesh["dp_shard"]
        for i, block in enumerate(blocks):
            # the last block is resharded anyway when its backward starts (torchtitan's choice)
            last = i == len(blocks) - 1
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=p.reshard and not last)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=p.reshard)
    if p.pp == 1:
        return module, params, None
    stage = PipelineStage(module, index, p.pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = SCHEDULES[p.schedule](stage, p.local // p.micro, loss_fn=loss_fn)
    return module, params, schedule


def main() -> None:
    opts, config, ac = parse(sys.argv[1:])
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    p = plan(opts, ac, world)
    model, params, schedule = build(config, p, world)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    vocab = CONFIGS[config][4]
    dp_rank = (rank // p.tp) % (p.replicate * p.shard)  # mesh order pp, dp_replicate, dp_shard, tp
    pp_rank = rank // (p.replicate * p.shard * p.tp)
    gen = torch.Generator().manual_seed(1000 + dp_rank)
    flops_per_token = 6 * params + 12 * CONFIGS[config][0] * CONFIGS[config][1] * p.seq
    peak = 0.0
    for step in range(1, p.steps + 1):
        # Memory is counted in step 2 (the first with Adam's states), whose time the tracking
        # slows: the study's warm-up skips it; the other steps run untracked.
        tracker = PeakBytes(_state_bytes(model, optim)) if step == min(2, p.steps) else None
        start = time.perf_counter()
        with tracker or contextlib.nullcontext():
            if schedule is None:
                for _ in range(p.accum):
                    ids = torch.randint(0, vocab, (p.local, p.seq + 1), generator=gen)
                    loss = model(ids[:, :-1], ids[:, 1:]) / p.accum
                    loss.backward()
            else:  # every stage draws the DP rank's batch; the first feeds it, the last scores it
                ids = torch.randint(0, vocab, (p.local, p.seq + 1), generator=gen)
                losses: list[torch.Tensor] = []
                if pp_rank == 0:
                    schedule.step(ids[:, :-1])
                elif pp_rank == p.pp - 1:
                    schedule.step(target=ids[:, 1:], losses=losses)
                else:
                    schedule.step()
                loss = torch.stack(losses).mean() if losses else torch.tensor(-1.0)
            norm = clip_grad_norm(model, 1.0, p.pp)
            optim.step()
            optim.zero_grad()
        elapsed = time.perf_counter() - start
        peak = tracker.peak if tracker is not None else peak
        if rank == 0 and (step == 1 or step % p.log_freq == 0):
            tps = p.local * p.seq * p.accum / (elapsed * p.tp * p.pp)
            tflops = flops_per_token * tps / 1e12
            norm_value = float(norm)
            value = float(loss) * (p.accum if schedule is None else 1)
            print(
                f"[titan] - root - INFO - step: {step:2}  loss: {value:8.5f}  grad_norm: "
                f"{norm_value if math.isfinite(norm_value) else float('nan'):7.4f}  memory: "
                f"{peak / 2**30:5.2f}GiB(0.00%)  tps: {round(tps):,}  tflops: {tflops:,.2f}  "
                "mfu: N/A",
                flush=True,
            )
    dist.destroy_process_group()


def clip_grad_norm(model: nn.Module, max_norm: float, pp: int = 1) -> torch.Tensor:
    """The global gradient norm over gradients on different meshes (FSDP's and FSDP x TP's,
    which ``torch.nn.utils.clip_grad_norm_`` cannot stack) and over the pipeline stages (their
    squares summed across ranks, as torchtitan's ``clip_grad_norm_`` does with PP), and the clip.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in grads]
    total = torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms])
    squares = torch.linalg.vector_norm(total) ** 2
    if pp > 1:  # each stage rank holds its own blocks: sum over all ranks, / the copies of each
        dist.all_reduce(squares)
        squares = squares / (dist.get_world_size() // pp)
    norm = squares.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return norm


class PeakBytes(TorchDispatchMode):
    """Live tensor bytes on this rank: ``base`` (the states that exist before the step) plus
    every storage an op creates during it, freed when its first tensor is collected (a view
    that outlives it is not followed); ``peak`` is the largest sum seen."""

    def __init__(self, base: float) -> None:
        super().__init__()
        self.live = self.peak = base
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor:
                continue
            key = t.untyped_storage().data_ptr()
            if not key or key in self.seen:
                continue
            size = t.untyped_storage().nbytes()
            self.seen.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, key, size)
        return out

    def _free(self, key: int, size: int) -> None:
        self.seen.discard(key)
        self.live -= size


def _state_bytes(model: nn.Module, optim: torch.optim.Optimizer) -> float:
    """Bytes of the rank's parameter shards, gradients and optimizer states before a step."""
    tensors: list[torch.Tensor] = []
    for p in model.parameters():
        tensors.append(p.to_local() if hasattr(p, "to_local") else p)
        if p.grad is not None:
            tensors.append(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad)
    for state in optim.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                tensors.append(v.to_local() if hasattr(v, "to_local") else v)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return float(sum(storages.values()))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
