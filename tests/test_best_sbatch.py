"""``tune best --emit sbatch``: the winning config as a Slurm batch script for the full run, with
the study's cluster.slurm options (golden file) and node scripts that bash accepts."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import optuna
import pytest

from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.layout import ResultsLayout
from tuner.report.export import emit_best
from tuner.space.trials import distributions
from tuner.spec.file import study_from_mapping
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")

GOLDEN = Path(__file__).parent / "launch" / "golden" / "slurm-best-2node.sh"

SPEC = study_from_mapping({
    "name": "llama-best",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2, "executor": "slurm",
                "slurm": {"partition": "gpu", "account": "proj-1", "qos": "high",
                          "gpus_per_node": 8, "extra_sbatch": ["--constraint=h100"],
                          "setup": ["module load cuda/12.4"]}},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
    "space": {"tp": [4, 8], "micro_batch_size": [1], "sequence_parallel": [True],
              "distributed_optimizer": [True]},
})  # fmt: skip


@pytest.fixture
def results(tmp_path: Path) -> Path:
    layout = ResultsLayout(tmp_path / "res", SPEC.name)
    study = optuna.create_study(study_name=SPEC.name, storage=open_storage(None, layout))
    for tp, step in ((8, 3.0), (4, 2.0)):
        c = ParallelConfig(tp=tp, dp=16 // tp, micro_batch_size=1, global_batch_size=64,
                           sequence_parallel=True, distributed_optimizer=True)  # fmt: skip
        trial = study.ask(distributions(SPEC))
        trial.set_user_attr("config", dataclasses.asdict(c))
        trial.set_user_attr("key", c.key())
        trial.set_user_attr("outcome", "ok")
        trial.set_user_attr("step_time_s", step)
        trial.set_user_attr("tokens_per_s", 64 * SPEC.model.seq_length / step)
        study.tell(trial, step)
    return tmp_path / "res"


def test_best_sbatch_golden(results: Path) -> None:
    """Re-record after an intended change: ``TUNER_REGOLD=1 pytest tests/test_best_sbatch.py``."""
    text = emit_best(SPEC, "sbatch", results=str(results), train_iters=50_000)
    best = (results / SPEC.name / "best").resolve()
    generic = text.replace(str(best), "RESULTS/llama-best/best")
    if os.environ.get("TUNER_REGOLD"):
        GOLDEN.write_text(generic)
    assert GOLDEN.exists(), f"record {GOLDEN.name} with TUNER_REGOLD=1 pytest {__file__}"
    assert generic == GOLDEN.read_text(), (
        f"{GOLDEN.name} differs from its golden file; if the change is intended, re-record with "
        f"TUNER_REGOLD=1 pytest {__file__}"
    )
    for line in ("#SBATCH --nodes=2", "#SBATCH --partition=gpu", "#SBATCH --account=proj-1",
                 "#SBATCH --qos=high", "#SBATCH --gres=gpu:8", "#SBATCH --constraint=h100",
                 "module load cuda/12.4"):  # fmt: skip
        assert line in text.splitlines(), line
    assert (best / "slurm-best.sh").read_text() == text
    node1 = (best / "launch-node-1.sh").read_text()
    assert "--tensor-model-parallel-size 4" in node1 and "--train-iters 50000" in node1
    assert "@TUNER_MASTER_ADDR@" in node1  # the wrapper puts the job's first node there
    assert (best / "slurm-node.sh").stat().st_mode & 0o111
    for script in ("slurm-best.sh", "slurm-node.sh", "launch-node-0.sh"):
        subprocess.run(["bash", "-n", str(best / script)], check=True)


def test_cli_best_emit_sbatch(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    study = results.parent / "study.yaml"
    study.write_text(yaml.safe_dump(_as_mapping()))
    assert main(["best", "--study", str(study), "--results", str(results), "--emit",
                 "sbatch"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in out


def _as_mapping() -> dict[str, object]:
    return {
        "name": "llama-best", "model": {"preset": "llama2-7b"},
        "training": {"global_batch_size": 64},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2,
                    "executor": "slurm", "slurm": {"partition": "gpu"}},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
        "space": {"tp": [4, 8], "micro_batch_size": [1], "sequence_parallel": [True],
                  "distributed_optimizer": [True]},
    }  # fmt: skip
