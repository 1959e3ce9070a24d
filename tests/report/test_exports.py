"""``tune best``'s exports run as they are: each kind in its own files, a launch script that bash
parses and that finds its master address when it runs, and a Megatron full run that the
stand-in (which checks every flag and Megatron's rules) trains with the study's own data."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.procs import run_in_group
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.layout import ResultsLayout
from tuner.report.export import trial_record
from tuner.space.trials import distributions
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.storage import open_storage

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
FAKE_TORCHRUN = """#!{python}
import json, os, sys
with open(os.environ["FAKE_TORCHRUN_OUT"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
"""
TRAIN_ARGS = ["--data-path", "/data/web text_document", "--split", "99,1,0",
              "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "/data/vocab.json",
              "--merge-file", "/data/merges.txt", "--lr", "1.5e-4", "--min-lr", "1.5e-5",
              "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--eval-interval", "1000",
              "--eval-iters", "10"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def megatron_study(tmp: Path, *, nodes: int, fake: bool = True, **launch: Any) -> dict[str, Any]:
    """A small Megatron study on local "nodes" of 2 ranks each, run by the stand-in; ``fake``:
    its interpreter's folder (first on the scripts' PATH) holds :func:`fake_torchrun`'s."""
    return {
        "name": "exports",
        "model": {"num_layers": 4, "hidden_size": 512, "ffn_hidden_size": 2048,
                  "num_attention_heads": 8, "vocab_size": 32000, "seq_length": 512},
        "training": {"global_batch_size": 8},
        "cluster": {"gpu": "a100-80gb", "gpus_per_node": 2, "num_nodes": nodes,
                    "executor": "local"},
        "framework": "megatron",
        "launch": {"template": "megatron_gpt", "megatron_path": str(STANDINS),
                   "python": str(tmp / "fakebin" / "python") if fake else sys.executable,
                   "train_iters": 6, "warmup_iters": 1,
                   "env": {"TUNER_STANDIN_TIME_SCALE": "0.0001", "NCCL_DEBUG": "WARN"},
                   **launch},
        "space": {"tp": [1, 2], "micro_batch_size": [1, 2], "sequence_parallel": [True]},
        "search": {"nodes_per_trial": nodes},
    }  # fmt: skip


def record_trials(spec: StudySpec, results: Path, measured: Mapping[int, float]) -> None:
    """One measured trial per tp in ``measured`` (tp -> step s), then an OOM trial."""

    def config(tp: int) -> ParallelConfig:
        return ParallelConfig(tp=tp, dp=spec.world_size // tp, micro_batch_size=1,
                              global_batch_size=8, sequence_parallel=tp > 1)  # fmt: skip

    record_measured(spec, results, [(config(tp), step) for tp, step in measured.items()],
                    failed=[config(1)])  # fmt: skip


def record_measured(
    spec: StudySpec, results: Path, measured: Sequence[tuple[ParallelConfig, float]],
    failed: Sequence[ParallelConfig] = (), figures: Mapping[str, float] | None = None,
) -> None:  # fmt: skip
    """Trials as the study loop leaves them: ``measured`` (config, step s) in order, then the
    ``failed`` ones (OOM); ``figures``: attributes of the measured ones set otherwise."""
    layout = ResultsLayout(results, spec.name)
    study = optuna.create_study(study_name=spec.name, storage=open_storage(None, layout))
    hosts = spec.node_names[: spec.nodes_per_trial]
    for c, step in [*measured, *((c, 0.0) for c in failed)]:
        trial = study.ask(distributions(spec))
        planned = {"config": dataclasses.asdict(c), "key": c.key(), "hosts": hosts,
                   "predicted_step_s": 0.9, "predicted_peak_gib": 12.5}  # fmt: skip
        for key, value in planned.items():
            trial.set_user_attr(key, value)
        if not step:
            trial.set_user_attr("outcome", "oom")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        got = {"outcome": "ok", "step_time_s": step, "tokens_per_s": 4096 / step,
               "peak_memory_gib": 10.0, "mfu": 0.41}  # fmt: skip
        for key, value in (got | dict(figures or {})).items():
            trial.set_user_attr(key, value)
        study.tell(trial, step)


def fake_torchrun(tmp: Path) -> dict[str, str]:
    """An environment whose ``torchrun`` records its argv and environment in ``argv.json``."""
    bin_dir = tmp / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN.format(python=sys.executable))
    (bin_dir / "torchrun").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp),
            "FAKE_TORCHRUN_OUT": str(tmp / "argv.json")}  # fmt: skip


