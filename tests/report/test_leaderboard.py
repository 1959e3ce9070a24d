"""The leaderboard's storage: opened once per process, and still current when other workers add
or finish trials (Optuna's cached storage re-reads what is unfinished or new)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.errors import StudyError
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.report.data import gather
from tuner.report.leaderboard import best_trial, leaderboard, load_optuna_study
from tuner.space.enumerate import enumerate_space
from tuner.space.trials import distributions
from tuner.space.trials import measured as trials_measured
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec
from tuner.study.loop import fastest
from tuner.study.storage import open_storage, open_study

STUDY: dict[str, Any] = {
    "name": "board",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "num_nodes": 2, "executor": "local"},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt"},
    "space": {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch_size": [1, 2]},
    "search": {"sampler": "random"},
}


def other_worker(spec: StudySpec, results: Path) -> optuna.Study:
    """The study as another ``tune run`` process opens it: its own storage connection."""
    layout = ResultsLayout(results, spec.name)
    return optuna.load_study(study_name=spec.name, storage=open_storage(None, layout))


def add(study: optuna.Study, spec: StudySpec, index: int, step: float | None) -> optuna.Trial:
    """A trial of the ``index``-th viable config, measured at ``step`` (None: still running)."""
    config = enumerate_space(spec).ranked()[index].config
    trial = study.ask(distributions(spec))
    trial.set_user_attr("config", dataclasses.asdict(config))
    trial.set_user_attr("key", config.key())
    trial.set_user_attr("launched", True)
    if step is not None:
        finish(study, trial, step)
    return trial


def finish(study: optuna.Study, trial: optuna.Trial, step: float) -> None:
    trial.set_user_attr("outcome", str(Outcome.OK))
    trial.set_user_attr("step_time_s", step)
    trial.set_user_attr("tokens_per_s", 1e6 / step)
    study.tell(trial, step)


def test_a_trial_added_or_finished_by_another_worker_is_seen(tmp_path: Path) -> None:
    spec = study_from_mapping(STUDY)
    layout = ResultsLayout(tmp_path, spec.name)
    layout.study_dir.mkdir(parents=True)
    open_study(spec, open_storage(None, layout), optuna.samplers.RandomSampler(), force=False,
               url=None, layout=layout)  # fmt: skip
    worker = other_worker(spec, tmp_path)
    add(worker, spec, 0, 2.0)
    running = add(worker, spec, 1, None)
    board = leaderboard(spec, results=str(tmp_path))
    assert list(board["measured_step_s"]) == [2.0]
    assert len(leaderboard(spec, results=str(tmp_path), include_all=True)) == 2
    opened = load_optuna_study(spec, None, str(tmp_path))

    finish(worker, running, 1.0)  # the running one ends, a new one is added, elsewhere
    add(worker, spec, 2, 3.0)
    assert load_optuna_study(spec, None, str(tmp_path)) is opened  # opened once ...
    board = leaderboard(spec, results=str(tmp_path))
    assert list(board["measured_step_s"]) == [1.0, 2.0, 3.0]  # ... and current
    assert best_trial(spec, None, str(tmp_path)).number == running.number


def test_a_storage_made_anew_is_not_read_from_the_old_one(tmp_path: Path) -> None:
    spec = study_from_mapping(STUDY)
    layout = ResultsLayout(tmp_path, spec.name)
    for step in (2.0, 5.0):
        layout.study_dir.mkdir(parents=True, exist_ok=True)
        study = open_study(spec, open_storage(None, layout), optuna.samplers.RandomSampler(),
                           force=False, url=None, layout=layout)  # fmt: skip
        add(study, spec, 0, step)
        assert list(leaderboard(spec, results=str(tmp_path))["measured_step_s"]) == [step]
        keep = tmp_path / "old.db"  # moved aside (not deleted: its inode stays taken)
        layout.storage_path.rename(keep.with_suffix(f".{int(step)}"))


def test_no_results_yet_is_one_line(tmp_path: Path) -> None:
    from tuner.errors import StudyError

    with pytest.raises(StudyError, match="no results"):
        leaderboard(study_from_mapping(STUDY), results=str(tmp_path))


def test_a_figure_that_is_not_a_number_above_zero_never_wins(tmp_path: Path) -> None:
    """A stored (or hand-edited) tokens/s of inf, NaN, 0 or below, or a step time of no figure,
    is shown as stored and ranked after every real measurement: never the leaderboard's top,
    ``tune best``'s pick, the report's best, nor the loop's."""
    spec = study_from_mapping(STUDY)
    layout = ResultsLayout(tmp_path, spec.name)
    layout.study_dir.mkdir(parents=True)
    open_study(spec, open_storage(None, layout), optuna.samplers.RandomSampler(), force=False,
               url=None, layout=layout)  # fmt: skip
    worker = other_worker(spec, tmp_path)
    bad = [(3.0, math.inf), (3.0, math.nan), (-1.0, -1e6), (4.0, 0.0), (0.0, 2e6)]
    for index, (step, tokens) in enumerate(bad[:2]):  # before the real one: no tie on number
        recorded(worker, spec, index, step, tokens)
    real = add(worker, spec, 2, 2.0).number
    for index, (step, tokens) in enumerate(bad[2:], 3):
        recorded(worker, spec, index, step, tokens)
    board = leaderboard(spec, results=str(tmp_path))
    assert list(board["trial"])[0] == real and len(board) == len(bad) + 1
    assert math.isinf(board["tokens_per_s"][1])  # shown as stored
    assert best_trial(spec, None, str(tmp_path)).number == real
    data = gather(spec, results=str(tmp_path))
    assert data.best is not None and data.best.number == real
    assert [r.number for r in data.measured][0] == real
    unranked = [r for r in data.measured if not r.ranked]  # shown with no tokens/s: no figure
    assert len(unranked) == len(bad) and {r.tokens_per_s_per_gpu for r in unranked} == {None}
    trials = worker.get_trials(deepcopy=False)
    done = fastest(trials_measured(trials).values())
    assert done is not None and done.number == real
    assert fastest(t for t in trials if float(t.value or 0.0) <= 0) is None  # the loop: by step


def recorded(study: optuna.Study, spec: StudySpec, index: int, step: float, tokens: float) -> None:
    """A measured trial whose stored figures are ``step`` and ``tokens``, as written."""
    trial = add(study, spec, index, None)
    trial.set_user_attr("outcome", str(Outcome.OK))
    trial.set_user_attr("step_time_s", step)
    trial.set_user_attr("tokens_per_s", tokens)
    study.tell(trial, step)


def test_a_storage_without_the_study_names_those_it_holds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = study_from_mapping(STUDY)  # "board"
    for name in ("Board", "other"):
        optuna.create_study(study_name=name, storage=url)
    with pytest.raises(StudyError) as info:
        leaderboard(spec, storage=url, results=str(tmp_path))
    assert str(info.value).endswith(
        "study 'board' is not in the storage; did you mean 'Board'? (it holds 'Board', 'other')"
    )
