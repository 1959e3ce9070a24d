"""The hash a frozen dataclass keeps (tuner._loader.KeptHash) is the generated one's, and nothing
else of the object changes: fields, asdict, equality, repr, pickling, replace."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from tuner._loader import KeptHash
from tuner.catalog import GPUSpec, get_gpu
from tuner.config.build import FIELDS as CONFIG_FIELDS
from tuner.config.build import built, replaced
from tuner.config.parallel import ParallelConfig
from tuner.spec.file import load_study
from tuner.spec.model import ModelSpec


def _generated_hash(obj: Any) -> int:
    """What dataclasses' generated ``__hash__`` returns: the hash of the tuple of the fields
    that take part in it."""
    return hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj)
                      if (f.compare if f.hash is None else f.hash)))  # fmt: skip


def _objects() -> list[Any]:
    dense, moe = load_study("gpt-70b").model, load_study("mixtral-8x7b").model
    config = ParallelConfig(tp=2, pp=4, micro_batch_size=2, recompute="selective")
    return [dense, moe, get_gpu("h100-sxm-80gb"), config, built(tuple(
        getattr(config, f) for f in CONFIG_FIELDS))]  # fmt: skip


@pytest.mark.parametrize("cls", [ModelSpec, GPUSpec, ParallelConfig])
def test_the_class_keeps_its_hash(cls: Any) -> None:
    assert issubclass(cls, KeptHash)
    assert cls.__hash__ is KeptHash.__hash__  # not replaced by the generated one
    assert "_kept_hash" not in {f.name for f in dataclasses.fields(cls)}


def test_the_kept_hash_is_the_generated_one_and_the_object_is_unchanged() -> None:
    for obj in _objects():
        before = (dataclasses.asdict(obj), repr(obj))
        first = hash(obj)
        assert first == _generated_hash(obj) == hash(obj)
        assert (dataclasses.asdict(obj), repr(obj)) == before  # the kept slot is no field
        twin = pickle.loads(pickle.dumps(obj))
        assert twin == obj and hash(twin) == first
        again = dataclasses.replace(obj)
        assert again == obj and hash(again) == first


def test_a_changed_copy_hashes_its_own_fields() -> None:
    """A copy made after the hash was kept (replace, or ``build.replaced``, which reads every
    field) hashes its own values, not the kept figure of the object it came from."""
    model, _, gpu, config, _ = _objects()
    for obj, change in ((model, {"num_layers": 40}), (gpu, {"memory_gib": 40.0}),
                        (config, {"tp": 4})):  # fmt: skip
        hash(obj)
        other = dataclasses.replace(obj, **change)
        assert other != obj and hash(other) == _generated_hash(other) != hash(obj)
    hash(config)
    other = replaced(config, micro_batch_size=4)
    assert hash(other) == _generated_hash(other) != hash(config)
    # equal objects made apart hash alike (a kept table finds one under the other's key)
    assert hash(ParallelConfig(tp=4, pp=4, micro_batch_size=2, recompute="selective")) == hash(
        dataclasses.replace(config, tp=4)
    )