def run_script(script: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Any]:
    out = Path(env["FAKE_TORCHRUN_OUT"])
    out.unlink(missing_ok=True)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return done, json.loads(out.read_text()) if out.exists() else None


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def two_nodes(tmp_path: Path) -> tuple[StudySpec, Path]:
    spec = study_from_mapping(megatron_study(tmp_path, nodes=2, train_args=TRAIN_ARGS))
    record_trials(spec, tmp_path / "results", {2: 2.0, 1: 3.0})
    return spec, tmp_path / "results"


def test_each_kind_writes_its_own_files(two_nodes: tuple[StudySpec, Path]) -> None:
    spec, results = two_nodes
    record = trial_record(spec, results=str(results))
    assert record.trial == 0 and record.best and record.config.tp == 2
    written: dict[str, dict[Path, bytes]] = {}
    for kind in ("script", "sbatch", "args"):
        export = record.export(kind)
        assert export.path in export.files and export.path.read_text() == export.text
        written[kind] = {p: p.read_bytes() for p in export.files if p.is_file()}
        for script in (p for p in export.files if p.suffix == ".sh"):
            subprocess.run(["bash", "-n", str(script)], check=True)
    files = [p for kind in written.values() for p in kind]
    assert len(files) == len(set(files)), "two kinds wrote the same file"
    for kind, contents in written.items():  # later kinds rewrote nothing of an earlier one
        assert {p: p.read_bytes() for p in contents} == contents, kind
    with pytest.raises(ConfigError, match="no DeepSpeed config"):
        record.export("ds-config")
    for script in (record.paths.script, record.paths.sbatch_node):  # each names itself
        text = " ".join(line.lstrip("# ") for line in script.read_text().splitlines())
        assert f"Run on every node: NODE_RANK=<k> bash {script.name} (" in text, script.name


def test_the_header_says_what_was_measured_and_what_was_not(
    two_nodes: tuple[StudySpec, Path],
) -> None:
    spec, results = two_nodes
    log = ResultsLayout(results, spec.name).trial(0).node_log(0)
    log.parent.mkdir(parents=True)
    log.write_text("tuner-versions: python=3.11.7 torch=2.13.0+cpu\n iteration 1/ 6 |\n")
    text = trial_record(spec, results=str(results)).export("script", train_iters=500).text
    header = " ".join(line[1:].strip() for line in text.splitlines()[1:] if line.startswith("#"))
    for words in ("trial 0 (the fastest measured trial)", ParallelConfig(
            tp=2, dp=2, micro_batch_size=1, global_batch_size=8, sequence_parallel=True).key(),
            "2.000 s/step (median)", "41.0% MFU", "10.0 GiB peak allocated", "0.9000 s/step",
            "Software: tuner ", "python 3.11.7, torch 2.13.0+cpu.", "500 iterations",
            "--data-path '/data/web text_document'",
            "NCCL_DEBUG=WARN", "evaluation", "checkpoint", "data loading at scale"):  # fmt: skip
        assert words in header, words
    assert "--mock-data" not in text and "NullTokenizer" not in text


def test_the_header_prints_gib_seconds_and_rates_as_the_tables_do(tmp_path: Path) -> None:
    """``units.gib``, ``units.seconds``, ``units.rate``: a CPU demo's 0.081 GiB reads ``0.0810``
    as in ``tune leaderboard``, a large peak ``1234.5``, never ``1.23e+03`` (the ``.3g`` it
    was)."""
    spec = study_from_mapping(megatron_study(tmp_path, nodes=2, train_args=TRAIN_ARGS))
    c = ParallelConfig(tp=2, dp=2, micro_batch_size=1, global_batch_size=8, sequence_parallel=True)
    record_measured(spec, tmp_path, [(c, 12345.6)],
                    figures={"peak_memory_gib": 0.081, "predicted_peak_gib": 1234.5,
                             "tokens_per_s": 16384.0})  # fmt: skip
    results = tmp_path
    text = trial_record(spec, trial=0, results=str(results)).export("script").text
    header = " ".join(line[1:].strip() for line in text.splitlines()[1:] if line.startswith("#"))
    for words in ("0.0810 GiB peak allocated", "1234.5 GiB peak", "16,384 tokens/s",
                  "12,346 s/step"):  # fmt: skip
        assert words in header, (words, header)
    assert "e+0" not in header and "e-0" not in header


