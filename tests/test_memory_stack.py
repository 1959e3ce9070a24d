"""What a stack's versions change in the memory outside PyTorch's allocator
(tuner.models.memory.stack): the CUDA context loads every kernel image eagerly before lazy module
loading (CUDA 11.7, on by default from PyTorch 1.13 or CUDA 12.2)."""

from __future__ import annotations

import copy

import pytest

from tests.test_memory_stages import STUDY
from tuner.catalog import get_gpu
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.models.memory.estimate import GIB, estimate_memory
from tuner.models.memory.stack import EAGER_CONTEXT_GIB, lazy_module_loading, stack_overheads
from tuner.space.enumerate import study_gpu
from tuner.spec.file import study_from_mapping
from tuner.spec.overheads import StackVersions, version
from tuner.spec.study import ModelSpec

H100 = get_gpu("h100-sxm-80gb")


def lazy(text: str) -> bool | None:
    return lazy_module_loading(StackVersions.parse(text))


def test_versions_read_major_and_minor() -> None:
    assert version("2.1.0a0+fe05266") == (2, 1)
    assert version("11.5") == (11, 5)
    assert version("") is None and version(None) is None and version("main") is None


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ("torch=1.11 cuda=11.5", False),  # BigScience tr11: the runtime predates lazy loading
        ("torch=1.13 cuda=11.6", False),  # torch asks for LAZY, an 11.6 runtime cannot
        ("torch=1.13 cuda=11.7", True),  # pytorch#86509 sets CUDA_MODULE_LOADING=LAZY
        ("torch=1.12 cuda=11.7", False),  # opt-in, and nobody opted in
        ("torch=1.12 cuda=11.7 module_loading=LAZY", True),
        ("torch=2.4 cuda=12.4 module_loading=EAGER", False),
        ("cuda=12.2", True),  # the Linux default from CUDA 12.2, whatever the framework
        ("torch=2.1.0a0 cuda=12.0", True),
        ("torch=2.1", None),  # a torch build's CUDA unknown: it may be an 11.6 one
        ("torch=1.11", None),
        ("", None),
    ],
)
def test_lazy_module_loading_follows_the_versions(stack: str, expected: bool | None) -> None:
    assert lazy(stack) is expected


def test_only_an_eager_stack_replaces_the_catalog_context() -> None:
    assert stack_overheads(StackVersions.parse("torch=1.11 cuda=11.5")) == {
        "cuda_context_gib": EAGER_CONTEXT_GIB
    }
    assert stack_overheads(StackVersions.parse("torch=2.4 cuda=12.4")) == {}
    assert stack_overheads(StackVersions()) == {}
    # pytorch#55277: 1687 MiB after one tensor, torch 1.8.2+cu111 (eager), over the catalog's
    # lazy A100 figure.
    assert EAGER_CONTEXT_GIB == pytest.approx(1.647, abs=1e-3)
    assert EAGER_CONTEXT_GIB > get_gpu("a100-80gb").cuda_context_gib


def test_an_eager_context_adds_its_difference_to_every_device_figure() -> None:
    """The eager context sits outside the allocator: the device figure grows by the difference
    from the catalog's lazy context on every stage, allocated and reserved do not move."""
    model = ModelSpec(
        name="t", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
        vocab_size=1024, seq_length=256,
    )  # fmt: skip
    c = ParallelConfig(tp=2, pp=2, global_batch_size=4)
    a100 = get_gpu("a100-80gb")
    eager = get_gpu("a100-80gb", overheads=stack_overheads(StackVersions.parse("cuda=11.5")))
    extra = (EAGER_CONTEXT_GIB - a100.cuda_context_gib) * GIB
    base, old = estimate_memory(model, c, a100), estimate_memory(model, c, eager)
    for before, after in zip(base.stages, old.stages, strict=True):
        for p, q in zip(before.phases, after.phases, strict=True):
            assert q.device - p.device == pytest.approx(extra)
            assert (q.allocated, q.reserved) == (p.allocated, p.reserved)


@pytest.mark.parametrize("text", ["torch", "pytorch=1.11", "cuda=", "module_loading=SOMETIMES"])
def test_a_malformed_stack_is_one_error_naming_the_field(text: str) -> None:
    with pytest.raises(ConfigError, match="stack"):
        StackVersions.parse(text)


def test_a_studys_stack_versions_give_its_gpu_the_eager_context() -> None:
    """``cluster.overheads.stack`` reaches the study's GPU: an eager stack's context, unless the
    study measured its own ``cuda_context_gib``, which wins; a malformed one is one ConfigError
    naming the field."""
    data = copy.deepcopy(STUDY)
    data["cluster"]["overheads"] = {"stack": "torch=1.11 cuda=11.5"}
    assert study_gpu(study_from_mapping(data)).cuda_context_gib == EAGER_CONTEXT_GIB
    data["cluster"]["overheads"] = {"stack": "torch=1.11 cuda=11.5", "cuda_context_gib": 2.5}
    assert study_gpu(study_from_mapping(data)).cuda_context_gib == 2.5
    data["cluster"]["overheads"] = {"stack": "torch=2.4 cuda=12.4"}
    assert study_gpu(study_from_mapping(data)).cuda_context_gib == H100.cuda_context_gib
    data["cluster"]["overheads"] = {"stack": "pytorch=1.11"}
    with pytest.raises(ConfigError, match="stack"):
        study_from_mapping(data)
