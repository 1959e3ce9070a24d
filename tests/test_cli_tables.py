"""Tables that fit: ``space``, ``leaderboard``, ``estimate`` and ``calibrate`` rendered at 80 and
160 columns against golden files, the plain form for files, ``--columns``, and the one spelling
of a config (the long ``tp=..,pp=..`` key only in JSON and CSV).

The study's trials are stored the way the loop stores them (the same user attributes, told to a
real Optuna storage at the results folder's path), with measured figures derived from the
models' predictions so that the golden files are fixed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from tuner.cli.main import main
from tuner.layout import ResultsLayout
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec

GOLDEN = Path(__file__).parent / "golden" / "cli"
STUDY = "gpt-70b"
RECORD = "TUNER_RECORD_GOLDEN"


def _attrs(spec: StudySpec, candidate: object, slower: float) -> dict[str, object]:
    c = candidate.config  # type: ignore[attr-defined]
    t = candidate.time  # type: ignore[attr-defined]
    step = round(t.step * slower, 4)
    tokens = spec.training.global_batch_size * spec.model.seq_length / step
    return {
        "config": dataclasses.asdict(c), "key": c.key(), "outcome": "ok", "reason": "",
        "hosts": [f"node{i:03d}" for i in range(spec.nodes_per_trial)],
        "predicted_step_s": t.step, "step_time_s": step, "tokens_per_s": tokens,
        "tflops_per_gpu": round(t.model_tflops_per_gpu / slower, 1), "mfu": t.mfu / slower,
        "predicted_peak_gib": candidate.memory.peak / 2**30,  # type: ignore[attr-defined]
        "predicted_allocated_gib": candidate.memory.peak / 2**30 * 0.9,  # type: ignore[attr-defined]
        "peak_memory_gib": round(candidate.memory.peak / 2**30 * 0.85, 2),  # type: ignore[attr-defined]
        "duration_s": 300.0 + 10 * slower,
    }  # fmt: skip


def store_study(spec: StudySpec, results: Path) -> list[optuna.trial.FrozenTrial]:
    """Six measured configs (the predicted top six, each measured 5-15 % slower) and a failed
    one, told to the study's storage; returns the trials."""
    from tuner.space.enumerate import enumerate_space

    layout = ResultsLayout(results, spec.name)
    layout.storage_path.parent.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=spec.name, storage=layout.storage_url)
    ranked = enumerate_space(spec).ranked()
    for i, candidate in enumerate(ranked[:6]):
        attrs = _attrs(spec, candidate, 1.05 + 0.02 * i)
        study.add_trial(create_trial(value=attrs["step_time_s"], user_attrs=attrs))  # type: ignore[arg-type]
    failed = _attrs(spec, ranked[7], 1.0) | {
        "outcome": "nccl_timeout", "step_time_s": None, "tokens_per_s": None, "mfu": None,
        "tflops_per_gpu": None, "peak_memory_gib": None,
        "reason": "NCCL watchdog: collective operation timed out after 600000 ms on rank 17 "
        "(ALLREDUCE, 268435456 elements)",
    }  # fmt: skip
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=failed))
    return study.get_trials(deepcopy=False)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with the stored study and its cluster's calibration."""
    from tuner.calibrate.store import record_study

    results = tmp_path_factory.mktemp("tables") / "results"
    spec = load_study(STUDY)
    trials = store_study(spec, results)
    record_study(spec, trials, 80.0, results, now=dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    return results


def run(argv: list[str], columns: int | None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> str:  # fmt: skip
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    assert main(argv) == 0
    return capsys.readouterr().out


COMMANDS = {
    "space": ["space", "--study", STUDY, "--top", "5"],
    "leaderboard": ["leaderboard", "--study", STUDY, "--all"],
    "estimate": ["estimate", "--study", STUDY, "--set", "tp=8", "--set", "pp=4", "--set", "sp=1",
                 "--set", "vp=5", "--set", "recompute=selective"],
    "calibrate": ["calibrate", "--study", STUDY],
}  # fmt: skip


def _check_golden(name: str, text: str, results: Path) -> None:
    text = text.replace(str(results.resolve()), "RESULTS").replace(str(results), "RESULTS")
    path = GOLDEN / name
    if os.environ.get(RECORD):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}; record it with {RECORD}=1"
    assert text == path.read_text(), (
        f"{path.name} differs from its golden file; if the change is intended, re-record with "
        f"{RECORD}=1 pytest {__file__}"
    )


@pytest.mark.parametrize("width", [80, 160, None])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_tables_fit_and_match_their_golden_files(
    command: str, width: int | None, stored: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """At 80 and 160 columns every table line fits; without a width (a file) the plain form;
    never an ellipsis, never the machine key."""
    text = run([*COMMANDS[command], "--results", str(stored)], width, capsys, monkeypatch)
    lines = text.splitlines()
    table_lines = [ln for ln in lines if "─" in ln or "  " in ln.strip()]
    assert table_lines, text
    for line in table_lines if width else ():
        assert len(line.rstrip()) <= width, line
    assert "…" not in text and "..." not in text
    assert "tp=" not in text  # the machine key never reaches a person
    _check_golden(f"{command}-{width or 'plain'}.txt", text, stored)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_json_form_keeps_every_field(
    command: str, stored: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    argv = [*COMMANDS[command], "--results", str(stored)]
    flag = ["--format", "json"]
    data = json.loads(run([*argv, *flag], 80, capsys, monkeypatch))
    configs = {"space": lambda d: d["top"][0]["config"], "estimate": lambda d: d["config"],
               "calibrate": lambda d: d["trials"][0]["config"],
               "leaderboard": lambda d: d[0]}  # fmt: skip
    config = configs[command](data)
    assert {"tp", "pp", "dp"} <= set(config)  # every knob by its full name


def test_a_file_gets_the_plain_form_with_every_column(
    stored: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = run(["leaderboard", "--study", STUDY, "--all", "--results", str(stored)], None,
               capsys, monkeypatch)  # fmt: skip
    assert "─" not in text and "left out" not in text
    header = next(line for line in text.splitlines() if line.startswith("rank"))
    for head in ("trial", "config", "step s", "MFU %", "pred peak GiB", "took s", "reason"):
        assert head in header
    reason = next(line for line in text.splitlines() if "nccl_timeout" in line)
    assert "timed out after 600000 ms on rank 17 (ALLREDUCE, 268435456 elements)" in reason


def test_columns_picks_and_orders_any_field(
    stored: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["leaderboard", "--study", STUDY, "--results", str(stored), "--columns",
            "trial,zero_stage,mfu,rank"]  # fmt: skip
    text = run(argv, 80, capsys, monkeypatch)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("trial"))
    assert lines[head].split() == ["trial", "zero_stage", "MFU", "%", "rank"]
    first = lines[head + 2].split()
    assert first == ["0", "0", "51.6", "1"]
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*argv[:-1], "trial,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--columns: no column 'nope'" in err[0]


@pytest.mark.parametrize(
    ("extra", "says"),
    [(["--top", "3", "--columns", "rank,nope"], "no column 'nope'"),
     (["--columns", "rank"], "add --top K")],
)  # fmt: skip
def test_space_refuses_columns_it_cannot_show(
    extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A column the top table lacks, or --columns with no top table to choose from, is one
    line and exit 2 before the space is enumerated, not silently ignored."""
    assert main(["space", "--study", "llama3-8b", *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and not captured.out


def test_machine_formats_keep_the_full_key(
    stored: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["leaderboard", "--study", STUDY, "--results", str(stored), "--format"]
    rows = json.loads(run([*base, "json"], 80, capsys, monkeypatch))
    assert rows[0]["key"].startswith("tp=4,pp=4,cp=1,dp=32,vp=4,sp=1,mbs=1,")
    assert rows[0]["mfu"] < 1  # a share in the machine form; the table shows a percent
    csv = run([*base, "csv"], 80, capsys, monkeypatch)
    assert "tp=4,pp=4,cp=1,dp=32" in csv and ",key" in csv.splitlines()[0]
    space = json.loads(run(["space", "--study", STUDY, "--top", "2", "--json"], 80, capsys,
                           monkeypatch))  # fmt: skip
    assert space["top"][0]["config"]["tp"] == 4


@pytest.mark.parametrize(
    "command", ["estimate", "space", "run", "leaderboard", "catalog", "calibrate"]
)
def test_help_explains_every_abbreviation(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.cli.board import BOARD_COLUMNS
    from tuner.cli.tables import STAGE_COLUMNS, TOP_COLUMNS
    from tuner.config.spelling import KNOBS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    for knob in KNOBS:
        assert knob.name in text and knob.meaning[:30] in text.replace("\n", " ")
    columns = {"leaderboard": BOARD_COLUMNS, "space": TOP_COLUMNS, "run": TOP_COLUMNS,
               "estimate": STAGE_COLUMNS}  # fmt: skip
    flat = " ".join(text.split())
    for column in columns.get(command, ()):
        # each with what it means: estimate's per-stage columns had their headers alone
        # ("in_flight  in-flight micro-b.", "buffers  buffers GiB")
        assert column.meaning, column.name
        assert " ".join(column.header.split()) in flat, column.header
        assert " ".join(column.meaning.split()) in flat, column.meaning
    assert "GiB 2^30 bytes" in text


def test_counts_in_correct_english() -> None:
    from tuner.report.units import plural

    assert plural(1, "trial") == "1 trial" and plural(2, "trial") == "2 trials"
    assert plural(0, "config") == "0 configs"


def _grid(minor: bool) -> object:
    from tuner.cli.render import Column, Grid

    return Grid(
        title="t",
        columns=(Column(name="a", header="a"), Column(name="text", header="text", wrap=2),
                 Column(name="b", header="bbbbbb"), Column(name="c", header="cccccc", minor=minor),
                 Column(name="d", header="dddddddddd")),
        rows=(("1", "one two three four", "2", "3", "4"),),
    )  # fmt: skip


def test_fit_keeps_priority_order_folds_only_text_and_names_what_it_leaves_out() -> None:
    from tuner.cli.render import GAP, fit

    wide = 1 + 18 + 6 + 6 + 10 + 4 * GAP
    assert fit(_grid(False), wide) == ([0, 1, 2, 3, 4], [None] * 5, [])  # type: ignore[arg-type]
    # one column short: the text folds onto two lines before anything is left out
    assert fit(_grid(False), wide - 1) == (  # type: ignore[arg-type]
        [0, 1, 2, 3, 4],
        [None, 17, None, None, None],
        [],
    )
    # narrower: the lowest priority goes first and is named
    kept, _, dropped = fit(_grid(False), 1 + 16 + 6 + 6 + 3 * GAP)  # type: ignore[arg-type]
    assert kept == [0, 1, 2, 3] and dropped == ["d"]
    # a minor column below the text gives way rather than fold it
    assert fit(_grid(True), wide - 1) == (  # type: ignore[arg-type]
        [0, 1, 2, 4],
        [None] * 4,
        ["c"],
    )


def test_the_config_folds_onto_two_lines_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's dry run at 80 columns printed its first config on three lines
    (``tp4 pp8 dp4 sp`` / ``mbs1 ga128`` / ``distopt``): the width was taken as half the text's
    length, but a line breaks only between words. Now the column is as wide as two lines of
    whole words need, and a figure column makes way for it instead."""
    import io

    from rich.console import Console

    from tuner.cli.render import Grid, render
    from tuner.cli.tables import TOP_COLUMNS

    monkeypatch.setenv("COLUMNS", "80")
    config = "tp4 pp8 dp4 sp mbs1 ga128 distopt"
    row = ("1", config, "30.47", "1,076", "52.4", "68.6", "1.404", "2.608", "0.002250")
    out = io.StringIO()
    render(Console(file=out, width=80), Grid(title="", columns=TOP_COLUMNS, rows=(row,)))
    body = [line for line in out.getvalue().splitlines()[2:] if not line.startswith("left out")]
    folded = [line[6:].split("  ")[0].strip() for line in body]  # under the header and rule
    assert " ".join(folded).split() == config.split(), out.getvalue()
    assert len(folded) <= 2, out.getvalue()


def test_a_path_column_folds_inside_the_path_rather_than_push_figures_out() -> None:
    from tuner.cli.render import Column, Grid, fit

    long = "/scratch/alice/runs/2026-12-06/llama-70b/trials/17/node-3.log"  # 61, one word
    grid = Grid(
        title="t", rows=((long, "ok", "6.801", "55.6"),),
        columns=(Column(name="file", header="file", right=False, wrap=3, path=True),
                 Column(name="outcome", header="outcome", right=False),
                 Column(name="step", header="step s"), Column(name="peak", header="peak GiB")),
    )  # fmt: skip
    kept, widths, dropped = fit(grid, 60)  # type: ignore[arg-type]
    assert kept == [0, 1, 2, 3] and dropped == [] and widths[0] is not None and widths[0] < 61
    as_text = Grid(title="t", rows=grid.rows, columns=(
        dataclasses.replace(grid.columns[0], path=False), *grid.columns[1:]))  # fmt: skip
    assert fit(as_text, 60)[2] == ["file"]  # type: ignore[arg-type]  # one word: left out whole


def test_columns_of_zeros_are_named_not_shown() -> None:
    from tuner.cli.render import Column, Grid, without_zeros

    grid = Grid(
        title="t", columns=(Column(name="a", header="a"), Column(name="z", header="z s"),
                            Column(name="w", header="w", right=False)),
        rows=(("1", "0", "0"), ("2", "0", "x")),
    )  # fmt: skip
    out = without_zeros(grid)
    assert [c.name for c in out.columns] == ["a", "w"] and out.rows == (("1", "0"), ("2", "x"))
    assert out.notes == ("0 in every row: z",)


def test_the_dry_run_names_no_option_tune_run_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns the dry run's first-launch table leaves columns out; its note said
    '--columns chooses', which tune run refuses; tune space --top, which takes it, says so."""
    results = ["--results", str(tmp_path / "results")]
    text = run(["run", "--study", STUDY, "--dry-run", *results], 80, capsys, monkeypatch)
    notes = [ln for ln in text.splitlines() if ln.startswith("left out to fit 80 columns")]
    assert notes and not any("--columns" in ln for ln in notes), text
    text = run(["space", "--study", STUDY, "--top", "5", *results], 80, capsys, monkeypatch)
    assert "; --columns chooses" in text


@pytest.mark.parametrize(
    "command",
    [[], ["estimate"], ["space"], ["run"], ["leaderboard"], ["best"], ["profile"], ["calibrate"],
     ["catalog"], ["parse-log"], ["report"]],
)  # fmt: skip
def test_help_fits_an_80_column_terminal(
    command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epilogs' legend lines (up to 130 characters) and argparse's choice lists (``--emit
    {script,...}``, 88) ran past 80 columns, where the terminal broke them at the left margin.
    Folded, every line fits and every knob's and column's meaning is still there, word for
    word."""
    import re

    from tuner.cli.board import BOARD_COLUMNS
    from tuner.config.spelling import KNOBS

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if len(line) > 80] == []
    words = " ".join(text.split())
    if command in (["estimate"], ["space"], ["leaderboard"]):
        board = [c.meaning for c in BOARD_COLUMNS] if command == ["leaderboard"] else []
        for meaning in [k.meaning for k in KNOBS] + board:
            assert " ".join(meaning.split()) in words, meaning
    if command == ["best"]:
        assert re.search(r"script, sbatch, args, ds-config", words)


def test_every_knob_meaning_lines_up_in_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``1F1B / GPipe / Interleaved1F1B`` and ``reshard-always / reshard-never`` are longer
    than the glossary's name column: their meanings ran on after one space, off the column, and
    the folded rest hung at the left margin. Each meaning now begins in the meaning column
    (under a long name, on the next line) and its folded rest continues under it."""
    from tuner.config.spelling import KNOBS

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["leaderboard", "--help"])
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("config spelling (knobs equal in every row are named once above a table):")
    end = next(i for i, line in enumerate(lines) if line.startswith("columns ("))
    glossary = lines[start + 1 : end]
    column = glossary[0].index(KNOBS[0].meaning)  # where the first knob's meaning begins
    for line in glossary:
        assert line[2] != " " or line[:column].isspace() and line[column] != " ", line
    meanings = " ".join(line[column:] for line in glossary if len(line) > column)
    for knob in KNOBS:
        assert " ".join(knob.meaning.split()) in " ".join(meanings.split()), knob.name
