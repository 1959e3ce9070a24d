"""Issue 33's scenario under a time limit no config's trial fits: measured at fewer micro-batches.

Llama-3-70B on 16 nodes x 8 H100, global batch 2048, ``search.trial_timeout_min: 20``: every
config's shortest useful trial (start-up + 13 iterations of ~2 min steps) takes 28-50 minutes.
Through the real CLI the dry run must adapt each config (the same tp, pp, dp and micro-batch at
a smaller global batch, ``tuner.space.shorten``) or refuse it with the minutes and the fix; then
the same space runs on the Megatron stand-in paced at the tuner's own predicted steps at each
micro-batch count, and every trial ends ``ok`` with its full step extrapolated and marked so.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_cost import STANDIN, dry_run, one_process, scenario, write
from tuner.cli.main import main
from tuner.models.time.estimate import estimate_time
from tuner.report.leaderboard import load_optuna_study
from tuner.space.cost import LIMIT_MARGIN, trial_cost
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.space.shorten import at_microbatches, shorten
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.build import build_loop

LIMIT = 20
TIME_SCALE = 0.002  # a 115 s step sleeps 0.23 s


def test_the_dry_run_adapts_every_config_too_slow_for_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = scenario(trial_timeout_min=LIMIT)
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 0, captured.err
    cost = json.loads(captured.out)["cost"]
    spec = study_from_mapping(data)
    gpu = study_gpu(spec)
    viable = {c.config.key(): c for c in enumerate_space(spec).ranked()}
    fewer = {item["config"]: item for item in cost["fewer_microbatches"]}
    slow = {item["config"] for item in cost["too_slow"]}
    fits = {k for k, c in viable.items() if trial_cost(spec, c.time.step if c.time else 0).fits}
    # every config either fits, or is adapted, or is refused: here none is refused
    assert set(viable) == fits | set(fewer) | slow and not slow and not fits
    for key, item in fewer.items():
        config = viable[key].config
        m = item["microbatches"]
        assert config.pp <= m < item["full_microbatches"] == config.num_microbatches
        shorter = at_microbatches(config, m)
        assert (shorter.tp, shorter.pp, shorter.dp, shorter.micro_batch_size) == (
            config.tp, config.pp, config.dp, config.micro_batch_size)  # fmt: skip
        step = estimate_time(spec.model, spec.training, shorter, gpu, 8).step
        assert item["step_s"] == pytest.approx(step)
        assert LIMIT_MARGIN * item["trial_min"] <= LIMIT + 0.01 < item["full_trial_min"]
        # the most micro-batches that keep the margin: one more does not
        more = estimate_time(spec.model, spec.training, at_microbatches(config, m + 1), gpu, 8)
        assert LIMIT_MARGIN * trial_cost(spec, more.step).minutes > LIMIT
    first = cost["configs"][0]
    assert first["measured_microbatches"] == fewer[first["config"]]["microbatches"]
    assert first["trial_min"] == fewer[first["config"]]["trial_min"] and not first["fits"]
    assert 0 < cost["expected_node_hours"] <= cost["worst_node_hours"]
    # the terminal names them, with the measured and the full micro-batch counts
    code = main(["run", "--study", write(tmp_path, data), "--dry-run",
                 "--results", str(tmp_path / "results")])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0 and "measured at fewer micro-batches per step: 30 configs" in text
    item = cost["fewer_microbatches"][0]
    assert (f"{item['spelled']}: {item['microbatches']} of {item['full_microbatches']} "
            "micro-batches") in text  # fmt: skip


def test_proxies_of_a_config_too_slow_run_at_its_fewer_microbatches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``search.proxy`` a proxy saves node-hours, not minutes: it runs at the same fewer
    micro-batches, and its confirmation (at full DP) too."""
    data = scenario(trial_timeout_min=LIMIT, proxy=True)
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 0, captured.err
    cost = json.loads(captured.out)["cost"]
    spec = study_from_mapping(data)
    gpu = study_gpu(spec)
    fewer = {item["config"]: item for item in cost["fewer_microbatches"]}
    row = cost["configs"][0]
    m = fewer[row["config"]]["microbatches"]
    config = next(c.config for c in enumerate_space(spec).ranked()
                  if c.config.key() == row["config"])  # fmt: skip
    proxy = at_microbatches(dataclasses.replace(config, dp=row["proxy_dp"]), m)
    step = estimate_time(spec.model, spec.training, proxy, gpu, 8).step
    assert row["proxy_step_s"] == pytest.approx(step)
    assert row["proxy_trial_min"] <= LIMIT and cost["proxy"]["confirmations"] >= 1


