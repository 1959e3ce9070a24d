"""Hostile and malformed input through the real ``tune`` command (issue 11).

Every malformed study file must make ``tune space`` and ``tune run --dry-run`` exit 2 with exactly
one line on stderr that names the field or the file, never a traceback; every malformed log must
get a classification from ``tune parse-log --json`` (or, when it cannot be read, one line and exit
2). Nothing in any input is ever executed: several values try shell injection and the test checks
that no ``PWNED`` file appears. Subprocess timeouts are a guard against hangs, not timings.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_profile import a_profile
from tests.test_reliability import _mounted
from tests.test_study import SURFACE, standin_processes, study_data, write_study
from tuner.calibrate.store import Calibration, Observation
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.errors import StudyError
from tuner.layout import ClusterLayout
from tuner.outcome import Outcome
from tuner.report.leaderboard import leaderboard
from tuner.spec.file import study_from_mapping

REPO = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 120  # far above the seconds any case takes; only a hang reaches it

BASE: dict[str, Any] = {
    "name": "hostile",
    "model": {
        "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 4,
        "vocab_size": 4096, "seq_length": 256,
    },
    "training": {"global_batch_size": 8},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "nodes": ["n1"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2], "micro_batch_size": [1, 2]},
}  # fmt: skip
INJECTIONS = ("a'; touch PWNED; '", "$(touch PWNED)", "`touch PWNED`", 'x"; touch PWNED #')


def tune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TUNER_HOSTILE_UNSET", None)
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", *args], cwd=cwd, env=env, capture_output=True,
        text=True, errors="replace", timeout=HANG_GUARD_S, check=False,
    )  # fmt: skip


def changed(path: str, value: Any) -> str:
    """BASE as YAML with ``path`` (dotted) set to ``value``."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return yaml.safe_dump(data, allow_unicode=True)


def base_text() -> str:
    return yaml.safe_dump(BASE)


def hostfile_case(content: bytes | None, hostfile: str) -> Callable[[Path], str]:
    def make(root: Path) -> str:
        if content is not None:
            (root / "hosts").write_bytes(content)
        cluster = {"gpu": "h100-sxm-80gb", "gpus_per_node": 2, "hostfile": hostfile}
        return changed("cluster", cluster)

    return make


