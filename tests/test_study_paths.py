"""Paths in a study file are relative to the study file's folder, wherever tune runs from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from tuner.config.parallel import ParallelConfig
from tuner.launch.templates import render_launch
from tuner.spec.file import load_study
from tuner.spec.paths import STUDY_PATHS
from tuner.spec.study import ClusterSpec, LaunchSpec, SSHSpec


def write_study(folder: Path, **launch: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text("gpu001\ngpu002 slots=8\n")
    (folder / "templates").mkdir(exist_ok=True)
    (folder / "templates" / "mine.sh.j2").write_text(
        "run {{ launch.script | shq }} in {{ launch.workdir | shq }} with {{ python | shq }}\n"
    )
    study = {
        "name": "paths",
        "model": {"preset": "llama3-8b"},
        "training": {"global_batch_size": 64},
        "cluster": {
            "gpu": "h100-sxm-80gb", "gpus_per_node": 8, "hostfile": "hosts", "executor": "ssh",
            "ssh": {"key_file": "keys/id_ed25519", "known_hosts": "~/.ssh/known_hosts",
                    "config_file": "/etc/ssh/ssh_config"},
        },
        "framework": "megatron",
        "launch": {"template": "mine", "templates_dir": "templates", "script": "train.py",
                   "python": ".venv/bin/python", "megatron_path": "../Megatron-LM",
                   "workdir": ".", **launch},
    }  # fmt: skip
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_relative_paths_are_relative_to_the_study_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    write_study(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_study("../project/study.yaml")
    assert spec.node_names == ("gpu001", "gpu002")  # the hostfile next to the study
    assert spec.launch.script == str(project / "train.py")
    assert spec.launch.python == str(project / ".venv" / "bin" / "python")
    assert spec.launch.megatron_path == str(tmp_path / "Megatron-LM")
    assert spec.launch.workdir == str(project)
    assert spec.launch.templates_dir == str(project / "templates")
    assert spec.cluster.ssh.key_file == str(project / "keys" / "id_ed25519")
    assert spec.cluster.ssh.known_hosts == "~/.ssh/known_hosts"  # ~ stays for whoever opens it
    assert spec.cluster.ssh.config_file == "/etc/ssh/ssh_config"
    # the template in the study's folder is found from here too
    out = render_launch(spec, ParallelConfig(dp=16, global_batch_size=64), hosts=["gpu001"],
                        master_addr="gpu001", master_port=29500, trial_dir="/r/t/0")  # fmt: skip
    assert out.scripts[0] == (
        f"run {project}/train.py in {project} with {project}/.venv/bin/python\n"
    )
    # the same study loaded from its own folder is the same study (the same fingerprint)
    monkeypatch.chdir(project)
    assert load_study("study.yaml") == spec
    assert load_study("study.yaml").fingerprint() == spec.fingerprint()


def test_absolute_home_bare_and_env_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_T_PROJECT", "relative/proj")
    study = write_study(
        tmp_path / "s", python="python3", script="${TUNER_T_PROJECT}/train.py",
        megatron_path="/opt/Megatron-LM", workdir="~/work",
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    spec = load_study(str(study))
    assert spec.launch.python == "python3"  # no '/': looked up on the nodes' PATH
    assert spec.launch.script == str(tmp_path / "s" / "relative" / "proj" / "train.py")
    assert spec.launch.megatron_path == "/opt/Megatron-LM"
    assert spec.launch.workdir == "~/work"


def test_a_linked_folder_means_the_folder_it_links_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "repo" / "tuner" / "studies"
    write_study(real, script="../../train.py")
    (tmp_path / "repo" / "studies").symlink_to(real)  # as this repository's studies/ is
    monkeypatch.chdir(tmp_path / "repo")
    assert load_study("studies/study.yaml").launch.script == str(tmp_path / "repo" / "train.py")


def test_every_path_field_exists() -> None:
    sections = {"cluster": ClusterSpec, "ssh": SSHSpec, "launch": LaunchSpec}
    for dotted in STUDY_PATHS:
        *parents, leaf = dotted.split(".")
        assert leaf in {f.name for f in dataclasses.fields(sections[parents[-1]])}, dotted


def test_the_shipped_demo_finds_the_workload_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    spec = load_study(str(repo / "studies" / "demo.yaml"))
    assert spec.launch.script == str(repo / "workloads" / "gpt_deepspeed.py")
    assert Path(spec.launch.script).is_file()
    assert spec.launch.python == str(repo / ".venv" / "bin" / "python")
