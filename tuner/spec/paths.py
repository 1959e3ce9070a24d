"""Which study fields are paths, and what a relative one is relative to: the study file's folder.

:func:`tuner.spec.file.study_from_mapping` applies :func:`study_relative` to a study read from a
file, after ``${NAME}`` expansion and before the strict loader.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STUDY_PATHS = (
    "cluster.hostfile", "cluster.ssh.config_file", "cluster.ssh.key_file",
    "cluster.ssh.known_hosts", "launch.python", "launch.megatron_path", "launch.script",
    "launch.workdir", "launch.templates_dir",
)  # fmt: skip
"""The study fields that name a file or directory: a relative one is relative to the study file."""


def study_relative(data: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """``data`` with each relative path of :data:`STUDY_PATHS` joined to ``base_dir``.

    Why: a study must mean the same files wherever ``tune`` is started from, and its hostfile,
    training script or templates usually sit next to it. Absolute paths and ``~/...`` stay as
    written (``~`` is the home directory of whoever opens the file: on the nodes, theirs), and so
    does a ``launch.python`` without a ``/`` (looked up on PATH). ``..`` is taken literally.
    """
    out = dict(data)
    for dotted in STUDY_PATHS:
        *parents, leaf = dotted.split(".")
        node: Any = out
        for key in parents:
            if not isinstance(node.get(key), Mapping):
                break
            node[key] = node = dict(node[key])
        else:
            value = node.get(leaf)
            bare = dotted == "launch.python" and isinstance(value, str) and "/" not in value
            if isinstance(value, str) and value and not bare and not value.startswith("~"):
                node[leaf] = os.path.normpath(base_dir / value)  # unchanged when absolute
    return out
