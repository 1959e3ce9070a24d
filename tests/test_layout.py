"""ResultsLayout owns every path under results/<study>/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.layout import (
    MAX_NAME_LENGTH,
    ClusterLayout,
    ResultsLayout,
    name_problem,
    study_name_problem,
)


def test_paths(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path / "results", "gpt-70b")
    assert layout.study_dir == tmp_path / "results" / "gpt-70b"
    assert layout.storage_path == layout.study_dir / "study.db"
    assert layout.storage_url.startswith("sqlite:///") and layout.storage_url.endswith("study.db")
    t = layout.trial(7)
    assert t.dir == layout.study_dir / "trials" / "7"
    assert t.launch_script(1).name == "launch-node-1.sh"
    assert t.node_log(0).name == "node-0.log"
    assert t.config_yaml.name == "config.yaml" and t.metrics_json.name == "metrics.json"
    assert t.file("ds_config.json") == t.files_dir / "ds_config.json"
    exports = layout.export(7)
    assert exports.dir == layout.study_dir / "exports" / "trial-7"
    kinds = [exports.script, exports.script_files, exports.sbatch, exports.sbatch_node,
             exports.sbatch_files, exports.args, exports.args_files,
             exports.ds_config]  # fmt: skip
    assert len(set(kinds)) == len(kinds) and {p.parent for p in kinds} == {exports.dir}


def test_trial_numbers_and_rebase(tmp_path: Path) -> None:
    layout = ResultsLayout(tmp_path, "s")
    assert layout.trial_numbers() == []
    for n in (10, 2):
        layout.trial(n).dir.mkdir(parents=True)
    assert layout.trial_numbers() == [2, 10]
    remote = layout.rebase(Path("/scratch/tuner"))
    assert remote.trial(2).dir == Path("/scratch/tuner/s/trials/2")


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden"])
def test_names_must_not_be_paths(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="plain name"):
        ResultsLayout(tmp_path, bad)
    with pytest.raises(ValueError, match="plain name"):
        ResultsLayout(tmp_path, "s").trial(0).file(bad)


def test_negative_numbers_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ResultsLayout(tmp_path, "s").trial(-1)
    with pytest.raises(ValueError):
        ResultsLayout(tmp_path, "s").trial(0).node_log(-1)


@pytest.mark.parametrize("bad", ["..", "a..b", "ünï", "a" * 101, "a b", "a'; touch PWNED; '"])
def test_one_name_rule_for_the_layout_and_the_spec(tmp_path: Path, bad: str) -> None:
    problem = name_problem(bad)
    assert problem is not None and "plain name" in problem
    with pytest.raises(ValueError, match="plain name"):
        ResultsLayout(tmp_path, bad)
    assert name_problem("a" * MAX_NAME_LENGTH) is None and name_problem("gpt-70b_v1.2") is None


def test_no_study_may_take_the_cluster_profiles_directory(tmp_path: Path) -> None:
    clusters = ClusterLayout(tmp_path, "clusters")  # a cluster may be named so: clusters/*.yaml
    assert clusters.dir == tmp_path / "clusters" and name_problem("clusters") is None
    for name in ("clusters", "CLUSTERS"):
        problem = study_name_problem(name)
        assert problem is not None and "reserved" in problem and "\n" not in problem
        with pytest.raises(ValueError, match="study name .* is reserved"):
            ResultsLayout(tmp_path, name)
    assert study_name_problem("clusters-a100") is None
    assert study_name_problem("..") == name_problem("..")  # the one name rule first


def test_a_new_trial_never_writes_into_an_earlier_run_s_folder(tmp_path: Path) -> None:
    """The study's storage made anew (``rm results/X/study.db``) numbers its trials from 0
    again: trial 0's node logs were appended to the earlier trial 0's, and the new trial
    measured both runs' steps. The earlier files are moved aside, whole."""
    layout = ResultsLayout(tmp_path, "s")
    paths, aside = layout.fresh_trial(0)
    assert aside is None and not paths.dir.exists()  # nothing there: nothing moved
    paths.dir.mkdir(parents=True)
    paths, aside = layout.fresh_trial(0)
    assert aside is None and paths.dir.is_dir()  # an empty folder (a launch that failed) stays
    paths.node_log(0).write_text("iteration 1 of the earlier run\n")
    paths, aside = layout.fresh_trial(0)
    assert aside is not None and not paths.dir.exists()
    assert (aside / "node-0.log").read_text() == "iteration 1 of the earlier run\n"
    assert aside.parent == layout.trials_dir and layout.trial_numbers() == []