# ----------------------------------------------------------------------------- a paced study


def batch_table(spec: StudySpec) -> dict[str, dict[str, dict[str, float]]]:
    """Every viable config's predicted step and peak at its own micro-batch count and at the
    one it is measured at under the limit (the stand-in's table)."""
    gpu = study_gpu(spec)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for c in enumerate_space(spec).ranked():
        config = c.config
        key = (f"tp={config.tp},pp={config.pp},cp={config.cp},vp={config.vp},"
               f"mbs={config.micro_batch_size},recompute={config.recompute},"
               f"sp={int(config.sequence_parallel and config.tp > 1)},"
               f"distopt={int(config.distributed_optimizer)}")  # fmt: skip
        peak = c.memory.peak / 2**30
        entries = {str(config.num_microbatches): {"step_s": c.time.step if c.time else 0.0,
                                                  "memory_gib": peak}}  # fmt: skip
        shorter = shorten(spec, config, gpu)
        if shorter is not None:
            entries[str(shorter.microbatches)] = {"step_s": shorter.step_s, "memory_gib": peak}
        table[key] = entries
    return table


def run_paced(tmp_path: Path, data: dict[str, Any]) -> tuple[StudySpec, Any, list[Any]]:
    """The study ``data`` on this machine's 16 local "nodes", one stand-in process per trial
    paced at the tuner's predicted step of each config at the micro-batches it runs: (spec,
    the run's summary, every trial)."""
    data["cluster"] = dict(data["cluster"], executor="local")
    spec = study_from_mapping(data)
    (tmp_path / "table.json").write_text(json.dumps(batch_table(spec)))
    surface = {"kind": "python", "function": f"{STANDIN.parent / 'batch_surface.py'}:point",
               "noise": 0.01, "warmup_factor": 1.5}  # fmt: skip
    (tmp_path / "surface.json").write_text(json.dumps(surface))
    data["launch"]["env"] = {"TUNER_STANDIN_SURFACE": str(tmp_path / "surface.json"),
                             "TUNER_STANDIN_BATCH_TABLE": str(tmp_path / "table.json"),
                             "TUNER_STANDIN_TIME_SCALE": str(TIME_SCALE)}  # fmt: skip
    spec = study_from_mapping(data)
    results = tmp_path / "results"
    loop = build_loop(spec, results=str(results), launcher=one_process)
    try:
        summary = loop.run()
    finally:
        loop.executor.close()
    return spec, summary, load_optuna_study(spec, None, str(results)).trials