def test_another_trial_and_the_ones_that_measured_nothing(
    two_nodes: tuple[StudySpec, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec, results = two_nodes
    record = trial_record(spec, 1, results=str(results))
    assert (record.trial, record.best, record.config.tp) == (1, False, 1)
    text = record.export("script").text
    assert "trial 1 (chosen with --trial)" in text and "--tensor-model-parallel-size 1" in text
    recipe = record.export("bridge-recipe").text
    assert "Trial 1's config (--trial) of study exports" in recipe and "fastest" not in recipe
    assert (
        "The fastest config of study"
        in trial_record(spec, results=str(results)).export("bridge-recipe").text
    )
    assert record.paths.dir.name == "trial-1"
    with pytest.raises(ConfigError, match=r"--trial: trial 2 measured nothing \(outcome oom\)"):
        trial_record(spec, 2, results=str(results))
    with pytest.raises(ConfigError, match="--trial: study 'exports' has no trial 9"):
        trial_record(spec, 9, results=str(results))
    study = results.parent / "study.yaml"
    study.write_text(json.dumps(megatron_study(results.parent, nodes=2, train_args=TRAIN_ARGS)))
    assert main(["best", "--study", str(study), "--results", str(results), "--trial", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trial 2 measured nothing" in err


def test_master_address_and_rank_are_found_when_the_script_runs(
    two_nodes: tuple[StudySpec, Path], tmp_path: Path
) -> None:
    spec, results = two_nodes
    script = trial_record(spec, results=str(results)).export("script").path
    env = fake_torchrun(tmp_path)
    done, _ = run_script(script, env)  # two nodes: neither rank nor address can be guessed
    assert done.returncode == 2 and "set NODE_RANK" in done.stderr
    done, _ = run_script(script, {**env, "NODE_RANK": "1"})
    assert done.returncode == 2 and "set MASTER_ADDR" in done.stderr
    done, ran = run_script(script, {**env, "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3"})
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--master_addr") == "10.1.2.3"
    assert flag(ran["argv"], "--node_rank") == "1" and flag(ran["argv"], "--nnodes") == "2"
    assert ran["env"]["NCCL_DEBUG"] == "WARN" and ran["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the job's nodes\n\n  gpu017 slots=8\ngpu018 slots=8\n")
    done, ran = run_script(script, {**env, "SLURM_NODEID": "0", "HOSTFILE": str(hostfile)})
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--master_addr") == "gpu017"
    assert flag(ran["argv"], "--node_rank") == "0"
    done, _ = run_script(script, {**env, "NODE_RANK": "2", "MASTER_ADDR": "h"})
    assert done.returncode == 2 and "NODE_RANK 2 is not in 0..1" in done.stderr
    # a rank the run has not is the error, before the master address is asked for or named
    # ("tuner: node 2 of 2, master h", then the refusal)
    for rank in ("2", "x", "-1"):
        done, _ = run_script(script, {**env, "NODE_RANK": rank})
        assert done.returncode == 2, rank
        assert done.stderr.strip() == f"tuner: NODE_RANK {rank} is not in 0..1", done.stderr
    done, ran = run_script(script, {**env, "NODE_RANK": "01", "MASTER_ADDR": "h"})
    assert done.returncode == 0 and flag(ran["argv"], "--node_rank") == "1", done.stderr


def test_a_slurm_job_step_without_scontrol_is_no_empty_master(
    two_nodes: tuple[StudySpec, Path], tmp_path: Path
) -> None:
    """Inside a Slurm job but where Slurm's client cannot answer (a container image without it,
    a node without the cluster's config), the allocation gives no address: the script goes on
    to the next source and, with none, stops asking for MASTER_ADDR; it started torchrun with
    an empty master address."""
    spec, results = two_nodes
    script = trial_record(spec, results=str(results)).export("script").path
    env = {**fake_torchrun(tmp_path), "SLURM_JOB_NODELIST": "gpu[017-018]", "SLURM_NODEID": "1"}
    no_client = tmp_path / "fakebin" / "scontrol"  # first on the script's PATH
    no_client.write_text("#!/bin/sh\necho 'scontrol: command not found' >&2; exit 127\n")
    no_client.chmod(0o755)
    done, ran = run_script(script, env)
    assert done.returncode == 2 and "set MASTER_ADDR" in done.stderr, done.stderr
    assert ran is None
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu017 slots=8\ngpu018 slots=8\n")
    done, ran = run_script(script, {**env, "HOSTFILE": str(hostfile)})
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--master_addr") == "gpu017"


def test_hostile_values_stay_values(tmp_path: Path) -> None:
    evil = "a'; touch pwned; echo '\n$(touch pwned2)"
    data = megatron_study(tmp_path, nodes=1, train_args=["--data-path", evil],
                          env={"NCCL_SOCKET_IFNAME": evil})  # fmt: skip
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {1: 1.0})
    script = trial_record(spec, results=str(tmp_path / "results")).export("script").path
    subprocess.run(["bash", "-n", str(script)], check=True)
    env = fake_torchrun(tmp_path)
    done, ran = run_script(script, env)
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--data-path") == evil and ran["env"]["NCCL_SOCKET_IFNAME"] == evil
    assert flag(ran["argv"], "--master_addr") == "127.0.0.1"  # one node: loopback
    assert not list(tmp_path.rglob("pwned*"))


def test_a_proxy_trials_config_runs_on_the_nodes_it_needs(tmp_path: Path) -> None:
    """A proxy ran the config at half its DP on 2 of the 4 nodes: the export is the config
    itself, on 4 nodes (on 2, torchrun's world would halve DP and double the accumulation), and
    its header says the step was extrapolated."""
    data = megatron_study(tmp_path, nodes=4, train_args=TRAIN_ARGS)
    spec = study_from_mapping({**data, "search": {**data["search"], "proxy": True}})
    config = ParallelConfig(tp=2, dp=4, micro_batch_size=1, global_batch_size=8,
                            sequence_parallel=True)  # fmt: skip
    storage = open_storage(None, ResultsLayout(tmp_path / "r", spec.name))
    study = optuna.create_study(study_name=spec.name, storage=storage)
    trial = study.ask(distributions(spec))
    attrs = {"config": dataclasses.asdict(config), "key": config.key(), "outcome": "ok",
             "hosts": list(spec.node_names[:2]), "step_time_s": 2.0, "tokens_per_s": 2048.0,
             "proxy": True, "proxy_dp": 2, "proxy_nodes": 2, "proxy_step_s": 1.8}  # fmt: skip
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 2.0)
    record = trial_record(spec, results=str(tmp_path / "r"))
    env = {**fake_torchrun(tmp_path), "NODE_RANK": "3", "MASTER_ADDR": "h0"}
    done, ran = run_script(record.export("script").path, env)
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--nnodes") == "4" and flag(ran["argv"], "--node_rank") == "3"
    assert "#SBATCH --nodes=4" in record.export("sbatch").text
    assert flag(record.export("args").text.split(), "--tensor-model-parallel-size") == "2"
    header = " ".join(line[1:].strip() for line in record.export("script").text.splitlines()
                      if line.startswith("# "))  # fmt: skip
    assert "ran this config at DP 2 on 2 node(s), 1.800 s/step" in header, header
    assert "extrapolated to the 4 node(s) of this run" in header, header


def test_a_bridge_full_run_keeps_the_recipes_checkpoints_and_takes_the_studys_args(
    tmp_path: Path,
) -> None:
    """A Bridge study's launch.sh is the full run, not a trial: no override turns off the
    recipe's evaluation or checkpoint saving, launch.train_args reach the recipe script (before
    tune's overrides, which win), and the stand-in recipe script accepts the line as Bridge's
    struct-mode overrides would."""
    data = megatron_study(
        tmp_path,
        nodes=1,
        train_args=["checkpoint.save=/ckpt/run1", "checkpoint.save_interval=1000"],
    )
    data.update(framework="megatron-bridge", space={"tp": [1, 2]})
    del data["launch"]["megatron_path"]
    bridge = str(STANDINS / "megatron_bridge")
    data["launch"].update(template="megatron_bridge", bridge_path=bridge,
                          recipe="llama3_8b_pretrain_config")  # fmt: skip
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {2: 1.0})
    script = trial_record(spec, results=str(tmp_path / "results")).export("script").path
    done, ran = run_script(script, fake_torchrun(tmp_path))
    assert done.returncode == 0, done.stderr
    argv = ran["argv"][ran["argv"].index("--recipe") - 1 :]
    assert "checkpoint.save=/ckpt/run1" in argv and "train.train_iters=6" in argv
    assert not [w for w in argv if w.startswith(("checkpoint.save=null", "validation."))], argv
    assert "--dataset" not in argv  # the trials' mock data: the recipe's own data instead
    assert argv.index("checkpoint.save_interval=1000") < argv.index("train.global_batch_size=8")
    env = {**os.environ, "WORLD_SIZE": "2", "TUNER_STANDIN_TIME_SCALE": "0",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # fmt: skip
    recipe = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert recipe.returncode == 0, recipe.stderr[-2000:]
    assert "iteration        6/       6" in recipe.stdout, recipe.stdout[-2000:]


def test_a_torchtitan_full_run_takes_the_studys_own_args(tmp_path: Path) -> None:
    """launch.train_args reach torchtitan's trainer in launch.sh and in --emit args (after the
    config selection, before tune's overrides), and the stand-in trainer, which refuses what
    0.3.0's parser refuses, runs the exported line."""
    data = {
        "name": "titan", "model": {"num_layers": 6, "hidden_size": 256, "ffn_hidden_size": 768,
                                   "num_attention_heads": 16, "vocab_size": 2048,
                                   "seq_length": 2048, "tied_embeddings": False},
        "training": {"global_batch_size": 8, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "num_nodes": 1,
                    "executor": "local"},
        "framework": "torchtitan",
        "launch": {"template": "torchtitan_llama", "script": str(STANDINS / "torchtitan_train.py"),
                   "script_args": ["--module", "llama3", "--config", "llama3_debugmodel"],
                   "python": str(tmp_path / "fakebin" / "python"), "train_iters": 4,
                   "warmup_iters": 1, "train_args": ["--training.max-norm", "0.5"]},
        "space": {"tp": [1, 2]},
    }  # fmt: skip
    spec = study_from_mapping(data)
    config = ParallelConfig(tp=2, dp=1, micro_batch_size=1, global_batch_size=8)
    record_measured(spec, tmp_path / "results", [(config, 1.0)])
    record = trial_record(spec, results=str(tmp_path / "results"))
    done, ran = run_script(record.export("script").path, fake_torchrun(tmp_path))
    assert done.returncode == 0, done.stderr
    argv = ran["argv"][ran["argv"].index("--module") - 1 :]
    args = shlex.split(record.export("args").text)
    assert args[args.index("--module") - 1 :] == argv
    assert argv.index("llama3_debugmodel") + 1 == argv.index("--training.max-norm")
    assert flag(argv, "--training.max-norm") == "0.5"
    env = {**os.environ, "WORLD_SIZE": "2", "TUNER_STANDIN_TIME_SCALE": "0"}
    trainer = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    assert trainer.returncode == 0, trainer.stderr[-2000:]
    assert record.export("torchtitan").text.split() == argv[1:]  # the line after the script


def test_tune_best_refuses_a_torchtitan_word_its_line_cannot_hold_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ``extra_args`` word setting the tensor-parallel degree, given after tune's overrides,
    would make the exported line another config than the winner's: ``tune best`` says so in one
    line and exits 2, for ``--emit torchtitan`` and the scripts alike (the study is refused as it
    loads, ``tuner.spec.controlled``: its trials would have measured that degree too)."""
    import yaml

    data = {
        "name": "titan", "model": {"num_layers": 6, "hidden_size": 256, "ffn_hidden_size": 768,
                                   "num_attention_heads": 16, "vocab_size": 2048,
                                   "seq_length": 2048, "tied_embeddings": False},
        "training": {"global_batch_size": 8, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "num_nodes": 1,
                    "executor": "local"},
        "framework": "torchtitan",
        "launch": {"template": "torchtitan_llama",
                   "script_args": ["--module", "llama3", "--config", "llama3_debugmodel"],
                   "extra_args": ["--parallelism.tensor-parallel-degree", "1"]},
        "space": {"tp": [1, 2]},
    }  # fmt: skip
    study = tmp_path / "titan.yaml"
    study.write_text(yaml.safe_dump(data))
    spec = study_from_mapping({**data, "launch": {**data["launch"], "extra_args": []}})
    config = ParallelConfig(tp=2, dp=1, micro_batch_size=1, global_batch_size=8)
    record_measured(spec, tmp_path / "results", [(config, 1.0)])  # a study run without the word
    for kind in ("torchtitan", "script"):
        argv = ["best", "--study", str(study), "--results", str(tmp_path / "results"), "--emit",
                kind]  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "launch.extra_args[0]: '--parallelism.tensor-" in err, err
        assert "sets --parallelism.tensor-parallel-degree, which tune sets for the config" in err


def test_a_megatron_full_run_needs_the_studys_own_data(tmp_path: Path) -> None:
    spec = study_from_mapping(megatron_study(tmp_path, nodes=1))
    record_trials(spec, tmp_path / "results", {1: 1.0})
    record = trial_record(spec, results=str(tmp_path / "results"))
    with pytest.raises(ConfigError, match="launch.train_args: the full run needs"):
        record.export("script")
    assert "--tensor-model-parallel-size 1" in record.export("args").text  # args need no data


@pytest.mark.slow
def test_the_megatron_export_trains_through_the_standin(tmp_path: Path) -> None:
    """The exported script, run as it is: torchrun starts the stand-in on 2 ranks, which parses
    every flag with Megatron's own names, applies its rules (one data source, a tokenizer with
    its files) and runs the full run's iterations."""
    data = megatron_study(tmp_path, nodes=1, fake=False, train_args=TRAIN_ARGS,
                          master_port=free_port())  # fmt: skip
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {2: 1.0, 1: 2.0})
    script = trial_record(spec, results=str(tmp_path / "results")).export("script", train_iters=3)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("MASTER_ADDR", None)
    env.pop("NODE_RANK", None)
    done = run_in_group(["bash", str(script.path)], timeout=300, env=env, cwd=tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "building GPT2BPETokenizer tokenizer" in log and "master 127.0.0.1" in log
    iterations = [line for line in log.splitlines() if "consumed samples" in line]
    assert len(iterations) == 3 and "iteration        3/       3" in iterations[-1], log[-3000:]
    assert "validation loss at iteration 3 on test set" in log  # the study's --eval-iters 10


def test_a_deepspeed_studys_args_are_its_launcher_line_and_ds_config(tmp_path: Path) -> None:
    from tuner.space.enumerate import enumerate_space
    from tuner.spec.file import load_study

    spec = load_study(str(REPO / "tuner" / "studies" / "demo-moe.yaml"))
    best = enumerate_space(spec).ranked()[0].config
    record_measured(spec, tmp_path / "results", [(best, 0.5)])
    record = trial_record(spec, results=str(tmp_path / "results"))
    args = record.export("args", train_iters=100)
    words = args.text.split()
    assert words[:6] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "2", spec.launch.script]
    assert not [w for w in words if w.startswith(("--tensor-model", "--pipeline-model"))]
    assert flag(words, "--ep-size") == str(best.ep) and flag(words, "--train-iters") == "100"
    config = Path(flag(words, "--deepspeed_config"))
    assert config in args.files and config.parent == record.paths.args_files
    ds = record.export("ds-config")
    assert json.loads(config.read_text()) == json.loads(ds.text)
    assert ds.path != config  # each kind its own file


