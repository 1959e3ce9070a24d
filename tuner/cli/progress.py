"""Presentation: the live progress display of ``tune run`` and leaderboard rendering."""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console as RichConsole
from rich.console import ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tuner.cli.cost import spent_line
from tuner.cli.render import CONFIG, MIN_WIDTH, Column, Console, Grid, console, fitted, visible
from tuner.config.spelling import spell
from tuner.logs.progress import log_iteration
from tuner.outcome import figure
from tuner.report import units
from tuner.space.cost import trial_limit_s
from tuner.space.trials import measured_value
from tuner.spec.file import study_env_names

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.study.loop import Running, StudyLoop
    from tuner.study.record import Summary

logger = logging.getLogger(__name__)


RUNNING_COLUMNS = (
    Column(name="trial", header="trial", number=True),
    CONFIG,
    Column(name="phase", header="phase", right=False),
    Column(name="left", header="left"),
    Column(name="job", header="Slurm job", right=False),
    Column(name="elapsed", header="elapsed"),
    Column(name="nodes", header="nodes", right=False, wrap=2),
)
"""The live table's columns in priority order (the job, which ``squeue`` and ``scancel`` take,
only while a running trial has a Slurm job): laid out as every table is
(:func:`tuner.cli.render.fit`), so that at 80 columns the last ones are left out and named,
never cut. The live table drew its own box, as wide as its
cells: a 16-node trial's host list took the whole width and the trial, its config, the time
left and the job id were lost."""


PHASE_WHOLE = len("iteration 12345 of 50000")
"""A phase this long is shown whole (``iteration 12 of`` over ``20`` read as a cut figure); a
longer one (queued, with Slurm's reason) folds onto two lines."""


@dataclasses.dataclass(frozen=True, slots=True)
class FittedGrid:
    """A grid laid out when it is drawn, for the width it is drawn at (the terminal's, which
    may change while the live display runs), with the line naming the columns left out."""

    grid: Grid

    def __rich_console__(self, console: RichConsole, options: ConsoleOptions) -> RenderResult:
        table, footer = fitted(self.grid, max(options.max_width, MIN_WIDTH))
        yield table
        if footer:
            yield Text(footer)


def hosts_text(hosts: Sequence[str]) -> str:
    """A trial's nodes: both names of two, else the first and how many more (``gpu001 +15``:
    sixteen names are no column)."""
    return ", ".join(hosts) if len(hosts) <= 2 else f"{hosts[0]} +{len(hosts) - 1}"


class LiveProgress:
    """Running trials, counts by outcome, best so far and budget used; log lines when quiet."""

    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self._live: Live | None = None
        self._last_line = ""

    def __enter__(self) -> LiveProgress:
        if not self.quiet and self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
            self._live = None

    def update(self, loop: StudyLoop) -> None:
        """Called by the loop after every pass."""
        if self._live is not None:
            self._live.update(self._render(loop))
            return
        line = self._line(loop)
        if line != self._last_line:
            logger.info("%s", line)
            self._last_line = line

    def _line(self, loop: StudyLoop) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(loop.summary.outcomes.items()))
        best = loop.best(loop.trials())
        best_text = (f"best {units.seconds(best.value)} s (trial {best.number})"
                     if best and best.value is not None else "no result yet")  # fmt: skip
        phases = "; ".join(f"trial {n} {running_cells(loop, r)[1]}"
                           for n, r in sorted(loop.running.items()))  # fmt: skip
        running = f"running {len(loop.running)}" + (f" ({phases})" if phases else "")
        return f"{running}; {outcomes or 'nothing finished'}; {best_text}"

    def _render(self, loop: StudyLoop) -> Group:
        now = loop.clock()
        rows = []
        for number, run in sorted(loop.running.items()):
            job, phase, left = running_cells(loop, run)
            elapsed = clock_text(now - run.started)
            rows.append((str(number), spell(run.config), visible(phase), left, job, elapsed,
                         hosts_text(run.group.hosts)))  # fmt: skip
        # the job column only where there are jobs (a local study's empty column made its
        # configs fold onto three lines at 80 columns)
        shown = [i for i, c in enumerate(RUNNING_COLUMNS) if c.name != "job"
                 or any(row[i] for row in rows)]  # fmt: skip
        columns = [RUNNING_COLUMNS[i] for i in shown]
        if any(len(row[2]) > PHASE_WHOLE for row in rows):  # a Slurm reason: it may fold
            columns[2] = dataclasses.replace(columns[2], wrap=2)
        grid = Grid(title="running trials", choosable=False, columns=tuple(columns),
                    rows=tuple(tuple(row[i] for i in shown) for row in rows))  # fmt: skip
        running: list[RenderableType] = [Text(grid.title), FittedGrid(grid)]
        trials = loop.trials()
        best = loop.best(trials)
        status = Table.grid(padding=(0, 2))
        status.add_row(
            "outcomes", ", ".join(f"{k}: {v}" for k, v in loop.summary.outcomes.items())
        )
        if best is not None and best.value is not None:
            predicted = best.user_attrs.get("predicted_step_s")
            status.add_row(
                "best measured",
                f"{units.seconds(best.value)} s/step (trial {best.number}, predicted "
                f"{units.seconds(predicted) if predicted else '?'} s)",
            )
        launched = loop.launched_count(trials)
        budget = f"{launched}/{units.plural(loop.n_trials, 'run')}, "
        spent = units.node_hours(loop.node_hours(trials))
        budget += f"{spent} node-hours, {clock_text(now - loop.started)} "
        eta = loop_eta(loop, trials, now)
        budget += "elapsed, " + (f"about {clock_text(eta)} left" if eta is not None
                                 else "time left known after the first trial")  # fmt: skip
        status.add_row("budget", budget)
        return Group(*running, status)

    def final(self, loop: StudyLoop, summary: Summary) -> None:
        """The closing lines of ``tune run``: to a file or a pipe one line each, as every table
        is (a console of its own folded them at 80 columns, in ``make demo``'s log too)."""
        out = console()
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())) or "none"
        out.print(f"stopped: {summary.stop_reason or 'done'}")
        out.print(f"this run: launched {units.plural(summary.launched, 'trial')}; outcomes: "
                  f"{counts}")  # fmt: skip
        out.print(spent_line(loop.trials()))  # the whole study's, every worker's
        space = loop.space_counts
        if space:
            probes = space.get("memory_probes", 0)
            launched = f" but {units.plural(probes, 'memory probe')}" if probes else ""
            out.print(
                f"space: {units.plural(space['total'], 'config')}; {space['invalid']} break a "
                "framework rule and "
                f"{space['predicted_oom']} are predicted to run out of memory (never launched"
                f"{launched}); {space['viable']} fit (tune space --study {loop.spec.study_arg})"
            )
        ratios = model_ratios(loop.measured(loop.trials()).values())
        if ratios:
            out.print(
                f"measured / predicted step time: median {statistics.median(ratios):.2f} "
                f"(range {min(ratios):.2f}-{max(ratios):.2f}, "
                f"{units.plural(len(ratios), 'config')})"
            )
        study = loop.spec.command_args(loop.layout.root)
        if summary.best_step_s is not None:
            out.print(
                f"best: trial {summary.best_trial}, {units.seconds(summary.best_step_s)} s/step "
                f"(tune leaderboard {study})"
            )
            out.print(f"next: tune best {study} writes its launch script, tune report {study} "
                      f"the HTML report (all under {loop.layout.study_dir})")  # fmt: skip
        elif loop.trials():
            out.print(f"no trial measured a step: tune leaderboard {study} --all says how each "
                      "ended")  # fmt: skip
        names = study_env_names(loop.spec.source_path)
        if names:  # set for this run alone (make demo-ssh), the commands above fail as printed
            them = "it" if len(names) == 1 else "them"
            out.print(f"these tune commands need {' and '.join(names)} set as for this run "
                      f"(the study file refers to {them} as ${{NAME}})")  # fmt: skip


