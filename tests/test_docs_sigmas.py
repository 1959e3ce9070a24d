"""The uncertainty table in docs/internals/models.md states the catalog's sds as the code does."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.models.uncertainty import (
    CATALOG_MEMORY_SIGMA,
    CATALOG_TIME_SIGMA,
    CATALOG_TIME_STACK_SIGMA,
)

MODELS_DOC = Path(__file__).resolve().parents[1] / "docs" / "internals" / "models.md"


def _stated_sds() -> dict[str, float]:
    """Each group's sd as the table's third column states it (a percentage)."""
    stated: dict[str, float] = {}
    for line in MODELS_DOC.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            continue
        match = re.match(r"(\d+(?:\.\d+)?)% ", cells[2])
        if match is not None:
            stated[cells[0]] = float(match.group(1)) / 100
    return stated


def test_the_documented_catalog_sds_are_the_constants() -> None:
    expected = {
        **CATALOG_MEMORY_SIGMA,
        **CATALOG_TIME_SIGMA,
        "stack": CATALOG_TIME_STACK_SIGMA,
    }
    stated = _stated_sds()
    assert set(stated) == set(expected)
    for group, sd in expected.items():
        assert round(stated[group], 4) == round(sd, 4), group