@pytest.mark.parametrize(
    ("framework", "template"),
    [("megatron", "megatron_gpt"), ("megatron-deepspeed", "megatron_deepspeed_gpt"),
     ("deepspeed", "deepspeed_gpt")],
)  # fmt: skip
def test_every_shipped_template_renders_the_full_run(
    framework: str, template: str, tmp_path: Path
) -> None:
    data = megatron_study(tmp_path, nodes=1, train_args=["--data-path", "/data/full_document"])
    data["framework"] = framework
    data["launch"].update(template=template, script="/opt/train.py")
    data["space"] = {"micro_batch_size": [1], "zero_stage": [1]} if framework != "megatron" else {}
    spec = study_from_mapping(data)
    config = ParallelConfig(tp=1, dp=2, micro_batch_size=1, global_batch_size=8,
                            zero_stage=0 if framework == "megatron" else 1)  # fmt: skip
    record_measured(spec, tmp_path / "results", [(config, 1.0)])
    script = trial_record(spec, results=str(tmp_path / "results")).export("script").path
    subprocess.run(["bash", "-n", str(script)], check=True)
    done, ran = run_script(script, fake_torchrun(tmp_path))
    assert done.returncode == 0, done.stderr
    argv = ran["argv"]
    assert flag(argv, "--data-path") == "/data/full_document"
    assert flag(argv, "--master_addr") == "127.0.0.1" and flag(argv, "--train-iters") == "6"
    assert not {"--mock-data", "NullTokenizer", "--eval-iters"} & set(argv), argv


