"""Write the Megatron-Bridge override table the stand-in recipe script accepts.

The table lists, per ``ConfigContainer`` section, every dataclass field a recipe override can
name and its annotation as written in the source, read (with :mod:`ast`, nothing imported) from
two pinned commits: Megatron-Bridge v0.6.0 and the Megatron-LM commit its ``3rdparty/Megatron-LM``
submodule pins. A section's fields are the union over its class and the classes it inherits from
(the chains below, as the source declares them). Run it with two git directories::

    python tools/bridge_fields.py BRIDGE_GIT_DIR MEGATRON_LM_GIT_DIR > \
        tests/standins/megatron_bridge/fields.json
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

BRIDGE_TAG = "v0.6.0"
BRIDGE_COMMIT = "51885cf132b2814188b6855c25a8588254274c2a"
MCORE_COMMIT = "cd4afffa648426a959dc7cb1e24b5ce7d0c3ff54"  # Bridge v0.6.0's 3rdparty/Megatron-LM

_B = "src/megatron/bridge/"
_TC = "megatron/training/config/"
SECTIONS: dict[str, list[tuple[str, str, str]]] = {
    "model": [("bridge", _B + "models/gpt_provider.py", "GPTModelProvider"),
              ("mcore", "megatron/core/transformer/transformer_config.py", "TransformerConfig"),
              ("mcore", "megatron/core/model_parallel_config.py", "ModelParallelConfig")],
    "train": [("bridge", _B + "training/config.py", "TrainingConfig"),
              ("mcore", _TC + "training_config.py", "TrainingConfig")],
    "validation": [("mcore", _TC + "training_config.py", "ValidationConfig")],
    "optimizer": [("bridge", _B + "training/config.py", "OptimizerConfig"),
                  ("mcore", "megatron/core/optimizer/optimizer_config.py", "OptimizerConfig")],
    "scheduler": [("bridge", _B + "training/config.py", "SchedulerConfig"),
                  ("mcore", _TC + "training_config.py", "SchedulerConfig")],
    "ddp": [("bridge", _B + "training/config.py", "DistributedDataParallelConfig"),
            ("mcore", "megatron/core/distributed/distributed_data_parallel_config.py",
             "DistributedDataParallelConfig")],
    "dist": [("bridge", _B + "training/config.py", "DistributedInitConfig"),
             ("mcore", _TC + "common_config.py", "DistributedInitConfig")],
    "logger": [("bridge", _B + "training/config.py", "LoggerConfig"),
               ("mcore", _TC + "training_config.py", "LoggerConfig")],
    "checkpoint": [("bridge", _B + "training/config.py", "CheckpointConfig"),
                   ("mcore", _TC + "training_config.py", "CheckpointConfig")],
    "dataset": [("bridge", _B + "training/config.py", "MockGPTDatasetConfig"),
                ("bridge", _B + "training/config.py", "GPTDatasetConfig"),
                ("bridge", _B + "data/base.py", "DataloaderConfig"),
                ("mcore", "megatron/core/datasets/gpt_dataset.py", "GPTDatasetConfig"),
                ("mcore", "megatron/core/datasets/blended_megatron_dataset_config.py",
                 "BlendedMegatronDatasetConfig")],
    "comm_overlap": [("bridge", _B + "training/comm_overlap.py", "CommOverlapConfig")],
    "mixed_precision": [("bridge", _B + "training/mixed_precision.py", "MixedPrecisionConfig")],
}  # fmt: skip


def _source(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def class_fields(source: str, name: str) -> dict[str, str]:
    """The annotated public class-level names of class ``name`` (its own, not inherited)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and not item.target.id.startswith("_")
                and "ClassVar" not in ast.unparse(item.annotation)
            }
    raise SystemExit(f"class {name} not found")


def main(bridge_git: str, mcore_git: str) -> None:
    repos = {"bridge": (bridge_git, BRIDGE_COMMIT), "mcore": (mcore_git, MCORE_COMMIT)}
    table: dict[str, object] = {
        "_source": {"megatron-bridge": f"{BRIDGE_TAG} {BRIDGE_COMMIT}",
                    "megatron-lm": MCORE_COMMIT,
                    "generator": "tools/bridge_fields.py"},
    }  # fmt: skip
    for section, chain in SECTIONS.items():
        fields: dict[str, str] = {}
        for repo, path, cls in reversed(chain):  # base first: a subclass re-annotation wins
            git_dir, commit = repos[repo]
            fields.update(class_fields(_source(git_dir, commit, path), cls))
        table[section] = dict(sorted(fields.items()))
    json.dump(table, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
