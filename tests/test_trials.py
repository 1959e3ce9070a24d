"""Trials in the storage: parameter names a dashboard shows, and configs read back from them."""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.report.leaderboard import COLUMNS
from tuner.space.trials import config_from_params, config_params, distributions
from tuner.spec.file import study_from_mapping

SPEC = study_from_mapping({
    "name": "params",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 1, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
    "space": {"tp": [1, 2], "micro_batch_size": [1, 2], "sequence_parallel": [True, False],
              "recompute": ["none", "full"], "recompute_method": ["uniform"],
              "recompute_num_layers": [1], "distributed_optimizer": [True]},
})  # fmt: skip

CONFIG = ParallelConfig(tp=2, dp=4, micro_batch_size=2, global_batch_size=64,
                        sequence_parallel=True, recompute="full", recompute_method="uniform",
                        recompute_num_layers=1, distributed_optimizer=True)  # fmt: skip


def test_every_searched_knob_is_named_as_its_leaderboard_column() -> None:
    names = set(distributions(SPEC))
    assert names <= set(COLUMNS), names - set(COLUMNS)
    assert {"micro_batch", "sp", "recompute"} <= names


def test_recompute_is_stored_in_the_leaderboards_spelling() -> None:
    params = config_params(CONFIG)
    assert params["recompute"] == CONFIG.recompute_setting == "full:uniform:1"
    assert params["recompute"] in distributions(SPEC)["recompute"].choices  # type: ignore[attr-defined]


def test_params_round_trip_to_the_same_config() -> None:
    assert config_from_params(SPEC, config_params(CONFIG)) == CONFIG


def test_a_study_stored_under_the_old_names_still_reads() -> None:
    legacy = dict(config_params(CONFIG))
    legacy["micro_batch_size"] = legacy.pop("micro_batch")
    legacy["sequence_parallel"] = legacy.pop("sp")
    assert config_from_params(SPEC, legacy) == CONFIG
