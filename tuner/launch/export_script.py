"""The exported launch script of a full run (``tune best``): pure text, no I/O.

A trial's node scripts are rendered with the hosts and the master address of that trial; a full
run starts later, on nodes the tuner may never see. So the exported script decides both when it
runs: this node's rank (``NODE_RANK``, else ``SLURM_NODEID`` inside a Slurm job, else 0 when the
run has one node) and the master address (``MASTER_ADDR``, else the first node of the Slurm
allocation, else the first host of ``$HOSTFILE``, else the study's first SSH node, else loopback
for one node). The node scripts are the study's template rendered with
:data:`~tuner.launch.slurm_script.MASTER_PLACEHOLDER` for the address, which is replaced here by
the variable the script resolved; each becomes one shell function of the script, so the export
is one self-contained file.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.launch.slurm_script import MASTER_PLACEHOLDER, SLURM_FIRST_NODE

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class MasterSources:
    """Where the exported script looks for the master address, after ``MASTER_ADDR`` and the
    Slurm allocation."""

    study_host: str | None = None
    """The address an SSH study's trials used for its first node (its ssh config HostName)."""


def comment_block(lines: Sequence[str], width: int = 96) -> list[str]:
    """``lines`` as shell comments, wrapped at ``width``; a control character (a newline in a
    study's value) is written as its escape, so no value can end the comment."""
    out = []
    for line in lines:
        safe = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode()
                       for ch in line)  # fmt: skip
        wrapped = textwrap.wrap(safe, width - 2, break_long_words=False, break_on_hyphens=False)
        out += [f"# {wrapped[0]}", *(f"#   {part}" for part in wrapped[1:])] if wrapped else ["#"]
    return out


def _rank_lines(nnodes: int) -> list[str]:
    return [
        f"nnodes={nnodes}",
        "# this node's rank: NODE_RANK, else SLURM_NODEID inside a Slurm job, else 0 on one node",
        "rank=${NODE_RANK:-${SLURM_NODEID:-}}",
        'if [ -z "$rank" ]; then',
        '  if [ "$nnodes" -eq 1 ]; then rank=0; else',
        '    echo "tuner: set NODE_RANK to the rank of this node (0..$((nnodes - 1)))" >&2',
        "    exit 2",
        "  fi",
        "fi",
        "# a rank the run does not have stops here, before a master address is looked up",
        'case "$rank" in',
        "  ''|*[!0-9]*) rank_ok=0 ;;",
        "  *) rank=$((10#$rank)); rank_ok=$(( rank < nnodes )) ;;",
        "esac",
        'if [ "$rank_ok" -ne 1 ]; then',
        '  echo "tuner: NODE_RANK $rank is not in 0..$((nnodes - 1))" >&2',
        "  exit 2",
        "fi",
    ]


def _master_lines(nnodes: int, sources: MasterSources) -> list[str]:
    out = [
        "# the master address, found when this script runs (see the header)",
        "tuner_master_addr() {",
        '  if [ -n "${MASTER_ADDR:-}" ]; then printf "%s\\n" "$MASTER_ADDR"; return; fi',
        '  if [ -n "${SLURM_JOB_NODELIST:-}" ]; then  # no scontrol (a container): the next',
        "    local first addr",
        *("    " + line for line in SLURM_FIRST_NODE.splitlines()),
        '    if [ -n "${addr:-$first}" ]; then printf "%s\\n" "${addr:-$first}"; return; fi',
        "  fi",
        # HOSTFILE only: a study's cluster.hostfile was read into its nodes when it loaded,
        # so its first host is the study's first node, below
        "  local hostfile=${HOSTFILE:-}",
        '  if [ -n "$hostfile" ] && [ -r "$hostfile" ]; then',
        "    local host",
        "    host=$(sed -e 's/#.*//' \"$hostfile\" | awk 'NF { print $1; exit }')",
        '    if [ -n "$host" ]; then printf "%s\\n" "$host"; return; fi',
        "  fi",
    ]
    if sources.study_host:
        out.append(f'  printf "%s\\n" {shlex.quote(sources.study_host)}')
    elif nnodes == 1:
        out.append(f"  printf '%s\\n' {LOOPBACK}")
    else:  # no last source: ask (a line after a fallback's return was never reached)
        out += ['  echo "tuner: set MASTER_ADDR to the address of the node with rank 0" >&2',
                "  return 2"]  # fmt: skip
    out += [
        "}",
        "MASTER_ADDR=$(tuner_master_addr)",
        "export MASTER_ADDR",
    ]
    return out


def runtime_master(script: str) -> str:
    """A node script rendered with the placeholder address, reading ``$MASTER_ADDR`` instead."""
    return script.replace(MASTER_PLACEHOLDER, '"${MASTER_ADDR}"')


def launch_script(
    header: Sequence[str], node_scripts: Sequence[str], sources: MasterSources
) -> str:
    """One script for every node of the run: ``header`` (comment lines, without ``#``), the rank
    and master address found at run time, then node ``rank``'s rendered script."""
    nnodes = len(node_scripts)
    out = ["#!/usr/bin/env bash", *comment_block(header), "set -euo pipefail"]
    out += _rank_lines(nnodes) + _master_lines(nnodes, sources)
    cases = []
    for k, script in enumerate(node_scripts):
        body = runtime_master(script)
        if body.startswith("#!"):
            body = body.split("\n", 1)[1] if "\n" in body else ""
        out += ["", f"tuner_node_{k}() {{", body.rstrip("\n"), "}"]
        cases.append(f"  {k}) tuner_node_{k} ;;")
    out += [
        "",
        'echo "tuner: node $rank of $nnodes, master $MASTER_ADDR" >&2',
        'case "$rank" in',
        *cases,
        '  *) echo "tuner: NODE_RANK $rank is not in 0..$((nnodes - 1))" >&2; exit 2 ;;',
        "esac",
    ]
    return "\n".join(out) + "\n"