# (id, study text or bytes or a function of the folder, words the one stderr line must hold)
Study = str | bytes | Callable[[Path], str]
BAD_STUDIES: list[tuple[str, Study, str]] = [
    ("duplicate-top-key", base_text() + "name: other\n", "duplicate key 'name'"),
    ("duplicate-nested-key", base_text().replace("  gpus_per_node: 2\n",
     "  gpus_per_node: 2\n  gpus_per_node: 4\n"), "duplicate key 'gpus_per_node'"),
    ("alias-bomb", base_text() + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9)
    ), "aliases (*name) are not allowed"),
    ("undefined-alias", base_text() + "x: *nowhere\n", "aliases (*name) are not allowed"),
    ("merge-key-alias", "b: &b {name: x}\n" + base_text() + "c: {<<: *b}\n", "aliases"),
    ("not-utf8", base_text().encode().replace(b"hostile", b"host\xffile"), "not UTF-8 text"),
    ("utf16", base_text().encode("utf-16"), "not UTF-8 text"),
    ("empty-file", "", "must be a mapping of sections"),
    ("top-level-list", "- a\n- b\n", "must be a mapping of sections"),
    ("two-documents", base_text() + "---\nname: other\n",  # was "but found another document"
     "expected a single document in the stream, but found another document at line"),
    ("unclosed-bracket", "name: [unclosed\n", "at line"),
    ("tab-indent", "cluster:\n\tgpu: x\n", "at line 2 (a tab: write spaces there)"),
    ("tab-in-flow", "name: x\nspace: {tp: [1,\n\t2]}\n", "at line 3 (a tab: write spaces there)"),
    ("deep-nesting", "x: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ("5000-digit-int", base_text() + "x: " + "9" * 5000 + "\n", "of more than 4300 digits"),
    ("too-big-file", base_text() + "#" * (2 << 20) + "\n", "larger than 1024 KiB"),
    ("num-layers-1e30", changed("model.num_layers", 10**30), "model.num_layers: must be at most"),
    ("num-layers-float", changed("model.num_layers", 1e30), "model.num_layers: expected an int"),
    ("hidden-size-huge", changed("model.hidden_size", 2**40), "model.hidden_size: must be at"),
    ("gpus-per-node-huge", changed("cluster.gpus_per_node", 10**9), "cluster.gpus_per_node"),
    ("batch-huge", changed("training.global_batch_size", 10**20), "training.global_batch_size"),
    ("nan-gpu-memory", changed("cluster.gpu_memory_gib", float("nan")), "cluster.gpu_memory_gib"),
    ("inf-timeout", changed("search.trial_timeout_min", float("inf")), "search.trial_timeout_min"),
    ("neg-inf-headroom", changed("search.memory_headroom", float("-inf")), "memory_headroom"),
    # tune run: numpy's "Seed must be between 0 and 2**32 - 1" traceback from every sampler
    ("seed-2-to-the-40", changed("search.seed", 2**40), "search.seed: must be from 0 to"),
    ("seed-negative", changed("search.seed", -1), "search.seed: must be from 0 to 4,294,967,295"),
    # tune run: the heartbeat thread's wait overflowed (a traceback, then no heartbeats)
    ("heartbeat-1e30", changed("search.heartbeat_s", 1e30), "search.heartbeat_s: must be at most"),
    ("nan-ssh-timeout", changed("cluster.ssh", {"connect_timeout_s": float("nan")}),
     "cluster.ssh.connect_timeout_s: must be a finite number"),
    ("name-dotdot", changed("name", ".."), "name: '..' must be a plain name"),
    ("name-non-ascii", changed("name", "modèle-ünï"), "must be a plain name"),
    ("name-300-chars", changed("name", "n" * 300), "name: 'nnnn"),
    ("name-slash", changed("name", "../../etc"), "must be a plain name"),
    *[(f"name-injection-{i}", changed("name", v), "must be a plain name")
      for i, v in enumerate(INJECTIONS)],
    *[(f"env-key-injection-{i}", changed("launch.env", {v: "1"}), "launch.env: ")
      for i, v in enumerate(INJECTIONS)],
    ("env-key-space", changed("launch.env", {"A B": "1"}), "not an environment variable name"),
    # '$' of the name's pattern matched before a final line break: "export NCCL_DEBUG" then a
    # line "=INFO" that bash ran as a command (exit 127), in every trial and in tune best's script
    ("env-key-line-break", changed("launch.env", {"NCCL_DEBUG\n": "INFO"}),
     "launch.env: 'NCCL_DEBUG\\n' is not an environment variable name"),
    ("env-value-nul", changed("launch.env", {"A": "x\0y"}), "launch.env.A: must not contain"),
    # Linux's execve takes no one string over 128 KiB: every trial was a launch_error "exited
    # with code 126", naming nothing, until three in a row stopped the study
    ("env-value-over-exec-limit", changed("launch.env", {"BIG": "x" * 140_000}),
     "launch.env.BIG: 140,005 bytes as BIG=value, more than the 131,072 one"),
    ("extra-arg-over-exec-limit", changed("launch.extra_args", ["--x", "y" * 131_072]),
     "launch.extra_args[1]: 131,073 bytes, more than the 131,072 one"),
    # the master address's stand-in in scripts written before the nodes are known: replaced
    # there, so tune best's script ran '--data-path /d/"${MASTER_ADDR}"', a Slurm trial the address
    ("master-placeholder", changed("launch.extra_args", ["--data-path", "/d/@TUNER_MASTER_ADDR@"]),
     "launch.extra_args[1]: holds @TUNER_MASTER_ADDR@, which stands for the master address"),
    ("env-unset-variable", changed("launch.python", "${TUNER_HOSTILE_UNSET}/python"),
     "environment variable TUNER_HOSTILE_UNSET is not set"),
    ("template-escape", changed("launch.template", "../../../etc/passwd"), "launch.template"),
    ("template-absolute", changed("launch.template", "/etc/passwd"), "launch.template"),
    ("template-injection", changed("launch.template", INJECTIONS[1]), "launch.template"),
    ("num-nodes-with-ssh", changed("cluster", {"gpu": "h100-sxm-80gb", "gpus_per_node": 2,
     "num_nodes": 2, "executor": "ssh"}), "cluster.num_nodes"),
    ("hostfile-not-utf8", hostfile_case(b"n1\n\xc3\x28\n", "hosts"), "cluster.hostfile"),
    ("hostfile-is-a-folder", hostfile_case(None, "."), "cluster.hostfile: cannot read"),
    ("hostfile-unknown-user", hostfile_case(None, "~no-such-user-xyz/h"), "no such user"),
    ("hostfile-name-too-long", hostfile_case(None, "h" * 5000),
     "cluster.hostfile: cannot read hostfile"),  # exists() itself raised: exit 1 before
    ("preset-a-list", changed("model", {"preset": ["llama2-7b"]}), "model.preset: unknown preset"),
    *[(f"hostfile-injection-{i}", hostfile_case(None, v), "cluster.hostfile: cannot read")
      for i, v in enumerate(INJECTIONS)],
    *[(f"host-injection-{i}", changed("cluster.nodes", [v]), "cluster.nodes[0]: ")
      for i, v in enumerate(INJECTIONS)],
    ("hostfile-host-injection", hostfile_case(b"n1\n`touch${IFS}PWNED`\n", "hosts"),
     "is not a host name"),
    # named cluster.nodes[0] before, a field the study does not have: now the hostfile's line
    ("hostfile-host-nul", hostfile_case(b"n1\0\n", "hosts"),
     "/hosts:1: 'n1\\x00' is not a host name"),
    ("hostfile-utf8-bom", hostfile_case(b"\xef\xbb\xbfn1\n", "hosts"),
     "/hosts:1: '\\ufeffn1' is not a host name"),
    ("hostfile-dash-host", hostfile_case(b"n1\n-oProxyCommand=x\n", "hosts"),
     "/hosts:2: '-oProxyCommand=x' is not a host name"),
    # a list's "in" per line: minutes of CPU before this line was reached
    ("hostfile-100k-hosts-one-twice", hostfile_case(b"".join(b"n%d\n" % i for i in
     range(100_000)) + b"n7\n", "hosts"), "hosts:100001: host 'n7' is listed twice"),
    ("unknown-key", changed("space.tpp", [1]), "space.tpp: unknown key 'tpp'"),
    ("axis-value-twice", changed("space.tp", [1, 1]), "space.tp[1]: 1 is listed twice"),
    ("axis-value-huge", changed("space.micro_batch_size", [10**30]), "space.micro_batch_size[0]"),
    ("space-explodes", changed("space", {"tp": list(range(1, 120)), "pp": list(range(1, 120)),
     "micro_batch_size": list(range(1, 120))}), "combinations, more than 1,000,000"),
]  # fmt: skip
NO_VIABLE = changed("cluster.gpu_memory_gib", 0.001)
# Hostile but valid: the values are data for the launch layer, which quotes them; loading,
# ranking and --dry-run run nothing.
HOSTILE_VALID = changed(
    "launch",
    {
        "template": "megatron_gpt", "python": INJECTIONS[1], "megatron_path": INJECTIONS[0],
        "env": {"X": INJECTIONS[1], "Y": INJECTIONS[2]}, "extra_args": list(INJECTIONS),
        "workdir": INJECTIONS[3],
    },
)  # fmt: skip


