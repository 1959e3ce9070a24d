"""Pipeline transfers of the step-time model: which schedules hide them behind compute."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.time.estimate import estimate_time
from tuner.models.time.pipeline import exposed_hops
from tuner.spec.study import ModelSpec, TrainingSpec

H100 = get_gpu("h100-sxm-80gb")
MODEL = ModelSpec(
    num_layers=32, hidden_size=5120, ffn_hidden_size=13824, num_attention_heads=40,
    vocab_size=32000, seq_length=4096, swiglu=True, normalization="rmsnorm",
    position_embedding="rope", dropout=False, tied_embeddings=False, add_bias_linear=False,
)  # fmt: skip
TRAINING = TrainingSpec(global_batch_size=128)
# NeMo 24.07's Llama 2 13B layout: TP 1, PP 4, DP 4 on two nodes (the pipeline crosses them)
INTERLEAVED = ParallelConfig(tp=1, pp=4, dp=4, vp=4, micro_batch_size=1, global_batch_size=128)


def test_exposed_hops_is_what_a_transfer_takes_beyond_its_window() -> None:
    assert exposed_hops(1.0, 2.0, 3.0) == 0.0
    assert exposed_hops(1.0, 0.25, 3.0) == pytest.approx(0.75)
    assert exposed_hops(1.0, 0.25, 0.5) == pytest.approx(0.75 + 0.5)


def test_interleaved_megatron_hides_steady_state_transfers() -> None:
    overlapped = estimate_time(MODEL, TRAINING, INTERLEAVED, H100, 8)
    waiting = estimate_time(MODEL, TRAINING, INTERLEAVED, H100, 8, p2p_overlap=False)
    assert waiting.pp_p2p > 10.0 * overlapped.pp_p2p > 0.0  # fill and drain stay exposed
    assert overlapped.step == pytest.approx(waiting.step - waiting.pp_p2p + overlapped.pp_p2p)


def test_without_interleaving_or_under_deepspeed_every_transfer_waits() -> None:
    plain = dataclasses.replace(INTERLEAVED, vp=1)
    assert estimate_time(MODEL, TRAINING, plain, H100, 8).pp_p2p == pytest.approx(
        estimate_time(MODEL, TRAINING, plain, H100, 8, p2p_overlap=False).pp_p2p
    )
    # DeepSpeed's PipelineEngine has no overlap to turn on: the switch changes nothing there,
    # even for a config carrying a virtual size (the engine's rules refuse one; the arithmetic
    # must not hide its transfers either way)
    for config in (plain, INTERLEAVED):
        fork = estimate_time(MODEL, TRAINING, config, H100, 8, "megatron-deepspeed")
        waiting = estimate_time(
            MODEL, TRAINING, config, H100, 8, "megatron-deepspeed", p2p_overlap=False
        )
        assert fork.pp_p2p == pytest.approx(waiting.pp_p2p) and fork.pp_p2p > 0.0


def _replay_deepspeed_schedule(
    stages: int, micro_batches: int, work: list[tuple[float, float]], transfer: float
) -> float:
    """Seconds to the last instruction of DeepSpeed's own TrainSchedule (deepspeed/runtime/pipe/
    schedule.py) on ``stages`` stages, stage i's forward and backward taking ``work[i]``: each
    stage runs its instructions in order; a send and its receive are blocking and rendezvous
    (the k-th SendActivation of stage i pairs with the k-th RecvActivation of stage i + 1, the
    same for gradients), then both sides spend ``transfer``."""
    from deepspeed.runtime.pipe import schedule

    kinds = {"SendActivation": (1, "a"), "RecvActivation": (-1, "a"),
             "SendGrad": (-1, "g"), "RecvGrad": (1, "g")}  # fmt: skip
    ops: list[list[tuple[str, int, str, int]]] = []
    for stage in range(stages):
        seen: dict[tuple[int, str], int] = {}
        mine: list[tuple[str, int, str, int]] = []
        plan = schedule.TrainSchedule(micro_batches=micro_batches, stages=stages, stage_id=stage)
        for step in plan.steps():
            for cmd in step:
                name = type(cmd).__name__
                if name in ("ForwardPass", "BackwardPass"):
                    mine.append((name, stage, "", 0))
                elif name in kinds:
                    side, what = kinds[name]
                    src, dst = (stage, stage + side) if name.startswith("Send") else (
                        stage + side, stage)  # fmt: skip
                    k = seen.get((src, what), 0)
                    seen[(src, what)] = k + 1
                    mine.append(("p2p", stage + side, f"{what}{src}>{dst}", k))
        ops.append(mine)
    at, clock = [0] * stages, [0.0] * stages
    while any(at[s] < len(ops[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            while at[s] < len(ops[s]):
                name, peer, channel, k = ops[s][at[s]]
                if name != "p2p":
                    clock[s] += work[s][0] if name == "ForwardPass" else work[s][1]
                    at[s] += 1
                    moved = True
                    continue
                other = ops[peer][at[peer]] if at[peer] < len(ops[peer]) else None
                if other is None or other[2:] != (channel, k):
                    break
                clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer
                at[s], at[peer], moved = at[s] + 1, at[peer] + 1, True
        assert moved, "the replay deadlocked"
    return max(clock)


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 16), (4, 16), (12, 64), (24, 96)])
def test_deepspeeds_schedule_paces_as_the_model_composes_bubble_and_last_stage(
    stages: int, micro_batches: int
) -> None:
    """The step the model composes for DeepSpeed's pipeline (compute of m micro-batches, the
    bubble's p - 1 stage slots, the LM head on the last stage once per micro-batch:
    ``pipeline_seconds`` and ``stage_imbalance``) is what DeepSpeed's own TrainSchedule runs to
    when its blocking transfers cost nothing; with a cost per transfer, the critical path holds
    the model's count of them less two (``pipeline_seconds``: 2(p - 1) fill and drain hops, 2
    per micro-batch), though every send and receive is a blocking call of its own."""
    fwd, bwd, head = 1.0, 3.0, 0.75  # full recompute: backward = recompute + 2 x forward
    work = [(fwd, bwd)] * (stages - 1) + [(fwd + head / 3, bwd + 2 * head / 3)]
    total = _replay_deepspeed_schedule(stages, micro_batches, work, 0.0)
    model = (micro_batches + stages - 1) * (fwd + bwd) + micro_batches * head
    assert total == pytest.approx(model)
    tau = 1e-3
    hops = (_replay_deepspeed_schedule(stages, micro_batches, work, tau) - total) / tau
    assert hops == pytest.approx(2 * (stages - 1) + 2 * micro_batches - 2)
