"""Presentation: the live progress display of ``tune run`` and leaderboard rendering."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from tuner.cli.cost import spent_line

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.study.loop import StudyLoop
    from tuner.study.record import Summary

logger = logging.getLogger(__name__)


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
        best_text = f"best {best.value:.3f} s (trial {best.number})" if best else "no result yet"
        return f"running {len(loop.running)}; {outcomes or 'nothing finished'}; {best_text}"

    def _render(self, loop: StudyLoop) -> Group:
        now = loop.clock()
        running = Table(title="running trials")
        for col in ("trial", "nodes", "config", "elapsed"):
            running.add_column(col)
        for number, run in sorted(loop.running.items()):
            running.add_row(str(number), ",".join(run.group.hosts), run.config.key(),
                            f"{now - run.started:.0f} s")  # fmt: skip
        trials = loop.trials()
        best = loop.best(trials)
        status = Table.grid(padding=(0, 2))
        status.add_row(
            "outcomes", ", ".join(f"{k}: {v}" for k, v in loop.summary.outcomes.items())
        )
        if best is not None:
            status.add_row(
                "best measured",
                f"{best.value:.3f} s/step (trial {best.number}, predicted "
                f"{best.user_attrs.get('predicted_step_s', float('nan')):.3f} s)",
            )
        elapsed = time.strftime("%H:%M:%S", time.gmtime(now - loop.started))
        budget = f"{loop.launched_count(trials)}/{loop.n_trials} runs, "
        budget += f"{loop.node_hours(trials):.2f} node-hours, {elapsed} elapsed"
        status.add_row("budget", budget)
        return Group(running, status)

    def final(self, loop: StudyLoop, summary: Summary) -> None:
        """The closing lines of ``tune run``."""
        out = Console(highlight=False)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())) or "none"
        out.print(f"stopped: {summary.stop_reason or 'done'}")
        out.print(f"this run: launched {summary.launched}; outcomes: {counts}")
        out.print(spent_line(loop.trials()))  # the whole study's, every worker's
        space = loop.space_counts
        if space:
            out.print(
                f"space: {space['total']} configs; {space['invalid']} break a framework rule and "
                f"{space['predicted_oom']} are predicted to run out of memory (never launched, "
                f"but for {space.get('memory_probes', 0)} memory probes); "
                f"{space['viable']} fit (tune space --study {loop.spec.name})"
            )
        ratios = model_ratios(loop.measured(loop.trials()).values())
        if ratios:
            out.print(
                f"measured / predicted step time: median {statistics.median(ratios):.2f} "
                f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} configs)"
            )
        if summary.best_step_s is not None:
            out.print(
                f"best: trial {summary.best_trial}, {summary.best_step_s:.4f} s/step "
                f"(tune leaderboard --study {loop.spec.name})"
            )


def model_ratios(trials: Iterable[FrozenTrial]) -> list[float]:
    """measured / predicted step time of each measured trial: how far to trust the time model."""
    out = []
    for t in trials:
        predicted = t.user_attrs.get("predicted_step_s")
        if t.value is not None and predicted:
            out.append(float(t.value) / float(predicted))
    return out