def _write(root: Path, study: Study) -> Path:
    path = root / "study.yaml"
    text = study(root) if callable(study) else study
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _assert_one_line(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("tune: error: ") and words in lines[0], lines[0][:500]


def _assert_nothing_ran(root: Path) -> None:
    assert not [p for p in root.rglob("*PWNED*") if p.name == "PWNED"]
    assert not (REPO / "PWNED").exists()


def test_enough_hostile_cases() -> None:
    assert len(BAD_STUDIES) >= 30 and len(LOGS) >= 10


@pytest.mark.parametrize(("study", "words"), [c[1:] for c in BAD_STUDIES],
                         ids=[c[0] for c in BAD_STUDIES])  # fmt: skip
def test_malformed_study_is_one_line_and_exit_2(tmp_path: Path, study: Study, words: str) -> None:
    path = _write(tmp_path, study)
    for command in (["space", "--study", str(path)], ["run", "--study", str(path), "--dry-run"]):
        proc = tune(*command, cwd=tmp_path)
        _assert_one_line(proc, words)
        if not words.startswith("space") and "combinations" not in words:
            assert str(path) in proc.stderr  # load errors name the file
    _assert_nothing_ran(tmp_path)


def test_no_viable_space_is_refused_before_any_storage(tmp_path: Path) -> None:
    path = _write(tmp_path, NO_VIABLE)
    space = tune("space", "--study", str(path), "--json", cwd=tmp_path)
    counts = json.loads(space.stdout)
    assert space.returncode == 0 and counts["viable"] == 0  # `tune space` just reports
    for extra in (["--dry-run"], ["--results", str(tmp_path / "results")]):
        proc = tune("run", "--study", str(path), *extra, cwd=tmp_path)
        _assert_one_line(proc, "no viable config in the search space of hostile")
        assert f"{counts['total']} total" in proc.stderr
        assert f"{counts['predicted_oom']} predicted OOM" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_hostile_values_are_data_never_run(tmp_path: Path) -> None:
    path = _write(tmp_path, HOSTILE_VALID)
    for command in (["space", "--study", str(path)], ["run", "--study", str(path), "--dry-run"]):
        proc = tune(*command, cwd=tmp_path)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for name in INJECTIONS:  # as a study name or path on the command line
        proc = tune("space", "--study", f"{name}.yaml", cwd=tmp_path)
        _assert_one_line(proc, "does not exist")
    _assert_nothing_ran(tmp_path)


# ----------------------------------------------------------------------------- logs

ITERATION = (
    " iteration {i:8d}/     100 | elapsed time per iteration (ms): 1000.0 | lm loss: {loss} |"
    " loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"


_SEE_MEMORY = ("[2022-12-08 16:39:23,472] [INFO] [utils.py:828:see_memory_usage] MA {0} GB  "
               "Max_MA {1} GB  CA 1.0 GB  Max_CA 1 GB\n")  # fmt: skip


def _run_lines(n: int, loss: str = "2.0E+00") -> str:
    return "\n".join(ITERATION.format(i=i, loss=loss) for i in range(1, n + 1)) + "\n"


def _big_log(path: Path) -> None:
    """50 MB: noise lines with an iteration line every ten, then an OOM."""
    noise = "gpu001:1234:1290 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via P2P/IPC/read\n"
    block = noise * 9
    with path.open("w") as f:
        i = 0
        while f.tell() < 50 << 20:
            i += 1
            f.write(block + ITERATION.format(i=i, loss="2.0E+00") + "\n")
        f.write(OOM + "\n")


# (id, how to write the log, expected outcome or None for "any classification")
LOGS: list[tuple[str, Callable[[Path], None], Outcome | None]] = [
    ("2mb-single-line", lambda p: p.write_text("x" * (2 << 20)), Outcome.NO_METRICS),
    ("2mb-line-no-spaces-error", lambda p: p.write_text("a" * (2 << 20) + ": error: x"), None),
    ("50mb-file", _big_log, Outcome.OOM),
    ("binary-garbage", lambda p: p.write_bytes(os.urandom(1 << 20)), None),
    ("nul-bytes", lambda p: p.write_bytes(b"\0" * (1 << 20)), Outcome.NO_METRICS),
    ("latin1-oom", lambda p: p.write_bytes(b"caf\xe9 \xff\n" + OOM.encode() + b"\n"), Outcome.OOM),
    ("carriage-returns-only", lambda p: p.write_text("progress 50%\r" * 100_000), None),
    ("nan-loss", lambda p: p.write_text(_run_lines(5, "NAN")), Outcome.DIVERGED),
    ("garbage-numbers", lambda p: p.write_text(_run_lines(5, "1e99999") + "iteration 1/ |||"),
     None),
    ("pg-tags-no-close", lambda p: p.write_text("[PG " * 500_000), None),
    ("argparse-repeated", lambda p: p.write_text("prog: error: " * 200_000 + "\n"), None),
    ("glued-iterations", lambda p: p.write_text(_run_lines(3).replace("\n", "") * 5_000), None),
    ("escape-spam", lambda p: p.write_text("\x1b[31m\x1b[0m^[c" * 300_000), None),
    ("empty", lambda p: p.write_text(""), Outcome.NO_METRICS),
    ("injection-in-name", lambda p: p.write_text(_run_lines(3)), Outcome.OK),
    # each a traceback before (int() of over 4,300 digits, float(".")), or a peak of Infinity
    ("iteration-5000-digits", lambda p: p.write_text(ITERATION.format(i=1, loss="2.0").replace(
     " 1/", f" {'9' * 5000}/") + "\n" + _run_lines(3)), Outcome.OK),
    ("memory-report-5000-digits", lambda p: p.write_text(_run_lines(3) + f"[Rank 0] (after "
     f"{'9' * 5000} iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 |\n"),
     Outcome.OK),
    ("see-memory-dots", lambda p: p.write_text(_run_lines(3) + _SEE_MEMORY.format(".", "..")),
     Outcome.OK),
    ("see-memory-400-digits", lambda p: p.write_text(_run_lines(3) + _SEE_MEMORY.format(
     "1.0", "1" * 400)), Outcome.OK),
    ("theoretical-memory-dot", lambda p: p.write_text("Theoretical memory footprints: weight "
     "and optimizer=. MB\n" + _run_lines(3)), Outcome.OK),
    ("bridge-utilization-dot", lambda p: p.write_text("Step Time : 1.5s GPU utilization: .\n"
     + _run_lines(3)), Outcome.OK),
]  # fmt: skip


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON (Python's json module writes it for a float)")


@pytest.mark.parametrize(("write", "expected"), [c[1:] for c in LOGS], ids=[c[0] for c in LOGS])
def test_malformed_log_is_classified(
    tmp_path: Path, write: Callable[[Path], None], expected: Outcome | None
) -> None:
    path = tmp_path / f"{INJECTIONS[1]} node-0.log"
    write(path)
    proc = tune("parse-log", str(path), "--json", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (result,) = json.loads(proc.stdout, parse_constant=_no_constant)["logs"]  # one per file
    assert result["file"] == str(path)
    outcome = Outcome(result["outcome"])
    assert expected is None or outcome is expected, result
    _assert_nothing_ran(tmp_path)


def test_unreadable_logs_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "folder.log").mkdir()
    for name in ("folder.log", "missing.log"):
        proc = tune("parse-log", str(tmp_path / name), cwd=tmp_path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and "cannot read log" in lines[0]


# ------------------------------------------------- the cluster's saved profile and calibration


def _profile_data() -> dict[str, Any]:
    """A valid saved profile of BASE's cluster, as plain data."""
    spec = study_from_mapping(copy.deepcopy(BASE))
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    profile = a_profile(cluster=spec.cluster_name, gpu=spec.cluster.gpu_name, created=now)
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(profile.to_dict()))
    return data


def _calibration_data() -> dict[str, Any]:
    """A valid saved calibration of BASE's cluster (two measured trials), as plain data: two
    rows (their predictions differ; the same config measured again under the same prediction
    would be one row with its repeat)."""
    config = dataclasses.asdict(ParallelConfig(tp=2, global_batch_size=8))
    observations = tuple(
        Observation(study="hostile", fingerprint="f" * 16, trial=k, config=config,
                    outcome="ok", predicted_step_s=1.0 + k, measured_step_s=1.2,
                    predicted_gib=10.0, measured_gib=11.0)
        for k in range(2)
    )  # fmt: skip
    calibration = Calibration(cluster=study_from_mapping(copy.deepcopy(BASE)).cluster_name,
                              observations=observations)  # fmt: skip
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(calibration.to_dict()))
    return data


def _edited(make: Callable[[], dict[str, Any]], edit: Callable[[dict[str, Any]], object]) -> bytes:
    data = make()
    edit(data)
    return yaml.safe_dump(data).encode()


def _nan(node: dict[str, Any], key: str) -> None:
    node[key] = float("nan")


ALIAS_BOMB = ("{" + ", ".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]"
                              for i in range(9)) + "}").encode()  # fmt: skip
