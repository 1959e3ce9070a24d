"""The exported launch script holds the node script once, whatever the number of nodes.

It held one shell function per node: a 16-node export (``sbatch-node.sh``, ``launch.sh``) was
about 1,200 lines, 16 copies of one script differing in ``--node_rank K`` and a comment. The node
scripts are now one function: the rank reads the ``$rank`` the script found, any other word that
differs per node reads a table; a template whose nodes differ in more than whole words (a line
only one node has, a word inside quotes) keeps one function per node. Each case is run by bash
with a stand-in ``torchrun`` that records what it was given.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuner.launch.export_script import MasterSources, launch_script
from tuner.launch.slurm_script import MASTER_PLACEHOLDER

TORCHRUN = """#!{python}
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump(sys.argv[1:], f)
"""


def node_script(k: int, nnodes: int, *, host: bool = False, quoted: bool = False) -> str:
    """A node script as tuner's templates render it: the rank in a comment and after
    ``--node_rank``; optionally a per-node host word, or the rank inside a quoted string."""
    extra = [f"  --host gpu{k + 1:03d}"] if host else []
    echo = [f"echo 'starting node {k} now'"] if quoted else []
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Rendered by tuner for node {k} of {nnodes}: tp=4,pp=8",
        "set -euo pipefail",
        *echo,
        "args=(",
        "  --tensor-model-parallel-size 4",
        *extra,
        "  --lr 'a b'",
        ")",
        "exec torchrun \\",
        f"  --nnodes {nnodes} \\",
        f"  --node_rank {k} \\",
        f"  --master_addr {MASTER_PLACEHOLDER} \\",
        '  pretrain_gpt.py "${args[@]}"',
    ]) + "\n"  # fmt: skip


def export(nnodes: int, **kind: bool) -> str:
    scripts = [node_script(k, nnodes, **kind) for k in range(nnodes)]
    return launch_script(["header"], scripts, MasterSources())


def run(
    text: str, rank: int, tmp_path: Path, extra: dict[str, str] | None = None
) -> tuple[list[str], str]:
    """The argv torchrun got and the script's stdout, for node ``rank`` (``extra``: more
    environment)."""
    import json

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(TORCHRUN.format(python=sys.executable))
    (bin_dir / "torchrun").chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text(text)
    record = tmp_path / "argv.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NODE_RANK": str(rank), "MASTER_ADDR": "10.0.0.7",
           "RECORD": str(record), **(extra or {})}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"tuner: node {rank} of " in done.stderr
    return json.loads(record.read_text()), done.stdout


def test_sixteen_nodes_are_one_function_as_long_as_two(tmp_path: Path) -> None:
    two, sixteen = export(2), export(16)
    assert len(sixteen.splitlines()) == len(two.splitlines()) < 80
    assert sixteen.count("tuner_node() {") == 1 and "tuner_node_1" not in sixteen
    assert "# Rendered by tuner for node $rank of 16" in sixteen
    for rank in (0, 9, 15):
        argv, _ = run(sixteen, rank, tmp_path)
        assert argv[argv.index("--node_rank") + 1] == str(rank)
        assert argv[argv.index("--master_addr") + 1] == "10.0.0.7"
        assert argv[argv.index("--lr") + 1] == "a b" and argv[argv.index("--nnodes") + 1] == "16"


def test_another_word_per_node_reads_a_table(tmp_path: Path) -> None:
    text = export(12, host=True)
    assert text.count("tuner_node() {") == 1
    assert "tuner_node_words_0=(gpu001 gpu002" in text
    for rank in (0, 11):
        argv, _ = run(text, rank, tmp_path)
        assert argv[argv.index("--host") + 1] == f"gpu{rank + 1:03d}"
        assert argv[argv.index("--node_rank") + 1] == str(rank)


@pytest.mark.parametrize("differ", ["quoted", "lines"])
def test_nodes_that_differ_in_more_than_words_keep_a_function_each(
    differ: str, tmp_path: Path
) -> None:
    """A word inside quotes cannot read a variable (``'node $rank'`` prints as written), and a
    line only one node has has no word to put in a table: the export stays one function per
    node, and each node still runs its own."""
    nnodes = 3
    if differ == "quoted":
        scripts = [node_script(k, nnodes, quoted=True) for k in range(nnodes)]
    else:
        scripts = [node_script(k, nnodes) for k in range(nnodes)]
        scripts[0] = scripts[0].replace("set -euo pipefail\n", "set -euo pipefail\necho first\n")
    text = launch_script(["header"], scripts, MasterSources())
    assert "tuner_node() {" not in text and "tuner_node_2() {" in text
    for rank in range(nnodes):
        argv, out = run(text, rank, tmp_path)
        assert argv[argv.index("--node_rank") + 1] == str(rank)
        if differ == "quoted":
            assert out == f"starting node {rank} now\n"
        else:
            assert out == ("first\n" if rank == 0 else "")


def test_the_master_port_is_the_studys_unless_master_port_is_set(tmp_path: Path) -> None:
    """The trials' port may be taken where the full run starts (a run still up, another job):
    ``MASTER_PORT`` overrides it, as it does the address; unset, the study's port; a port
    option at another number (a template's own) is left as rendered."""
    scripts = [
        node_script(k, 2).replace(
            "  pretrain_gpt.py", "  --master_port 29500 \\\n  pretrain_gpt.py --other-port 29500"
        )
        for k in range(2)
    ]
    text = launch_script(["header"], scripts, MasterSources(port=29500))
    for extra, want in (({}, "29500"), ({"MASTER_PORT": "31337"}, "31337")):
        argv, _ = run(text, 1, tmp_path, extra)
        assert argv[argv.index("--master_port") + 1] == want
        assert argv[argv.index("--other-port") + 1] == "29500"
    other = launch_script(["header"], scripts, MasterSources(port=6000))
    argv, _ = run(other, 0, tmp_path, {"MASTER_PORT": "31337"})
    assert argv[argv.index("--master_port") + 1] == "29500"
