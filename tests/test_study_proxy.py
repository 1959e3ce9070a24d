"""A study with ``search.proxy: on`` through the real loop: local executor, the Megatron stand-in
under torchrun on 4 "nodes", real SQLite. Proxies run on 2 nodes at once, their figures are
extrapolated, the best is confirmed at full scale and is the one called best."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_study import STANDINS
from tuner.cli.board import board_grid
from tuner.report.data import gather
from tuner.report.leaderboard import (
    best_trial,
    board_rows,
    board_trials,
    leaderboard,
    load_optuna_study,
)
from tuner.report.views import leaderboard as html_board
from tuner.spec.file import study_from_mapping
from tuner.study.build import build_loop

pytestmark = [pytest.mark.slow]


def test_proxies_run_on_half_the_nodes_and_the_best_is_confirmed_at_full_scale(
    tmp_path: Path,
) -> None:
    # the stand-in's step grows with DP (a gradient reduction it does not hide), so a proxy
    # measures less than the full run: the extrapolation, not the raw proxy, is recorded
    (tmp_path / "surface.json").write_text(
        '{"kind": "formula", "memory_gib": 10.0, "noise": 0.0, "warmup_factor": 1.0,'
        ' "step_s": {"base": 1.0, "terms": {"dp": 0.01}, "factors": {"tp": {"1": 1.2},'
        ' "mbs": {"1": 1.3}}}}'
    )
    spec = study_from_mapping({
        "name": "px",
        "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024,
                  "num_attention_heads": 8, "vocab_size": 1024, "seq_length": 128},
        "training": {"global_batch_size": 64},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 4, "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": str(STANDINS),
                   "python": sys.executable, "train_iters": 5, "warmup_iters": 1,
                   "env": {"TUNER_STANDIN_SURFACE": str(tmp_path / "surface.json"),
                           "TUNER_STANDIN_TIME_SCALE": "0.0001"}},
        "space": {"tp": [1, 2], "pp": [1], "micro_batch_size": [1, 2],
                  "sequence_parallel": [False], "recompute": ["none"],
                  "distributed_optimizer": [True]},
        "search": {"n_trials": 2, "trial_timeout_min": 2, "seed": 1, "early_stop_trials": None,
                   "stop_chance": None, "proxy": True, "proxy_confirm": 1},
    })  # fmt: skip
    results = str(tmp_path / "results")
    loop = build_loop(spec, results=results)
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    trials = load_optuna_study(spec, None, results).get_trials(deepcopy=False)
    launched = [t for t in trials if t.user_attrs.get("launched")]
    # a rendezvous port another test took meanwhile is a node error, run again: count ok ones
    ok = [t for t in launched if t.user_attrs.get("outcome") == "ok"]
    proxies = [t for t in ok if t.user_attrs.get("proxy")]
    full = [t for t in ok if not t.user_attrs.get("proxy")]
    assert len(proxies) == 2 and len(full) >= 1, summary
    for t in proxies:  # on 2 of the 4 nodes, DP halved, the global batch with it
        a = t.user_attrs
        assert len(a["hosts"]) == a["proxy_nodes"] == 2 and a["outcome"] == "ok"
        assert a["proxy_dp"] * 2 == a["config"]["dp"] and a["proxy_global_batch"] == 32
        assert a["proxy_step_s"] > 0 and a["step_time_s"] == t.value
        assert a["step_time_s"] == a["proxy_extrapolation"]["step_s"]
        assert a["step_time_s"] != a["proxy_step_s"]
    # two proxies ran at once on disjoint nodes
    runs = [t for t in launched if t.user_attrs.get("proxy")]
    spans = [(t.datetime_start, t.datetime_complete) for t in runs]
    assert any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(spans)
               for b0, b1 in spans[i + 1:])  # fmt: skip
    # the best extrapolated config ran again at full scale, on all 4 nodes
    best_proxy = min(proxies, key=lambda t: float(t.value or 0.0))
    confirm = [t for t in full if t.user_attrs.get("confirms") == best_proxy.number]
    assert len(confirm) == 1 and len(confirm[0].user_attrs["hosts"]) == 4
    assert confirm[0].user_attrs["key"] == best_proxy.user_attrs["key"]
    assert confirm[0].user_attrs["outcome"] == "ok"
    assert confirm[0].user_attrs["purpose"] == "confirmation"  # the spend summary's third kind
    # best is a full-scale measurement; the board marks the proxies
    assert not best_trial(spec, None, results).user_attrs.get("proxy")
    assert summary.best_trial == confirm[0].number
    board = leaderboard(spec, results=results)
    assert sorted(board["scale"]) == ["full"] * len(full) + ["proxy"] * 2
    grid = board_grid("px", board_rows(spec, board_trials(spec, None, results)), False)
    names = [c.name for c in grid.columns]
    step = names.index("measured_step_s")
    marks = {row[names.index("scale")]: row[step].startswith("~") for row in grid.rows}
    assert marks == {"proxy": True, "full": False}
    page = str(html_board(gather(spec, results=results)))
    assert page.count('class="proxy"') == 2
