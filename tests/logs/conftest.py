"""Where the shared real-log fixtures live: ``shared/`` sits beside the repository checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "logs"


@pytest.fixture
def fixtures_dir() -> Path:
    """The fixture folder; the test is skipped when the checkout has no ``../shared`` beside it."""
    if not FIXTURES.is_dir():
        pytest.skip(
            f"real-log fixtures not found at {FIXTURES.resolve()} (shared/ not beside repo)"
        )
    return FIXTURES
