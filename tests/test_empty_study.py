"""``tune leaderboard``, ``best`` and ``report`` on a study with no measured trial say why and
what to do: the leaderboard printed an empty table (a header and a rule), ``best`` only "no
successful trial yet", ``report`` only where it wrote a page with nothing on it."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from tuner.cli.main import main
from tuner.layout import ResultsLayout
from tuner.spec.file import load_study

STUDY = "demo"


def _stored(results: Path, failed: int = 0, running: int = 0) -> None:
    """The study's storage with ``failed`` trials that ended without a step time and
    ``running`` ones still going (none at all: a study created and stopped before any)."""
    layout = ResultsLayout(results, load_study(STUDY).name)
    layout.storage_path.parent.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=STUDY, storage=layout.storage_url)
    for _ in range(failed):
        attrs = {"outcome": "oom", "reason": "CUDA out of memory", "config": None}
        study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=attrs))
    for _ in range(running):
        study.ask()


def _tune(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_study_with_no_trial_says_to_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = ["--results", str(tmp_path / "results")]
    code, text = _tune(capsys, "leaderboard", "--study", STUDY, *results)  # no storage at all
    assert code == 2 and "tune run --study demo writes them" in text, text
    _stored(tmp_path / "results")
    run = f"tune run --study demo --results {tmp_path / 'results'} runs them"  # not ./results
    for command in (["leaderboard"], ["leaderboard", "--all"]):
        code, text = _tune(capsys, *command, "--study", STUDY, *results)
        assert code == 0 and run in text, text
        assert "rank" not in text  # no empty table
    code, text = _tune(capsys, "best", "--study", STUDY, *results)
    assert code == 2 and run in text, text
    code, text = _tune(capsys, "report", "--study", STUDY, *results)
    assert code == 0 and "report.html" in text and run in text, text


def test_the_hint_names_results_only_where_it_is_not_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _stored(Path("results"))
    for command in (["leaderboard"], ["best"], ["report"]):
        code, text = _tune(capsys, *command, "--study", STUDY)
        assert "tune run --study demo runs them" in text and "--results" not in text, text


def test_trials_without_a_step_time_are_counted_and_all_shows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = ["--results", str(tmp_path / "results")]
    _stored(tmp_path / "results", failed=2, running=1)
    code, text = _tune(capsys, "leaderboard", "--study", STUDY, *results)
    assert code == 0 and "1 still running" in text, text
    assert "2 ended without a step time" in text, text
    assert f"--study demo --results {tmp_path / 'results'} --all" in text, text
    code, text = _tune(capsys, "best", "--study", STUDY, *results)
    assert code == 2 and "--all" in text, text
    code, text = _tune(capsys, "leaderboard", "--study", STUDY, "--all", *results)
    assert code == 0 and "oom" in text and "rank" in text, text  # --all: the table of them


@pytest.mark.parametrize("stopped_in", ["study_rates", "SharedSpace", "make_sampler"])
def test_a_run_stopped_before_its_study_leaves_no_storage(
    stopped_in: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A Ctrl-C while ``tune run`` built the space (seconds on a large one) left ``study.db``
    with Optuna's tables and no study in it; the next leaderboard said the study "is not in
    the storage" instead of that it has not run yet."""
    from tuner.study import build

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(build, stopped_in, stopped)
    results = tmp_path / "results"
    with pytest.raises(KeyboardInterrupt):
        build.build_loop(load_study(STUDY), results=str(results))
    assert not ResultsLayout(results, STUDY).storage_path.exists()
    code, text = _tune(capsys, "leaderboard", "--study", STUDY, "--results", str(results))
    assert code == 2 and "tune run --study demo writes them" in text, text