"""A flow mapping of nine levels of nine aliases of the level below: 9**8 leaves once walked."""

# (id, "profile" or "calibration", the file's bytes or a function making it, words of the line).
# Each was a traceback (or, for a FIFO, a hang) before, or a NaN the models took as a figure.
SavedFile = bytes | Callable[[Path], None]
BAD_CLUSTER_FILES: list[tuple[str, str, SavedFile, str]] = [
    ("profile-not-utf8", "profile", b"cluster: caf\xe9\n", "not UTF-8 text (byte 0xe9"),
    ("profile-deep-nesting", "profile", b"x: " + b"[" * 3000 + b"]" * 3000, "not YAML"),
    ("profile-a-folder", "profile", lambda p: p.mkdir(), "cannot read the cluster profile"),
    ("profile-a-fifo", "profile", os.mkfifo, "cluster profile: not a regular file"),
    ("profile-nan-tflops", "profile", _edited(_profile_data, lambda d: _nan(d["gemm"][0],
     "tflops")), "gemm[0].tflops is not a number above zero: nan"),
    ("profile-negative-time", "profile", _edited(_profile_data, lambda d: d["stream"].update(
     median_s=-1.0)), "stream.median_s is not a number above zero: -1.0"),
    ("profile-inf-hosts", "profile", _edited(_profile_data, lambda d: d.update(
     hosts=float("inf"))), "hosts is not int: inf"),
    ("profile-huge-int-figure", "profile", _edited(_profile_data, lambda d: d["gemm"][0].update(
     tflops=10**400)), "gemm[0].tflops is not a number above zero"),
    ("profile-gemm-of-size-zero", "profile", _edited(_profile_data, lambda d: d["gemm"][0].update(
     m=0)), "gemm[0].m is not int: 0"),  # "math domain error": the log of each size
    ("profile-figure-true", "profile", _edited(_profile_data, lambda d: d["gemm"][0].update(
     tflops=True)), "gemm[0].tflops is not a number above zero: True"),  # was 1.0 TFLOP/s
    ("profile-zero-tflops", "profile", _edited(_profile_data, lambda d: d["gemm"][0].update(
     tflops=0)), "gemm[0].tflops is not a number above zero: 0"),  # left out without a word
    ("profile-zero-median", "profile", _edited(_profile_data, lambda d: d["collectives"][0].update(
     median_s=0.0)), "collectives[0].median_s is not a number above zero: 0.0"),  # latency 0
    ("profile-of-another-cluster", "profile", _edited(_profile_data, lambda d: d.update(
     cluster="other")), "foreign profile: its cluster is 'other'"),
    ("profile-created-garbage", "profile", _edited(_profile_data, lambda d: d.update(
     created="yesterday")), "created is not an ISO 8601 time with its zone: 'yesterday'"),
    ("profile-created-no-zone", "profile", _edited(_profile_data, lambda d: d.update(
     created="2026-01-01T00:00:00")), "created is not an ISO 8601 time with its zone"),
    # cut short: "not YAML: while parsing a flow node", the context alone, no problem, no line
    ("profile-cut-short", "profile", b"gemm: [", "not YAML: expected the node content, but "
     "found '<stream end>' at line 1"),
    ("calibration-cut-short", "calibration", b"observations: [",
     "not YAML: did not find expected node content at line 2"),
    ("calibration-not-utf8", "calibration", b"cluster: \xff\n", "not UTF-8 text (byte 0xff"),
    ("calibration-deep-nesting", "calibration", b"x: " + b"[" * 3000, "not YAML"),
    ("calibration-a-fifo", "calibration", os.mkfifo, "calibration file: not a regular file"),
    ("calibration-a-folder", "calibration", lambda p: p.mkdir(),
     "cannot read the calibration file: Is a directory"),  # exit 1 before
    ("calibration-observations-a-number", "calibration", b"cluster: c\nobservations: 5\n",
     "not a calibration file (expected a mapping with a list of observations)"),
    ("calibration-nan-step", "calibration", _edited(_calibration_data, lambda d: _nan(
     d["observations"][0], "measured_step_s")), "observations[0].measured_step_s: must be a"),
    ("calibration-negative-step", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"][1].update(predicted_step_s=-1.0)), "observations[1].predicted_step_s"),
    ("calibration-step-a-string", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"][0].update(measured_gib="lots")), "measured_gib: expected a number"),
    ("calibration-trial-a-list", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"][0].update(trial=[1])), "observations[0].trial: expected an integer"),
    ("calibration-tp-zero", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"][0]["config"].update(tp=0)), "observations[0].config.tp: must be > 0"),
    ("calibration-unknown-knob", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"][0]["config"].update(tpp=2)), "config.tpp: unknown key"),
    ("calibration-bad-split", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"][0]["config"].update(pipeline_split="zz")), "config.pipeline_split: 'zz'"),
    ("calibration-observation-a-number", "calibration", _edited(_calibration_data, lambda d: d[
     "observations"].append(7)), "observations[2]: expected a mapping"),
    # a hang and a GB: `tune profile --show --json` dumped the profile's tool, the calibration
    # took str() of its cluster (the study file refuses aliases; these files were read with them)
    ("profile-alias-bomb", "profile", _edited(_profile_data, lambda d: d.update(tool="BOMB"))
     .replace(b"BOMB", ALIAS_BOMB), "not YAML: aliases (*name) are not allowed"),
    ("calibration-alias-bomb", "calibration", _edited(_calibration_data, lambda d: d.update(
     cluster="BOMB")).replace(b"BOMB", ALIAS_BOMB), "not YAML: aliases (*name) are not allowed"),
]  # fmt: skip


@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize(("kind", "content", "words"), [c[1:] for c in BAD_CLUSTER_FILES],
                         ids=[c[0] for c in BAD_CLUSTER_FILES])  # fmt: skip
def test_a_bad_saved_cluster_file_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    kind: str, content: SavedFile, words: str,
) -> None:  # fmt: skip
    """What ``tune profile`` and the calibration saved under <results>/clusters/, damaged:
    every command that reads it says so in one line naming the file and the field, exit 2."""
    study = _write(tmp_path, base_text())
    layout = ClusterLayout((tmp_path / "results").resolve(),
                           study_from_mapping(copy.deepcopy(BASE)).cluster_name)  # fmt: skip
    layout.profile_yaml.parent.mkdir(parents=True)
    path = layout.profile_yaml if kind == "profile" else layout.calibration_yaml
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        content(path)
    monkeypatch.chdir(tmp_path)
    for command in ("estimate", "space"):
        assert main([command, "--study", str(study)]) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
        assert lines[0].startswith(f"tune: error: {path}: ") and words in lines[0], lines[0]


def test_the_valid_saved_cluster_files_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The base of the cases above loads: each case fails for its own damage only."""
    study = _write(tmp_path, base_text())
    layout = ClusterLayout((tmp_path / "results").resolve(),
                           study_from_mapping(copy.deepcopy(BASE)).cluster_name)  # fmt: skip
    layout.profile_yaml.parent.mkdir(parents=True)
    layout.profile_yaml.write_text(yaml.safe_dump(_profile_data()))
    layout.calibration_yaml.write_text(yaml.safe_dump(_calibration_data()))
    monkeypatch.chdir(tmp_path)
    assert main(["estimate", "--study", str(study), "--set", "tp=2"]) == 0
    assert "2 saved trials" in capsys.readouterr().out


# --------------------------------------------------- a user's own launch template, broken

_HEAD = "{#- framework: megatron -#}\n"
# (id, the template's bytes, words of the one line). Through `tune best --emit script` the first
# two were exit 1 before (a broken template is the user's input, not the machine), the others
# a traceback.
BAD_TEMPLATES: list[tuple[str, bytes, str]] = [
    ("syntax-error", (_HEAD + "run {{ cfg.tp\n").encode(), "mine.sh.j2:2: unexpected end"),
    ("undefined-name", (_HEAD + "run {{ nowhere }}\n").encode(), "'nowhere' is undefined"),
    ("division-by-zero", (_HEAD + "run {{ cfg.tp / 0 }}\n").encode(),
     "template 'mine': ZeroDivisionError: division by zero"),
    ("int-plus-str", (_HEAD + "run {{ cfg.tp + 'x' }}\n").encode(), "'mine': TypeError:"),
    ("includes-itself", (_HEAD + "{% include 'mine.sh.j2' %}\n").encode(),
     "template 'mine': recursion too deep"),
    ("folded-huge-int", (_HEAD + "{{ (10 ** 100000) | string }}\n").encode(),
     "mine.sh.j2: Exceeds the limit"),
    ("latin-1", _HEAD.encode() + b"echo caf\xe9\n", "mine.sh.j2 is not UTF-8 text (byte 0xe9"),
    ("binary", bytes(range(256)), "is not UTF-8 text (byte 0x80 at offset 128)"),
]  # fmt: skip


@pytest.fixture
def finished_study(tmp_path: Path) -> Path:
    """BASE with its own template ``mine``, one measured trial in its storage: what
    ``tune best --emit script`` renders the template for."""
    import optuna

    from tuner.layout import ResultsLayout
    from tuner.space.trials import distributions
    from tuner.study.storage import open_storage

    data = copy.deepcopy(BASE)
    data["launch"]["template"] = "mine"
    study = _write(tmp_path, yaml.safe_dump(data))
    spec = study_from_mapping(data)
    layout = ResultsLayout(tmp_path / "results", spec.name)
    optuna_study = optuna.create_study(study_name=spec.name, storage=open_storage(None, layout))
    config = ParallelConfig(tp=2, micro_batch_size=1, global_batch_size=8)
    trial = optuna_study.ask(distributions(spec))
    trial.set_user_attr("config", dataclasses.asdict(config))
    for key, value in (("key", config.key()), ("outcome", "ok"), ("step_time_s", 1.0)):
        trial.set_user_attr(key, value)
    optuna_study.tell(trial, 1.0)
    (tmp_path / "launch_templates").mkdir()
    return study


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize(("content", "words"), [c[1:] for c in BAD_TEMPLATES],
                         ids=[c[0] for c in BAD_TEMPLATES])  # fmt: skip
def test_a_broken_own_template_is_one_line_and_exit_2(
    finished_study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    content: bytes, words: str,
) -> None:  # fmt: skip
    root = finished_study.parent
    (root / "launch_templates" / "mine.sh.j2").write_bytes(content)
    monkeypatch.chdir(root)
    assert main(["best", "--study", str(finished_study), "--emit", "script"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith("tune: error: template ") and words in lines[0], lines[0]


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_the_own_template_of_the_broken_cases_renders(
    finished_study: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (finished_study.parent / "launch_templates" / "mine.sh.j2").write_text(
        _HEAD + "run tp={{ cfg.tp }}\n"
    )
    monkeypatch.chdir(finished_study.parent)
    assert main(["best", "--study", str(finished_study), "--emit", "script"]) == 0
    assert "run tp=2" in capsys.readouterr().out


# ----------------------------------------------------------------------------- issue 31


def test_parse_log_reads_only_regular_files(tmp_path: Path) -> None:
    """A FIFO would block the reader forever and a device never ends: both are one line."""
    fifo = tmp_path / "f.log"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        proc = tune("parse-log", path, "--json", cwd=tmp_path)  # the hang guard catches a block
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and path in lines[0] and "not a regular file" in lines[0], lines


def test_parse_log_warmup_must_leave_a_step(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text(_run_lines(10))
    ok = tune("parse-log", str(log), "--warmup", "9", "--json", cwd=tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["logs"][0]["outcome"] == "ok"
    cases = (("10", "has 10 step record(s); drop at most 9"), ("1000000", "--warmup 1000000"),
             ("-5", "--warmup: must be >= 0"))  # fmt: skip
    for warmup, words in cases:
        proc = tune("parse-log", str(log), "--warmup", warmup, "--json", cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines


def _template(root: Path, name: str, text: str) -> None:
    (root / "launch_templates").mkdir(exist_ok=True)
    (root / "launch_templates" / f"{name}.sh.j2").write_text(text)


def _own_template(framework: str) -> Callable[[Path], str]:
    def make(root: Path) -> str:
        _template(root, "mine", f"{{#- framework: {framework} -#}}\nrun {{{{ cfg.tp }}}}\n")
        return changed("launch.template", "mine")

    return make


def _two(path: str, value: Any, path2: str, value2: Any) -> str:
    data = yaml.safe_load(changed(path, value))
    *parents, last = path2.split(".")
    node = data
    for p in parents:
        node = node[p]
    node[last] = value2
    return yaml.safe_dump(data)


# Accepted before, could never run: each is refused at load, naming the field.
CANNOT_RUN: list[tuple[str, Study, str]] = [
    ("hostfile-slots-abc", hostfile_case(b"n1 slots=abc\n", "hosts"),
     "cluster.hostfile: " ),
    ("hostfile-slots-zero", hostfile_case(b"n1 slots=0\n", "hosts"), "slots must be"),
    ("nodes-empty", changed("cluster.nodes", []), "cluster.nodes: the list is empty"),
    ("megatron-with-deepspeed-template", changed("launch.template", "deepspeed_gpt"),
     "launch.template: 'deepspeed_gpt' is a template for deepspeed"),
    ("deepspeed-with-megatron-template", changed("framework", "deepspeed"),
     "launch.template: 'megatron_gpt' is a template for megatron ("),
    ("megatron-deepspeed-with-megatron-template", changed("framework", "megatron-deepspeed"),
     "this study's framework is megatron-deepspeed"),
    ("own-template-for-deepspeed", _own_template("deepspeed"), "'mine' is a template for"),
    ("own-template-unknown-framework", _own_template("jax"), "declares framework 'jax'"),
    ("split-first-negative", _two("space.pp", [2], "space.pipeline_split", ["first=-1"]),
     "space.pipeline_split[0]: 'first=-1': first must be >= 0"),
]  # fmt: skip


@pytest.mark.parametrize(("study", "words"), [c[1:] for c in CANNOT_RUN],
                         ids=[c[0] for c in CANNOT_RUN])  # fmt: skip
def test_accepted_but_cannot_run_is_refused_at_load(
    tmp_path: Path, study: Study, words: str
) -> None:
    path = _write(tmp_path, study)
    for command in (["space", "--study", str(path)], ["estimate", "--study", str(path)],
                    ["run", "--study", str(path), "--dry-run"]):  # fmt: skip
        proc = tune(*command, cwd=tmp_path)
        _assert_one_line(proc, words)
        assert str(path) in proc.stderr


def test_own_template_for_its_framework_is_accepted(tmp_path: Path) -> None:
    for framework in ("megatron", "megatron, megatron-deepspeed"):
        path = _write(tmp_path, _own_template(framework))
        proc = tune("run", "--study", str(path), "--dry-run", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_template_that_cannot_render_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A broken own template turned every trial of the budget into a launch_error (exit 1);
    ``tune run`` renders the first config's launch before the storage or any node is touched."""
    _template(tmp_path, "mine", "{#- framework: megatron -#}\nrun {{ no_such_name.x }}\n")
    path = _write(tmp_path, changed("launch.template", "mine"))
    proc = tune("run", "--study", str(path), "--results", str(tmp_path / "results"), cwd=tmp_path)
    _assert_one_line(proc, "template 'mine': 'no_such_name' is undefined (rendering the launch")
    assert "nothing was launched" in proc.stderr
    assert not (tmp_path / "results").exists()  # no storage, no trial folder


def test_out_of_range_command_line_values_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, base_text())
    cases = (
        (["estimate", "--study", str(path), "--set", f"tp={2**63}"], "--set tp: must be at most"),
        (["estimate", "--study", str(path), "--set", "tp=0"], "--set tp: must be > 0"),
        (["estimate", "--study", str(path), "--set", "zero_stage=7"], "--set zero_stage"),
        (["report", "--study", str(path), "--train-tokens", "inf"],
         "--train-tokens: must be a finite number > 0, got inf"),
        (["report", "--study", str(path), "--train-tokens", "nan"],
         "--train-tokens: must be a finite number > 0, got nan"),
        # --n-trials -3 printed "budget of -3 launches"; 0 silently meant the study's count
        (["run", "--study", str(path), "--dry-run", "--n-trials", "-3"], "--n-trials: must be"),
        (["run", "--study", str(path), "--dry-run", "--n-trials", "0"], "--n-trials: must be"),
        (["space", "--study", str(path), "--top", "-5"], "--top: must be >= 0"),
        (["best", "--study", str(path), "--train-iters", "0"], "--train-iters: must be"),
        # --rerun is checked where it is parsed, before the study is read
        (["run", "--study", str(path), "--rerun", "ok"], "--rerun: 'ok' is not one of"),
        (["best", "--study", str(path), "--trial", "x"], "--trial: expected a whole number"),
        # a ValueError traceback from the list's int() before
        (["profile", "--study", str(path), "--message-bytes", "4096,abc"], "--message-bytes"),
        (["profile", "--study", str(path), "--repeats", "0"], "--repeats: must be 1 to 1,000"),
        # the last --set silently won
        (["estimate", "--study", str(path), "--set", "tp=2", "--set", "tp=4"], "given twice"),
        (["estimate", "--study", str(path), "--set", "mbs=1", "--set", "micro_batch_size=2"],
         "--set micro_batch_size: given twice (first as --set mbs)"),
        # argparse's own errors: one line too (its usage block used to come first)
        (["best", "--study", str(path), "--format", "nope"], "invalid choice: 'nope'"),
        (["space"], "tune space needs --study NAME: one of demo, "),
        # "the following arguments are required: what", under a usage line of {gpus,models}
        (["catalog"], "tune catalog needs one of: gpus, models (see tune catalog --help)"),
        ([], "tune needs a command, one of: estimate, space, run, "),
        # an option the command does not take pointed at `tune --help`, which does not list it
        (["leaderboard", "--study", str(path), "--json"],
         "unrecognized arguments: --json (see tune leaderboard --help)"),
        (["estimate", "--study", str(path), "--tp", "2"], "--tp 2 (see tune estimate --help)"),
    )  # fmt: skip
    for command, words in cases:
        _assert_one_line(tune(*command, cwd=tmp_path), words)


def test_a_study_name_the_system_refuses_is_one_line(tmp_path: Path) -> None:
    """A name past the file system's limit (ENAMETOOLONG) made is_file() raise: exit 1."""
    for name in ("s" * 300, f"{'s' * 300}.yaml"):
        _assert_one_line(tune("space", "--study", name, cwd=tmp_path), "File name too long")


def test_a_directory_given_as_study_is_named_a_directory(tmp_path: Path) -> None:
    """A folder as ``--study`` (``.``, ``studies``, ``x.yaml/``) was "does not exist" or "unknown
    study": it exists, and the user looked for the mistake in the name."""
    (tmp_path / "studies").mkdir()
    (tmp_path / "d.yaml").mkdir()
    for name in (".", "studies", "d.yaml", "d.yaml/", str(tmp_path)):
        _assert_one_line(tune("space", "--study", name, cwd=tmp_path), "is a directory")
    _assert_one_line(tune("space", "--study", "no/x.yaml", cwd=tmp_path), "does not exist")


def test_another_programs_database_at_the_storage_path_is_one_line(tmp_path: Path) -> None:
    """A valid SQLite file that is not an Optuna study (its own ``studies`` table): opening
    works, reading fails inside Optuna; every reader says so in one line, exit 2."""
    path = _write(tmp_path, base_text())
    name = yaml.safe_load(base_text())["name"]
    (tmp_path / "results" / name).mkdir(parents=True)
    with sqlite3.connect(tmp_path / "results" / name / "study.db") as db:
        db.execute("CREATE TABLE studies (owner TEXT)")
    for command in ("leaderboard", "best", "report"):
        proc = tune(command, "--study", str(path), cwd=tmp_path)
        _assert_one_line(proc, "cannot read the study's storage: no such column")


def _fifo_journal(root: Path) -> str:
    os.mkfifo(root / "study.log")
    return f"journal:{root / 'study.log'}"


# (id, the --storage value made in the folder, words of the one line): a hang (the journal's
# reader blocked on the FIFO), three lines of SQLAlchemy's warning, exit 1 before.
BAD_STORAGE: list[tuple[str, Callable[[Path], str], str]] = [
    ("journal-a-fifo", _fifo_journal, "study.log': not a regular file"),
    ("sqlite-query-the-driver-ignores", lambda root: f"sqlite:///{root / 'x.db'}?mode=ro",
     "Query string argument(s) 'mode' are not accepted"),
    ("file-name-too-long", lambda root: "sqlite:///" + "a" * 5000, "File name too long"),
    # a bare postgresql:// said "No module named 'psycopg'" (SQLAlchemy 2.1's default driver)
    # with the psycopg2 of the postgres extra installed, and printed the password
    ("postgresql-bare-url-server-down", lambda root: "postgresql://u:secret@127.0.0.1:1/db",
     "'postgresql+psycopg2://u:***@127.0.0.1:1/db': connection to server"),
]  # fmt: skip


def test_a_bare_postgresql_url_takes_the_installed_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare URL keeps SQLAlchemy's own default driver where it is installed (psycopg 3 from
    SQLAlchemy 2.1, psycopg2 before) and names the installed one where it is not."""
    import importlib.util
    import types

    import sqlalchemy as sa

    from tuner.study import url as where

    url = "postgresql://u@db/tuner"
    cases = (
        ("psycopg", ("psycopg", "psycopg2"), url),
        ("psycopg", ("psycopg2",), "postgresql+psycopg2://u@db/tuner"),
        ("psycopg2", ("psycopg", "psycopg2"), url),  # SQLAlchemy 2.0's default
        ("psycopg2", ("psycopg",), "postgresql+psycopg://u@db/tuner"),
    )
    for default, installed, expected in cases:
        dialect = types.SimpleNamespace(driver=default)
        monkeypatch.setattr(sa.dialects.registry, "load", lambda name, d=dialect: d)
        monkeypatch.setattr(
            importlib.util,
            "find_spec",
            lambda name, found=installed: object() if name in found else None,
        )
        assert where.postgres_driver(url) == expected, (default, installed)
        assert (
            where.postgres_driver("postgresql+psycopg://u@db/t") == "postgresql+psycopg://u@db/t"
        )
    monkeypatch.undo()
    assert where.postgres_driver(url) in (url, "postgresql+psycopg2://u@db/tuner")  # this one
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(StudyError, match=r"no PostgreSQL driver is installed \(pip install"):
        where.postgres_driver(url)


@pytest.mark.timeout(HANG_GUARD_S)
@pytest.mark.parametrize(("make", "words"), [c[1:] for c in BAD_STORAGE],
                         ids=[c[0] for c in BAD_STORAGE])  # fmt: skip
def test_a_bad_storage_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], str], words: str
) -> None:
    study, url = _write(tmp_path, base_text()), make(tmp_path)
    for command in ("leaderboard", "best", "report"):
        assert main([command, "--study", str(study), "--storage", url]) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
        assert lines[0].startswith("tune: error: cannot open storage '") and words in lines[0]


# ------------------------------------------------------- issue 31: the storage fails mid-study


def _as_plain_user() -> list[str]:
    """A prefix that runs a command without root's right to write anywhere (so that a folder
    made read-only is read-only to it), or nothing when this is not root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's file-permission override")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def _faulted_study(
    tmp_path: Path, fault: Callable[[Path], None], *flags: str, prefix: Sequence[str] = ()
) -> tuple[int, str]:
    """Start a real stand-in study (two trials at once), apply ``fault`` to the results folder
    once both run; the exit status and stderr of the worker. Nothing may be left running."""
    data = study_data(tmp_path, SURFACE, n_trials=4, heartbeat_s=2)
    # ~5 s per trial; a file the stand-in reads at every sleep: a resume may run unpaced
    (tmp_path / "time_scale").write_text("1")
    data["launch"]["env"]["TUNER_STANDIN_TIME_SCALE"] = str(tmp_path / "time_scale")
    path = write_study(tmp_path, data)
    results = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "tuner.cli.main", "run", "--study", str(path),
         "--results", str(results), "--quiet", *flags], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + HANG_GUARD_S
    while len(standin_processes(tmp_path)) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "the trials never started"
        time.sleep(0.1)
    fault(results)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert standin_processes(tmp_path) == []
    return proc.returncode, err