def model_ratios(trials: Iterable[FrozenTrial]) -> list[float]:
    """measured / predicted step time of each measured trial: how far to trust the time model."""
    out = []
    for t in trials:
        predicted = figure(t.user_attrs.get("predicted_step_s"))
        if (step := measured_value(t)) is not None and predicted is not None:
            out.append(step / predicted)
    return out


QUEUED_STATES = frozenset({"UNSUBMITTED", "PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD"})
"""A Slurm job's states before it runs (the local and SSH jobs have no state: they start at
once)."""


def clock_text(seconds: float) -> str:
    """``1:02:03`` / ``2:03``: elapsed and remaining times of the live display."""
    whole = max(int(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def running_cells(loop: StudyLoop, run: Running) -> tuple[str, str, str]:
    """A running trial's Slurm job id (empty elsewhere), its phase (queued, starting, iteration
    k of n) and the time left before its limit."""
    job = run.job
    job_id = str(getattr(job, "job_id", None) or "")
    state = str(getattr(job, "state", ""))
    if state in QUEUED_STATES:
        reason = str(getattr(job, "pending_reason", "") or "")
        return job_id, "queued" + (f" ({reason})" if reason else ""), ""
    iteration = log_iteration(job.paths.node_log(0))
    total = loop.spec.launch.train_iters
    phase = "starting" if iteration is None else f"iteration {iteration} of {total}"
    limit = getattr(getattr(job, "request", None), "timeout_s", None)  # as it was launched
    if limit is None:  # the config's own limit follows its predicted step
        trial = getattr(run, "trial", None)
        step = trial.user_attrs.get("predicted_step_s") if trial is not None else None
        limit = trial_limit_s(loop.spec, step)
    return job_id, phase, clock_text(limit - (loop.clock() - run.started))


def budget_eta(
    durations: Sequence[float], to_launch: int, running_elapsed: Sequence[float], slots: int,
    wall_left: float | None = None,
) -> float | None:  # fmt: skip
    """Seconds until the budget is spent: the trials not yet launched at the mean duration of
    the finished ones, ``slots`` at a time, after what the running ones have left; capped by
    the wall-time limit. None until a trial has finished (nothing to go by)."""
    if not durations:
        return wall_left
    mean = statistics.fmean(durations)
    left = [max(mean - e, 0.0) for e in running_elapsed]
    if to_launch <= 0:
        eta = max(left, default=0.0)
    else:
        eta = (sum(left) + to_launch * mean) / max(slots, 1)
    return eta if wall_left is None else min(eta, wall_left)


def loop_eta(loop: StudyLoop, trials: Sequence[FrozenTrial], now: float) -> float | None:
    """:func:`budget_eta` of a running study loop."""
    durations = [float(t.user_attrs["duration_s"]) for t in trials
                 if t.user_attrs.get("duration_s") and t.number not in loop.running]  # fmt: skip
    spec = loop.spec
    groups = max(len(spec.node_names) // max(spec.nodes_per_trial, 1), 1)
    slots = max(groups, len(loop.running), 1)
    wall = spec.search.max_wall_time_min
    wall_left = wall * 60 - (now - loop.started) if wall else None
    to_launch = max(loop.n_trials - loop.launched_count(list(trials)), 0)
    elapsed = [now - r.started for r in loop.running.values()]
    return budget_eta(durations, to_launch, elapsed, slots, wall_left)
