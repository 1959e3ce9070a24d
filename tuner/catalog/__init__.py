"""Catalogs as data: GPU specs and model presets, loaded lazily from the YAML files beside this."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from tuner._loader import load_dataclass
from tuner.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator type (per GPU figures)."""

    name: str = ""
    """Catalog key."""
    memory_gib: float
    """Device memory the driver reports, GiB."""
    peak_tflops: float
    """Peak dense 16-bit tensor TFLOP/s (no sparsity)."""
    hbm_gbps: float
    """Device memory bandwidth, GB/s."""
    intra_node_gbps: float
    """Per-GPU, per-direction bandwidth to GPUs of the same node, GB/s."""
    inter_node_gbps: float
    """Per-GPU share of the network to other nodes, GB/s."""
    sm_count: int = 0
    """Streaming multiprocessors (the time model's wave quantization); 0 = not a GPU / unknown."""


@functools.cache
def _gpus() -> dict[str, GPUSpec]:
    raw = yaml.safe_load(resources.files(__name__).joinpath("gpus.yaml").read_text())
    return {
        name: load_dataclass(GPUSpec, {"name": name, **entry}, f"gpus.{name}")
        for name, entry in raw.items()
    }


def gpu_names() -> list[str]:
    """Names in the GPU catalog."""
    return sorted(_gpus())


def get_gpu(name: str, memory_gib: float | None = None) -> GPUSpec:
    """The catalog entry ``name``, with its memory replaced by ``memory_gib`` when given."""
    gpus = _gpus()
    if name not in gpus:
        raise ConfigError(
            f"unknown GPU {name!r} (catalog: {', '.join(sorted(gpus))})", path="cluster.gpu"
        )
    gpu = gpus[name]
    if memory_gib is None:
        return gpu
    return GPUSpec(
        name=gpu.name,
        memory_gib=memory_gib,
        peak_tflops=gpu.peak_tflops,
        hbm_gbps=gpu.hbm_gbps,
        intra_node_gbps=gpu.intra_node_gbps,
        inter_node_gbps=gpu.inter_node_gbps,
    )
