"""Hostile values on ``tune``'s command line and in what it reads around it: each is one line
naming the option or the file, exit status 2, never a traceback, never a silent default."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.test_cli_profile import CLUSTER_TEXT
from tests.test_hostile_inputs import BASE, HANG_GUARD_S, REPO
from tuner.cli.main import CLOSED_STDOUT, main

EMPTY_VALUES = [
    (["leaderboard", "--study", "demo", "--results", ""], "--results", "DIR"),
    (["--results", "", "leaderboard", "--study", "demo"], "--results", "DIR"),
    (["space", "--study", ""], "--study", "NAME"),
    (["leaderboard", "--study", "demo", "--storage", ""], "--storage", "URL"),
    (["report", "--study", "demo", "--out", ""], "--out", "FILE.html"),
    (["profile", "--study", ""], "--study", "NAME"),
    (["profile", "--cluster", ""], "--cluster", "FILE"),
    (["calibrate", "--study", ""], "--study", "NAME"),
    (["parse-log", ""], "FILE", "FILE"),
]


@pytest.mark.parametrize(("argv", "option", "what"), EMPTY_VALUES)
def test_an_empty_value_is_refused_naming_its_option(
    argv: list[str], option: str, what: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--results ""`` was the current folder (``Path("")`` is "."), ``--study ""`` "is a
    directory", ``tune profile --study ""`` a TypeError's traceback and ``tune calibrate
    --study ""`` the calibration of a cluster named None."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tune: error: "), err
    assert f"argument {option}: an empty value; give {what}" in err
    assert list(tmp_path.iterdir()) == []  # nothing written in the folder "" stood for


def test_an_option_whose_default_is_empty_still_takes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rerun ""`` is its default (no outcome runs again), not an error."""
    argv = ["run", "--study", "demo", "--dry-run", "--json", "--rerun", ""]
    assert main([*argv, "--results", str(tmp_path)]) == 0, capsys.readouterr().err


def _without_megatron_path(folder: Path) -> None:
    assert BASE["launch"] == {"template": "megatron_gpt"}  # no launch.megatron_path
    (folder / "studies").mkdir()
    (folder / "studies" / "nopath.yaml").write_text(yaml.safe_dump({**BASE, "name": "nopath"}))


