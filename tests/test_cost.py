"""Paying only for what answers the question: the cost preview and trials sized to their need.

The scenario of issue 33: Llama-3-70B on 16 nodes x 8 H100 over Slurm, global batch 2048. At
~115 s per step, 30 iterations do not fit the old 20-minute default limit: every trial would have
timed out. Through the real CLI the dry run must state each trial's minutes and node-hours and
the budget's, adapt the limit per config when the user set none, and refuse (naming the minutes
and the fix) when the user's limit fits no config. Then the same space runs for real: the
Megatron stand-in, launched by the real loop as a process per trial, paced at the tuner's own
predicted step times (scaled down), and every trial must end ``ok`` as soon as its step time is
known to the stated precision, before ``train_iters``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.calibrate.store import (
    Calibration,
    Observation,
    cluster_layout,
    save_calibration,
    setup_fingerprint,
)
from tuner.cli.cost import SHOWN_TOO_SLOW, spent_json
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.launch import LaunchRequest, render_launch
from tuner.report.leaderboard import load_optuna_study
from tuner.space.cost import RECORDS_PER_BATCH, trial_cost
from tuner.space.enumerate import enumerate_space
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.build import build_loop

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standins" / "pretrain_gpt.py"
TIME_SCALE = 0.002  # a 115 s step sleeps 0.23 s


def scenario(**search: Any) -> dict[str, Any]:
    return {
        "name": "llama3-70b-16n",
        "model": {"preset": "llama3-70b"},
        "training": {"global_batch_size": 2048},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 16,
                    "executor": "slurm"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": str(STANDIN.parent),
                   "python": sys.executable},
        "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "micro_batch_size": [1, 2],
                  "sequence_parallel": [True], "recompute": ["none", "selective", "full"],
                  "distributed_optimizer": [True]},
        "search": {"n_trials": 8, **search},
    }  # fmt: skip


def write(tmp: Path, data: dict[str, Any]) -> str:
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def dry_run(tmp: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any]) -> Any:
    code = main(["run", "--study", write(tmp, data), "--dry-run", "--json",
                 "--results", str(tmp / "results")])  # fmt: skip
    captured = capsys.readouterr()
    return code, captured


def test_the_dry_run_states_each_trial_and_the_budget_in_node_hours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, captured = dry_run(tmp_path, capsys, scenario())
    assert code == 0, captured.err
    out = json.loads(captured.out)
    cost = out["cost"]
    first = out["launch_first"][0]
    assert first["step_s"] > 100  # the scenario: about two minutes per step
    row = cost["configs"][0]
    needed = 5 + 4 * RECORDS_PER_BATCH  # warm-up floor + min_batches batches of two records
    assert row["trial_min"] == pytest.approx(3.0 + needed * first["step_s"] / 60, abs=0.01)
    assert row["trial_min"] > 20  # what the old fixed 20-minute limit would have killed
    assert row["fits"] and row["limit_min"] >= row["trial_min"]  # adapted: a limit per config
    assert row["node_hours"] == pytest.approx(row["trial_min"] * 16 / 60, abs=0.01)
    assert 0 < cost["expected_node_hours"] <= cost["worst_node_hours"]
    assert cost["launches"] == 8 and not cost["too_slow"]
    # the text form says the same
    code = main(["run", "--study", write(tmp_path, scenario()), "--dry-run",
                 "--results", str(tmp_path / "results")])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0 and "node-hours" in text and "trial min" in text


def test_a_trial_costs_no_more_than_its_limit_when_start_up_fills_it() -> None:
    """The CPU demo: a 3-minute limit and the default 3-minute start-up. The iterations fit (the
    start-up is the user's estimate), and the trial is ended at its limit: expected node-hours
    never exceed the worst case."""
    data = scenario(trial_timeout_min=3, startup_min=3)
    data["training"]["global_batch_size"] = 16
    spec = study_from_mapping(data)
    cost = trial_cost(spec, 0.5)
    assert cost.fits and cost.minutes > cost.limit_minutes == 3
    assert cost.node_hours == pytest.approx(3 * 16 / 60) == cost.worst_node_hours
    roomy = trial_cost(study_from_mapping(scenario()), 0.5)  # a limit per config: room to finish
    assert roomy.node_hours == pytest.approx(roomy.minutes * 16 / 60)
    assert roomy.node_hours < roomy.worst_node_hours


def test_the_preview_charges_the_start_up_launches_of_the_setup_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo's gap: a 3-minute start-up estimate against a 3-minute limit. Once launches of
    the same setup ran on the cluster, the preview charges the start-up they measured (the
    saved calibration's); another setup's launches leave the estimate."""
    data = scenario(trial_timeout_min=3)
    data["training"]["global_batch_size"] = 16
    spec = study_from_mapping(data)
    results = tmp_path / "results"

    def saved(fingerprint: str) -> None:
        config = dataclasses.asdict(ParallelConfig())
        kept = Observation(study="earlier", fingerprint=fingerprint, trial=0, outcome="ok",
                           config=config, startup_s=12.0)  # fmt: skip
        layout = cluster_layout(spec, results)
        save_calibration(Calibration(cluster=layout.name, observations=(kept,)),
                         layout.calibration_yaml)  # fmt: skip

    def preview() -> dict[str, Any]:
        code, captured = dry_run(tmp_path, capsys, data)
        assert code == 0, captured.err
        return dict(json.loads(captured.out)["cost"])

    guessed = preview()
    assert guessed["startup_min"] == 3 and not guessed["startup_measured"]
    assert guessed["configs"][0]["trial_min"] > 3  # more than the limit: start-up fills it
    saved("another setup")
    assert preview()["startup_min"] == 3
    saved(setup_fingerprint(spec))
    measured = preview()
    assert measured["startup_min"] == pytest.approx(0.2) and measured["startup_measured"]
    row, before = measured["configs"][0], guessed["configs"][0]
    assert row["trial_min"] == pytest.approx(before["trial_min"] - 2.8, abs=0.01)
    assert row["trial_min"] < row["limit_min"] == 3
    assert measured["expected_node_hours"] < guessed["expected_node_hours"]
    code = main(["run", "--study", write(tmp_path, data), "--dry-run",
                 "--results", str(results)])  # fmt: skip
    assert code == 0 and "as earlier launches of this setup" in capsys.readouterr().out


def test_tune_space_shows_the_cost_of_its_top_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["space", "--study", write(tmp_path, scenario()), "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["cost"]["configs"]
    assert [r["predicted_step_s"] for r in rows] == [t["step_s"] for t in out["top"]]
    assert all(r["trial_min"] > 3.0 and r["node_hours"] > 0 for r in rows)
    assert out["cost"]["worst_node_hours"] >= out["cost"]["expected_node_hours"] > 0


def test_the_preview_counts_proxies_and_the_confirmations_at_full_scale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # search.proxy on: each config's first launch is its proxy on fewer nodes, the best are
    # confirmed at full scale; the preview must say so per config and in the budget
    from tuner.models.time.estimate import estimate_time
    from tuner.space.enumerate import study_gpu
    from tuner.space.proxy import study_proxy

    code, captured = dry_run(tmp_path, capsys, scenario())
    plain = json.loads(captured.out)["cost"]
    assert code == 0 and "proxy" not in plain and "proxy_nodes" not in plain["configs"][0]
    data = scenario(proxy=True)
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 0, captured.err
    out = json.loads(captured.out)
    cost = out["cost"]
    spec = study_from_mapping(data)
    gpu = study_gpu(spec)
    needed = 5 + 4 * RECORDS_PER_BATCH
    full_rows = {r["config"]: r for r in plain["configs"]}
    assert cost["configs"]
    for row in cost["configs"]:
        # the full-scale columns are the plain preview's: they are the confirmation's trial
        assert full_rows[row["config"]].items() <= row.items()
        config = spec_config(spec, row["config"])
        proxy = study_proxy(spec, config, gpu)
        assert proxy is not None and row["proxy_nodes"] == proxy.nodes < 16
        assert row["proxy_dp"] == proxy.config.dp < config.dp
        step = estimate_time(spec.model, spec.training, proxy.config, gpu, 8).step
        assert row["proxy_step_s"] == pytest.approx(step)
        assert row["proxy_trial_min"] == pytest.approx(3.0 + needed * step / 60, abs=0.01)
        assert row["proxy_node_hours"] == pytest.approx(
            row["proxy_trial_min"] * proxy.nodes / 60, abs=0.01
        )
        assert row["proxy_node_hours"] < row["node_hours"]  # fewer nodes, about as long
    p = cost["proxy"]
    assert p["as_proxy"] >= 1 and p["confirmations"] == min(2, p["as_proxy"])  # proxy_confirm 2
    assert p["worst_confirmations"] == 4  # a slower confirmation brings another in: 2 x 2
    assert cost["expected_node_hours"] == pytest.approx(
        p["launches_expected_node_hours"] + p["confirm_node_hours"], abs=0.002
    )
    assert cost["worst_node_hours"] == pytest.approx(
        p["launches_worst_node_hours"] + p["confirm_worst_node_hours"], abs=0.002
    )
    # proxies cut what the launches cost; the confirmations are paid on top
    assert p["launches_expected_node_hours"] < plain["expected_node_hours"]
    assert p["launches_worst_node_hours"] <= plain["worst_node_hours"]
    assert p["confirm_node_hours"] > 0 and cost["launches"] == plain["launches"] == 8
    # the terminal says the same, and tune space shows the proxies of its top configs
    code = main(["run", "--study", write(tmp_path, data), "--dry-run",
                 "--results", str(tmp_path / "results")])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0 and "proxy node-h" in text and "confirmations at full scale" in text
    assert main(["space", "--study", write(tmp_path, data), "--json", "--top", "3"]) == 0
    space = json.loads(capsys.readouterr().out)["cost"]
    assert all(r["proxy_nodes"] for r in space["configs"]) and space["proxy"] == p


def spec_config(spec: StudySpec, key: str) -> Any:
    return next(c.config for c in enumerate_space(spec).ranked() if c.config.key() == key)


@pytest.mark.parametrize(
    ("limit", "fewer"), [(20, False), (1, True)], ids=["not-measured-fewer", "fewest-too-slow"]
)
def test_a_limit_no_config_fits_is_refused_with_the_minutes_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: int, fewer: bool
) -> None:
    """Refused: no config fits the limit as it is, and fewer micro-batches per step are off
    (20 min) or do not fit either (1 min: less than the start-up)."""
    data = scenario(trial_timeout_min=limit, fewer_microbatches=fewer)
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 2 and captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1
    assert "search.trial_timeout_min" in err and "min (start-up" in err
    assert "raise search.trial_timeout_min to" in err
    # the other fix, or that it was tried
    assert ("set search.fewer_microbatches" in err) is not fewer
    assert ("at its fewest micro-batches per step" in err) is fewer
    code = main(["run", "--study", write(tmp_path, data),
                 "--results", str(tmp_path / "results"), "--skip-preflight"])  # fmt: skip
    assert code == 2  # the real run refuses too, before anything is created
    assert not (tmp_path / "results").exists()


def test_a_start_up_that_would_cut_trials_at_the_limit_is_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Configs whose iterations fit the limit the user set, but not once the start-up estimate
    is added, are launched (the start-up is an estimate) and named in one warning line."""
    data = scenario(trial_timeout_min=30, startup_min=25)
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 0, captured.err
    cost = json.loads(captured.out)["cost"]
    assert cost["cut_by_startup"] > 0 and cost["cut_limit_min"] == 30
    code = main(["run", "--study", write(tmp_path, data), "--dry-run",
                 "--results", str(tmp_path / "results")])  # fmt: skip
    text = " ".join(capsys.readouterr().out.split())
    assert code == 0 and f"warning: {cost['cut_by_startup']} configs need more than" in text
    assert "start-up of 25 min (search.startup_min, an estimate)" in text
    code, captured = dry_run(tmp_path, capsys, scenario(trial_timeout_min=30, startup_min=1))
    assert json.loads(captured.out)["cost"]["cut_by_startup"] < cost["cut_by_startup"]


def test_configs_too_slow_for_the_limit_are_named_and_never_launched_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = scenario(trial_timeout_min=30, fewer_microbatches=False)
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 0, captured.err
    out = json.loads(captured.out)
    slow = {item["config"]: item for item in out["cost"]["too_slow"]}
    assert slow, "some configs of the scenario need more than 30 min of iterations"
    for item in slow.values():  # the iterations alone (start-up is 3 min) exceed the limit
        assert item["trial_min"] - 3.0 > 30 and "raise search.trial_timeout_min" in item["reason"]
    assert not {c["config"] for c in out["cost"]["configs"]} & set(slow)  # never launched first
    assert out["cost"]["configs"] and all(c["fits"] for c in out["cost"]["configs"])


def test_the_dry_run_warns_of_a_launch_its_template_cannot_render(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without launch.megatron_path the dry run said all was well and the first trial, nodes
    booked, was refused; the dry run renders the first config's launch and warns (a preview of
    a study whose launch section is not written yet still runs)."""
    data = scenario()
    del data["launch"]["megatron_path"]
    code, captured = dry_run(tmp_path, capsys, data)
    assert code == 0 and json.loads(captured.out)["launch_first"]
    assert captured.err.strip() == (
        f"tune: warning: tune run would refuse the first trial's launch: {tmp_path}/study.yaml: "
        "launch.megatron_path: this launch template needs it; set it there"
    )
    code, captured = dry_run(tmp_path, capsys, scenario())
    assert code == 0 and captured.err == ""  # a complete study: no warning


def test_the_table_names_the_fix_for_too_slow_configs_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fix was repeated under every config (six times four lines on a 70B study); it is
    said once, with the limit that lets the slowest listed config run, then one line each."""
    data = scenario(trial_timeout_min=30, fewer_microbatches=False)
    code, captured = dry_run(tmp_path, capsys, data)
    slow = json.loads(captured.out)["cost"]["too_slow"]
    code = main(["run", "--study", write(tmp_path, data), "--dry-run",
                 "--results", str(tmp_path / "results")])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    text = " ".join(" ".join(lines).split())
    assert text.count("raise search.trial_timeout_min to") == 1
    need = math.ceil(max(item["trial_min"] for item in slow))
    assert f"raise search.trial_timeout_min to {need} or more" in text
    shown = [line for line in lines if line.startswith("  ") and line.endswith(" min")]
    assert len(shown) == min(len(slow), SHOWN_TOO_SLOW)
    first = slow[0]
    assert first["iterations_min"] > 30  # the iterations alone, start-up left out
    assert f"  {first['spelled']}: {first['iterations_min']:.2f} min" in lines


# ----------------------------------------------------------------------------- a paced study


def paced_surface(spec: StudySpec) -> dict[str, Any]:
    """The stand-in's table: every config at the tuner's own predicted step time and peak."""
    report = enumerate_space(spec)
    configs = {}
    for c in (*report.ranked(), *report.probes):
        config = c.config
        key = (f"tp={config.tp},pp={config.pp},cp={config.cp},vp={config.vp},"
               f"mbs={config.micro_batch_size},recompute={config.recompute},"
               f"sp={int(config.sequence_parallel and config.tp > 1)},"
               f"distopt={int(config.distributed_optimizer)}")  # fmt: skip
        configs[key] = {"step_s": c.time.step if c.time else 200.0,
                        "memory_gib": c.memory.peak / 2**30}  # fmt: skip
    return {"kind": "formula", "step_s": 200.0, "memory_gib": 10.0, "configs": configs,
            "noise": 0.01, "warmup_factor": 1.5}  # fmt: skip


def one_process(spec: StudySpec, config: Any, number: int, group: Any, paths: Any,
                master: str) -> LaunchRequest:  # fmt: skip
    """The template's script with ``torchrun`` swapped for one stand-in process playing every
    rank on the first node (128 ranks on this machine would be 128 processes)."""
    rendered = render_launch(spec, config, hosts=group.hosts, master_addr=master,
                             master_port=group.master_port,
                             trial_dir=str(paths.dir.resolve()))  # fmt: skip
    head = rendered.scripts[0].split("exec torchrun", 1)[0]
    node0 = head + f'WORLD_SIZE={spec.world_size} exec {sys.executable} {STANDIN} "${{args[@]}}"\n'
    scripts = (node0,) + ("exit 0\n",) * (len(group.hosts) - 1)
    return LaunchRequest(trial=number, hosts=tuple(group.hosts), scripts=scripts, paths=paths,
                         timeout_s=None)  # fmt: skip


def paced_study(tmp_path: Path, **search: Any) -> tuple[StudySpec, Any, list[Any]]:
    """The scenario on this machine's 16 local "nodes", paced by the predictions: (spec, the
    run's summary, every trial of the study). The surface is the model's own prediction, so a
    memory probe (a config predicted over the GPU) would run out of memory by construction:
    none is launched here (what is checked is how trials are paced and ended)."""
    data = scenario(n_trials=4, seed=1, memory_probes=0, **search)
    data["cluster"] = dict(data["cluster"], executor="local")
    spec, summary = run_paced(tmp_path, data, tmp_path / "results", TIME_SCALE)
    return spec, summary, load_optuna_study(spec, None, str(tmp_path / "results")).trials


def run_paced(tmp_path: Path, data: dict[str, Any], results: Path,
              time_scale: float) -> tuple[StudySpec, Any]:  # fmt: skip
    """``tune run`` of the study ``data`` on the stand-in, each config's step its predicted one
    (``paced_surface``) times ``time_scale``, one process per trial: (spec, the run's
    summary)."""
    spec = study_from_mapping(data)
    (tmp_path / "surface.json").write_text(json.dumps(paced_surface(spec)))
    data["launch"]["env"] = {"TUNER_STANDIN_SURFACE": str(tmp_path / "surface.json"),
                             "TUNER_STANDIN_TIME_SCALE": str(time_scale)}  # fmt: skip
    spec = study_from_mapping(data)
    loop = build_loop(spec, results=str(results), launcher=one_process)
    try:
        return spec, loop.run()
    finally:
        loop.executor.close()


@pytest.mark.slow
def test_a_paced_study_ends_every_trial_ok_at_the_stated_precision(tmp_path: Path) -> None:
    spec, summary, everything = paced_study(tmp_path)
    trials = [t for t in everything if t.user_attrs.get("launched")]
    assert len(trials) == summary.launched >= 2, summary
    precision = spec.search.precision
    for t in trials:
        a = t.user_attrs
        assert a["outcome"] == "ok", (t.number, a.get("reason"))
        assert a["ended"] in ("precise", "raced"), a
        assert a["iterations"] < spec.launch.train_iters  # ended before the cap
        assert a["steady_batches"] >= spec.search.min_batches
        if a["ended"] == "precise":
            assert a["steady_halfwidth_s"] <= precision * a["steady_step_s"]
        assert a["steady_step_s"] == pytest.approx(a["predicted_step_s"], rel=0.03)
        # its limit and its cost were the predicted ones: start-up + iterations, with a margin
        limit = trial_cost(spec, a["predicted_step_s"]).limit_minutes
        assert limit > trial_cost(spec, a["predicted_step_s"]).minutes
    assert any(t.user_attrs["ended"] == "precise" for t in trials)
    spent = spent_json(everything)  # what the end of tune run says was spent, and on what
    assert spent["node_hours"] > 0 and set(spent["by_outcome"]) == {"ok"}
    assert sum(spent["measured_ended"].values()) == len(trials)
    assert "cap" not in spent["measured_ended"]


@pytest.mark.slow
def test_the_node_hour_budget_stops_a_launch_that_could_pass_it(tmp_path: Path) -> None:
    spec = study_from_mapping(scenario())
    first = enumerate_space(spec).ranked()[0]
    budget = trial_cost(spec, first.time.step if first.time else None).worst_node_hours
    # the first trial's worst case is exactly the budget: it may run; after it, anything spent
    # plus the next trial's worst case (no smaller: the search starts from the fastest) is over
    spec, summary, trials = paced_study(tmp_path, max_node_hours=budget)
    launched = [t for t in trials if t.user_attrs.get("launched")]
    assert len(launched) == 1 and launched[0].user_attrs["outcome"] == "ok"
    refused = [t for t in trials if t.user_attrs.get("outcome") == "interrupted"]
    assert len(refused) == 1 and "node-hour budget" in refused[0].user_attrs["reason"]
    assert summary.stop_reason.startswith("node-hour budget")
