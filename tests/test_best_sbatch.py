"""``tune best --emit sbatch``: the winning config as a Slurm batch script for the full run, with
the study's cluster.slurm options (golden file), and the same export submitted to a real local
Slurm, where the Megatron stand-in trains on both nodes of the job."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import tuner
from tests.launch.slurm import LocalSlurm, local_slurm
from tests.report.test_exports import (
    TRAIN_ARGS,
    fake_torchrun,
    free_port,
    megatron_study,
    record_measured,
    record_trials,
)
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.layout import ResultsLayout
from tuner.report.export import emit_best, trial_record
from tuner.space.trials import distributions
from tuner.spec.file import study_from_mapping
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")
__all__ = ["local_slurm"]  # a fixture, used by name

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
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron",
               "train_args": ["--data-path", "/data/corpus_text_document", "--lr", "1e-4"]},
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
    script = emit_best(SPEC, "script", results=str(results), train_iters=50_000)
    text = emit_best(SPEC, "sbatch", results=str(results), train_iters=50_000)
    exports = ResultsLayout(results, SPEC.name).export(1)
    generic = text.replace(str(exports.dir.resolve()), "RESULTS/llama-best/exports/trial-1")
    generic = generic.replace(f"tuner {tuner.__version__}", "tuner VERSION")
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
    assert exports.sbatch.read_text() == text
    node = exports.sbatch_node.read_text()
    assert "--tensor-model-parallel-size 4" in node and "--train-iters 50000" in node
    assert '--master_addr "${MASTER_ADDR}"' in node and "SLURM_JOB_NODELIST" in node
    # the same script as launch.sh but for its files' folder and its header's own name
    node_as_script = node.replace(str(exports.sbatch_files), str(exports.script_files))
    assert _code(node_as_script) == _code(script) and "bash sbatch-node.sh" in node
    assert exports.script.read_text() == script  # the sbatch export rewrote nothing of it
    for path in (exports.sbatch, exports.sbatch_node, exports.script):
        subprocess.run(["bash", "-n", str(path)], check=True)


def _code(script: str) -> list[str]:
    """A script's lines without its comments (its header names the script's own file)."""
    return [line for line in script.splitlines() if not line.startswith("#")]


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
        "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron",
                   "train_args": ["--data-path", "/data/corpus_text_document"]},
        "space": {"tp": [4, 8], "micro_batch_size": [1], "sequence_parallel": [True],
                  "distributed_optimizer": [True]},
    }  # fmt: skip


FAKE_SCONTROL = """#!/bin/bash
case "$2" in
  hostnames) printf 'nodeA\\nnodeB\\n' ;;
  node) echo "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=$3" ;;
esac
"""
# srun into a container (pyxis): the job's environment goes in, the batch host's tools do not
FAKE_SRUN = """#!/bin/bash
for k in 0 1; do
  PATH="$INSIDE_PATH" SLURM_NODEID=$k "${@:$#-1}" || exit $?
