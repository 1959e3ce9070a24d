"""``tune run --dry-run``: the space, the configs launched first, the budget's cost and how the
search goes on, with nothing launched."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tuner.cli import profile as cli_profile
from tuner.cli import render
from tuner.cli.cost import check_launch, cost_json, measurable, print_cost
from tuner.cli.resume import changed
from tuner.cli.tables import (
    _candidate_json,
    _console,
    _counts_table,
    _emit_json,
    launch_first_table,
)
from tuner.report import units
from tuner.spec.study import StudySpec

if TYPE_CHECKING:
    from tuner.space.enumerate import SpaceReport


def dry_run(spec: StudySpec, as_json: bool, n_trials: int | None, results: str, *,
            storage: str | None, force: bool) -> int:  # fmt: skip
    """What ``tune run`` would do (``n_trials``, ``storage``, ``force``: its options), printed or
    as JSON."""
    from tuner.space.enumerate import require_viable

    recorded = stored_fingerprint(spec, storage, results)

    # the ranking the run itself starts from: the cluster profile's rates and the probe's terms
    report: SpaceReport
    report, rates, terms, _ = cli_profile.measured_space(spec, results)
    everything = report.ranked()  # sorted once: costly at 10^5
    lines, calibrated = cli_profile.calibrated_lines(spec, report, 5, results, ranked=everything)
    require_viable(spec, report)
    budget = n_trials or spec.search.n_trials
    ranked = measurable(spec, everything, rates, terms)  # the others are never launched
    if spec.search.sampler == "model":  # one trial per node group, fastest predicted first
        groups = max(len(spec.node_names) // spec.nodes_per_trial, 1)
        first = ranked[: min(groups, budget)]
        then = ("then each measurement corrects the time model and the model sampler proposes "
                "the config with the highest expected improvement")  # fmt: skip
    else:
        first = ranked[: max(spec.search.enqueue_top, 1)]
        then = f"then the {spec.search.sampler} sampler proposes configs"
    check_launch(spec, first)  # a warning on stderr when the first trial could not launch
    if not force and (why := changed(spec, recorded)):  # tune run's refusal, said
        sys.stderr.write(f"tune: warning: {why}\n")  # before the launch, not at it
    cost = cost_json(spec, everything, first, budget, rates, terms, results, report.probes)
    if as_json:
        out = report.counts()
        out["launch_first"] = [_candidate_json(c) for c in first]
        out["n_trials"] = budget
        out["calibrated"] = calibrated
        out["cost"] = cost
        _emit_json(out)
        return 0
    console = _console()
    render.render(console, _counts_table(spec, report.counts()))
    render.render(console, launch_first_table(first, spec.framework))
    print_cost(console, spec, cost)
    if lines and spec.search.sampler == "model":
        for line in lines:
            render.show(console, line)
        console.print("the saved calibration reorders them: the model sampler starts from the "
                      "calibrated ranking")  # fmt: skip
    console.print(f"{then} {until(spec, cost['launches'], budget)}; nothing was launched "
                  "(--dry-run).")  # fmt: skip
    return 0


def until(spec: StudySpec, runs: int, budget: int) -> str:
    """How far the search goes: ``runs`` launches (the budget's, :func:`cost_json`), fewer than
    the ``budget`` (n_trials) when fewer configs may run: ``tune run`` stops once every
    config that may run has run; or sooner, at the study's node-hour or wall-time limit."""
    if runs >= budget:
        out = f"until {units.plural(budget, 'run')}"
    else:
        out = (f"until every config that may run has run: {units.plural(runs, 'run')}, fewer "
               f"than n_trials {budget}")  # fmt: skip
    s, limits = spec.search, []
    if s.max_node_hours:
        limits.append(f"{s.max_node_hours:g} node-hours are spent (max_node_hours)")
    if s.max_wall_time_min:
        limits.append(f"{s.max_wall_time_min:g} min have passed (max_wall_time_min)")
    if not limits:
        return out
    return f"{out} or {' or '.join(limits)}, whichever comes first"


def stored_fingerprint(spec: StudySpec, storage: str | None, results: str) -> object:
    """The fingerprint ``spec``'s stored study was started with (None: no storage there yet, no
    study of this name in it, or one stored before fingerprints), read in the one open of the
    storage that checks it can be read: a one-line error (:func:`tuner.cli.failure.
    exit_status`) when the study's storage is there and ``tune run`` could not open or read it
    (a database cut short, random bytes, another program's database): the dry run planned a
    study that could not start. A storage that is not there, or holds no study of this name, is
    one ``tune run`` makes or adds to. (The storage was opened twice: once for this check, again
    for the fingerprint.)"""
    from pathlib import Path

    from tuner.layout import ResultsLayout
    from tuner.study.schema import schema_checked
    from tuner.study.storage import FINGERPRINT_ATTR, open_storage
    from tuner.study.url import resolve_url

    layout = ResultsLayout(Path(results), spec.name)
    local = resolve_url(storage, layout).local_file
    if local is not None and (not local.is_file() or local.stat().st_size == 0):
        return None
    with schema_checked():  # as the read commands open it: no alembic import at the head schema
        opened = open_storage(storage, layout, create=False)
    stored = [s for s in opened.get_all_studies() if s.study_name == spec.name]
    return stored[0].user_attrs.get(FINGERPRINT_ATTR) if stored else None