def test_a_hostfile_study_export_reads_what_its_header_says(tmp_path: Path) -> None:
    """The header said the master address falls back to "HOSTFILE (default: the study's
    hostfile)", but loading a study reads its ``cluster.hostfile`` into its nodes, so the
    script's default was always empty. The first host of the study's hostfile is the study's
    first node, which the script falls back to; HOSTFILE is the user's only."""
    hosts = tmp_path / "hosts"
    hosts.write_text("# the study's nodes\ngpu017 slots=2\ngpu018 slots=2\n")
    data = megatron_study(tmp_path, nodes=2, train_args=TRAIN_ARGS)
    data["cluster"] = {"gpu": "a100-80gb", "gpus_per_node": 2, "hostfile": str(hosts),
                       "executor": "ssh"}  # fmt: skip
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {2: 2.0})
    text = trial_record(spec, results=str(tmp_path / "results")).export("script").text
    header = " ".join(line.removeprefix("#").strip() for line in text.splitlines()
                      if line.startswith("#"))  # fmt: skip
    assert ("else the first host of the file HOSTFILE names, else the study's first SSH node"
            in header), header  # fmt: skip
    assert "local hostfile=${HOSTFILE:-}" in text  # no default the header would have to name
    script = trial_record(spec, results=str(tmp_path / "results")).export("script").path
    env = {**fake_torchrun(tmp_path), "NODE_RANK": "1"}
    done, ran = run_script(script, env)
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--master_addr") == "gpu017"
    (tmp_path / "other").write_text("gpu099\n")
    done, ran = run_script(script, {**env, "HOSTFILE": str(tmp_path / "other")})
    assert done.returncode == 0, done.stderr
    assert flag(ran["argv"], "--master_addr") == "gpu099"