def _one_storage_line(code: int, err: str, *words: str) -> str:
    """The README's promise: a failed storage is exit 1 and one line naming cause and file."""
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("tune: error: ") and "Traceback" not in err
    assert all(w in lines[0] for w in words), lines[0]
    print(lines[0])  # with -s: what the user sees
    return lines[0]


@pytest.mark.slow
def test_results_made_read_only_mid_trial_is_one_line_and_resumes_at_once(
    tmp_path: Path,
) -> None:
    """The folder turns read-only under running trials: one line naming a file under it. The
    worker could not give its leases back; the next start (an hour's heartbeat, so waiting them
    out would show as this test's timeout) proves the holder dead and takes them over."""
    prefix = _as_plain_user()
    results = tmp_path / "results"

    def read_only(folder: Path) -> None:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)

    try:
        code, err = _faulted_study(tmp_path, read_only, prefix=prefix)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(results)], check=True)
    line = _one_storage_line(code, err, str(results / "e2e"))
    assert "Permission denied" in line or "read-only" in line, line
    data = yaml.safe_load((tmp_path / "study.yaml").read_text())
    data["search"]["heartbeat_s"] = 3600
    write_study(tmp_path, data)
    (tmp_path / "time_scale").write_text("0.0001")  # the resumed trials need no pace
    again = tune("run", "--study", str(tmp_path / "study.yaml"), "--results", str(results),
                 "--quiet", cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    rows = leaderboard(study_from_mapping(data), include_all=True, results=str(results))
    assert (rows.outcome == "ok").sum() == 4, rows[["trial", "outcome", "reason"]]
    assert standin_processes(tmp_path) == []


@pytest.mark.slow
def test_study_db_deleted_mid_run_says_deleted(tmp_path: Path) -> None:
    code, err = _faulted_study(tmp_path, lambda r: (r / "e2e" / "study.db").unlink())
    _one_storage_line(code, err, f"{tmp_path / 'results' / 'e2e' / 'study.db'} was deleted")


@pytest.mark.slow
def test_study_db_overwritten_mid_run_is_one_line(tmp_path: Path) -> None:
    def overwrite(results: Path) -> None:
        (results / "e2e" / "study.db").write_bytes(b"not a database\n" * 4096)

    code, err = _faulted_study(tmp_path, overwrite)
    _one_storage_line(code, err, str(tmp_path / "results" / "e2e" / "study.db"))


@pytest.mark.slow
def test_full_disk_mid_run_is_one_line_and_details_under_debug(tmp_path: Path) -> None:
    """Quick beats (the heartbeat thread is the first to meet the full disk) used to add a
    misleading "heartbeat failed: ... exceeding max length" per beat."""
    for root, flags in ((tmp_path / "quiet", ()), (tmp_path / "debug", ("--debug",))):
        root.mkdir()
        db_dir, db = root / "db", root / "db" / "study.db"

        def fill(results: Path, db_dir: Path = db_dir) -> None:
            subprocess.run(["dd", "if=/dev/zero", f"of={db_dir / 'filler'}", "bs=64k"],
                           capture_output=True, check=False)  # fmt: skip

        with _mounted(["-t", "tmpfs", "-o", "size=4m", "tmpfs"], db_dir):
            code, err = _faulted_study(root, fill, "--storage", f"sqlite:///{db}", *flags)
        if not flags:
            line = _one_storage_line(code, err, str(db), "full")
            assert "exceeding max length" not in line
        else:  # the details, traceback included, only when asked for
            assert code == 1 and "Traceback" in err and len(err.strip().splitlines()) > 1, err


# ------------------------------------------------------- issue 31: hosts that never answer

# Run inside a network namespace of its own: 10.77.0.0/24 is routed into the loopback link, where
# a packet for an address nobody holds is dropped without a word (no forwarding, no reset), so a
# TCP connect there can only time out; two sockets on 127.0.0.1 listen and are never accepted
# from, so the kernel completes the handshake and nothing is ever said (an SSH client waits for
# the banner). Then the real `tune run`.
_NETNS_SETUP = 'ip link set lo up && ip route add 10.77.0.0/24 dev lo && exec "$@"'

_SILENT_LISTENERS = (
    "import socket, subprocess, sys\n"
    "socks = [socket.create_server(('127.0.0.1', p), backlog=16) for p in (2201, 2202)]\n"
    "sys.exit(subprocess.run(sys.argv[1:]).returncode)\n"
)


def _in_own_netns() -> list[str]:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (iproute2) to make a network namespace")
    prefix = ["unshare", "--net"] + (["--map-root-user"] if os.geteuid() != 0 else [])
    probe = subprocess.run([*prefix, "sh", "-c", _NETNS_SETUP, "sh", "true"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.strip()}")
    return [*prefix, "sh", "-c", _NETNS_SETUP, "sh"]


@pytest.mark.ssh
def test_hosts_that_drop_packets_or_never_speak_time_out_together(tmp_path: Path) -> None:
    """Two hosts that drop every packet (TCP connect timeout) and two that accept and never
    send a banner (SSH banner timeout), checked at once by `tune run`'s preflight: one line per
    node naming why, exit 1, nothing launched. The preflight's duration is printed (-s)."""
    timeout_s = 3
    (tmp_path / "ssh_config").write_text(
        "".join(f"Host silent-{p}\n  HostName 127.0.0.1\n  Port {p}\n" for p in (2201, 2202))
    )
    nodes = ["10.77.0.2", "silent-2201", "10.77.0.3", "silent-2202"]
    data = copy.deepcopy(BASE)
    data["cluster"] = {
        "gpu": "h100-sxm-80gb", "gpus_per_node": 2, "nodes": nodes, "executor": "ssh",
        "ssh": {"config_file": str(tmp_path / "ssh_config"), "connect_timeout_s": timeout_s,
                "known_hosts": str(tmp_path / "known_hosts")},
    }  # fmt: skip
    data["launch"]["megatron_path"] = str(tmp_path)
    path = _write(tmp_path, yaml.safe_dump(data))
    command = [*_in_own_netns(), sys.executable, "-c", _SILENT_LISTENERS, sys.executable, "-m",
               "tuner.cli.main", "run", "--study", str(path), "--results",
               str(tmp_path / "results"), "--quiet"]  # fmt: skip
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S, check=False)  # fmt: skip
    took = time.monotonic() - started
    print(f"preflight of {len(nodes)} unreachable nodes ({timeout_s} s timeout): {took:.1f} s")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == len(nodes), proc.stderr
    by_node = {node: [x for x in lines if x.startswith(f"tune: preflight: {node}: ")]
               for node in nodes}  # fmt: skip
    assert all(len(found) == 1 for found in by_node.values()), lines
    for node in ("10.77.0.2", "10.77.0.3"):
        assert "cannot connect to" in by_node[node][0] and "timed out" in by_node[node][0]
    for node in ("silent-2201", "silent-2202"):
        assert f"no SSH protocol banner within {timeout_s} s" in by_node[node][0]
    assert not (tmp_path / "results").exists()
