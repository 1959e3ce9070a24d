"""One machine named twice in a study's hosts: host names ignore case (RFC 4343), so ``n1`` and
``N1`` were two "nodes" on which two trials' ranks would share the GPUs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.test_hostile_inputs import BASE
from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.launch.pool import NodePool


def _study(tmp_path: Path, **cluster: object) -> str:
    study = copy.deepcopy(BASE)
    study["cluster"] = {k: v for k, v in study["cluster"].items() if k != "nodes"} | cluster
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    return str(path)


@pytest.mark.parametrize(
    ("cluster", "words"),
    [({"nodes": ["gpu-a1", "n2", "GPU-A1"]},
      "cluster.nodes: node 'GPU-A1' is listed twice (first as 'gpu-a1': host names ignore case)"),
     ({"nodes": ["n1", "n1"]}, "cluster.nodes: node 'n1' is listed twice\n"),
     ({"hostfile": "hosts"},
      "hosts:2: host 'Gpu7' is listed twice (first as 'gpu7': host names ignore case)")],
)  # fmt: skip
def test_a_host_named_twice_in_any_case_is_refused(
    cluster: dict[str, object], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hosts").write_text("gpu7 slots=8\nGpu7 slots=8\n")
    assert main(["space", "--study", _study(tmp_path, **cluster)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune: error: ") and err.count("\n") == 1 and words in err, err


def test_the_node_pool_takes_a_host_once_in_any_case() -> None:
    """The pool, given hosts by the API as well as by a study, took ``n7`` and ``N7`` as two."""
    hosts = [f"n{i}" for i in range(10)]
    assert len(NodePool(hosts, 1).hosts) == len(hosts)
    with pytest.raises(ConfigError, match="node 'N7' is listed twice"):
        NodePool([*hosts, "N7"], 1)
