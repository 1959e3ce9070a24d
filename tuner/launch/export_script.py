"""The exported launch script of a full run (``tune best``): pure text, no I/O.

A trial's node scripts are rendered with the hosts and the master address of that trial; a full
run starts later, on nodes the tuner may never see. So the exported script decides these when it
runs: this node's rank (``NODE_RANK``, else ``SLURM_NODEID`` inside a Slurm job, else 0 when the
run has one node), the master address (``MASTER_ADDR``, else the first node of the Slurm
allocation, else the first host of ``$HOSTFILE``, else the study's first SSH node, else loopback
for one node) and the master port (``MASTER_PORT``, else the study's ``launch.master_port``: the
trials' port may be taken where the full run starts, and torchrun reads ``MASTER_PORT`` only
when no ``--master_port`` is given, so the rendered option reads it). The node scripts are the
study's template rendered with :data:`~tuner.launch.slurm_script.MASTER_PLACEHOLDER` for the
address, which is replaced here by the variable the script resolved. The node scripts become one
shell function, with a table of the words that differ between nodes (the rank), so the export is
one self-contained file whose length does not grow with the nodes; a template whose nodes differ
in more than words gets one function per node.
"""

from __future__ import annotations

import os
import re
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
    port: int | None = None
    """The study's ``launch.master_port``: the port when ``MASTER_PORT`` is unset; None leaves
    the rendered port in place."""


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
    if sources.port is not None:
        out += [f"MASTER_PORT=${{MASTER_PORT:-{sources.port}}}", "export MASTER_PORT"]
    return out


PORT_FLAG = re.compile(r"(--master[_-]port)(=|[ \t]+)(?:'(\d+)'|(\d+))(?=[ \t]|$)", re.M)
"""torchrun's port option with a number, as a template renders it (``--master_port 29500``,
``--master-port='29500'``)."""


def runtime_master(script: str, port: int | None = None) -> str:
    """A node script rendered with the placeholder address, reading ``$MASTER_ADDR`` instead;
    with ``port``, torchrun's port option at that number reads ``$MASTER_PORT``."""
    script = script.replace(MASTER_PLACEHOLDER, '"${MASTER_ADDR}"')
    if port is None:
        return script

    def _port(m: re.Match[str]) -> str:
        number = m.group(3) or m.group(4)
        return f'{m.group(1)}{m.group(2)}"${{MASTER_PORT}}"' if int(number) == port else m[0]

    return PORT_FLAG.sub(_port, script)


SAFE_WORD = re.compile(r"[A-Za-z0-9_.,:/=@%+-]+")
"""A word the shell reads as itself, unquoted, in any position: what a per-node table holds."""


@dataclass(frozen=True, slots=True)
class _Folded:
    """Every node's script as one body: the lines that differ between nodes read the one word
    that differs from a table (``columns[c][k]``: the word of column ``c`` on node ``k``)."""

    body: list[str]
    columns: list[list[str]]


def _strip_shebang(script: str, port: int | None) -> str:
    body = runtime_master(script, port)
    if body.startswith("#!"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
    return body.rstrip("\n")


def _split_line(variants: Sequence[str]) -> tuple[str, list[str], str] | None:
    """``(prefix, words, suffix)`` of one line as it reads on each node, where the nodes differ
    in one whole shell word; None otherwise (two words, a quoted word, a word inside quotes)."""
    prefix = os.path.commonprefix(list(variants))
    prefix = prefix[: max(prefix.rfind(" "), prefix.rfind("\t")) + 1]
    rest = [line[len(prefix) :] for line in variants]
    tail = os.path.commonprefix([line[::-1] for line in rest])[::-1]
    cut = next((i for i, ch in enumerate(tail) if ch in " \t"), len(tail))
    suffix = tail[cut:]
    words = [line[: len(line) - len(suffix)] for line in rest]
    if not all(SAFE_WORD.fullmatch(word) for word in words):
        return None
    if prefix.lstrip().startswith("#"):
        return prefix, words, suffix
    try:  # the word starts a word of its own, outside any quote or comment
        if "#" in prefix or shlex.split(prefix + "x")[-1] != "x":
            return None
    except ValueError:
        return None
    return prefix, words, suffix


def _fold(bodies: Sequence[str]) -> _Folded | None:
    """The nodes' scripts as one body, where they differ only in whole shell words outside quotes:
    the node rank (tuner's templates) reads ``$rank``, any other word a table; None where they
    differ otherwise (a template that renders other lines per node), or hold a here-document."""
    split = [body.split("\n") for body in bodies]
    if len({len(lines) for lines in split}) != 1 or any("<<" in body for body in bodies):
        return None
    ranks = [str(k) for k in range(len(bodies))]
    out: list[str] = []
    columns: list[list[str]] = []
    for variants in zip(*split, strict=True):
        if len(set(variants)) == 1:
            out.append(variants[0])
            continue
        parts = _split_line(variants)
        if parts is None:
            return None
        prefix, words, suffix = parts
        if prefix.lstrip().startswith("#"):  # a comment: the rank, read as a name of it
            if words != ranks:
                return None
            out.append(f"{prefix}$rank{suffix}")
            continue
        if words == ranks:  # the node rank itself: the rank the script found
            out.append(f'{prefix}"$rank"{suffix}')
            continue
        if words not in columns:
            columns.append(words)
        out.append(f'{prefix}"${{tuner_node_words_{columns.index(words)}[$rank]}}"{suffix}')
    return _Folded(out, columns)


def _node_lines(node_scripts: Sequence[str], port: int | None) -> list[str]:
    """The nodes' scripts as shell code that runs node ``$rank``'s: one function and a table of
    what differs per node, or (a template whose nodes differ in more than words) one function
    per node."""
    bodies = [_strip_shebang(script, port) for script in node_scripts]
    folded = _fold(bodies)
    if folded is None:
        out, cases = [], []
        for k, body in enumerate(bodies):
            out += ["", f"tuner_node_{k}() {{", body, "}"]
            cases.append(f"  {k}) tuner_node_{k} ;;")
        return [*out, "", 'echo "tuner: node $rank of $nnodes, master $MASTER_ADDR" >&2',
                'case "$rank" in', *cases,
                '  *) echo "tuner: NODE_RANK $rank is not in 0..$((nnodes - 1))" >&2; exit 2 ;;',
                "esac"]  # fmt: skip
    out = [""]
    if folded.columns:
        out.append("# what differs between the nodes: word k of each table is node k's")
    for c, words in enumerate(folded.columns):
        out.append(f"tuner_node_words_{c}=({' '.join(words)})")
    started = 'echo "tuner: node $rank of $nnodes, master $MASTER_ADDR" >&2'
    return [*out, "", "tuner_node() {", *folded.body, "}", "", started, "tuner_node"]


def launch_script(
    header: Sequence[str], node_scripts: Sequence[str], sources: MasterSources
) -> str:
    """One script for every node of the run: ``header`` (comment lines, without ``#``), the rank
    and master address found at run time, then node ``rank``'s rendered script."""
    nnodes = len(node_scripts)
    out = ["#!/usr/bin/env bash", *comment_block(header), "set -euo pipefail"]
    out += (
        _rank_lines(nnodes)
        + _master_lines(nnodes, sources)
        + _node_lines(node_scripts, sources.port)
    )
    return "\n".join(out) + "\n"
