"""A small GPT trained with the real DeepSpeed engine, for tuner's demo study and tests.

Launch with torchrun (one process per device; gloo on CPU, nccl on CUDA)::

    torchrun --nproc_per_node 2 workloads/gpt_deepspeed.py --deepspeed_config ds_config.json

Everything about parallelism and precision comes from the ds_config.json: ZeRO stage 0-3,
``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps`` / ``train_batch_size``,
``bf16.enabled``, an ``activation_checkpointing`` section (only the transformer blocks are
checkpointed), ``"pipeline": {"stages": P, "partition": METHOD}`` (P > 1 builds a DeepSpeed
``PipelineModule`` with ``partition_method=METHOD``: ``type:Block`` when absent or DeepSpeed's
default ``best``, else ``uniform``, ``parameters`` or ``type:REGEX``; ZeRO 0/1 only), and an
optional ``optimizer`` section (without one, ``torch.optim.AdamW`` is created here).
Tokens are synthetic and seeded.

Mixture of experts (``--num-experts E``): the MLP of the blocks ``--moe-layer-freq`` picks is a
``deepspeed.moe.layer.MoE`` over E copies of the MLP (width ``--moe-ffn-hidden-size``), split over
``--ep-size`` expert-parallel ranks, top-``--moe-router-topk`` gating with
``--moe-capacity-factor`` / ``--moe-min-capacity`` (no factor: dropless), the gates' summed
``l_aux`` times ``--moe-aux-loss-coeff`` added to the loss; the expert parameters get their own
optimizer groups (``split_params_into_different_moe_groups_for_optimizer``). Refused, one line,
exit 2: ZeRO-3 (DeepSpeed's native MoE does not run under it), pipeline stages, and a
data-parallel world that ``--ep-size`` does not divide.

A framework probe's points (``--probe-points FILE``: a marker and, per point, the workload's
arguments) run in one process, each framed by ``<marker> <point> start`` and
``<marker> <point> end rc=<code>`` lines from rank 0: the interpreter, imports (torch's lazy
compiler import in the first optimizer included), the process group and DeepSpeed's comm op
start once for all of them. On CPU ranks their timed steps are interleaved, one step of each
point per round, each step framed by ``<marker> <point> resume`` / ``pause`` lines
(``interleave_points``); on CUDA they run one after another.

Rank 0 first prints ``tuner-versions: python=... torch=... deepspeed=...``. The other printed
lines (``tuner-step``, ``tuner-memory``, ``tuner-done``) and how memory is
measured on CPU: ``gpt_deepspeed_train``. This file starts the process group and the engine;
its siblings, imported from this directory (on ``sys.path`` when it runs as a script), hold
the command line and ds_config checks (``gpt_deepspeed_args``), the model
(``gpt_deepspeed_model``), the memory accounting (``gpt_deepspeed_memory``) and the training
loop (``gpt_deepspeed_train``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpt_deepspeed_args import (
    PROG,
    RunPlan,
    WorkloadConfigError,
    engine_config,
    load_ds_config,
    model_shape,
    parse_args,
    plan_run,
)
from gpt_deepspeed_memory import rss_kib
from gpt_deepspeed_model import build_model
from gpt_deepspeed_train import Session, done, emit, one_step, run_steps


def prefer_own_ninja() -> None:
    """Put this interpreter's bin first on PATH when it has a ninja.

    DeepSpeed's JIT op loader runs whichever ``ninja`` PATH finds, and a ninja of another version
    than the one that built the cached op rebuilds it (about 45 s), e.g. over a remote shell
    whose PATH lacks the venv.
    """
    bin_dir = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if (bin_dir / "ninja").exists() and not path.startswith(f"{bin_dir}{os.pathsep}"):
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{path}"


def start_distributed() -> tuple[Any, int]:
    """Init the process group (nccl on CUDA, gloo on CPU) and run one untimed collective.

    The collective makes DeepSpeed build or load its CPU shared-memory comm op (about 45 s the
    first time on a machine, cached in ~/.cache/torch_extensions) before anything is timed.
    """
    import deepspeed

    prefer_own_ninja()
    for key, default in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, default)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(1)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    deepspeed.init_distributed(dist_backend=backend)
    warm = torch.ones(1024, device=device)
    deepspeed.comm.all_reduce(warm)
    dist.barrier()
    return device, dist.get_rank()


def start_engine(model: Any, plan: RunPlan, config: dict[str, Any]) -> tuple[Any, Any]:
    """deepspeed.initialize; DeepSpeed's own config errors become WorkloadConfigError."""
    import deepspeed

    def make_adamw(params: Any) -> Any:
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)

    params: list[Any] = [p for p in model.parameters() if p.requires_grad]
    if plan.moe:
        # Expert parameters in their own groups: ZeRO partitions (and the engine reduces) them
        # over the expert-data-parallel group, the others over the whole data-parallel group.
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        params = split_params_into_different_moe_groups_for_optimizer(
            {"params": params, "name": "dense-params"}
        )
    try:
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=params,
            optimizer=None if plan.has_optimizer else make_adamw,
            config=engine_config(config, plan),
        )
    except (AssertionError, ValueError, TypeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadConfigError(f"deepspeed rejected the config: {first}") from exc
    return engine, engine.basic_optimizer


def data_parallel_rank(engine: Any, rank: int) -> int:
    grid = getattr(engine, "grid", None)
    return int(grid.get_data_parallel_id()) if grid is not None else rank


def versions_line() -> str:
    """The software this run uses, as ``tuner-versions: name=version ...`` (tuner reads it back
    into the header of an exported full run: ``tuner.logs.versions``)."""
    import platform

    import deepspeed

    return (f"tuner-versions: python={platform.python_version()} torch={torch.__version__} "
            f"deepspeed={deepspeed.__version__}")  # fmt: skip


def fail(exc: Exception) -> int:
    """One line on stderr from the first process of each node; exit code 2 (bad input)."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
    return 2


Prepared = tuple[Any, Any, dict[str, Any], RunPlan]  # args, shape, ds_config, plan


def prepare(args: Any) -> Prepared:
    """The run's shape, ds_config and plan; a bad one is a WorkloadConfigError."""
    shape = model_shape(args)
    config = load_ds_config(args.deepspeed_config)
    plan = plan_run(config, int(os.environ.get("WORLD_SIZE", "1")), shape)
    return args, shape, config, plan


def own_groups(engine: Any | None) -> None:
    """Give DeepSpeed's module-wide model-parallel unit back to ``engine`` (None: to none, as
    in a fresh process). An engine built with one (a ``PipelineModule``'s grid) leaves it in
    ``deepspeed.utils.groups.mpu`` (``DeepSpeedEngine._configure_distributed_model``: "pass
    the mpu from here to groups; for subsequent use, just query groups"), where every engine
    built after it and every later group look-up finds it: in one process that runs several
    points, a data-parallel point after a pipeline point would take the pipeline's
    data-parallel group (one rank on two) or fail to build. Each point is built and stepped
    with its own."""
    from deepspeed.utils import groups

    groups.mpu = None if engine is None else engine.mpu


def open_session(run: Prepared, device: Any, rank: int) -> Session:
    """Build the model and engine of ``run``: its session, no step run yet."""
    own_groups(None)
    args, shape, config, plan = run
    rss_base = rss_kib("VmRSS")
    model = build_model(shape, plan, config, args.seed)
    engine, inner = start_engine(model, plan, config)
    return Session(
        engine=engine,
        inner=inner,
        plan=plan,
        shape=shape,
        rank=rank,
        dp_rank=data_parallel_rank(engine, rank),
        device=device,
        seed=args.seed,
        rss_base_kib=rss_base,
    )


def train(run: Prepared, device: Any, rank: int) -> Any:
    """Build the model and engine of ``run``, run its steps; the engine."""
    session = open_session(run, device, rank)
    run_steps(session, run[0].train_iters)
    return session.engine


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        points = load_points(args.probe_points) if args.probe_points else None
        first = prepare(args)
    except WorkloadConfigError as exc:
        return fail(exc)
    device, rank = start_distributed()
    if rank == 0:
        emit(versions_line())
    if points is not None:
        run_points(points, device, rank)
        return 0
    try:
        engine = train(first, device, rank)
    except WorkloadConfigError as exc:
        return fail(exc)
    shutdown(engine)
    return 0


Points = tuple[str, list[tuple[int, list[str]]], bool]  # marker, [(point, argv)], interleave


def load_points(path: Path) -> Points:
    """(marker, [(point, argv)], interleave) of a ``--probe-points`` file (``interleave``: its
    optional key, true when absent)."""
    import json

    try:
        data = json.loads(Path(path).read_text())
        runs = [(int(p["point"]), [str(a) for a in p["argv"]]) for p in data["points"]]
        return str(data["marker"]), runs, bool(data.get("interleave", True))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WorkloadConfigError(f"--probe-points {path}: {exc}") from exc


def run_points(points: Points, device: Any, rank: int) -> None:
    """Each point's run in this process (imports, process group and the first collective paid
    once), its lines framed by ``<marker> <point> start`` and, once, ``<marker> <point> end
    rc=<code>``; then leave as :func:`shutdown` does. On CUDA the points run one after another
    (the allocator's peak and cache are the process's, so engines alive together would add up);
    on CPU they are interleaved (:func:`interleave_points`) unless the file says
    ``"interleave": false`` (many points, each engine's memory held until the end)."""
    import gc

    marker, runs, interleave = points
    if device.type != "cuda" and interleave:
        interleave_points(marker, runs, rank)
    else:
        for point, argv in runs:
            dist.barrier()
            if rank == 0:
                emit(f"{marker} {point} start")
            code = 0
            try:
                engine = train(prepare(parse_args(argv)), device, rank)
                engine.destroy()
                del engine
            except WorkloadConfigError as exc:
                code = fail(exc)
            gc.collect()
            fresh_peaks(device)
            dist.barrier()
            if rank == 0:
                emit(f"{marker} {point} end rc={code}")
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def interleave_points(marker: str, runs: list[tuple[int, list[str]]], rank: int) -> None:
    """The points on CPU ranks, their timed steps interleaved: every point's engine is built and
    its first step (the warm-up, with the memory accounting, which is per engine) run in turn;
    then round ``r`` runs step ``r`` of every point, in order on even rounds and in reverse on
    odd ones, so the points' steps of one round run side by side and a drift of the machine's
    load slower than a round moves them alike (a linear one cancels over each pair of rounds).
    Each step's lines are framed by ``<marker> <point> resume`` and ``<marker> <point> pause``;
    ``tuner.profile.probe`` pairs the points' samples by round."""
    cpu = torch.device("cpu")
    live: list[tuple[int, int, Session]] = []
    for point, argv in runs:
        dist.barrier()
        if rank == 0:
            emit(f"{marker} {point} start")
        try:
            run = prepare(parse_args(argv))
            session = open_session(run, cpu, rank)
            one_step(session, 1)
            live.append((point, run[0].train_iters, session))
            word = "pause"
        except WorkloadConfigError as exc:
            word = f"end rc={fail(exc)}"
        dist.barrier()
        if rank == 0:
            emit(f"{marker} {point} {word}")
    for step in range(2, max((iters for _, iters, _ in live), default=0) + 1):
        for point, iters, session in live if step % 2 == 0 else live[::-1]:
            if step > iters:
                continue
            if rank == 0:
                emit(f"{marker} {point} resume")
            own_groups(session.engine)
            one_step(session, step)
            dist.barrier()
            if rank == 0:
                emit(f"{marker} {point} pause")
    for point, iters, session in live:
        if rank == 0:
            emit(f"{marker} {point} resume")
        dist.barrier()
        own_groups(session.engine)
        done(session, iters)
        session.engine.destroy()
        dist.barrier()
        if rank == 0:
            emit(f"{marker} {point} end rc=0")


def fresh_peaks(device: Any) -> None:
    """Start the next point's peak figures afresh: the allocator's peak statistics and cache on
    CUDA, the resident set's high-water mark on CPU (``clear_refs`` 5, where Linux allows)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def shutdown(engine: Any) -> None:
    """Release DeepSpeed and the process group, then leave without interpreter teardown.

    With ZeRO-3 on CPU, one rank in a few aborted in teardown after finishing
    ("terminate called without an active exception", exit -6), failing a complete run.
    """
    engine.destroy()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
