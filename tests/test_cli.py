"""The `tune` command line: JSON contracts and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.models.uncertainty import CATALOG_TIME_STACK_SIGMA

REPO = Path(__file__).resolve().parents[1]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        capsys, "estimate", "--study", "gpt-70b", "--set", "tp=8", "--set", "pp=4",
        "--set", "sp=true", "--set", "recompute=selective", "--set", "distributed_optimizer=1",
        "--json",
    )  # fmt: skip
    assert {"config", "valid", "errors", "memory", "gpu_memory_gib", "fits"} <= set(out)
    assert out["valid"] and out["errors"] == [] and out["fits"]
    assert out["config"]["dp"] == 16 and out["config"]["grad_accum"] == 64
    # catalog terms: the step's sd from their held-out error (tuner.models.uncertainty), an
    # unseen stack's own bias included, and the 90% band around the step
    assert out["time_error"] == out["time_sigma"] > CATALOG_TIME_STACK_SIGMA
    low, high = out["step_band_s"]
    assert low < out["step_s"] < high
    assert "catalog" in out["time_error_from"]
    assert 0 < out["fit_probability"] <= 1 and isinstance(out["memory_risk"], bool)
    assert out["memory"]["band_gib"][0] < out["memory"]["peak_gib"] < out["memory"]["band_gib"][1]
    mem = out["memory"]
    assert {"weights", "grads", "optimizer", "activations", "peak_gib"} <= set(mem)
    assert mem["peak_gib"] < out["gpu_memory_gib"]
    # every stage, both phases, three figures; the peak is the worst device figure
    assert [s["stage"] for s in mem["stages"]] == [0, 1, 2, 3]
    assert mem["peak_gib"] == max(s["device_gib"] for s in mem["stages"]) == mem["device_gib"]
    for s in mem["stages"]:
        assert [p["phase"] for p in s["phases"]] == ["fwd_bwd", "step"]
        assert s["allocated_gib"] <= s["reserved_gib"] <= s["device_gib"]


def test_estimate_invalid_config_exits_2_with_the_rules_it_breaks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["estimate", "--study", "gpt-70b", "--set", "tp=3"]
    assert main([*argv, "--json"]) == 2  # bad input, but the JSON still says why
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["valid"] is False and out["fits"] is False and out["memory"] is None
    assert any("does not divide world size 512" in e for e in out["errors"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tune: error: tp3 pp1 dp")
    assert "breaks" in err[0] and "does not divide world size 512" in err[0]


def test_estimate_predicted_oom(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "estimate", "--study", "gpt-70b", "--set", "tp=1", "--set", "pp=1",
                   "--json")  # fmt: skip
    assert out["valid"] and not out["fits"] and out["memory"]["peak_gib"] > 80


def test_estimate_table_has_a_row_per_stage(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a file: the plain form, every column
    argv = ["estimate", "--study", "gpt-70b", "--set", "tp=8", "--set", "pp=4"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "per pipeline stage" in text
    for head in (
        "in-flight",
        "slack",
        "overhead",
        "allocated",
        "reserved",
        "device",
        "peak",
        "phase",
    ):
        assert head in text
    stages = json.loads(run_json_text(argv + ["--json"]))["memory"]["stages"]
    rows = [
        words
        for words in (line.split() for line in text.splitlines())
        if len(words) > 3 and words[0].isdigit() and words[3] in ("fwd_bwd", "step")
    ]
    assert len(rows) == len(stages) == 4


def run_json_text(argv: list[str]) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    return buffer.getvalue()


def test_estimate_lists_the_fp8_cast_and_moe_routing_terms(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step-time table names every term; Mixtral in FP8 pays both the TE casts and the
    routing (tuner.models.time.fp8, tuner.models.time.moe)."""
    from tuner.spec.file import resolve_study_path

    text = resolve_study_path("mixtral-8x7b").read_text()
    assert "precision: bf16" in text
    study = tmp_path / "mixtral-fp8.yaml"
    study.write_text(text.replace("precision: bf16", "precision: fp8"))
    argv = ["estimate", "--study", str(study), "--set", "tp=1", "--set", "pp=4",
            "--set", "ep=8"]  # fmt: skip
    monkeypatch.delenv("COLUMNS", raising=False)  # the plain form: "term  seconds" rows
    assert main(argv) == 0
    table = capsys.readouterr().out
    rows = {w[0]: w for w in (line.split() for line in table.splitlines()) if len(w) == 2}
    for term in ("ep_comm", "fp8_cast", "moe_routing"):  # zero terms are left out
        assert term in rows and float(rows[term][1]) > 0, rows.get(term)
    time = json.loads(run_json_text(argv + ["--json"]))["time"]
    assert time["fp8_cast"] > 0 and time["moe_routing"] > 0


