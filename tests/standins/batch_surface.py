"""A stand-in surface keyed by config and micro-batches per step: for a config measured at fewer
micro-batches per step than its own (``search.fewer_microbatches``), whose step differs from the
full step's.

``TUNER_STANDIN_SURFACE`` names a JSON file ``{"kind": "python", "function":
"tests/standins/batch_surface.py:point", "noise": ..., "warmup_factor": ...}``;
``TUNER_STANDIN_BATCH_TABLE`` a JSON file ``{config key: {micro-batches: {"step_s": s,
"memory_gib": g}}}`` (config keys as ``pretrain_gpt.config_key``). A point missing from the
table is an error: the test gave the stand-in every step it may run.
"""

from __future__ import annotations

import json
import os
from typing import Any


def point(v: dict[str, Any]) -> dict[str, Any]:
    """The table's step and peak for the config and micro-batch count in ``v``."""
    with open(os.environ["TUNER_STANDIN_BATCH_TABLE"], encoding="utf-8") as handle:
        table = json.load(handle)
    key = ",".join(f"{name}={v[name]}" for name in
                   ("tp", "pp", "cp", "vp", "mbs", "recompute", "sp", "distopt"))  # fmt: skip
    entry = table.get(key, {}).get(str(v["microbatches"]))
    if entry is None:
        raise RuntimeError(f"no step for {key} at {v['microbatches']} micro-batches")
    return dict(entry)
