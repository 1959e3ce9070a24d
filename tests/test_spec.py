"""Strict study loading: good files load, every bad input names its YAML path."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.errors import ConfigError
from tuner.spec.file import (
    load_study,
    model_preset_names,
    resolve_study_path,
    shipped_study_names,
    study_from_mapping,
)
from tuner.spec.study import StudySpec

GOOD: dict[str, Any] = {
    "name": "t",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64, "precision": "bf16"},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["a", "b"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "env": {"NCCL_IB_TIMEOUT": 19}},
    "space": {"tp": [1, 2, 4], "pp": "auto", "recompute": ["none", "full"]},
    "search": {"n_trials": 5, "nodes_per_trial": 1},
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """GOOD with one key set (value DELETE removes it)."""
    data = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()


def test_good_study_loads_with_preset_and_defaults() -> None:
    spec = study_from_mapping(GOOD)
    assert isinstance(spec, StudySpec)
    assert spec.model.name == "llama2-7b" and spec.model.num_layers == 32
    assert spec.space.tp == (1, 2, 4) and spec.space.pp == "auto"
    assert spec.launch.env == {"NCCL_IB_TIMEOUT": "19"}
    assert spec.world_size == 8 and spec.nodes_per_trial == 1
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


def test_preset_fields_can_be_overridden() -> None:
    spec = study_from_mapping(with_change("model", {"preset": "llama2-7b", "seq_length": 2048}))
    assert spec.model.seq_length == 2048 and spec.model.hidden_size == 4096


BAD = [
    # (change path, value, expected YAML path in the message, words in the message)
    ("space.tp", [1, 2, "x"], "space.tp[2]", "expected an integer"),
    ("space.tp", [1, 0], "space.tp[1]", "must be > 0"),
    ("space.tp", "some", "space.tp", "expected a list or auto, got 'some'"),
    ("space.recompute", ["none", "most"], "space.recompute[1]", "not one of"),
    ("space.zero_stage", [4], "space.zero_stage[0]", "0, 1, 2 or 3"),
    ("space.pp", [], "space.pp", "empty"),
    ("space.tpp", [1], "space.tpp", "unknown key 'tpp'"),
    # a key in the wrong section names the field it is (the list of the section's own keys did
    # not), a knob's short name too; a near miss in its own section names the nearest key
    (
        "search.micro_batch_size",
        [1],
        "search.micro_batch_size",
        "unknown key 'micro_batch_size'; did you mean space.micro_batch_size?",
    ),
    ("global_batch_size", 64, "global_batch_size", "did you mean training.global_batch_size?"),
    ("cluster.partition", "gpu", "cluster.partition", "did you mean cluster.slurm.partition?"),
    ("training.seq_length", 4096, "training.seq_length", "did you mean model.seq_length?"),
    (
        "cluster.precision",
        "bf16",
        "cluster.precision",
        "did you mean training.precision or search.precision?",
    ),
    ("space.mbs", [1], "space.mbs", "did you mean space.micro_batch_size?"),
    ("search.zero", [1], "search.zero", "did you mean space.zero_stage?"),
    (
        "space.micro_batch_sizes",
        [1],
        "space.micro_batch_sizes",
        "did you mean 'micro_batch_size'?",
    ),
    ("search.n_trial", 5, "search.n_trial", "did you mean 'n_trials'?"),
    ("framework", "megatron-lm", "framework", "torchtitan; did you mean 'megatron'?"),
    ("framework", "Megatron", "framework", "did you mean 'megatron'?"),
    ("cluster.executor", "slrum", "cluster.executor", "did you mean 'slurm'?"),
    ("training.global_batch_size", -8, "training.global_batch_size", "must be > 0"),
    ("training.global_batch_size", "64", "training.global_batch_size", "expected an integer"),
    ("training.precision", "fp4", "training.precision", "not one of"),
    ("training", DELETE, "training", "required field is missing"),
    ("cluster.gpu", "v100", "cluster.gpu", "unknown GPU"),
    ("cluster.gpus_per_node", 0, "cluster.gpus_per_node", "must be > 0"),
    ("cluster.gpus_per_node", True, "cluster.gpus_per_node", "expected an integer"),
    ("cluster.nodes", ["a", "a"], "cluster.nodes", "listed twice"),
    ("cluster.executor", "kubernetes", "cluster.executor", "not one of"),
    ("cluster.ssh", {"prot": 22}, "cluster.ssh.prot", "unknown key"),
    ("framework", "jax", "framework", "not one of"),
    ("launch.train_iters", 0, "launch.train_iters", "must be > 0"),
    ("launch.warmup_iters", 40, "launch.warmup_iters", "< train_iters"),
    ("launch.env", ["A=1"], "launch.env", "expected a mapping"),
    ("search.sampler", "cmaes", "search.sampler", "not one of"),
    ("search.memory_headroom", 1.5, "search.memory_headroom", "(0, 1]"),
    ("search.nodes_per_trial", 3, "search.nodes_per_trial", "more than the cluster's 2 nodes"),
    ("model", {"preset": "llama9"}, "model.preset", "unknown preset"),
    ("model", {"preset": ["llama2-7b"]}, "model.preset", "unknown preset"),  # was a TypeError
    ("model", {"preset": "llama2-7b", "num_query_groups": 5}, "model.num_query_groups", "divide"),
    ("model", {"preset": "llama2-7b", "hidden_size": 4100}, "model.hidden_size", "divisible"),
    ("model", {"preset": "llama2-7b", "layers": 2}, "model.layers", "unknown key"),
    ("name", "a b", "name", "may only hold"),
    # hostile or absurd input (issue 11): each is refused at load, naming the field
    ("name", "..", "name", "plain name"),
    ("name", "ünï", "name", "plain name"),
    ("name", "a" * 300, "name", "300 characters long"),
    ("name", "a'; touch PWNED; '", "name", "plain name"),
    # results/clusters/ holds the cluster profiles (tuner.layout.ClusterLayout)
    ("name", "clusters", "name", "'clusters' is reserved: <results>/clusters/ holds the cluster"),
    ("name", "Clusters", "name", "is reserved"),  # the same directory on a case-blind filesystem
    ("cluster.gpu_memory_gib", float("nan"), "cluster.gpu_memory_gib", "finite number"),
    ("cluster.gpu_memory_gib", float("inf"), "cluster.gpu_memory_gib", "finite number"),
    (
        "cluster.ssh",
        {"connect_timeout_s": float("nan")},
        "cluster.ssh.connect_timeout_s",
        "finite ",
    ),
    ("search.trial_timeout_min", float("inf"), "search.trial_timeout_min", "finite number"),
    ("search.memory_headroom", float("nan"), "search.memory_headroom", "finite number"),
    ("search.max_node_hours", 10**400, "search.max_node_hours", "finite number"),
    ("launch.env", {"A B": "1"}, "launch.env", "not an environment variable name"),
    ("launch.env", {"$(touch PWNED)": "1"}, "launch.env", "not an environment variable name"),
    ("launch.env", {"1A": "1"}, "launch.env", "not an environment variable name"),
    ("launch.python", "py\0thon", "launch.python", "NUL"),
    ("launch.template", "../../etc/passwd", "launch.template", "inside the template folders"),
    ("launch.template", "/etc/passwd", "launch.template", "inside the template folders"),
    ("launch.template", "a/../b", "launch.template", "inside the template folders"),
    ("model", {"preset": "llama2-7b", "num_layers": 10**30}, "model.num_layers", "at most 4,096"),
    ("model", {"preset": "llama2-7b", "vocab_size": 10**12}, "model.vocab_size", "at most"),
    ("model", {"preset": "llama2-7b", "seq_length": 10**12}, "model.seq_length", "at most"),
    ("cluster.gpus_per_node", 10**9, "cluster.gpus_per_node", "at most 1,024"),
    ("training.global_batch_size", 10**30, "training.global_batch_size", "at most"),
    ("space.tp", [1, 1], "space.tp[1]", "listed twice"),
    ("space.micro_batch_size", [10**30], "space.micro_batch_size[0]", "at most"),
    ("search.n_trials", 10**12, "search.n_trials", "at most 100,000"),
    ("launch.train_iters", 10**12, "launch.train_iters", "at most"),
    # one value where a list goes: it said "expected a list, got 4 or 4 is not one of: auto"
    ("space.tp", 4, "space.tp", "expected a list, got 4: write [4] (or auto)"),
    ("space.recompute", "selective", "space.recompute", "got 'selective': write [selective]"),
    ("space.sequence_parallel", True, "space.sequence_parallel", "got True: write [true]"),
    ("cluster.nodes", "gpu001", "cluster.nodes", "got 'gpu001': write [gpu001]"),
    # neither a list nor a word the field takes: it said "... got 'foo' or 'foo' is not one of"
    ("space.pp", 2.5, "space.pp", "expected a list or auto, got 2.5"),
]


@pytest.mark.parametrize(("where", "value", "path", "words"), BAD, ids=[b[2] for b in BAD])
def test_bad_input_names_the_yaml_path(where: str, value: Any, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        study_from_mapping(with_change(where, value))
    assert info.value.path == path
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("where", "value"), [("training.name", "x"), ("space.colour", [1]), ("framework", "jax")]
)
def test_an_unknown_key_with_no_home_or_many_gets_no_guess(where: str, value: Any) -> None:
    """``name`` is a field in four places (the study, its model, cluster and GPU): a guess among
    them would be noise; a word near no field or choice gets none either."""
    with pytest.raises(ConfigError) as info:
        study_from_mapping(with_change(where, value))
    assert "did you mean" not in str(info.value)
    assert "(allowed: " in str(info.value) or "is not one of" in str(info.value)


def test_cluster_needs_exactly_one_node_source() -> None:
    data = with_change("cluster.num_nodes", 2)
    with pytest.raises(ConfigError, match="exactly one of nodes, hostfile or num_nodes"):
        study_from_mapping(data)


def test_hostfile(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("# the cluster\nn1 slots=8\nn2\n\n")
    data = with_change("cluster", {"gpu": "cpu", "gpus_per_node": 2, "hostfile": "hosts"})
    spec = study_from_mapping(data, base_dir=tmp_path)
    assert spec.node_names == ("n1", "n2")
    (tmp_path / "hosts").write_text("n1 slots=8 extra\n")
    with pytest.raises(ConfigError, match="bad entry"):
        study_from_mapping(data, base_dir=tmp_path)
    data = with_change("cluster", {"gpu": "cpu", "gpus_per_node": 2, "hostfile": "missing"})
    with pytest.raises(ConfigError, match="cannot read hostfile"):
        study_from_mapping(data, base_dir=tmp_path)


def test_load_study_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "mine.yaml").write_text(yaml.safe_dump(with_change("framework", 3)))
    with pytest.raises(ConfigError) as info:
        load_study("mine", cwd=tmp_path)
    assert "mine.yaml: framework:" in str(info.value)
    (tmp_path / "studies" / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: .* at line"):
        load_study("broken", cwd=tmp_path)


def test_study_resolution_order(tmp_path: Path) -> None:
    assert resolve_study_path("gpt-70b", cwd=tmp_path).name == "gpt-70b.yaml"
    (tmp_path / "studies").mkdir()
    local = tmp_path / "studies" / "gpt-70b.yaml"
    local.write_text(yaml.safe_dump(GOOD))
    assert resolve_study_path("gpt-70b", cwd=tmp_path) == local
    assert resolve_study_path(str(local)) == local
    with pytest.raises(ConfigError, match="unknown study 'nope' .*gpt-70b"):
        resolve_study_path("nope", cwd=tmp_path)


@pytest.mark.parametrize("name", ["gpt-70b", "llama3-8b", "llama3-8b-bridge", "llama3-8b-titan"])
def test_shipped_studies_load(name: str) -> None:
    assert name in shipped_study_names()
    spec = load_study(name)
    assert spec.cluster.gpu == "h100-sxm-80gb"


def test_gpt70b_is_64_nodes_of_8() -> None:
    spec = load_study("gpt-70b")
    assert len(spec.node_names) == 64 and spec.world_size == 512


def test_all_model_presets_are_valid() -> None:
    names = model_preset_names()
    for required in ("gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                     "llama3-70b", "llama3-405b", "gpt-70b"):  # fmt: skip
        assert required in names
    for name in names:
        study_from_mapping(with_change("model", {"preset": name}))


def test_fingerprint_ignores_budget_but_not_space() -> None:
    a = study_from_mapping(GOOD)
    b = study_from_mapping(with_change("search.n_trials", 50))
    c = study_from_mapping(with_change("space.tp", [1]))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_cli_bad_study_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "bad.yaml").write_text(
        yaml.safe_dump(with_change("space.tp", [3, "a"]))
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", "space", "--study", "bad"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "space.tp[1]" in lines[0] and "Traceback" not in proc.stderr


def test_environment_variables_in_string_values_are_expanded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNER_T_ROOT", "/shared/proj")
    monkeypatch.setenv("TUNER_T_HOST", "gpu001")
    launch = {
        "template": "megatron_gpt",
        "python": "${TUNER_T_ROOT}/venv/bin/python",
        "megatron_path": "${TUNER_T_ROOT}/Megatron-LM",
        "env": {"LITERAL": "$${TUNER_T_ROOT}", "NODE_SIDE": "$HOME/x", "N": 19},
    }
    data = with_change("launch", launch)
    data["cluster"]["nodes"] = ["${TUNER_T_HOST}", "gpu002"]
    spec = study_from_mapping(data)
    assert spec.launch.python == "/shared/proj/venv/bin/python"
    assert spec.launch.megatron_path == "/shared/proj/Megatron-LM"
    # $${ is a literal ${, a plain $ is left for the nodes' shell, non-strings are untouched
    assert spec.launch.env == {"LITERAL": "${TUNER_T_ROOT}", "NODE_SIDE": "$HOME/x", "N": "19"}
    assert spec.cluster.nodes == ("gpu001", "gpu002")
    monkeypatch.setenv("TUNER_T_ROOT", "/elsewhere")
    assert study_from_mapping(data).fingerprint() != spec.fingerprint()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("${TUNER_T_UNSET}/bin/python", "environment variable TUNER_T_UNSET is not set"),
        ("${TUNER_T_EMPTY}/bin/python", "environment variable TUNER_T_EMPTY is empty"),
        ("${TUNER_T_ROOT:-/opt}/python", "only ${NAME} is expanded"),
        ("${TUNER_T_ROOT/python", "unterminated '${'"),
    ],
)
def test_bad_environment_reference_names_the_field(
    value: str, words: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TUNER_T_UNSET", raising=False)
    monkeypatch.setenv("TUNER_T_EMPTY", "")
    monkeypatch.setenv("TUNER_T_ROOT", "/shared/proj")
    study = tmp_path / "env.yaml"
    study.write_text(yaml.safe_dump(with_change("launch.python", value)))
    with pytest.raises(ConfigError) as err:
        load_study(str(study))
    assert err.value.path == "launch.python"
    assert words in str(err.value) and str(study) in str(err.value)


def test_num_nodes_is_for_the_local_executor_only() -> None:
    cluster = {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2}
    with pytest.raises(ConfigError, match="executor: ssh give the hosts") as info:
        study_from_mapping(with_change("cluster", {**cluster, "executor": "ssh"}))
    assert info.value.path == "cluster.num_nodes"
    with pytest.raises(ConfigError, match="executor: ssh"):  # ssh is the default executor
        study_from_mapping(with_change("cluster", cluster))
    spec = study_from_mapping(with_change("cluster", {**cluster, "executor": "local"}))
    assert spec.node_names == ("local-0", "local-1")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: a\nname: b\n", "duplicate key 'name' at line 2"),
        ("launch: {template: x, template: y}\n", "duplicate key 'template' at line 1"),
        ('a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n', "aliases (*name) are not allowed"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("x: " + "9" * 5000 + "\n", "invalid YAML"),
    ],
)
def test_hostile_yaml_is_refused_before_any_walk(tmp_path: Path, text: str, words: str) -> None:
    study = tmp_path / "s.yaml"
    study.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_study(str(study))
    assert words in str(info.value) and str(study) in str(info.value)


def test_files_that_are_not_utf8_are_one_error(tmp_path: Path) -> None:
    study = tmp_path / "s.yaml"
    study.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8 text .byte 0xff at offset 6"):
        load_study(str(study))
    (tmp_path / "hosts").write_bytes(b"n1\n\xc3\x28\n")
    data = with_change("cluster", {"gpu": "cpu", "gpus_per_node": 2, "hostfile": "hosts"})
    with pytest.raises(ConfigError, match="hostfile .* is not UTF-8") as info:
        study_from_mapping(data, base_dir=tmp_path)
    assert info.value.path == "cluster.hostfile"
    study.write_bytes(b"# " + b"x" * (2 << 20))
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_study(str(study))


def test_home_of_an_unknown_user_is_one_error(tmp_path: Path) -> None:
    data = with_change(
        "cluster", {"gpu": "cpu", "gpus_per_node": 2, "hostfile": "~no-such-user-xyz/hosts"}
    )
    with pytest.raises(ConfigError, match="no such user") as info:
        study_from_mapping(data, base_dir=tmp_path)
    assert info.value.path == "cluster.hostfile"


@pytest.mark.parametrize("host", ["a b", "$(touch PWNED)", "a'; touch PWNED; '", "h" * 254, ""])
def test_node_names_must_be_host_names(host: str) -> None:
    with pytest.raises(ConfigError) as info:
        study_from_mapping(with_change("cluster.nodes", ["gpu001", host]))
    assert info.value.path == "cluster.nodes[1]"
    assert "not a host name" in str(info.value) or "non-empty" in str(info.value)


@pytest.mark.parametrize("host", ["gpu-001.cluster", "10.0.0.1", "::1", "[fe80::1]", "node_7"])
def test_real_host_names_load(host: str) -> None:
    assert study_from_mapping(with_change("cluster.nodes", [host])).node_names == (host,)


def test_a_fifo_hostfile_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "hosts")
    data = with_change("cluster", {"gpu": "cpu", "gpus_per_node": 2, "hostfile": "hosts"})
    with pytest.raises(ConfigError, match="not a regular file"):
        study_from_mapping(data, base_dir=tmp_path)


def test_megatron_deepspeed_is_a_framework_with_deepspeed_splits() -> None:
    data = with_change("framework", "megatron-deepspeed")
    data["launch"] = {"template": "megatron_deepspeed_gpt", "megatron_path": "/opt/mds"}
    data["space"] = {"pp": [2], "pipeline_split": ["even", "parameters", "type:transformer"]}
    spec = study_from_mapping(data)
    assert spec.framework == "megatron-deepspeed"
    data["space"] = {"pp": [2], "pipeline_split": ["first=16,last=16"]}
    with pytest.raises(ConfigError, match=r"space.pipeline_split\[0\].*framework is megatron-"):
        study_from_mapping(data)
    with pytest.raises(ConfigError, match="megatron-deepspeed"):  # the choices are listed
        study_from_mapping(with_change("framework", "megatron_deepspeed"))


def test_cross_entropy_fusion_is_megatron_lms_switch() -> None:
    fused = with_change("training.cross_entropy_fusion", True)
    assert study_from_mapping(fused).training.cross_entropy_fusion
    fused["framework"] = "megatron-deepspeed"
    fused["launch"] = {"template": "megatron_deepspeed_gpt", "megatron_path": "/opt/mds"}
    with pytest.raises(ConfigError) as info:
        study_from_mapping(fused)
    assert info.value.path == "training.cross_entropy_fusion"
    assert "--cross-entropy-loss-fusion" in str(info.value)


def test_probe_one_process_is_refused_where_the_script_cannot_run_the_points() -> None:
    """Only the DeepSpeed workload takes --probe-points: elsewhere the switch would be ignored
    silently, so the loader refuses it, naming the field."""
    assert study_from_mapping(with_change("launch.probe_one_process", False))
    with pytest.raises(ConfigError) as info:
        study_from_mapping(with_change("launch.probe_one_process", True))
    assert info.value.path == "launch.probe_one_process"
    assert "--probe-points" in str(info.value)


def test_search_proxy_reads_on_off_auto_and_refuses_anything_else(tmp_path: Path) -> None:
    for text, value in (("on", True), ("off", False), ("auto", "auto")):
        data = yaml.safe_load(yaml.safe_dump(with_change("search.proxy", "X")).replace("X", text))
        assert study_from_mapping(data).search.proxy == value
    assert study_from_mapping(GOOD).search.proxy is False  # off unless asked
    with pytest.raises(ConfigError, match=r"search\.proxy") as info:
        study_from_mapping(with_change("search.proxy", "sometimes"))
    # one list of what it accepts, not one error per alternative of the union
    assert info.value.reason == ("'sometimes' is not one of: true (on), false (off), auto"), (
        info.value.reason
    )
    with pytest.raises(ConfigError, match=r"search\.proxy_confirm"):
        study_from_mapping(with_change("search.proxy_confirm", 0))
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "bad.yaml").write_text(
        yaml.safe_dump(with_change("search.proxy", "sometimes"))
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", "space", "--study", "bad"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "search.proxy" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("n1\nn1.\n", r"'n1\.' is listed twice \(first as 'n1': a final '\.' names the same host"),
        ("N1.lab.\nn1.lab\n", r"'n1\.lab' is listed twice \(first as 'N1\.lab\.'"),
        ("n1\fn2\n", r"hosts:3: bad entry 'n1\\x0cn2'"),  # one line, as DeepSpeed reads it
        ("n1\u2028n2\n", r"hosts:3: bad entry 'n1\\u2028n2'"),
        ("n1 slots=1\n", r"hosts:3: 'slots=1': fewer GPUs than cluster.gpus_per_node \(2\)"),
    ],
)
def test_a_hostfile_is_read_as_deepspeed_and_ssh_read_it(
    tmp_path: Path, text: str, error: str
) -> None:
    data = with_change("cluster", {"gpu": "cpu", "gpus_per_node": 2, "hostfile": "hosts"})
    (tmp_path / "hosts").write_text("n0 slots=2\r\nn9.\r\n" + text, newline="")
    with pytest.raises(ConfigError, match=error):
        study_from_mapping(data, base_dir=tmp_path)
    (tmp_path / "hosts").write_text("n0 slots=2\r\nn9.\rn1- slots=4\n")  # more slots: a subset
    assert study_from_mapping(data, base_dir=tmp_path).node_names == ("n0", "n9.", "n1-")
