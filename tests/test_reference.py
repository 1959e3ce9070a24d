"""The references the docs site shows are generated from the code, and nothing goes undocumented:
every study field has a docstring, every ``tune`` option its help text."""

from __future__ import annotations

import argparse

from tuner._loader import file_fields
from tuner.catalog import gpu_names
from tuner.cli.reference import (
    catalog_reference,
    cli_reference,
    field_bounds,
    missing_field_docs,
    missing_option_help,
    study_fields,
    study_reference,
)
from tuner.spec.cluster import ClusterSpec
from tuner.spec.file import model_preset_names
from tuner.spec.model import ModelSpec
from tuner.spec.study import SearchSpec, StudySpec


def test_every_study_field_has_a_docstring() -> None:
    assert missing_field_docs() == []


def test_every_tune_option_has_help() -> None:
    assert missing_option_help() == []


def test_an_option_without_help_is_named() -> None:
    parser = argparse.ArgumentParser(prog="tune")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("run", help="search")
    p.add_argument("--study")
    p.add_argument("--dry-run", action="store_true", help="launch nothing")
    sub.add_parser("space")
    assert missing_option_help(parser) == ["tune run --study", "tune space"]


def test_the_study_reference_has_every_field_of_every_section() -> None:
    text = study_reference()
    paths = {f.path for f in study_fields()}
    must = {
        "cluster.slurm.partition",
        "cluster.slurm.max_jobs",
        "model.moe.num_experts",
        "cluster.overheads.nccl_channels",
        "search.stop_chance",
        "space.zero_stage",
    }
    assert must <= paths
    for section in ("`cluster.slurm`", "`cluster.ssh`", "`model.moe`", "`space`", "`search`"):
        assert f"## {section}" in text
    for f in file_fields(ClusterSpec):  # the reader's own (recorded_stack) are no file key
        assert f"| `{f.name}` |" in text
    for name in model_preset_names():
        assert f"`{name}`" in text


def test_bounds_are_read_from_the_checks() -> None:
    search = field_bounds(SearchSpec)
    assert search["memory_headroom"] == "0 < memory_headroom <= 1"
    assert search["n_trials"] == "> 0; <= 100,000"
    assert field_bounds(ClusterSpec)["gpus_per_node"] == "> 0; <= 1,024"
    assert field_bounds(ModelSpec)["hidden_size"] == "> 0; <= 1,048,576"  # set in a loop
    assert field_bounds(SearchSpec)["stop_chance"] == "0 < stop_chance < 1"  # given: checked
    assert "split_family" not in str(field_bounds(StudySpec))  # rules across fields: guides
    rows = {f.path: f for f in study_fields()}
    assert rows["search.memory_headroom"].default == "`0.92`"
    assert rows["cluster.gpu"].default == "required"
    assert rows["cluster.executor"].type == "`local` \\| `ssh` \\| `slurm`"


def test_the_cli_reference_has_every_command_and_option() -> None:
    from tuner.cli.commands import build_parser

    text = cli_reference()
    parser = build_parser()[0]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                assert f"## `tune {name}`" in text
                for a in sub._actions:
                    if isinstance(a, argparse._HelpAction):
                        continue
                    for option in a.option_strings:
                        assert f"`{option}`" in text, (name, option)


def test_the_cli_reference_says_each_commands_summary_once() -> None:
    """Each command's one-line help was followed by its description, the same sentence
    capitalised ("validate one config ..." then "Validate one config ...."); a description that
    says more (tune report's) is kept."""
    text = cli_reference()
    section = text.split("## `tune estimate`")[1].split("```text")[0]
    assert section.lower().count("validate one config and predict its memory and time") == 1
    report = text.split("## `tune report`")[1].split("```text")[0]
    assert "Pareto front" in report and "one self-contained HTML report" in report


def test_the_catalog_reference_has_every_gpu() -> None:
    text = catalog_reference()
    for name in gpu_names():
        assert f"| `{name}` |" in text


def test_every_bound_in_the_study_reference_is_in_numbers() -> None:
    """The reference showed bounds as the code spells them: `<= MAX_MINUTES * 60`
    (heartbeat_s), `<= 1 << 20` (min_capacity) and, for `if not self.nodes: raise`, the
    bare word `nodes`; a reader cannot tell what those allow."""
    import re

    rows = {f.path: f.bounds for f in study_fields()}
    assert rows["search.heartbeat_s"] == "> 0; <= 604,800"
    assert rows["model.moe.min_capacity"] == "0 <= min_capacity <= 1,048,576"
    assert rows["cluster.nodes"] == "not empty"
    for path, bound in rows.items():
        assert not re.search(r"[A-Z_]{3,}|<<|\*", bound), (path, bound)
