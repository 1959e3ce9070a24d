"""Catalogs as data: GPU specs and model presets, loaded lazily from the YAML files beside this."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from importlib import resources

import yaml

from tuner._loader import KeptHash, closest, load_dataclass
from tuner.errors import ConfigError
from tuner.layout import name_problem


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec(KeptHash):
    """One accelerator type (per GPU figures)."""

    __hash__ = KeptHash.__hash__  # hashed once (tuner._loader.KeptHash): a key of kept terms

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
    fp8_peak_tflops: float = 0.0
    """Peak dense FP8 tensor TFLOP/s (no sparsity); 0 = no FP8 tensor cores (A100, CPU)."""
    compute_capability: float = 0.0
    """CUDA compute capability (8.0 A100, 9.0 Hopper, 10.0 Blackwell); Transformer Engine's FP8
    recipes need 8.9+, MXFP8 10.0+. 0 = not a CUDA GPU."""
    sm_count: int = 0
    """Streaming multiprocessors (the time model's wave quantization); 0 = not a GPU / unknown."""
    mamf_tflops: float = 0.0
    """Maximum achievable matmul TFLOP/s at 16 bits, measured (the best of a shape sweep of
    ``torch.matmul``); 0 = not measured. ``tuner.models.rates.gemm_efficiency`` reads it."""
    mamf_fp8_tflops: float = 0.0
    """The same for FP8 (``float8_e4m3fn``) matmuls; 0 = not measured / no FP8."""
    # The software stack's fixed device memory (0 on ``cpu``: no CUDA context, gloo keeps no
    # device buffers). tuner.models.memory.overheads turns these into bytes; a study's
    # ``cluster.overheads`` replaces any of them with what its own stack measured.
    cuda_context_gib: float = 0.0
    """CUDA context plus the kernel images a training process loads, GiB (outside PyTorch)."""
    cublas_workspace_mib: float = 0.0
    """PyTorch's cuBLAS workspace of one (handle, stream) pair, MiB (through its allocator)."""
    cublaslt_workspace_mib: float = 0.0
    """PyTorch's cuBLASLt workspace of one (handle, stream) pair, MiB (through its allocator)."""
    nccl_channels: int = 0
    """NCCL collective channels per communicator (``NCCL INFO N coll channels``)."""
    nccl_buffer_mib: float = 0.0
    """Device buffer per channel of one collective connection, all protocols, MiB."""
    nccl_p2p_channels: int = 0
    """NCCL channels per send/recv peer (``p2p channels per peer``)."""
    nccl_p2p_buffer_mib: float = 0.0
    """Device buffer per p2p channel and peer, MiB."""
    allocator_fragmentation: float = 0.0
    """Caching-allocator reserve above live transient tensors, as a share of them."""


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


@functools.cache
def _folded_gpu_names() -> dict[str, str]:
    return {name.casefold(): name for name in _gpus()}


def catalog_gpu_name(name: str) -> str:
    """The catalog's spelling of the GPU ``name`` written in any case (``H100-SXM-80GB`` is
    ``h100-sxm-80gb``, as a datasheet or ``nvidia-smi`` may print it); ``name`` itself when no
    entry matches. The catalog holds no two names that differ only in case, so this is never a
    guess; a study stores the catalog's spelling, which keys its cluster's profile and
    calibration."""
    return _folded_gpu_names().get(name.casefold(), name)


def _name_tokens(name: str) -> list[str]:
    return [word for word in re.split(r"[-_\s]+", name.casefold()) if word]


def nearest_gpu(name: str) -> str | None:
    """The catalog entry a GPU ``name`` that is not one most likely means, or None.

    The chip's model is the token that decides (``h100`` in ``h100-80gb``): among the entries of
    that model (the first token of a catalog name), the one sharing most of the other tokens
    (memory, form factor), then the one nearest in spelling. Spelling alone would pick another
    chip (``h100-80gb`` is nearer ``a100-80gb`` than ``h100-sxm-80gb``). A name naming no model
    of the catalog gets the nearest spelling if it is close (``a10o-80gb``), else None (``h20``
    is not an ``h200``)."""
    names, given = gpu_names(), _name_tokens(name)
    models = {_name_tokens(entry)[0] for entry in names}
    model = next((word for word in given if word in models), None)
    if model is None:
        return closest(name, names)

    def likeness(entry: str) -> tuple[int, float]:
        shared = len(set(_name_tokens(entry)) & set(given))
        return shared, difflib.SequenceMatcher(None, name.casefold(), entry).ratio()

    return max((entry for entry in names if _name_tokens(entry)[0] == model), key=likeness)


def _gpu_hint(name: object) -> str:
    close = nearest_gpu(name) if isinstance(name, str) else None
    return f"; did you mean {close!r}?" if close else ""


def get_gpu(
    name: str | GPUSpec, memory_gib: float | None = None,
    overheads: Mapping[str, float] | None = None,
) -> GPUSpec:  # fmt: skip
    """The catalog entry ``name`` (or a GPU described by its figures, :func:`gpu_from_mapping`),
    with its memory replaced by ``memory_gib`` when given and any stack-overhead field
    (``cuda_context_gib``, ``nccl_channels``, ...) by ``overheads``."""
    gpus = _gpus()
    if isinstance(name, GPUSpec):
        gpu = name
    elif name not in gpus:
        raise ConfigError(
            f"unknown GPU {name!r}{_gpu_hint(name)} (catalog: {', '.join(sorted(gpus))}; or "
            "describe it: {name: ..., memory_gib: ..., peak_tflops: ..., ...})", path="cluster.gpu"
        )  # fmt: skip
    else:
        gpu = gpus[name]
    changes: dict[str, float] = {k: v for k, v in (overheads or {}).items() if v is not None}
    if memory_gib is not None:
        changes["memory_gib"] = memory_gib
    return replace(gpu, **changes) if changes else gpu  # type: ignore[arg-type]


POSITIVE = ("memory_gib", "peak_tflops", "hbm_gbps", "intra_node_gbps", "inter_node_gbps")
"""The figures a GPU described in a study must give (or take from its ``preset``), all > 0."""


def gpu_from_mapping(data: Mapping[str, object], path: str = "cluster.gpu") -> GPUSpec:
    """A GPU described in a study by its figures: ``name`` (its own, not a preset's), optionally
    ``preset`` to start from (its stack overheads too), and any :class:`GPUSpec` field; errors
    name the field (``cluster.gpu.peak_tflops: required field is missing``)."""
    entry = dict(data)
    preset = entry.pop("preset", None)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("a GPU given by its figures needs a name of its own (e.g. h100-nvl)",
                          path=f"{path}.name")  # fmt: skip
    if (problem := name_problem(name)) is not None:
        raise ConfigError(problem, path=f"{path}.name")
    if catalog_gpu_name(name) in _gpus():
        raise ConfigError(f"{name!r} is a preset's name: write preset: {catalog_gpu_name(name)} "
                          "and give this GPU a name of its own", path=f"{path}.name")  # fmt: skip
    if isinstance(preset, str):
        preset = catalog_gpu_name(preset)
    if preset is not None:
        if not isinstance(preset, str) or preset not in _gpus():
            raise ConfigError(f"unknown GPU preset {preset!r}{_gpu_hint(preset)} (catalog: "
                              f"{', '.join(gpu_names())})", path=f"{path}.preset")  # fmt: skip
        entry = {**asdict(_gpus()[preset]), **entry}
    gpu = load_dataclass(GPUSpec, entry, path)
    for key in POSITIVE:
        if getattr(gpu, key) <= 0:
            raise ConfigError(f"must be > 0, got {getattr(gpu, key)}", path=f"{path}.{key}")
    for f in fields(GPUSpec):
        value = getattr(gpu, f.name)
        if isinstance(value, int | float) and value < 0:
            raise ConfigError(f"must be >= 0, got {value}", path=f"{path}.{f.name}")
    if gpu.fp8_peak_tflops and gpu.compute_capability and gpu.compute_capability < 8.9:
        raise ConfigError(
            f"FP8 tensor cores need compute capability 8.9 or more (got "
            f"{gpu.compute_capability})", path=f"{path}.fp8_peak_tflops",
        )  # fmt: skip
    return gpu


def gpu_presets() -> list[GPUSpec]:
    """Every GPU preset, by name."""
    return [_gpus()[name] for name in gpu_names()]