@pytest.mark.parametrize("given", ["nopath", "studies/nopath.yaml"])
def test_a_setting_the_launch_needs_names_the_study_file(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``launch.megatron_path: this launch template needs it; set it in the study``: which
    file (a study found by name is one of several places)."""
    monkeypatch.chdir(tmp_path)
    _without_megatron_path(tmp_path)
    assert main(["run", "--study", given]) == 2
    err = capsys.readouterr().err
    file = tmp_path / "studies" / "nopath.yaml"
    assert err.count("\n") == 1, err
    assert err.startswith(f"tune: error: {file}: launch.megatron_path: this launch template "
                          "needs it"), err  # fmt: skip
    assert not (tmp_path / "results" / "nopath" / "trials").exists()  # nothing launched


def test_a_setting_the_probe_needs_names_the_cluster_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune profile --cluster FILE --probe`` said "set it in the study": there is none."""
    monkeypatch.chdir(tmp_path)
    Path("my cluster.yaml").write_text(CLUSTER_TEXT)
    assert main(["profile", "--cluster", "my cluster.yaml", "--probe"]) == 2
    err = capsys.readouterr().err
    assert err == ("tune: error: my cluster.yaml: launch.megatron_path: this launch template "
                   "needs it; set it there\n")  # fmt: skip


def test_a_warning_is_a_tune_line_not_a_log_record(tmp_path: Path) -> None:
    """tuner's warnings (a torn journal cut off, a second Ctrl-C while stopping) were printed
    as ``2026-01-05 10:12:03,114 WARNING tuner.study.journal: ...`` among ``tune:`` lines."""
    journal = tmp_path / "j.log"
    journal.write_text('{"op_code": 0, "worker_id": "w"}\n{"op_co')  # a torn last record
    argv = ["leaderboard", "--study", "demo", "--storage", f"journal:{journal}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "tuner.cli.main", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)  # fmt: skip
    first = done.stderr.splitlines()[0]
    assert first == (
        f"tune: warning: {journal}: cut off its last record, torn by a worker that stopped "
        "mid-write (7 bytes; its trial is recovered from its folder)"
    )


@pytest.mark.parametrize("command", ["space", "run", "calibrate", "leaderboard"])
@pytest.mark.parametrize("given", ["loop", "loop/deeper"])
def test_a_results_folder_through_a_symbolic_link_loop_is_one_line(
    command: str, given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``tune space``, ``run --dry-run`` and ``calibrate`` ended in a RuntimeError's traceback
    (pathlib's "Symlink loop"), exit 1; ``leaderboard`` said there were no results there."""
    monkeypatch.chdir(tmp_path)
    os.symlink("other", "loop")
    os.symlink("loop", "other")
    argv = [command, "--study", "demo", "--results", given]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--dry-run"] if command == "run" else argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"tune: error: argument --results: {given}: a symbolic "
                                       f"link loop (see tune {command} --help)\n")  # fmt: skip


DEFAULT_RESULTS = [
    ("a-link-loop", lambda: (os.symlink("other", "results"), os.symlink("results", "other")),
     "a symbolic link loop"),
    ("a-link-to-nothing", lambda: os.symlink("gone", "results"),
     "a symbolic link to nothing (gone)"),
    ("a-file", lambda: Path("results").write_text("x\n"), "a file, not a folder"),
]  # fmt: skip
RESULTS_COMMANDS = [["space"], ["estimate"], ["run", "--dry-run"], ["leaderboard"], ["best"],
                    ["report"], ["profile", "--show"], ["calibrate"]]  # fmt: skip


@pytest.mark.parametrize("command", RESULTS_COMMANDS, ids=[c[0] for c in RESULTS_COMMANDS])
@pytest.mark.parametrize(("make", "words"), [c[1:] for c in DEFAULT_RESULTS],
                         ids=[c[0] for c in DEFAULT_RESULTS])  # fmt: skip
def test_a_default_results_folder_that_cannot_hold_results_is_one_line(
    command: list[str], make: Callable[[], object], words: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``./results`` a link loop was a RuntimeError's traceback (space, estimate, run,
    calibrate), a link to nothing was followed (its target made, a profile saved there), a
    file was "Not a directory" (profile, exit 1); read commands said "no results yet"."""
    monkeypatch.chdir(tmp_path)
    make()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        main([command[0], "--study", "demo", *command[1:]])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"tune: error: the default results folder ./results: "
                                       f"{words}; give --results DIR (see tune {command[0]} "
                                       "--help)\n")  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == before  # nothing made through the link


def test_a_results_option_through_a_link_to_nothing_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--results LINK/sub``, LINK pointing nowhere: the link's target was made."""
    monkeypatch.chdir(tmp_path)
    os.symlink("gone", "link")
    with pytest.raises(SystemExit) as exit_:
        main(["space", "--study", "demo", "--results", "link/sub"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"tune: error: argument --results: link/sub: "
                                       f"{tmp_path / 'link'} is a symbolic link to nothing "
                                       "(gone) (see tune space --help)\n")  # fmt: skip


@pytest.mark.parametrize("name", ["COLUMNS", "LINES"])
@pytest.mark.parametrize("value", ["²", "٣", "12x", "-5", " 80"])
def test_a_terminal_size_variable_that_is_no_number_is_ignored(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``COLUMNS=²`` or ``LINES=²`` (a digit to ``str.isdigit``, which Rich asks too, and no
    number to ``int``) was a ValueError's traceback from every table; such a value is as if
    unset: the same output as without it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    assert main(["catalog", "gpus"]) == 0
    unset = capsys.readouterr()
    monkeypatch.setenv(name, value)
    assert main(["catalog", "gpus"]) == 0
    assert capsys.readouterr() == unset


STUDY_PATHS = [
    ("a-fifo", lambda p: os.mkfifo(p), "is not a regular file; give the study's YAML file"),
    ("a-dangling-link", lambda p: os.symlink("gone.yaml", p),
     "is a symbolic link to nothing (or a loop)"),
    ("a-link-loop", lambda p: os.symlink(p.name, p), "is a symbolic link to nothing (or a loop)"),
    ("missing", lambda p: None, "does not exist"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "words"), [c[1:] for c in STUDY_PATHS],
                         ids=[c[0] for c in STUDY_PATHS])  # fmt: skip
def test_a_study_path_that_is_no_file_says_what_it_is(
    make: Callable[[Path], object], words: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--study /dev/zero`` (or a FIFO, a link to nothing) said "does not exist"."""
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "s.yaml")
    assert main(["space", "--study", "s.yaml"]) == 2
    assert capsys.readouterr().err == f"tune: error: study file 's.yaml' {words}\n"


def test_an_output_encoding_without_the_characters_tune_prints_is_no_traceback(
    tmp_path: Path,
) -> None:
    """``PYTHONIOENCODING=ascii`` (or a Latin-1 login node): the dry run's ``±2%`` was a
    UnicodeEncodeError's traceback, exit 1."""
    argv = ["run", "--study", "demo", "--dry-run", "--results", str(tmp_path / "results")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-m", "tuner.cli.main", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert "known to \\xb12%" in done.stdout


def test_the_c_locale_without_utf8_mode_is_no_traceback(tmp_path: Path) -> None:
    """``LC_ALL=C`` with UTF-8 mode and locale coercion off (``PYTHONUTF8=0``,
    ``PYTHONCOERCECLOCALE=0``): Python writes ASCII with ``surrogateescape``, which the ``±``
    of ``tune space`` failed as well, a UnicodeEncodeError's traceback, exit 1."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LC_ALL": "C", "LANG": "C",
           "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}  # fmt: skip
    env.pop("PYTHONIOENCODING", None)
    done = subprocess.run([sys.executable, "-m", "tuner.cli.main", "space", "--study", "demo"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          encoding="utf-8", errors="replace", timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert "known to \\xb12%" in done.stdout


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize("emit", ["script", "ds-config", "args"])
def test_an_export_interrupted_mid_write_leaves_the_last_one_whole(
    emit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``tune best`` run again and stopped by Ctrl-C (or a full disk) while writing cut the
    previous, good launch script or ds_config short in place: written beside it and renamed
    now, so it is whole or as it was, and no half-written copy is left."""
    from tests.report.test_exports import record_measured
    from tuner.space.enumerate import iter_configs
    from tuner.spec.file import load_study

    monkeypatch.chdir(tmp_path)
    spec = load_study("demo")
    record_measured(spec, tmp_path / "results", [(next(iter_configs(spec)), 1.0)])
    argv = ["best", "--study", "demo", "--emit", emit, "--format", "json"]
    assert main(argv) == 0
    exports = tmp_path / "results" / "demo" / "exports"
    before = {p: p.read_bytes() for p in exports.rglob("*") if p.is_file()}
    assert before
    real = Path.write_text

    def half_then_interrupt(self: Path, data: str, *args: object, **kwargs: object) -> int:
        real(self, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", half_then_interrupt)
    assert main(argv) == 130
    monkeypatch.undo()
    assert capsys.readouterr().err.endswith("tune: interrupted\n")
    assert {p: p.read_bytes() for p in exports.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("stage", ["loading", "parsing"])
def test_a_ctrl_c_while_the_command_line_loads_is_one_line(
    stage: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in the second or so ``tune`` takes to import its commands and parse the command
    line (right after Enter, the wrong study named) was a KeyboardInterrupt traceback of up to
    85 lines; it is ``tune: interrupted``, exit 130, as during a command."""
    import builtins

    from tuner.cli import commands

    if stage == "loading":
        real = builtins.__import__

        def interrupted(name: str, *args: object, **kwargs: object) -> object:
            if name == "tuner.cli.commands":
                raise KeyboardInterrupt
            return real(name, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(builtins, "__import__", interrupted)
    else:

        def parse(*args: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(commands, "parse_args", parse)
    assert main(["space", "--study", "demo"]) == 130
    assert capsys.readouterr().err == "tune: interrupted\n"


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--warmup", "100000000000000000000", "must be 0 to 1,000"),
    ("--repeats", "1000000000", "must be 1 to 1,000"),
])  # fmt: skip
def test_a_profile_that_would_outrun_its_job_is_refused(
    option: str, value: str, words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``tune profile --repeats 1000000000`` (a typo) held the nodes until the job's 15-minute
    timeout killed it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--study", "demo", option, value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"tune: error: argument {option}: {words}, got "
                                       f"{value} (see tune profile --help)\n")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_a_collective_message_larger_than_the_gpu_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--message-bytes 10**30`` launched the profile job, which failed with torchrun's last
    line ("error_file: <N/A>"), exit 1."""
    from tuner.space.enumerate import study_gpu
    from tuner.spec.file import load_study

    monkeypatch.chdir(tmp_path)
    memory = study_gpu(load_study("demo")).memory_gib * 2**30
    assert main(["profile", "--study", "demo", "--message-bytes", f"4096,{10**30}"]) == 2
    assert capsys.readouterr().err == (f"tune: error: --message-bytes: {10**30:,} bytes: more "
                                       f"than a cpu's memory ({memory:,.0f} bytes)\n")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


EXPORT_FOLDERS = [
    ("a-file-named-exports", lambda d: d.parent.rmdir() or d.parent.write_text("x\n"),
     "{exports} is a file, not a folder"),
    ("a-link-to-nothing", lambda d: d.symlink_to("/nonexistent/x"),
     "a symbolic link to nothing (/nonexistent/x)"),
    ("a-link-loop", lambda d: d.symlink_to(d.name), "a symbolic link loop"),
]  # fmt: skip


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize(("make", "words"), [c[1:] for c in EXPORT_FOLDERS],
                         ids=[c[0] for c in EXPORT_FOLDERS])  # fmt: skip
def test_an_export_folder_that_cannot_hold_files_says_why(
    make: Callable[[Path], object], words: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``tune best`` said "results/demo/exports/trial-0: Not a directory" (exit 1) of a file
    named ``exports``, and "File exists" of a link to nothing or a loop at ``trial-0``."""
    from tests.report.test_exports import record_measured
    from tuner.space.enumerate import iter_configs
    from tuner.spec.file import load_study

    monkeypatch.chdir(tmp_path)
    spec = load_study("demo")
    record_measured(spec, tmp_path / "results", [(next(iter_configs(spec)), 1.0)])
    folder = Path("results", "demo", "exports", "trial-0")
    folder.parent.mkdir()
    make(folder)
    assert main(["best", "--study", "demo"]) == 2
    shown = words.format(exports=tmp_path / folder.parent)
    assert (
        capsys.readouterr().err == f"tune: error: cannot write the export to {folder}: {shown}\n"
    )


HUGE_LAYOUTS = ["layout:(t|)*99999999999", "layout:Et*" + "9" * 5000 + "|tL"]


@pytest.mark.parametrize("layout", HUGE_LAYOUTS)
def test_a_layout_that_unrolls_past_any_model_is_one_line(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--set 'split=layout:(t|)*99999999999'`` (or the same in a study's
    ``space.pipeline_split``) was a MemoryError traceback from unrolling it; 5,000 digits were
    int()'s own refusal."""
    assert main(["estimate", "--study", "demo", "--set", f"split={layout}", "--set", "pp=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune: error: --set split: layout '") and err.count("\n") == 1, err
    assert "unrolls to over 16,384 characters (a model has at most 4,096 layers)" in err
    data = yaml.safe_load((REPO / "studies" / "demo.yaml").read_text())
    data["space"]["pipeline_split"] = [layout]
    (study := tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    assert main(["space", "--study", str(study)]) == 2
    err = capsys.readouterr().err
    assert "space.pipeline_split[0]" in err and "unrolls to over" in err, err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("value", "words"),
    [("full:uniform:" + "9" * 5000, "N is more layers than any model has (4,096)"),
     ("full:block:5000", "N is more layers than any model has (4,096)"),
     ("full:uniform:\u00b2", "expected full:uniform:N or full:block:N")],
)  # fmt: skip
def test_a_recompute_layer_count_no_model_has_is_one_line(
    value: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``full:uniform:<5,000 digits>`` was int()'s ValueError traceback, and ``full:uniform:²``
    (a digit to ``str.isdigit``, none to ``int``) too."""
    assert main(["estimate", "--study", "demo", "--set", f"recompute={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune: error: --set recompute: '") and words in err, err
    assert err.count("\n") == 1
    data = yaml.safe_load((REPO / "studies" / "demo.yaml").read_text())
    data["space"]["recompute"] = [value]
    (study := tmp_path / "s.yaml").write_text(yaml.safe_dump(data, allow_unicode=True))
    assert main(["space", "--study", str(study)]) == 2
    err = capsys.readouterr().err
    assert "space.recompute" in err and words in err and err.count("\n") == 1, err


def test_a_cluster_file_without_a_model_says_it_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "model: the model to be searched (its GEMM shapes are measured)": a description,
    not that the field is missing, nor what to write."""
    (cluster := tmp_path / "c.yaml").write_text(
        "cluster: {gpu: cpu, gpus_per_node: 2, num_nodes: 1, executor: local}\n"
    )
    assert main(["profile", "--cluster", str(cluster)]) == 2
    assert capsys.readouterr().err == (
        f"tune: error: {cluster}: model: required field is missing: the model whose GEMM shapes "
        "are measured (for example model: {preset: llama3-8b})\n"
    )


def _with_closed(fd: int, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``tune ARGV`` started with descriptor ``fd`` closed (``>&-``, ``2>&-``), its other
    standard output captured in a file."""
    other = cwd / "captured"
    with other.open("w") as f:
        return subprocess.run(
            [sys.executable, "-m", "tuner.cli.main", *argv], cwd=cwd, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=HANG_GUARD_S,
            stdout=f if fd == 2 else None, stderr=f if fd == 1 else None,
            preexec_fn=lambda: os.close(fd),
        )  # fmt: skip


def test_a_closed_standard_output_is_one_line(tmp_path: Path) -> None:
    """``tune space --study demo >&-``: Python leaves ``sys.stdout`` None, and the first line
    printed was an AttributeError's traceback."""
    done = _with_closed(1, ["space", "--study", "demo"], tmp_path)
    assert done.returncode == 2
    err = (tmp_path / "captured").read_text()
    said = "tune: error: standard output is closed (>&-); send it to a file or /dev/null instead\n"
    assert err == CLOSED_STDOUT == said, err


def test_a_closed_standard_error_keeps_the_exit_status(tmp_path: Path) -> None:
    """``2>&-``: the one-line error of a bad study was an AttributeError (exit 1), not 2."""
    done = _with_closed(2, ["space", "--study", "no-such-study"], tmp_path)
    assert done.returncode == 2
    assert (tmp_path / "captured").read_text() == ""


def test_a_results_folder_of_a_user_with_no_home_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--results=~nobody/r`` (the shell expands no ``~`` after ``=``) was a RuntimeError's
    traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(["--results=~no-such-user-here/r", "leaderboard", "--study", "demo"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --results: ~no-such-user-here/r: no home folder "\
        "for ~no-such-user-here" in err, err  # fmt: skip


def test_a_results_folder_under_home_is_the_one_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--results=~/r``: the check was of ``$HOME/r``, the results went to ``./~/r``."""
    from tuner.cli.commands import build_parser, parse_args

    monkeypatch.setenv("HOME", str(tmp_path))
    args = parse_args(build_parser()[0], ["--results=~/r", "leaderboard", "--study", "demo"])
    assert args.results == str(tmp_path / "r")


@pytest.mark.parametrize("argv", [
    ["leaderboard", "--study", "demo", "--format", "csv", "--columns", "no-such-column"],
    ["leaderboard", "--study", "demo", "--format", "markdown", "--columns", "trial"],
    ["estimate", "--study", "demo", "--json", "--columns", "stage"],
    ["space", "--study", "demo", "--json", "--top", "2", "--columns", "rank"],
    ["catalog", "gpus", "--format", "json", "--columns", "name"],
])  # fmt: skip
def test_columns_with_a_format_that_writes_every_field_is_refused(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--columns`` was ignored without a word where ``--format`` writes every field, a name
    no table has included."""
    assert main([*argv, "--results", str(tmp_path)] if argv[0] != "catalog" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--columns picks the table's columns; --format " in err, err


def test_a_report_under_a_file_names_the_option_before_it_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out afile/r.html`` said "afile: File exists", exit 1, once the report was built."""
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "r.html"
    assert main(["report", "--study", "demo", "--results", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"tune: error: --out {out}: the folder {out.parent}: a file, not a folder\n"
