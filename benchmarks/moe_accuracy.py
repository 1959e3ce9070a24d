"""How ``tuner.models.time.estimate`` / ``tuner.models.memory.estimate`` predict published
mixture-of-experts training runs.

Published measured figures (each with its source):

- Mixtral 8x7B, bf16, dropless, all-to-all dispatcher, 64 H100 SXM 80GB (8 per node, 8 x 400
  Gb/s InfiniBand), seq 4096, TP1 EP8 PP4 VP8, MBS 1, GBS 256: **468 TFLOP/s per GPU**
  (Megatron-LM megatron/core/transformer/moe/README.md, core_v0.15: "468 TFLOPS for Mixtral 8X7B
  bf16 training" with MCore v0.9 and the "Reference Best Parallel Mapping" table).

The TFLOP/s are Megatron's own (training.py num_floating_point_operations: k routed experts per
token); ours follow tuner.models.time.estimate's convention, which counts the same GEMMs (plus the
small router GEMM). Target: the dense models' 10 % (issue 14). Run:

    .venv/bin/python benchmarks/moe_accuracy.py
"""

from __future__ import annotations

import dataclasses

from tuner._loader import load_dataclass
from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.config.rules import validate
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.time.estimate import estimate_time
from tuner.spec.file import _expand_model
from tuner.spec.study import ModelSpec, TrainingSpec

CASES = [
    # (label, preset, gpu, gpus per node, config, published TFLOP/s per GPU, source)
    (
        "Mixtral 8x7B bf16 64xH100 TP1 EP8 PP4 VP8",
        "mixtral-8x7b",
        "h100-sxm-80gb",
        8,
        ParallelConfig(
            pp=4,
            dp=16,
            vp=8,
            ep=8,
            micro_batch_size=1,
            global_batch_size=256,
            distributed_optimizer=True,
        ),  # fmt: skip
        468.0,
        "Megatron-LM core/transformer/moe/README.md (MCore v0.9)",
    ),
]


def main() -> None:
    errors = []
    for label, preset, gpu_name, gpn, config, published, source in CASES:
        model = load_dataclass(ModelSpec, _expand_model({"preset": preset}), "model")
        gpu = get_gpu(gpu_name)
        assert not validate(config, model, config.world_size, "megatron")
        training = TrainingSpec(global_batch_size=config.global_batch_size)
        t = estimate_time(model, training, config, gpu, gpn)
        mem = estimate_memory(model, config, gpu, "megatron", "bf16")
        err = (t.model_tflops_per_gpu - published) / published
        errors.append(abs(err))
        print(
            f"{label}: published {published:.0f} TFLOP/s/GPU ({source}); predicted "
            f"{t.model_tflops_per_gpu:.0f} ({err:+.1%}); step {t.step:.3f} s, ep_comm "
            f"{t.ep_comm:.3f} s, moe_routing {t.moe_routing:.3f} s, bubble {t.pp_bubble:.3f} s; "
            "predicted peak "
            f"{mem.peak / GIB:.1f} GiB (fits 80 GB: {mem.peak / GIB <= gpu.memory_gib})"
        )
        for imbalance in (1.0, 1.1, 1.25):
            assert model.moe is not None
            skew = dataclasses.replace(
                model, moe=dataclasses.replace(model.moe, imbalance=imbalance)
            )
            ts = estimate_time(skew, training, config, gpu, gpn)
            print(
                f"  stated load imbalance {imbalance:.2f}: {ts.model_tflops_per_gpu:.0f} "
                "TFLOP/s/GPU"
            )
    print(f"MAPE {sum(errors) / len(errors):.1%} over {len(errors)} published MoE run(s)")


if __name__ == "__main__":
    main()
