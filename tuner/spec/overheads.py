"""``cluster.overheads``: stack overheads a user measured, replacing the GPU catalog's figures."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class OverheadsSpec:
    """Stack overheads a user measured on their own cluster; each replaces the GPU catalog's
    figure of the same name (tuner/catalog/gpus.yaml explains each one and its source)."""

    cuda_context_gib: float | None = None
    """CUDA context + kernel images per process, GiB (nvidia-smi minus max_memory_reserved)."""
    cublas_workspace_mib: float | None = None
    """PyTorch's cuBLAS workspace per handle and stream, MiB (CUBLAS_WORKSPACE_CONFIG)."""
    cublaslt_workspace_mib: float | None = None
    """PyTorch's cuBLASLt workspace per handle and stream, MiB (CUBLASLT_WORKSPACE_SIZE)."""
    nccl_channels: int | None = None
    """NCCL collective channels per communicator (NCCL_DEBUG=INFO "coll channels")."""
    nccl_buffer_mib: float | None = None
    """Device buffer per channel and connection, all protocols, MiB."""
    nccl_p2p_channels: int | None = None
    """NCCL channels per send/recv peer."""
    nccl_p2p_buffer_mib: float | None = None
    """Device buffer per p2p channel and peer, MiB."""
    allocator_fragmentation: float | None = None
    """Reserved above allocated as a share of transient tensors (e.g. lower with
    expandable_segments)."""

    def __post_init__(self) -> None:
        sizes = ("cuda_context_gib", "cublas_workspace_mib", "cublaslt_workspace_mib",
                 "nccl_buffer_mib", "nccl_p2p_buffer_mib", "allocator_fragmentation")  # fmt: skip
        for name in sizes:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"must be >= 0, got {value}", path=name)
        if self.cuda_context_gib is not None and self.cuda_context_gib > 64:
            raise ConfigError(
                f"must be at most 64 (more than a whole GPU), got {self.cuda_context_gib}",
                path="cuda_context_gib",
            )
        if self.allocator_fragmentation is not None and self.allocator_fragmentation > 1:
            raise ConfigError(
                f"must be at most 1 (a share), got {self.allocator_fragmentation}",
                path="allocator_fragmentation",
            )
        for name in ("nccl_channels", "nccl_p2p_channels"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 64:
                raise ConfigError(f"must be 0..64 (NCCL MAXCHANNELS is 32), got {value}",
                                  path=name)  # fmt: skip

    def values(self) -> dict[str, float]:
        """The fields that were given."""
        given = {n: getattr(self, n) for n in self.__slots__}
        return {n: v for n, v in given.items() if v is not None}