def test_an_ssh_studys_export_falls_back_to_the_master_its_trials_used(tmp_path: Path) -> None:
    """Trials take the first node's address from the ssh config (a node name may be an alias
    only the login node knows); the export fell back to the alias itself, which the nodes of
    the full run may not resolve."""
    from tuner.launch.ssh import SSHExecutor

    (tmp_path / "ssh_config").write_text("Host gpu-a\n  HostName 10.1.2.3\nHost gpu-b\n"
                                         "  HostName 10.1.2.4\n")  # fmt: skip
    data = megatron_study(tmp_path, nodes=2, train_args=TRAIN_ARGS)
    data["cluster"] = {
        "gpu": "a100-80gb",
        "gpus_per_node": 2,
        "nodes": ["gpu-a", "gpu-b"],
        "executor": "ssh",
        "ssh": {"config_file": str(tmp_path / "ssh_config")},
    }
    spec = study_from_mapping(data)
    record_trials(spec, tmp_path / "results", {2: 2.0})
    script = trial_record(spec, results=str(tmp_path / "results")).export("script").path
    done, ran = run_script(script, {**fake_torchrun(tmp_path), "NODE_RANK": "1"})
    assert done.returncode == 0, done.stderr
    with SSHExecutor(spec.cluster.ssh) as trials:
        assert flag(ran["argv"], "--master_addr") == trials.master_addr(spec.node_names)
    assert flag(ran["argv"], "--master_addr") == "10.1.2.3"
    (tmp_path / "ssh_config").unlink()  # tune best where the study's ssh config is not
    script = trial_record(spec, results=str(tmp_path / "results")).export("script").path
    done, ran = run_script(script, {**fake_torchrun(tmp_path), "NODE_RANK": "1"})
    assert done.returncode == 0 and flag(ran["argv"], "--master_addr") == "gpu-a", done.stderr
