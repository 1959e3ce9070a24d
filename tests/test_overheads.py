"""GEMM workspaces the memory model counts inside PyTorch's allocator
(tuner.models.memory.overheads), worked by hand from the sizes PyTorch and Transformer Engine
allocate."""

from __future__ import annotations

import pytest

from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.models.memory.estimate import estimate_memory
from tuner.models.memory.overheads import BLAS_THREADS, te_workspace_bytes, workspace_bytes
from tuner.spec.study import ModelSpec

MIB = 2**20
A100, H100, CPU = get_gpu("a100-80gb"), get_gpu("h100-sxm-80gb"), get_gpu("cpu")


def test_two_threads_each_hold_a_cublas_workspace() -> None:
    """The forward / step thread and autograd's device thread each own a cuBLAS handle, and
    PyTorch keeps one workspace per (handle, stream): 2 x the per-handle size."""
    assert BLAS_THREADS == 2
    # A100, PyTorch's default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" = 4 MiB x 2 + 16 KiB x 8.
    assert A100.cublas_workspace_mib == pytest.approx(8.125)
    # DeepSpeed's workload: nn.Linear with a bias runs cuBLASLt too (4 MiB per handle on A100).
    assert workspace_bytes(A100, "deepspeed") == pytest.approx(2 * (8.125 + 4) * MIB)
    assert workspace_bytes(H100, "megatron-deepspeed") == pytest.approx(2 * (32 + 32) * MIB)
    assert workspace_bytes(CPU, "megatron") == 0.0


def test_megatron_holds_transformer_engines_workspace_and_no_cublaslt_one() -> None:
    """Megatron-core: 2 cuBLAS workspaces plus TE's single one (4 MiB before sm90, 32 MiB + 1 KiB
    from sm90); its bias-free torch GEMMs never allocate PyTorch's cuBLASLt workspace."""
    assert te_workspace_bytes(A100) == 4 * MIB
    assert te_workspace_bytes(H100) == 32 * MIB + 1024
    # A100: 2 x 8.125 + 4 = 20.25 MiB.
    assert workspace_bytes(A100, "megatron") == pytest.approx(20.25 * MIB)
    # H100 (sm90 default 4096 KiB x 8 = 32 MiB): 2 x 32 MiB + 32 MiB + 1 KiB.
    assert workspace_bytes(H100, "megatron") == pytest.approx(96 * MIB + 1024)


def test_cublas_workspace_config_resizes_both_handles() -> None:
    """CUBLAS_WORKSPACE_CONFIG=:4096:8 (Megatron-LM CI) makes A100's per-handle workspace
    4096 KiB x 8 = 32 MiB: 2 x 32 + 4 (TE) = 68 MiB, 47.75 MiB more than the default."""
    ci = get_gpu("a100-80gb", overheads={"cublas_workspace_mib": 32.0})
    assert workspace_bytes(ci, "megatron") == pytest.approx(68 * MIB)
    tiny = ModelSpec(
        name="t", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        vocab_size=512, seq_length=128,
    )  # fmt: skip
    c = ParallelConfig(global_batch_size=1)
    default, with_ci = (estimate_memory(tiny, c, g).stages[0] for g in (A100, ci))
    for before, after in zip(default.phases, with_ci.phases, strict=True):
        assert after.workspaces - before.workspaces == pytest.approx(47.75 * MIB)