@pytest.mark.slow
def test_a_paced_study_measures_configs_too_slow_for_the_limit_at_fewer_microbatches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every viable config of the scenario: no stop rule ends the search before the space does
    data = scenario(trial_timeout_min=LIMIT, n_trials=40, seed=1, memory_probes=0,
                    stop_chance=None, early_stop_trials=None)  # fmt: skip
    spec, summary, trials = run_paced(tmp_path, data)
    results = tmp_path / "results"
    launched = [t for t in trials if t.user_attrs.get("launched")]
    viable = {c.config.key() for c in enumerate_space(spec).ranked()}
    assert len(launched) == summary.launched == len(viable) == 30, summary
    assert {t.user_attrs["key"] for t in launched} == viable
    for t in launched:
        a = t.user_attrs
        assert a["outcome"] == "ok", (t.number, a.get("reason"))
        assert a["ended"] in ("precise", "raced"), a
        assert a["iterations"] < spec.launch.train_iters
        if a["ended"] == "precise":  # at the stated precision, on the interval measured
            half, mean = a["proxy_steady_halfwidth_s"], a["proxy_steady_step_s"]
            assert half <= spec.search.precision * mean
        m, full_m = a["measured_microbatches"], a["full_microbatches"]
        assert a["config"]["pp"] <= m < full_m
        # what ran: the smaller global batch (its log read so), at the step predicted for it
        assert a["proxy_step_s"] == pytest.approx(a["measured_predicted_step_s"], rel=0.03)
        assert a["proxy_step_s"] < 0.9 * a["predicted_step_s"]
        # the figure: the full step, extrapolated (the stand-in follows the model: to noise)
        assert a["step_time_s"] == pytest.approx(a["predicted_step_s"], rel=0.03)
        assert a["proxy_extrapolation"]["step_s"] == a["step_time_s"]
        assert not a.get("proxy")  # full DP: not a proxy, nothing to confirm
        assert a["limit_s"] == LIMIT * 60
    # the leaderboard marks the figures extrapolated, with the micro-batches measured
    assert main(["leaderboard", "--study", write(tmp_path, data), "--results", str(results),
                 "--format", "json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)
    rows = rows if isinstance(rows, list) else rows["rows"]
    assert rows and all(r["measured_microbatches"] for r in rows)
    assert main(["leaderboard", "--study", write(tmp_path, data),
                 "--results", str(results)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "measured m" in text and "~" in text


@pytest.mark.slow
def test_proxies_and_their_confirmations_run_at_the_fewer_microbatches(tmp_path: Path) -> None:
    """``search.proxy: on`` under the same limit: each proxy runs at a smaller DP on fewer nodes
    and at the fewer micro-batches; the best are confirmed at full DP, still at the fewer
    micro-batches (their own do not fit the limit), before one is called best."""
    data = scenario(trial_timeout_min=LIMIT, n_trials=3, seed=1, memory_probes=0, proxy=True)
    spec, summary, trials = run_paced(tmp_path, data)
    launched = [t for t in trials if t.user_attrs.get("launched")]
    proxies = [t for t in launched if t.user_attrs.get("proxy")]
    confirms = [t for t in launched if "confirms" in t.user_attrs]
    assert proxies and confirms and len(launched) == len(proxies) + len(confirms), summary
    for t in launched:
        a = t.user_attrs
        assert a["outcome"] == "ok", (t.number, a.get("reason"))
        assert a["config"]["pp"] <= a["measured_microbatches"] < a["full_microbatches"]
        # the stand-in's step depends on the per-rank work alone: the proxy's step is the full
        # DP's at those micro-batches, and the extrapolation returns the full step to noise
        assert a["proxy_step_s"] == pytest.approx(a["measured_predicted_step_s"], rel=0.03)
        assert a["step_time_s"] == pytest.approx(a["predicted_step_s"], rel=0.05)
    for t in proxies:
        assert t.user_attrs["proxy_dp"] < t.user_attrs["config"]["dp"]
        assert t.user_attrs["proxy_nodes"] < 16
    by_number = {t.number: t for t in launched}
    for t in confirms:
        target = by_number[t.user_attrs["confirms"]]
        assert not t.user_attrs.get("proxy") and len(t.user_attrs["hosts"]) == 16
        assert t.user_attrs["measured_microbatches"] == target.user_attrs["measured_microbatches"]


def test_the_report_says_how_a_figure_at_fewer_microbatches_was_measured() -> None:
    from tuner.report.data import proxy_note

    fewer = {"measured_microbatches": 8, "full_microbatches": 64, "proxy_step_s": 1.5}
    assert proxy_note(fewer) == "run at 8 of 64 micro-batches per step: 1.5 s measured"
    both = fewer | {"proxy": True, "proxy_dp": 2, "proxy_nodes": 4}
    assert proxy_note(both) == (
        "proxy dp2 on 4 nodes at 8 of 64 micro-batches per step: 1.5 s measured"
    )
    assert proxy_note({"proxy_step_s": 1.5}) == ""  # a full-scale measurement
