"""The cost preview of ``tune run --dry-run`` and ``tune space``: minutes and node-hours.

Per config: the predicted minutes of its shortest useful trial (start-up, warm-up and the
iterations the steady-state estimator needs), its time limit and its node-hours
(:mod:`tuner.space.cost`). For the study: the expected and worst-case node-hours of its budget,
and every config that cannot be measured within the time limit the user set, with the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.calibrate.store import history, measured_startup_s, setup_fingerprint
from tuner.cli import render
from tuner.config.spelling import spell
from tuner.errors import ConfigError, TunerError
from tuner.report import units
from tuner.space.cost import (
    budget_cost,
    require_measurable,
    too_slow_fix,
    too_slow_reason,
    trial_cost,
    useful_iterations,
    with_startup,
)
from tuner.spec.study import StudySpec

if TYPE_CHECKING:
    from tuner.config.parallel import ParallelConfig
    from tuner.models.rates import Rates
    from tuner.models.stack import StackTerms
    from tuner.space.candidates import Candidate
    from tuner.space.cost import TrialCost
    from tuner.space.shorten import Shortened

SHOWN_TOO_SLOW = 10
"""The most configs named one by one as too slow to measure (the rest are counted)."""


def cost_json(spec: StudySpec, ranked: Sequence[Candidate], shown: Sequence[Candidate],
              n_trials: int, rates: Rates | None = None, terms: StackTerms | None = None,
              results: str | None = None,
              probes: Sequence[Candidate] = ()) -> dict[str, Any]:  # fmt: skip
    """The preview as one JSON object: ``shown`` configs one by one, the budget over what
    ``tune run`` may launch: ``ranked`` (every viable config, fastest predicted first), then
    the memory ``probes`` (``SpaceReport.probes``: the loop launches them too, so with fewer
    of both that fit than ``n_trials`` they are its last launches). With ``search.proxy``, each
    config's proxy trial (its step from the time model at ``rates`` and ``terms``, as the
    configs' own) and the confirmations at full scale are counted too (``proxy``). With
    ``results``, the start-up that launches of the same setup measured on the cluster (its
    saved calibration) replaces ``search.startup_min`` (``startup_measured``)."""
    given = spec.search.startup_min
    if results is not None:
        found = measured_startup_s(history(spec, results), setup_fingerprint(spec))
        spec = with_startup(spec, found)
    plans = launch_plans(spec, ranked, rates, terms)
    costs = [shorter.cost if shorter else k for k, shorter in plans]  # what each trial runs
    budget = budget_cost([*costs, *(trial_cost(spec, _step(c)) for c in probes)], n_trials)
    slow = [(c, k) for c, (k, shorter) in zip(ranked, plans, strict=True)
            if not k.fits and shorter is None]  # fmt: skip
    cut = [k for k in costs if k.fits and k.minutes > k.limit_minutes]  # by the start-up
    by_key = {c.config.key(): p for c, p in zip(ranked, plans, strict=True)}
    out: dict[str, Any] = {
        "configs": [
            _row(c, *(by_key.get(c.config.key()) or (trial_cost(spec, _step(c)), None)))
            for c in shown
        ],  # fmt: skip
        "launches": budget.launches,
        "expected_node_hours": round(budget.expected_node_hours, 3),
        "worst_node_hours": round(budget.worst_node_hours, 3),
        "max_node_hours": spec.search.max_node_hours,
        "startup_min": round(spec.search.startup_min, 3),
        "startup_measured": spec.search.startup_min != given,
        "precision": spec.search.precision,
        "cut_by_startup": len(cut),
        "cut_limit_min": round(min((k.limit_minutes for k in cut), default=0.0), 2),
        "too_slow": [
            {
                "config": c.config.key(),
                "spelled": spell(c.config),
                "trial_min": round(k.minutes, 2),
                "reason": too_slow_reason(spec, k, c.config.pp),
                "iterations_min": round(k.minutes - spec.search.startup_min, 2),
            }
            for c, k in slow
        ],  # fmt: skip
        "fewer_microbatches": [
            {
                "config": c.config.key(),
                "spelled": spell(c.config),
                "full_trial_min": round(k.minutes, 2),
                "trial_min": round(p.cost.minutes, 2),
                "microbatches": p.microbatches,
                "full_microbatches": p.full_microbatches,
                "step_s": p.step_s,
                "full_step_s": _step(c),
            }
            for c, (k, p) in zip(ranked, plans, strict=True)
            if p is not None
        ],  # fmt: skip
    }
    if spec.search.proxy is not False:
        fewer = {c.config.key(): p for c, (_, p) in zip(ranked, plans, strict=True) if p}
        _with_proxies(out, spec, [*ranked, *probes], shown, n_trials, rates, terms, fewer)
    return out


def _with_proxies(out: dict[str, Any], spec: StudySpec, ranked: Sequence[Candidate],
                  shown: Sequence[Candidate], n_trials: int, rates: Rates | None,
                  terms: StackTerms | None, fewer: Mapping[str, Shortened]) -> None:  # fmt: skip
    """``out`` with each shown config's proxy trial and the budget's proxies and
    confirmations (:mod:`tuner.space.proxy_cost`) over ``ranked`` (what may launch, in order);
    ``fewer``: the configs measured at fewer micro-batches per step, by key (their proxies and
    confirmations run so too)."""
    from tuner.space.enumerate import study_gpu  # the time model: only with proxies
    from tuner.space.proxy_cost import Costing, proxy_budget

    costing = Costing(spec, study_gpu(spec), rates, terms, fewer)

    def step(c: Candidate) -> float | None:  # what its full-DP trial runs
        shorter = fewer.get(c.config.key())
        return shorter.step_s if shorter else _step(c)

    for row, c in zip(out["configs"], shown, strict=True):
        k = costing(c.config, step(c))
        p = k.proxy
        row.update(
            proxy_nodes=p.nodes if p else None, proxy_dp=k.proxy_dp,
            proxy_step_s=k.proxy_step_s, proxy_trial_min=round(p.minutes, 2) if p else None,
            proxy_node_hours=round(p.node_hours, 3) if p else None,
            proxy_worst_node_hours=round(p.worst_node_hours, 3) if p else None,
        )  # fmt: skip
    found = proxy_budget(spec, [c.config for c in ranked], [step(c) for c in ranked], costing,
                         n_trials)  # fmt: skip
    out.update(
        launches=found.launches.launches,
        expected_node_hours=round(found.expected_node_hours, 3),
        worst_node_hours=round(found.worst_node_hours, 3),
        proxy={
            "mode": spec.search.proxy, "as_proxy": found.as_proxy,
            "launches_expected_node_hours": round(found.launches.expected_node_hours, 3),
            "launches_worst_node_hours": round(found.launches.worst_node_hours, 3),
            "confirmations": found.confirmations,
            "confirm_node_hours": round(found.confirm_node_hours, 3),
            "worst_confirmations": found.worst_confirmations,
            "confirm_worst_node_hours": round(found.confirm_worst_node_hours, 3),
        },
    )  # fmt: skip


def _step(c: Candidate) -> float | None:
    return c.time.step if c.time else None


def _row(c: Candidate, k: Any, shorter: Shortened | None) -> dict[str, Any]:
    """One config's preview: its trial as it runs (at fewer micro-batches per step when
    ``shorter``: ``measured_microbatches``, its own ``fits`` False)."""
    run = shorter.cost if shorter else k
    return {
        "config": c.config.key(), "spelled": spell(c.config), "predicted_step_s": _step(c),
        "trial_min": round(run.minutes, 2), "limit_min": round(run.limit_minutes, 2),
        "node_hours": round(run.node_hours, 3),
        "worst_node_hours": round(run.worst_node_hours, 3), "fits": k.fits,
        "measured_microbatches": shorter.microbatches if shorter else None,
    }  # fmt: skip


def launch_plans(
    spec: StudySpec,
    ranked: Sequence[Candidate],
    rates: Rates | None = None,
    terms: StackTerms | None = None,
) -> list[tuple[TrialCost, Shortened | None]]:
    """Each config's full trial, and what runs instead when it is too slow for the user's limit
    (:func:`tuner.space.shorten.too_slow`, the definition the sampler and the study's screen
    read: fewer micro-batches per step; None: it runs as it is, or, when its trial does not
    fit, not at all)."""
    from tuner.space.shorten import too_slow

    found = too_slow(spec, [c.config for c in ranked], [_step(c) for c in ranked], None, rates,
                     terms)  # fmt: skip
    return [(trial_cost(spec, _step(c)), found.get(c.config.key())) for c in ranked]


_PROXY_COLUMNS = (
    render.Column(name="proxy", header="proxy", meaning="the proxy's nodes and DP size (-: the "
                  "config runs at full scale only)"),
    render.Column(name="proxy_min", header="proxy min",
                  meaning="predicted minutes of the proxy's shortest useful trial"),
    render.Column(name="proxy_node_hours", header="proxy node-h",
                  meaning="node-hours of the proxy's shortest useful trial, at its nodes"),
)  # fmt: skip


_FEWER_COLUMN = render.Column(
    name="measured_microbatches", header="measured m",
    meaning="micro-batches per step the trial runs (-: all of the config's): the config's own "
    "trial does not fit search.trial_timeout_min; trial min and node-h are the shorter trial's",
)  # fmt: skip


def _proxy_cells(row: dict[str, Any]) -> tuple[str, ...]:
    if row.get("proxy_nodes") is None:
        return ("-", "-", "-")
    return (f"{row['proxy_nodes']} nodes dp {row['proxy_dp']}", f"{row['proxy_trial_min']:.1f}",
            units.node_hours(row["proxy_node_hours"]))  # fmt: skip


def print_cost(console: Console, spec: StudySpec, cost: dict[str, Any]) -> None:
    """The preview for a terminal."""
    proxies = "proxy" in cost
    if cost["configs"]:
        columns = (
            render.CONFIG,
            render.Column(name="step_s", header="step s", meaning="predicted step time"),
            render.Column(name="trial_min", header="trial min",
                          meaning="predicted minutes of the shortest useful trial"),
            render.Column(name="limit_min", header="limit min", meaning="the trial's time limit"),
            render.Column(name="node_hours", header="node-h",
                          meaning="node-hours of the shortest useful trial"),
            render.Column(name="worst_node_hours", header="worst node-h",
                          meaning="node-hours if it runs to its limit or train_iters"),
        ) + (_PROXY_COLUMNS if proxies else ())  # fmt: skip
        fewer = any(row["measured_microbatches"] for row in cost["configs"])
        columns += (_FEWER_COLUMN,) if fewer else ()
        rows = tuple(
            (row["spelled"], units.seconds(row["predicted_step_s"] or 0.0),
             f"{row['trial_min']:.1f}", f"{row['limit_min']:.1f}",
             units.node_hours(row["node_hours"]), units.node_hours(row["worst_node_hours"]))
            + (_proxy_cells(row) if proxies else ())
            + ((str(row["measured_microbatches"] or "-"),) if fewer else ())
            for row in cost["configs"]
        )  # fmt: skip
        title = ("cost of one trial (shortest useful trial: start-up + warm-up + the iterations "
                 "the step-time estimate needs)")  # fmt: skip
        if cost.get("startup_measured"):
            title += (f"; start-up {units.duration(cost['startup_min'] * 60)}, as earlier "
                      "launches of this setup on the cluster took (search.startup_min "
                      "replaced)")  # fmt: skip
        if proxies:
            title += ("; trial and node-h at full scale (the confirmation of a config measured "
                      "through a proxy), proxy at its own nodes")  # fmt: skip
        render.render(console, render.Grid(title=title, columns=columns, rows=rows,
                                           choosable=False))  # fmt: skip
    budget = f" (max_node_hours {cost['max_node_hours']:g})" if cost["max_node_hours"] else ""
    expected, worst = (
        units.node_hours(cost["expected_node_hours"]),
        units.node_hours(cost["worst_node_hours"]),
    )
    console.print(
        f"budget of {cost['launches']} launches{_proxy_part(cost)}: expected {expected} "
        f"node-hours (each ended once its step time is known to ±{spec.search.precision:.0%}), "
        f"worst case {worst} (each running to its time limit or train_iters){budget}"
    )
    if proxies:
        p: dict[str, Any] = {k: units.node_hours(v) if k.endswith("node_hours") else v
                             for k, v in cost["proxy"].items()}  # fmt: skip
        console.print(
            f"with proxies: launches {p['launches_expected_node_hours']} node-hours "
            f"(worst {p['launches_worst_node_hours']}) + "
            f"{units.plural(p['confirmations'], 'confirmation')} at full scale "
            f"{p['confirm_node_hours']} (worst {p['worst_confirmations']}: "
            f"{p['confirm_worst_node_hours']})"
        )
    if cost.get("cut_by_startup"):
        console.print(_startup_warning(cost))
    _print_fewer(console, spec, cost["fewer_microbatches"])
    _print_too_slow(console, spec, cost["too_slow"])


def _print_fewer(console: Console, spec: StudySpec, fewer: Sequence[dict[str, Any]]) -> None:
    """The configs too slow for the limit that run at fewer micro-batches per step."""
    if not fewer:
        return
    console.print(
        f"measured at fewer micro-batches per step: {units.plural(len(fewer), 'config')} whose "
        f"shortest useful trial does not fit search.trial_timeout_min "
        f"{spec.search.trial_timeout_min:g} min run with a smaller global batch (the same tp, "
        "pp, dp and micro-batch) and their full step is extrapolated by the time model (the "
        "pipeline's fill and drain, the gradient reduction and the optimizer step are per "
        "step); marked ~ on the leaderboard (search.fewer_microbatches: false refuses them)"
    )
    for item in fewer[:SHOWN_TOO_SLOW]:
        console.print(f"  {item['spelled']}: {item['microbatches']} of "
                      f"{item['full_microbatches']} micro-batches, {item['trial_min']:.1f} min "
                      f"(the full step's trial {item['full_trial_min']:.1f} min)")  # fmt: skip
    if len(fewer) > SHOWN_TOO_SLOW:
        console.print(f"  ... and {units.plural(len(fewer) - SHOWN_TOO_SLOW, 'more config')}")


def _print_too_slow(console: Console, spec: StudySpec, slow: Sequence[dict[str, Any]]) -> None:
    """The configs too slow to measure within the limit: the fix once, then one line each."""
    if not slow:
        return
    need = max(item["trial_min"] for item in slow)
    console.print(
        f"not launched: {units.plural(len(slow), 'config')} whose {useful_iterations(spec)} "
        f"measured iterations alone take longer than search.trial_timeout_min "
        f"{spec.search.trial_timeout_min:g} min (listed with their minutes); "
        f"{too_slow_fix(spec, need)}"
    )
    for item in slow[:SHOWN_TOO_SLOW]:
        console.print(f"  {item['spelled']}: {item['iterations_min']:.2f} min")
    if len(slow) > SHOWN_TOO_SLOW:
        console.print(f"  ... and {units.plural(len(slow) - SHOWN_TOO_SLOW, 'more config')}")


def render_first(spec: StudySpec, config: ParallelConfig) -> None:
    """Render one config's launch as its trial would (stand-in hosts and trial folder); raises
    the :class:`~tuner.errors.TunerError` its trial would end in (a template that does not
    render, a setting the template needs that the study leaves out)."""
    from tuner.launch import render_launch

    hosts = [f"node{i}" for i in range(spec.nodes_per_trial)]
    render_launch(spec, config, hosts=hosts, master_addr=hosts[0], master_port=29500,
                  trial_dir=f"results/{spec.name}/trials/0")  # fmt: skip


def check_launch(spec: StudySpec, first: Sequence[Candidate]) -> None:
    """Warn on stderr when the first config's launch cannot be rendered. A setting its template
    needs (``launch.megatron_path``, ``launch.script``) was otherwise found by the first trial,
    after the nodes were booked; a preview of a study whose launch section is not written yet
    still runs (``tune run`` refuses it: :func:`require_launch`)."""
    if not first:
        return
    try:
        render_first(spec, first[0].config)
    except TunerError as e:
        sys.stderr.write(f"tune: warning: tune run would refuse the first trial's launch: {e}\n")


def require_launch(spec: StudySpec, config: ParallelConfig) -> None:
    """Before any node is booked: the first config's launch renders, else a
    :class:`~tuner.errors.ConfigError` naming it. Without this a broken template turned every
    trial of the budget into a ``launch_error`` (and exit 1) instead of one line up front."""
    try:
        render_first(spec, config)
    except TunerError as e:
        raise ConfigError(f"{e} (rendering the launch of {spell(config)}; nothing was "
                          "launched)") from None  # fmt: skip


def _proxy_part(cost: dict[str, Any]) -> str:
    if "proxy" not in cost:
        return ""
    p = cost["proxy"]
    return (
        f" ({p['as_proxy']} of them as proxies) and up to "
        f"{units.plural(p['worst_confirmations'], 'confirmation')} at full scale"
    )


def measurable(spec: StudySpec, ranked: Sequence[Candidate], rates: Rates | None = None,
               terms: StackTerms | None = None) -> list[Candidate]:  # fmt: skip
    """The configs whose shortest useful trial fits the time limit (all, without a user's
    limit), or does at fewer micro-batches per step (:func:`launch_plans`), in the given
    order; :class:`~tuner.errors.ConfigError` when there is none."""
    plans = launch_plans(spec, ranked, rates, terms)
    if ranked and not any(k.fits or p is not None for k, p in plans):
        quickest = min(range(len(plans)), key=lambda i: plans[i][0].minutes)
        require_measurable(spec, [plans[quickest][0]], ranked[quickest].config.pp)
    return [c for c, (k, p) in zip(ranked, plans, strict=True) if k.fits or p is not None]


def spent_json(trials: Sequence[Any]) -> dict[str, Any]:
    """What a study's launched trials (Optuna ``FrozenTrial``) spent, in node-hours: in all, by
    outcome (node-hours and launches), on what (``exploitation``, ``exploration``,
    ``confirmation``: :data:`tuner.search.value.Purpose`; ``unlabelled`` for samplers that do
    not say), and how the measured ones ended (``precise``, ``raced``, ``limit``, or ``cap``:
    they ran all ``train_iters``)."""
    from tuner.search.value import purpose_of  # numpy: not at the command line's start-up

    by_outcome: dict[str, float] = {}
    launches: dict[str, int] = {}
    by_purpose: dict[str, dict[str, float]] = {}
    by_end: dict[str, int] = {}
    for t in trials:
        a = t.user_attrs
        if not a.get("launched") or "outcome" not in a:
            continue
        hours = float(a.get("duration_s", 0.0)) * len(a.get("hosts", ())) / 3600
        by_outcome[a["outcome"]] = by_outcome.get(a["outcome"], 0.0) + hours
        launches[a["outcome"]] = launches.get(a["outcome"], 0) + 1
        why = purpose_of(t.system_attrs, a) or "unlabelled"
        spent = by_purpose.setdefault(why, {"launches": 0, "node_hours": 0.0})
        spent["launches"] += 1
        spent["node_hours"] += hours
        if a["outcome"] == "ok":
            end = str(a.get("ended", "cap"))
            by_end[end] = by_end.get(end, 0) + 1
    return {
        "node_hours": round(sum(by_outcome.values()), 4),
        "launches": sum(launches.values()),
        "by_outcome": {k: round(v, 4) for k, v in sorted(by_outcome.items())},
        "launches_by_outcome": dict(sorted(launches.items())),
        "by_purpose": {
            k: {"launches": int(v["launches"]), "node_hours": round(v["node_hours"], 4)}
            for k, v in sorted(by_purpose.items())
        },  # fmt: skip
        "measured_ended": dict(sorted(by_end.items())),
    }


ENDED = {
    "precise": "once their step time was known",
    "raced": "once they could not win",
    "limit": "at their time limit",
    "cap": "after all train_iters",
}
"""How a measured trial ended, in words (``measured_ended`` keeps the keys: ``--json``)."""


def spent_line(trials: Sequence[Any]) -> str:
    """:func:`spent_json` as the lines that end ``tune run``: what was spent, per outcome, and
    on what."""
    spent = spent_json(trials)
    parts = ", ".join(
        f"{k} {units.plural(spent['launches_by_outcome'][k], 'launch', 'launches')} "
        f"{units.node_hours(v)}"
        for k, v in spent["by_outcome"].items()
    ) or "nothing"  # fmt: skip
    ends = ", ".join(f"{v} {ENDED.get(k, k)}" for k, v in spent["measured_ended"].items())
    tail = f"; measured trials ended: {ends}" if ends else ""
    on = ", ".join(
        f"{k} {units.plural(v['launches'], 'launch', 'launches')} "
        f"{units.node_hours(v['node_hours'])}"
        for k, v in spent["by_purpose"].items()
    )  # fmt: skip
    on_line = f"\nspent on: {on} (node-hours)" if on else ""
    launches = units.plural(spent["launches"], "launch", "launches")
    return (
        f"spent: {units.node_hours(spent['node_hours'])} node-hours in {launches}, by outcome: "
        f"{parts}{tail}{on_line}"
    )


def _startup_warning(cost: dict[str, Any]) -> str:
    """The line for configs whose iterations fit the limit the user set but whose start-up
    and iterations together do not: true to the estimate, such a trial is cut before its step
    time is known (its iterations fit, so it is not refused: the start-up is an estimate)."""
    whose = ("launches of this setup took" if cost.get("startup_measured")
             else "search.startup_min, an estimate")  # fmt: skip
    return (
        f"warning: {units.plural(cost['cut_by_startup'], 'config')} need more than the time "
        f"limit ({cost['cut_limit_min']:g} min) once a start-up of {cost['startup_min']:g} min "
        f"({whose}) is added: if a launch takes that long here they are cut before their step "
        "time is known; set search.startup_min to what a launch takes on this cluster or raise "
        "search.trial_timeout_min"
    )