def test_space_json_counts(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "space", "--study", "gpt-70b", "--json")
    assert {"total", "invalid", "invalid_by_rule", "predicted_oom", "viable"} <= set(out)
    assert out["total"] == out["invalid"] + out["predicted_oom"] + out["viable"]
    assert sum(out["invalid_by_rule"].values()) == out["invalid"]


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_space_ranks_once(
    fmt: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tune space`` sorts the viable configs once (the table, the cost preview and the
    calibrated ranking read the same list): on a 10^5-config space each sort costs."""
    from tuner.space.candidates import SpaceReport

    calls = []
    real = SpaceReport.ranked

    def counted(self: SpaceReport) -> list:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(SpaceReport, "ranked", counted)
    assert main(["space", "--study", "llama3-8b", "--top", "3", *fmt]) == 0
    assert capsys.readouterr().out
    assert len(calls) == 1


def test_space_without_top_says_how_to_see_the_configs(capsys: pytest.CaptureFixture[str]) -> None:
    """A first ``tune space`` prints counts and cost; it names the command that lists the fastest
    configs (runnable as printed), and a ``--top`` table needs no such line."""
    assert main(["space", "--study", "llama3-8b"]) == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    assert hint == "the fastest predicted configs: tune space --study llama3-8b --top 10"
    command = hint.split(": ", 1)[1].split()[1:]
    assert main(command) == 0
    text = capsys.readouterr().out
    assert "top 10 by predicted step time" in text and "fastest predicted configs" not in text


def test_space_with_nothing_viable_says_nothing_would_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Megatron study given ZeRO stages: every config breaks a rule. The counts showed 0 viable
    and a budget of 0 launches, exit 0, and nothing said the study could not run."""
    import yaml

    data = yaml.safe_load((REPO / "tuner" / "studies" / "llama3-8b.yaml").read_text())
    data["space"]["zero_stage"] = [1]
    study = tmp_path / "zero.yaml"
    study.write_text(yaml.safe_dump(data))
    assert main(["space", "--study", str(study)]) == 0
    last = " ".join(capsys.readouterr().out.split())
    assert "nothing to run: no config is valid and predicted to fit" in last
    assert f"tune estimate --study {study} --set KNOB=VALUE" in last
    assert "the fastest predicted configs" not in last


def test_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--study", "llama3-8b", "--set", "tp=2"]) == 0
    text = capsys.readouterr().out
    assert "peak_gib" in text and "fits" in text
    # the uncertainty each figure carries, and where it came from
    assert "all terms from the catalog, at its held-out error" in text
    assert "90% band" in text and "likely within the GPU's memory" in text


@pytest.mark.parametrize(
    "argv",
    [["estimate", "--study", "missing-study"], ["estimate", "--study", "gpt-70b", "--set", "x=1"]],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tune: error: ")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tuner

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"tune {tuner.__version__} (paratune)\n"


@pytest.mark.parametrize(
    "argv",
    [["--debug", "estimate", "--study", "missing-study"],
     ["estimate", "--study", "missing-study", "--debug"],
     ["-v", "space", "--study", "missing-study", "--debug"]],
)  # fmt: skip
def test_global_options_before_or_after_the_command(argv: list[str]) -> None:
    with pytest.raises(ConfigError, match="unknown study"):  # --debug: the exception itself
        main(argv)


def test_store_options_before_the_command_and_only_where_they_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = str(tmp_path / "elsewhere")
    for argv in (["--results", elsewhere, "leaderboard", "--study", "gpt-70b"],
                 ["leaderboard", "--study", "gpt-70b", "--results", elsewhere]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err  # names where it looked: results are relative to the cwd
        assert f"no results for study 'gpt-70b' in {Path(elsewhere) / 'gpt-70b'} yet" in err
        assert "--results DIR" in err
    with pytest.raises(SystemExit) as exc:
        main(["--results", elsewhere, "parse-log", str(tmp_path / "x.log")])
    assert exc.value.code == 2
    assert "--results applies to run, leaderboard, best" in capsys.readouterr().err
    # estimate reads the cluster's saved calibration under --results (none here)
    assert main(["--results", elsewhere, "estimate", "--study", "gpt-70b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibrated"] is None


@pytest.mark.parametrize("command", [["estimate", "--set", "tp=8"], ["space"],
                                     ["run", "--dry-run"]])  # fmt: skip
def test_format_json_is_json(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command[0], "--study", "gpt-70b", *command[1:]]
    assert run_json(capsys, *argv, "--format", "json") == run_json(capsys, *argv, "--json")


@pytest.mark.slow
def test_run_leaderboard_best_json_and_no_optuna_lines(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from tests.test_study import SURFACE, study_data, write_study

    data = study_data(tmp_path, SURFACE, n_trials=2)
    data["space"] = {"tp": [2], "micro_batch_size": [2, 4], "sequence_parallel": [True]}
    study = str(write_study(tmp_path, data))
    results = str(tmp_path / "results")
    assert main(["run", "--study", study, "--results", results, "--format", "json"]) == 0
    out, err = capfd.readouterr()
    summary = json.loads(out)
    assert summary["study"] == "e2e" and summary["launched"] == 2
    assert summary["outcomes"] == {"ok": 2} and summary["best_trial"] is not None
    spent = summary["spent"]  # what was spent, per outcome and on what (the model sampler says)
    assert spent["launches"] == 2 and spent["launches_by_outcome"] == {"ok": 2}
    assert spent["by_purpose"]["exploitation"]["launches"] >= 1  # the first: the model's fastest
    assert sum(v["launches"] for v in spent["by_purpose"].values()) == 2
    assert "A new study created" not in out + err and "Trial 0 finished" not in out + err

    assert main(["--results", results, "leaderboard", "--study", study, "--format", "json"]) == 0
    rows = json.loads(capfd.readouterr().out)
    assert [r["trial"] for r in rows][0] == summary["best_trial"]
    assert main(["best", "--study", study, "--results", results, "--emit", "args",
                 "--format", "json"]) == 0  # fmt: skip
    best = json.loads(capfd.readouterr().out)
    assert best["trial"] == summary["best_trial"] and best["config"]["tp"] == 2
    assert best["args"][:2] == ["--tensor-model-parallel-size", "2"]


def test_printed_commands_repeat_the_study_file_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study saved as ``my-cluster.yaml`` (the README's way: a file in the current folder) with
    ``name: mine``: the hints of ``tune estimate`` and ``tune space`` said ``tune profile
    --study mine``, which is no study here (only ``studies/NAME.yaml`` and the shipped ones are
    found by name). Each printed command names the file given, and that file loads."""
    import re
    import shlex

    import yaml

    from tuner.spec.file import load_study

    data = yaml.safe_load((REPO / "tuner" / "studies" / "llama3-8b.yaml").read_text())
    data["name"] = "mine"
    (tmp_path / "my cluster.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")  # one hint a line
    for argv in (["estimate", "--set", "tp=2"], ["space"]):
        assert main([*argv, "--study", "my cluster.yaml"]) == 0
        text = capsys.readouterr().out
        given = re.findall(r"tune \w+ --study ('[^']*'|\S+)", text)
        assert given, text
        for study in given:
            assert shlex.split(study) == ["my cluster.yaml"], text
            assert load_study(shlex.split(study)[0]).name == "mine"


@pytest.mark.parametrize(
    ("argv", "hint"),
    [(["leaderbord", "--study", "demo"], "did you mean 'leaderboard'?"),
     (["best", "--study", "demo", "--emit", "sbach"], "did you mean 'sbatch'?"),
     (["leaderboard", "--study", "demo", "--colums", "rank"], "did you mean '--columns'?"),
     (["space", "--study", "demo", "--top=3", "--colums=rank"], "did you mean '--columns'?"),
     (["space", "--study", "dmeo"], "did you mean 'demo'?"),
     (["space", "--study", "gpt70b"], "did you mean 'gpt-70b'?"),
     (["space", "--study", "GPT-70B"], "did you mean 'gpt-70b'?"),  # case: no hint before
     (["space", "--study", "llama3-70b"], "give --study llama3-70b.yaml"),
     (["leaderboard"], "tune leaderboard needs --study NAME: one of demo, ")],
)  # fmt: skip
def test_a_typo_says_what_to_type(
    argv: list[str], hint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A mistyped command, choice, option or study name, or a missing --study, said only what
    was wrong (argparse's "the following arguments are required: --study"). The
    README saves ``llama3-70b.yaml`` in the current folder; ``--study llama3-70b`` looks in
    ``studies/`` and the shipped studies, and said "unknown study" beside the very file."""
    (tmp_path / "llama3-70b.yaml").write_text("name: llama3-70b\n")
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's errors
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and hint in err, err


def test_a_name_like_none_known_suggests_none(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["space", "--study", "zzz"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "available: demo" in err and "YAML file" in err


def test_every_subcommand_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    """``tune run --help`` began with its usage and options: what ``run`` does was in ``tune
    --help``'s list only (8 of the 10 subcommands had no description)."""
    import argparse

    from tuner.cli.commands import build_parser

    parser = build_parser()[0]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    said = {a.dest: a.help for a in sub._choices_actions}
    for name in sub.choices:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        first = text.split("\n\n")[1]  # the paragraph after the usage
        assert not first.startswith(("options:", "positional arguments:")), (name, text[:400])
        if name not in ("parse-log", "report"):  # those two have descriptions of their own
            assert " ".join(first.split()).lower().startswith(said[name].lower()), name


def test_run_best_and_profile_help_say_what_comes_next(capsys: pytest.CaptureFixture[str]) -> None:
    """``tune run --help`` said "launch short real runs and record them" and listed options:
    not to look first with --dry-run, where the results go (the other commands read them from
    the folder run started in), that Ctrl-C is safe and running it again resumes. ``tune best
    --help`` did not say that a Megatron full run needs ``launch.train_args``, the first thing
    the README's study hits. ``tune profile --help`` showed ``--study STUDY``, ``--warmup
    WARMUP`` and not where the profile goes nor what uses it. The pages they point at exist."""
    import re

    from tests.docs_examples import REPO

    helps = {}
    for name in ("run", "best", "profile"):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        helps[name] = " ".join(capsys.readouterr().out.split())
    description = helps["run"].split(" options: ")[0]
    for words in ("--dry-run", "RESULTS/STUDY/", "trials/N/", "Ctrl-C", "resumes",
                  "tune leaderboard"):  # fmt: skip
        assert words in description, words
    assert "launch.train_args" in helps["best"] and "--emit args needs none" in helps["best"]
    assert "--study NAME" in helps["profile"] and "--warmup N" in helps["profile"]
    assert "RESULTS/clusters/NAME.yaml" in helps["profile"]
    for page in re.findall(r"docs/[\w/-]+\.md", " ".join(helps.values())):
        assert (REPO / page).is_file(), page


def test_run_closes_its_executor_when_the_study_cannot_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal (or a Ctrl-C) after the executor was made and before the loop runs: the
    executor (the nodes' SSH connections the preflight opened) is closed, the line printed."""
    import tuner.study.build as build_module
    import tuner.study.launchers as launchers
    from tests.test_study import SURFACE, study_data, write_study
    from tuner.errors import StudyError

    closed: list[bool] = []

    class Executor:
        def preflight(self, *args: object) -> list[object]:
            return []

        def close(self) -> None:
            closed.append(True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise StudyError("the study could not be made")

    monkeypatch.setattr(launchers, "make_executor", lambda spec: Executor())
    monkeypatch.setattr(build_module, "build_loop", refuse)
    study = str(write_study(tmp_path, study_data(tmp_path, SURFACE, n_trials=1)))
    code = main(["run", "--study", study, "--results", str(tmp_path / "r"), "--skip-preflight"])
    assert code == 2 and closed == [True]
    assert "the study could not be made" in capsys.readouterr().err


def test_run_refuses_a_changed_study_before_checking_the_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study file changed since its study started was refused only after the preflight had
    reached every node (an srun per node on Slurm)."""
    import optuna

    import tuner.study.launchers as launchers
    from tests.test_study import SURFACE, study_data, write_study
    from tuner.layout import ResultsLayout
    from tuner.spec.file import load_study
    from tuner.study.storage import start_study

    checked: list[bool] = []

    class Executor:
        def preflight(self, *args: object) -> list[object]:
            checked.append(True)
            return []

        def close(self) -> None:
            pass

    monkeypatch.setattr(launchers, "make_executor", lambda spec: Executor())
    data = study_data(tmp_path, SURFACE, n_trials=1)
    study = str(write_study(tmp_path, data))
    spec, results, journal = load_study(study), tmp_path / "r", f"journal:{tmp_path / 'j.log'}"
    start_study(spec, optuna.samplers.RandomSampler(), url=journal, heartbeat_s=30.0,
                force=False, layout=ResultsLayout(results, spec.name))  # fmt: skip
    data["launch"]["train_iters"] += 1  # what a trial measures changed
    write_study(tmp_path, data)
    argv = ["run", "--study", study, "--results", str(results), "--storage", journal, "--quiet"]
    assert main(argv) == 2
    assert "was started with a different study file" in capsys.readouterr().err
    assert checked == []  # refused before the nodes were reached


def test_the_dry_run_says_tune_run_would_refuse_a_changed_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune run`` refuses a study whose file changed since its study started; the dry run said
    nothing, so a user who dry-ran first learned of it at launch. It says it in the refusal's
    words; with --force (the run resumes) it says nothing."""
    import optuna

    from tests.test_study import SURFACE, study_data, write_study
    from tuner.layout import ResultsLayout
    from tuner.spec.file import load_study
    from tuner.study.storage import changed_study, start_study

    data = study_data(tmp_path, SURFACE, n_trials=1)
    study = str(write_study(tmp_path, data))
    spec, results, journal = load_study(study), tmp_path / "r", f"journal:{tmp_path / 'j.log'}"
    start_study(spec, optuna.samplers.RandomSampler(), url=journal, heartbeat_s=30.0,
                force=False, layout=ResultsLayout(results, spec.name))  # fmt: skip
    argv = ["run", "--study", study, "--results", str(results), "--storage", journal, "--dry-run"]
    assert main(argv) == 0
    assert "tune: warning" not in capsys.readouterr().err  # unchanged: resumed as it is
    data["launch"]["train_iters"] += 1
    write_study(tmp_path, data)
    assert main(argv) == 0
    refusal = changed_study(load_study(study), spec.fingerprint())
    assert f"tune: warning: {refusal}\n" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert "tune: warning" not in capsys.readouterr().err


def test_tune_help_says_where_to_start_and_its_commands_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tune --help`` listed the commands and the FLOPs convention, but not how to begin nor
    where a study file is described: a newcomer with the help alone could not write one. Its
    first steps name the guide and the reference (both exist), every command there is one the
    parser takes, and the first, on a shipped study, runs from an empty folder."""
    import re
    import shlex

    from tests.docs_examples import REPO
    from tuner.cli.commands import build_parser

    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    steps = text.split("first steps", 1)[1].split("FLOPs convention")[0]
    for page in ("docs/guides/studies.md", "docs/reference/study.md"):
        assert page in steps and (REPO / page).is_file(), page
    commands = re.findall(r"^\s+(tune .+?)\s{2,}", steps, flags=re.M)
    assert len(commands) == 3, steps
    parser = build_parser()[0]
    for command in commands:
        parser.parse_args(shlex.split(command)[1:])
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(commands[0])[1:]) == 0
    assert "top 5 by predicted step time" in capsys.readouterr().out


def test_the_dry_run_opens_the_storage_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run opened the study's storage twice: once to check it can be read, again for
    the fingerprint of the changed-study warning (a journal replays every record on each open).
    One open serves both, and the warning still comes."""
    import optuna

    import tuner.study.storage as storage_module
    from tests.test_study import SURFACE, study_data, write_study
    from tuner.layout import ResultsLayout
    from tuner.spec.file import load_study
    from tuner.study.storage import start_study

    data = study_data(tmp_path, SURFACE, n_trials=1)
    study = str(write_study(tmp_path, data))
    spec, results, journal = load_study(study), tmp_path / "r", f"journal:{tmp_path / 'j.log'}"
    start_study(spec, optuna.samplers.RandomSampler(), url=journal, heartbeat_s=30.0,
                force=False, layout=ResultsLayout(results, spec.name))  # fmt: skip
    data["launch"]["train_iters"] += 1
    write_study(tmp_path, data)
    opened: list[object] = []
    real = storage_module._open
    monkeypatch.setattr(storage_module, "_open", lambda *a: opened.append(a) or real(*a))
    argv = ["run", "--study", study, "--results", str(results), "--storage", journal, "--dry-run"]
    assert main(argv) == 0
    assert "was started with a different study file" in capsys.readouterr().err
    assert len(opened) == 1


def test_tune_help_says_where_each_framework_and_each_output_is_explained(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tune --help`` named the study guide but neither how to pick a framework (the guide it
    named listed three of the five) nor where its tables, the trials' cost and the report are
    explained. It names each framework with the page on running it, and the output and report
    pages; every page exists and every framework has one page."""
    import re

    from tests.docs_examples import REPO
    from tuner.cli.help_text import FRAMEWORK_PAGES
    from tuner.spec.frameworks import FRAMEWORKS

    named = [name for names in FRAMEWORK_PAGES.values() for name in names]
    assert sorted(named) == sorted(FRAMEWORKS)
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for page, names in FRAMEWORK_PAGES.items():
        assert (REPO / page).is_file() and f"{', '.join(names)}: {page}" in text, page
        for name in names:  # the page is about it: `megatron-bridge`, `framework: torchtitan`
            assert re.search(rf"`(framework: )?{name}`", (REPO / page).read_text()), (name, page)
    for page in ("docs/output.md", "docs/guides/report.md"):
        assert page in text and (REPO / page).is_file(), page
