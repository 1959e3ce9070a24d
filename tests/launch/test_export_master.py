"""The exported launch script's master-address function has no line it can never reach.

A one-node export (and an SSH study's, which falls back to its first node) ended the function
with its fallback's ``printf ...; return`` and then the "set MASTER_ADDR" refusal and
``return 2``, dead code a reader of launch.sh had to puzzle over. Each script now ends with one
last source: the fallback, or the refusal when there is none; bash still finds the address.
"""

from __future__ import annotations

import subprocess

import pytest

from tuner.launch.export_script import MasterSources, _master_lines


def _function(nnodes: int, sources: MasterSources) -> list[str]:
    lines = _master_lines(nnodes, sources)
    return lines[lines.index("tuner_master_addr() {") + 1 : lines.index("}")]


@pytest.mark.parametrize(
    ("nnodes", "host", "last", "said"),
    [(1, None, "127.0.0.1", "127.0.0.1"), (2, "10.0.0.7", "10.0.0.7", "10.0.0.7"),
     (2, None, "return 2", "")],
)  # fmt: skip
def test_the_master_function_ends_with_its_one_last_source(
    nnodes: int, host: str | None, last: str, said: str
) -> None:
    body = _function(nnodes, MasterSources(study_host=host))
    top = [line for line in body if line.startswith("  ") and not line.startswith("   ")]
    assert last in top[-1], top
    assert not any(line.rstrip().endswith("return") for line in top[:-1] if "fi" not in line), top
    lines = _master_lines(nnodes, MasterSources(study_host=host))
    script = "\n".join(["set -euo pipefail", *lines, 'printf "%s" "$MASTER_ADDR"'])
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert done.stdout == said and done.returncode == (0 if said else 2), done
