"""``tune profile --probe`` for real: the Megatron stand-in (tests/standins/pretrain_gpt.py) with a
known per-layer surface, run by the study's own template through the local executor under
torchrun, all points in one job; the saved probe then makes ``tune estimate`` at full depth
reproduce the surface and say which terms were measured."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.launch.slurm import LocalSlurm, local_slurm
from tuner.api import estimate
from tuner.cli.main import main
from tuner.layout import ClusterLayout
from tuner.models.memory.estimate import GIB
from tuner.profile.probe import POINT, probe_runs
from tuner.profile.probe_file import load_probe
from tuner.profile.rates import study_rates
from tuner.profile.stack_terms import study_terms
from tuner.spec.file import study_from_mapping

pytestmark = [pytest.mark.slow]
__all__ = ["local_slurm"]  # the fixture, imported for this module

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"
LAYER_S, REST_S = 0.02, 0.05
"""The stand-in's seconds per layer and per micro-batch rest (embedding, head, loss)."""
LAYER_GIB, FIXED_GIB = 0.5, 6.0
SURFACE: dict[str, Any] = {
    "kind": "formula",
    # (rest + layer x layers) per micro-batch, x1.4 per layer-share under full recomputation
    "step_s": {"base": REST_S, "terms": {"layers": LAYER_S}, "powers": {"microbatches": 1}},
    "memory_gib": {"base": FIXED_GIB, "terms": {"layers": LAYER_GIB}},
    "noise": 0.0,
    "warmup_factor": 1.0,
}  # fmt: skip


def study_data(tmp: Path) -> dict[str, Any]:
    (tmp / "surface.json").write_text(json.dumps(SURFACE))
    return {
        "name": "probe-e2e",
        "model": {"num_layers": 8, "hidden_size": 1024, "ffn_hidden_size": 4096,
                  "num_attention_heads": 16, "vocab_size": 32000, "seq_length": 1024},
        "training": {"global_batch_size": 16},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 1, "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": str(STANDINS),
                   "python": sys.executable, "master_port": 29771,
                   "env": {"TUNER_STANDIN_SURFACE": str(tmp / "surface.json"),
                           "TUNER_STANDIN_TIME_SCALE": "0.0001"}},
        "space": {"tp": [1], "pp": [1, 2], "micro_batch_size": [2],
                  "distributed_optimizer": [False, True]},
        "search": {"n_trials": 2, "nodes_per_trial": 1, "trial_timeout_min": 2},
    }  # fmt: skip


def test_the_probe_measures_the_standin_and_estimate_reproduces_its_surface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = study_data(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    spec = study_from_mapping(data)
    runs = probe_runs(spec)
    # the base at 1 and 4 layers and at 1 layer with twice the micro-batches, distopt at 4, the
    # pipeline point at 1 layer per stage
    assert [(r.depth, r.batch_scale, r.config.pp) for r in runs] == [
        (1, 1, 1), (4, 1, 1), (1, 2, 1), (4, 1, 1), (1, 1, 2)
    ]  # fmt: skip
    distopt = runs[3].config
    assert distopt.distributed_optimizer and not runs[0].config.distributed_optimizer
    assert main(["profile", "--study", str(path), "--probe"]) == 0
    out = capsys.readouterr().out
    assert "probe cost:" in out and "node-hours" in out
    layout = ClusterLayout(tmp_path / "results", spec.cluster_name)
    job = layout.stack_probe(spec.name)
    log = job.node_log(0).read_text()
    assert log.count(f"{POINT} ") == 2 * len(runs)  # one job: every point in one node log
    assert "rc=0" in log and "rc=1" not in log
    saved = load_probe(layout.stack_yaml(spec.name), spec)
    assert saved["cost"]["nodes"] == 1 and saved["cost"]["wall_s"] > 0

    terms = study_terms(spec, tmp_path / "results", study_rates(spec, tmp_path / "results"))
    # each probed config at 8 layers; the base was run at 1 and 4 layers, so its fixed memory and
    # its per-layer memory are apart; distopt ran at 4 layers only and takes the base's extras:
    # what the surface holds unlike the model (the same bytes with the optimizer sharded) counts
    # per layer there
    for config, mem_rel in ((runs[0].config, 0.01), (distopt, 0.08)):
        found = estimate(spec, config, terms=terms)
        m = config.num_microbatches
        true_step = m * (REST_S + LAYER_S * spec.model.num_layers)
        assert found.time is not None and found.memory is not None
        assert found.time.step == pytest.approx(true_step, rel=0.01)
        true_gib = FIXED_GIB + LAYER_GIB * spec.model.num_layers
        assert found.memory.allocated / GIB == pytest.approx(true_gib, rel=mem_rel)
        catalog = estimate(spec, config)
        assert catalog.time is not None and abs(catalog.time.step / true_step - 1) > 0.2

    assert main(["estimate", "--study", str(path), "--set", "pp=1", "--set", "distopt=false"]) == 0
    out = capsys.readouterr().out
    assert "layer_time: measured at tp1 pp1 mbs2, spread" in out
    assert "optimizer_step: catalog" in out


@pytest.mark.slurm
def test_every_probe_point_runs_in_one_slurm_allocation(
    local_slurm: LocalSlurm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through Slurm: one batch job whose node script starts each point in turn, on the two
    nodes of the allocation (a 2-node point: the trial shape of this study)."""
    data = study_data(tmp_path)
    data["cluster"] = {"gpu": "a100-80gb", "gpus_per_node": 1, "num_nodes": 2,
                       "executor": "slurm", "slurm": {"poll_interval_s": 0.3}}  # fmt: skip
    data["search"]["nodes_per_trial"] = 2
    data["space"]["distributed_optimizer"] = [False]
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    spec = study_from_mapping(data)
    with caplog.at_level(logging.INFO, logger="tuner.launch"):
        assert main(["profile", "--study", str(path), "--probe"]) == 0
    # the executor's messages name the job as what it is, not as a trial 0 of the study
    assert "the framework probe's job: Slurm job" in caplog.text
    assert "trial 0" not in caplog.text
    job = ClusterLayout(tmp_path / "results", spec.cluster_name).stack_probe(spec.name)
    result = json.loads(job.result_json.read_text())
    assert result["job_id"] and sorted(result["hosts"]) == ["n1", "n2"]
    # both nodes ran every point (the base's three, the pipeline's), in one job
    for node in (0, 1):
        assert job.node_log(node).read_text().count("rc=0") == len(probe_runs(spec)) == 4
    terms = study_terms(spec, tmp_path / "results")
    assert [(p.pp, p.layer_scale is not None) for p in terms.points] == [(1, True), (2, True)]
