"""FP8 training with Transformer Engine: recipes, which GPUs run them, and the memory they add.

``training.precision: fp8`` is Megatron's ``--bf16 --fp8-format FORMAT --fp8-recipe RECIPE``
(core_v0.15 megatron/training/arguments.py ``_add_transformer_engine_args``): the linear layers'
GEMMs run in FP8 while weights, gradients and the optimizer keep their bf16 / fp32 forms.

GPU support is Transformer Engine's (transformer_engine/pytorch/fp8.py ``check_fp8_support`` /
``check_mxfp8_support``): FP8 needs compute capability 8.9 or higher, MXFP8 10.0 or higher; the
messages below are its own.
"""

from __future__ import annotations

from typing import Literal

from tuner.catalog import GPUSpec

Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
"""Megatron ``--fp8-recipe``: delayed scaling (amax history), per-tensor current scaling, MXFP8
block scaling (Blackwell) or 1x128 / 128x128 block scaling (DeepSeek-V3 style, Hopper)."""
Fp8Format = Literal["hybrid", "e4m3"]
"""Megatron ``--fp8-format``: hybrid = E4M3 forward, E5M2 gradients; e4m3 everywhere."""

FP8_MIN_CC = 8.9
MXFP8_MIN_CC = 10.0
# TE's block-scaling recipe runs on Hopper only (transformer_engine/pytorch/fp8.py
# check_fp8_block_scaling_support: 9.0 <= capability < 10.0 and CUDA >= 12.9).
BLOCKWISE_CC = 9.0

# Bytes per parameter of the FP8 weight copies TE keeps between micro-batches (Linear /
# LayerNormLinear cache their cast weight across the micro-batches of a step, ``is_first_
# microbatch``): Hopper GEMMs need an FP8 copy and its FP8 transpose (1 B each); MXFP8 keeps a
# row-wise and a column-wise copy (1 B each) plus one E8M0 scale per 32 elements of each.
FP8_WEIGHT_COPY_BYTES: dict[str, float] = {
    "delayed": 2.0,
    "tensorwise": 2.0,
    "blockwise": 2.0 + 2 * 4.0 / (128 * 128),  # fp32 scale per 128x128 block of each copy
    "mxfp8": 2.0 + 2.0 / 32,
}


def fp8_problem(recipe: str, gpu: GPUSpec) -> str | None:
    """Why ``gpu`` cannot train with ``recipe``, or None."""
    cc = gpu.compute_capability
    if gpu.fp8_peak_tflops <= 0 or cc < FP8_MIN_CC:
        return (
            f"{gpu.name} has no FP8 tensor cores (Transformer Engine: Device compute capability "
            "8.9 or higher required for FP8 execution.); use precision bf16"
        )
    if recipe == "mxfp8" and cc < MXFP8_MIN_CC:
        return (
            f"fp8_recipe mxfp8 on {gpu.name}: Device compute capability 10.0 or higher required "
            "for MXFP8 execution. (use delayed, tensorwise or blockwise)"
        )
    if recipe == "blockwise" and cc != BLOCKWISE_CC:
        return (
            f"fp8_recipe blockwise on {gpu.name}: FP8 block scaled GEMM requires Hopper and "
            "CUDA >= 12.9. (Transformer Engine; use mxfp8 on Blackwell)"
        )
    return None


def fp8_weight_copy_bytes(params: float, recipe: str) -> float:
    """Bytes of the FP8 weight copies of ``params`` GEMM weights (see FP8_WEIGHT_COPY_BYTES)."""
    return params * FP8_WEIGHT_COPY_BYTES[recipe]
