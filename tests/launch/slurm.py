"""A throw-away real Slurm for the Slurm executor's tests: the dev tool ``tools/local_slurm.py``.

:func:`local_slurm` starts munged, slurmctld and two slurmd under a fresh directory once per test
module and always stops them again (also when a test fails), checking that nothing is left.
Without the Slurm binaries the tests are skipped with the reason, except under CI (``CI`` set),
where a missing Slurm is a failure: ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tools/ is not part of the installed package
    sys.path.insert(0, str(REPO))

from tools.local_slurm import LocalSlurm, slurm_missing_reason  # noqa: E402

__all__ = ["LocalSlurm", "local_slurm", "running_slurm", "slurm_missing_reason"]


@contextlib.contextmanager
def running_slurm(dir: Path, nodes: int, **kwargs: Any) -> Iterator[LocalSlurm]:
    """A started :class:`LocalSlurm` under ``dir`` (``kwargs`` as its own), stopped on the way
    out with nothing of it left; a missing Slurm skips the test (fails it under CI)."""
    reason = slurm_missing_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm(dir, nodes, **kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        survivors = cluster.stop()
        assert survivors == [], f"local Slurm left processes: {survivors}"


@pytest.fixture(scope="module")
def local_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """A running two-node Slurm (nodes n1, n2); ``SLURM_CONF`` is set while the module runs."""
    saved = os.environ.get("SLURM_CONF")
    with running_slurm(tmp_path_factory.mktemp("slurm"), 2) as cluster:
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            yield cluster
        finally:
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved
