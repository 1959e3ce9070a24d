"""The report's fast paths draw what plotly's checked ones draw, on a study of many trials of
every kind (measured with stated bands, OOMs, failed launches, a log and a command): with the
point traces made and added unchecked and Optuna's views drawn from the trials without copies
(the history and the importances computed here as Optuna computes them),
the whole page is the same bytes but for its time stamp."""

from __future__ import annotations

import copy
import html
import math
import re
from collections.abc import Callable
from pathlib import Path

import optuna
import optuna.visualization as ov
import plotly.graph_objects as go
import pytest
from optuna.trial import FrozenTrial, TrialState

from tests.report.test_report_data import new_study
from tests.test_results import SPEC, config, record
from tuner.layout import ResultsLayout
from tuner.outcome import Outcome
from tuner.report import figures as F
from tuner.report import importances as I
from tuner.report import page as P
from tuner.report import views as V
from tuner.report.data import gather

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def _study(tmp_path: Path, trials: int = 48) -> None:
    study = new_study(tmp_path)
    shapes = [(tp, mbs) for tp in (1, 2, 4, 8) for mbs in (1, 2)]
    for i in range(trials):
        tp, mbs = shapes[i % len(shapes)]
        attrs: dict[str, object] = {
            "predicted_step_s": 1.0 + 0.1 * i, "predicted_peak_gib": 30.0 + i % 17,
            "launched": True, "duration_s": 60.0 + i, "hosts": ["a", "b"],
            "predicted_peak_stage": 1, "predicted_peak_phase": "fwd_bwd",
        }  # fmt: skip
        if i % 5:  # some stored without their stated sds (no band bar)
            attrs |= {"predicted_step_sd": 0.1, "predicted_peak_sd": 0.05}
        if i % 7 == 3:
            record(study, SPEC, config(tp, mbs), Outcome.OOM, reason="CUDA out of memory",
                   **attrs)  # fmt: skip
        elif i % 11 == 5:
            record(study, SPEC, config(tp, mbs), Outcome.LAUNCH_ERROR,
                   reason=f"no megatron & no <{i}> in 'PATH'", **attrs)  # fmt: skip
        else:  # an int peak now and then: plotly keeps it an int, checked or not
            peak = 50 if i % 4 == 0 else 40.0 + (i % 9) / 3
            record(study, SPEC, config(tp, mbs), Outcome.OK, 3.0 + (i * 7 % 13) / 5,
                   peak_memory_gib=peak, **attrs)  # fmt: skip
    trial = ResultsLayout(tmp_path, SPEC.name).trial(3)
    trial.node_log(0).parent.mkdir(parents=True, exist_ok=True)
    trial.node_log(0).write_text("".join(f"line {i}\n" for i in range(100)))
    trial.launch_script(0).write_text("#!/bin/bash\nexec torchrun pretrain_gpt.py --tp 2\n")


def test_the_page_is_the_one_plotlys_checked_paths_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _study(tmp_path)
    data = gather(SPEC, results=str(tmp_path))
    fast = P.render(data, P.sections(data))
    monkeypatch.setattr(F, "FAST_POINTS", False)
    monkeypatch.setattr(F, "views_study", _checked_study)
    monkeypatch.setattr(F, "history", _optuna_history)
    monkeypatch.setattr(F, "plot_param_importances", I._optunas)
    monkeypatch.setattr(V, "_escaped", html.escape)  # each text escaped, none remembered
    checked = P.render(data, P.sections(data))

    def stamped(page: str) -> str:
        return re.sub(r"report written [^<]*", "report written", page)

    assert "tp2" in fast and "fig-optuna_importances" in fast and "line 99" in fast
    assert "no megatron &amp; no &lt;5&gt; in &#x27;PATH&#x27;" in fast
    assert stamped(fast) == stamped(checked)


def test_the_template_is_copied_without_plotlys_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the one copy plotly makes, no figure rebuilds the template (plotly's deep copy of
    a named template, 11 ms a figure); the page above is the checked one's."""
    _study(tmp_path, trials=12)
    data = gather(SPEC, results=str(tmp_path))
    F._checked_props()

    def rebuilt(self: object) -> None:
        raise AssertionError("a template rebuilt by plotly's deep copy")

    monkeypatch.setattr(go.layout.Template, "__reduce__", rebuilt)
    figures = [f for s in P.sections(data) for _, f in s.figures]
    assert len(figures) > 5
    assert all(f.layout.template.layout.paper_bgcolor == "white" for f in figures)


def _checked_study(name: str, trials: list[FrozenTrial]) -> optuna.Study:
    """Optuna's own in-memory study of ``trials``: each checked, copied and numbered by
    ``Study.add_trials``."""
    storage = optuna.storages.InMemoryStorage()
    storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
    study = optuna.Study(study_name=name, storage=storage)
    study.add_trials(trials)
    return study


def _optuna_history(
    trials: list[FrozenTrial], target: Callable[[FrozenTrial], float], name: str
) -> go.Figure:
    """The history as Optuna draws it, of Optuna's own in-memory study of ``trials``, the
    target negated back."""
    fig = ov.plot_optimization_history(_checked_study(SPEC.name, trials), target=target,
                                       target_name=name)  # fmt: skip
    for trace in fig.data:
        if trace.y is not None:
            trace.y = [-v for v in trace.y]
    return fig.update_layout(yaxis_title=name, template="plotly_white")


def test_the_history_is_optunas_drawn_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimization history is the figure Optuna draws (its JSON), checked or not, on
    trials with infinite and odd values too; the report's does not call Optuna's."""
    _study(tmp_path)
    data = gather(SPEC, results=str(tmp_path))
    complete = [t for t in data.trials if t.value]
    target = F._throughput_target(data)
    assert len(complete) > 20
    infinite = copy.copy(complete[5])
    infinite.values = [math.inf]
    odd = [*complete[:5], infinite]
    for trials in (complete, complete[:2], odd):
        want = _optuna_history(trials, target, "tokens/s/GPU").to_json()
        assert F.history(trials, target, "tokens/s/GPU").to_json() == want
        monkeypatch.setattr(F, "FAST_POINTS", False)
        assert F.history(trials, target, "tokens/s/GPU").to_json() == want
        monkeypatch.setattr(F, "FAST_POINTS", True)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("drawn through Optuna's history")

    monkeypatch.setattr(ov, "plot_optimization_history", refused)
    figures, _ = F.optuna_views(data)
    assert figures[0][0] == "optuna_history" and len(figures[0][1].data[0].x) == len(complete)


def test_the_importances_study_reads_its_trials_without_copies(tmp_path: Path) -> None:
    _study(tmp_path, trials=12)
    complete = [t for t in gather(SPEC, results=str(tmp_path)).trials if t.value]
    study = F.views_study(SPEC.name, complete)
    assert study.trials[-1] is study.get_trials(deepcopy=True)[-1]
    assert [t.number for t in study.trials] == list(range(len(complete)))


def test_the_views_study_holds_what_add_trials_stores_without_its_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The views' study holds the trials ``Study.add_trials`` stores (numbered and with ids by
    their place, the same values, parameters, distributions and times), without calling it:
    its check of each trial was 0.13 s of CPU at 10,000 trials."""
    _study(tmp_path)
    complete = [t for t in gather(SPEC, results=str(tmp_path)).trials if t.value]
    assert len(complete) > 20
    checked = _checked_study(SPEC.name, complete).get_trials(deepcopy=False)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the views' study checked its trials one by one")

    monkeypatch.setattr(optuna.Study, "add_trial", refused)
    monkeypatch.setattr(optuna.Study, "add_trials", refused)
    study = F.views_study(SPEC.name, complete)
    held = study.get_trials(deepcopy=False)
    assert held == checked  # FrozenTrial's equality: every field, the number and id too
    assert [t._trial_id for t in held] == [t._trial_id for t in checked]
    assert study.get_trials(states=(TrialState.COMPLETE,)) == checked
    assert study.get_trials(states=(TrialState.PRUNED,)) == []
    assert [t.number for t in complete] != [t.number for t in held]  # renumbered copies
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE]


def test_a_trial_views_bar_is_the_most_loaded_of_all_the_stages() -> None:
    """On every viable config of a 70B space (up to 16 stages, interleaved, uneven loads):
    the bar the view shows from the stages the bounds keep is the one from all of them,
    the same words; most configs leave stages out (the test would not show much otherwise)."""
    from tuner.report.data import MemoryBreakdown, estimate_memory, most_loaded_bars, stage_memory
    from tuner.space.enumerate import enumerate_space, study_gpu
    from tuner.spec.file import study_from_mapping

    spec = study_from_mapping({
        "name": "bars", "model": {"preset": "gpt-70b"},
        "training": {"global_batch_size": 1024, "precision": "bf16"},
        "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 16,
                    "executor": "local"},
        "framework": "megatron", "launch": {"template": "megatron_gpt"},
        "space": {"tp": [2, 4, 8], "pp": "auto", "cp": [1, 2], "vp": [1, 2],
                  "micro_batch_size": [1, 2], "recompute": ["none", "selective", "full"],
                  "sequence_parallel": [True], "distributed_optimizer": [True, False]},
    })  # fmt: skip
    gpu, fewer, shown = study_gpu(spec), 0, 0
    for estimate in enumerate_space(spec, with_time=False).ranked():
        c = estimate.config
        full = estimate_memory(spec.model, c, gpu, spec.framework, spec.training.precision)
        every = stage_memory(MemoryBreakdown(full.stages))
        kept = most_loaded_bars(spec, c, gpu)
        assert max(kept, key=lambda s: s.total) == max(every, key=lambda s: s.total), c.key()
        fewer += len(kept) < len(every)
        shown += 1
    assert shown > 100 and fewer > shown // 2, (shown, fewer)