done
"""


def test_the_sbatch_export_finds_the_master_outside_the_container(tmp_path: Path) -> None:
    """With cluster.slurm.container_image the node script runs in a container, where Slurm's
    client is usually missing: the batch script finds the master (the job's first node, its
    NodeAddr) before srun, as a trial's batch script does, and every node gets it."""
    data = megatron_study(tmp_path, nodes=2, train_args=TRAIN_ARGS)
    image = {"container_image": "nvcr.io#nvidia/pytorch:24.05-py3"}
    data["cluster"] = {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": 2,
                       "executor": "slurm", "slurm": image}  # fmt: skip
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {1: 1.0})
    export = trial_record(spec, results=str(tmp_path / "results")).export("sbatch")
    env = fake_torchrun(tmp_path)
    outside = tmp_path / "batch-host"
    outside.mkdir()
    for path, text in ((outside / "scontrol", FAKE_SCONTROL), (outside / "srun", FAKE_SRUN),
                       (tmp_path / "fakebin" / "scontrol", "#!/bin/sh\nexit 127\n")):  # fmt: skip
        path.write_text(text)
        path.chmod(0o755)
    env.update(INSIDE_PATH=env["PATH"], PATH=f"{outside}:{env['PATH']}",
               SLURM_JOB_NODELIST="node[A-B]", SLURM_JOB_ID="7",
               MASTER_ADDR="login01")  # sbatch carries the login node's over  # fmt: skip
    done = subprocess.run(["bash", str(export.path)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tuner: node 1 of 2, master 10.0.0.7" in done.stderr, done.stderr
    argv = json.loads((tmp_path / "argv.json").read_text())["argv"]
    assert argv[argv.index("--master_addr") + 1] == "10.0.0.7"


@pytest.mark.slow
@pytest.mark.slurm
def test_the_sbatch_export_runs_on_a_local_slurm(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    """Submitted as it is: Slurm starts the node script on both nodes of the job; each finds its
    rank in SLURM_NODEID and the master address in the allocation (NodeAddr 127.0.0.1), and
    torchrun runs the Megatron stand-in over the two nodes for the full run's iterations."""
    data = megatron_study(tmp_path, nodes=2, fake=False, train_args=TRAIN_ARGS,
                          master_port=free_port())  # fmt: skip
    data["cluster"] = {"gpu": "a100-80gb", "gpus_per_node": 1, "num_nodes": 2,
                       "executor": "slurm", "slurm": {"exclusive": False}}  # fmt: skip
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {1: 1.0})
    export = trial_record(spec, results=str(tmp_path / "results")).export("sbatch", train_iters=3)
    out = tmp_path / "job.out"
    env = {k: v for k, v in local_slurm.env.items() if k not in ("MASTER_ADDR", "NODE_RANK")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={out}", str(export.path)],
                               env=env, capture_output=True, text=True, check=True,
                               cwd=tmp_path)  # fmt: skip
    job = submitted.stdout.strip().split(";")[0]
    state = ""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                               text=True).stdout  # fmt: skip
        state = (re.findall(r"JobState=(\S+)", shown) or ["?"])[0]
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(1)
    log = out.read_text() if out.exists() else ""
    assert state == "COMPLETED", f"job {job}: {state}\n{log[-3000:]}"
    assert "tuner: node 0 of 2, master 127.0.0.1" in log, log[-3000:]
    assert "tuner: node 1 of 2, master 127.0.0.1" in log, log[-3000:]
    iterations = [line for line in log.splitlines() if "consumed samples" in line]
    assert len(iterations) == 3 and "iteration        3/       3" in iterations[-1], log[-3000:]


FAKE_SRUN_ALL = """#!/bin/bash
# srun --ntasks-per-node=1 ... bash NODE_SCRIPT: the node script once per node of the job
for k in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do
  SLURM_NODEID=$k "${@:$#-1}" || exit $?
done
"""
FAKE_TORCHRUN_LOG = """#!{python}
import json, os, sys
with open(os.environ["FAKE_TORCHRUN_OUT"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def _readme_study() -> str:
    """README.md's study for a cluster, as a reader saves it, with the full run's
    ``launch.train_args`` of docs/exports.md added, as the README sends the reader there."""
    import yaml

    from tests.docs_examples import REPO, blocks

    readme = next(b for b in blocks(REPO / "README.md")
                  if b.markers.get("file") == "llama3-70b.yaml")  # fmt: skip
    fragment = next(b for b in blocks(REPO / "docs" / "exports.md")
                    if b.lang == "yaml" and "train_args" in b.text)  # fmt: skip
    data = yaml.safe_load(readme.text)
    data["launch"]["train_args"] = yaml.safe_load(fragment.text)["launch"]["train_args"]
    return yaml.safe_dump(data, sort_keys=False)


def test_the_readmes_study_exports_a_batch_job_that_starts_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """README.md's 16-node Slurm/Megatron study, once trials are measured: ``tune best --emit
    sbatch --train-iters 50000`` as the README quotes it stops without the full run's data, and
    with docs/exports.md's ``launch.train_args`` writes a batch job that parses and, run with
    Slurm's srun and scontrol stood in, starts torchrun on all 16 nodes with its rank, the
    job's first node as master and the full run's arguments."""
    from tests.docs_examples import REPO, blocks
    from tuner.spec.file import load_study

    readme = next(b for b in blocks(REPO / "README.md")
                  if b.markers.get("file") == "llama3-70b.yaml")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    (tmp_path / "llama3-70b.yaml").write_text(readme.text)
    spec = load_study("llama3-70b.yaml")
    config = ParallelConfig(tp=4, pp=8, dp=4, micro_batch_size=1, global_batch_size=512,
                            sequence_parallel=True, distributed_optimizer=True)  # fmt: skip
    record_measured(spec, tmp_path / "results", [(config, 31.0)])
    argv = ["best", "--study", "llama3-70b.yaml", "--emit", "sbatch", "--train-iters", "50000"]
    assert main(argv) == 2
    assert "launch.train_args: the full run needs" in capsys.readouterr().err
    (tmp_path / "llama3-70b.yaml").write_text(_readme_study())
    assert main(argv) == 0
    capsys.readouterr()
    exports = ResultsLayout(tmp_path / "results", "llama3-70b").export(0)
    for path in (exports.sbatch, exports.sbatch_node):
        subprocess.run(["bash", "-n", str(path)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN_ALL),
                       ("torchrun", FAKE_TORCHRUN_LOG.format(python=sys.executable))):  # fmt: skip
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "torchrun.jsonl"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "7",
           "SLURM_JOB_NUM_NODES": "16", "SLURM_JOB_NODELIST": "gpu[001-016]",
           "FAKE_TORCHRUN_OUT": str(out)}  # fmt: skip
    done = subprocess.run(["bash", str(exports.sbatch)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r[r.index("--node_rank") + 1] for r in runs] == [str(k) for k in range(16)]
    for run in runs:
        assert run[run.index("--nnodes") + 1] == "16" and run[run.index("--master_addr") + 1] \
            == "10.0.0.7" and run[run.index("--nproc_per_node") + 1] == "8"  # fmt: skip
        assert run[run.index("--train-iters") + 1] == "50000" and "--data-path" in run
        assert run[run.index("--tensor-model-parallel-size") + 1] == "4"
    text = exports.sbatch.read_text()
    assert "#SBATCH --nodes=16" in text and "#SBATCH --partition=gpu" in text
    assert "#SBATCH --account=my-project" in text
