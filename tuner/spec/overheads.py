"""``cluster.overheads``: stack overheads a user measured, replacing the GPU catalog's figures,
and the stack's versions (:class:`StackVersions`), from which tuner.models.memory.stack derives
the ones a version decides."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError

_VERSION = re.compile(r"(\d+)\.(\d+)")
_KEYS = ("torch", "cuda", "nccl", "module_loading")


def version(text: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``1.11``, ``2.1.0a0+fe05266``, ``11.5``), None
    when empty or not a version."""
    match = _VERSION.match(text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True, slots=True)
class StackVersions:
    """The versions of a run's software that the memory outside the allocator depends on."""

    torch: str | None = None
    cuda: str | None = None  # the CUDA runtime the framework's libraries were built with
    nccl: str | None = None
    module_loading: str | None = None  # CUDA_MODULE_LOADING where the run set it

    @classmethod
    def parse(cls, text: str, path: str = "stack") -> StackVersions:
        """``torch=1.11 cuda=11.5`` (words ``name=version``, any order; empty: nothing known)."""
        fields: dict[str, str] = {}
        for word in text.split():
            name, sep, value = word.partition("=")
            if not sep or name not in _KEYS or not value:
                raise ConfigError(f"expected name=version with name in {', '.join(_KEYS)}, "
                                  f"got {word!r}", path=path)  # fmt: skip
            fields[name] = value
        loading = fields.get("module_loading")
        if loading is not None and loading.upper() not in ("LAZY", "EAGER"):
            raise ConfigError(f"module_loading must be LAZY or EAGER, got {loading!r}", path=path)
        return cls(**fields)

    @classmethod
    def recorded(cls, versions: Mapping[str, Any]) -> StackVersions:
        """The versions a cluster profile recorded (``tuner.profile.job.versions``: ``torch``,
        ``cuda``, ``nccl`` and, where the job saw it set, ``module_loading``); a field it holds
        no version for (a CPU node's missing CUDA, a ``module_loading`` other than LAZY or
        EAGER) stays unknown."""
        fields = {k: str(versions[k]) for k in _KEYS if versions.get(k) not in (None, "")}
        loading = fields.get("module_loading", "").upper()
        if "module_loading" in fields:
            fields["module_loading"] = loading
            if loading not in ("LAZY", "EAGER"):
                del fields["module_loading"]
        return cls(**fields)

    @property
    def known(self) -> bool:
        """Whether any version is known."""
        return any(getattr(self, k) is not None for k in _KEYS)

    def words(self) -> str:
        """The versions as a study states them, ``torch=1.11 cuda=11.5`` (known ones only)."""
        return " ".join(f"{k}={getattr(self, k)}" for k in _KEYS if getattr(self, k) is not None)


@dataclass(frozen=True, slots=True)
class RecordedStack:
    """The stack's versions a valid cluster profile recorded, and which profile: what
    decides the versions' overheads where a study states no ``cluster.overheads.stack``
    (tuner.models.memory.stack.study_stack)."""

    versions: StackVersions
    source: str
    """``cluster profile NAME (measured WHEN)``."""


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
    stack: str | None = None
    """The stack's versions, ``torch=1.11 cuda=11.5`` (``torch``, ``cuda``, ``nccl``,
    ``module_loading``): a stack before lazy module loading gets an eager CUDA context
    (tuner.models.memory.stack) unless ``cuda_context_gib`` is given."""

    def __post_init__(self) -> None:
        StackVersions.parse(self.stack or "")
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
        """The figures that were given (the GPU catalog's fields; not the stack's versions)."""
        given = {n: getattr(self, n) for n in self.__slots__ if n != "stack"}
        return {n: v for n, v in given.items() if v is not None}

    def versions(self) -> StackVersions:
        """The stack's versions (nothing known when not given)."""
        return StackVersions.parse(self.stack or "")
