"""Every valid config of a study at full depth, measured in one job, against the models with the
study's saved probe: measured / predicted peak memory and step time per config.

    python tools/probe_truth.py --study demo [--results results] [--iters 4] [--interleave]
                                [--with-probe] [--save FILE | --rows FILE]

The runs go through the framework probe's own machinery (``tuner.profile.probe``: one job, one
process per node where the study's script runs several points), each config at its full depth
(``num_layers`` over its pipeline stages), ``--iters`` iterations each, into
``<results>/clusters/<cluster>.<study>.truth/``. What it checks is the composition over the
whole space, including the configs no demo trial reaches; the probe itself is not run again (run
``tune profile --study NAME --probe`` first). CPU step times move with the machine's load (the
level of this job's against the probe's; the peak, a tensor accounting on CPU ranks, does not):
both are printed with how many configs are within 10% and 5%. ``--interleave`` (CPU ranks: the
workload's interleaved points) runs one step of every config per round instead, every engine held
to the end, and reads each config's step as the first config's median times their paired ratio
(``tuner.profile.paired.paired_ratio``): a load that comes and goes through the job (another
process's test run) then moves every config alike, so the configs' spread about the load level
is the composition's error, not the load's; give it more ``--iters`` (blocks of two rounds).
``--save FILE`` keeps the measured rows; ``--rows FILE`` measures nothing and compares kept rows
against the models of the code it runs in (with the same saved probe), so two versions of the
models are compared on one measurement instead of on two runs' loads. ``--with-probe`` puts the
probe's own runs first in the same interleaved job and derives the terms from them instead of
the saved probe, each config read against the probe's base point at 1 layer: the probe and the
configs then share one load, so what is left is the composition's error, without the level of one
job against another's (which ``--save`` keeps with the rows, for ``--rows``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def measure(
    study: str, results: str, iters: int, interleave: bool = False, save: str | None = None,
    with_probe: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """One dict per config: its spelling, probed or not, measured / predicted step and peak.
    ``save``: a file that keeps the measured rows, for :func:`compare` under other code.
    ``with_probe``: the probe's own runs go first in the same job, their steps interleaved with
    the configs', and the terms come from them instead of the saved probe."""
    from tuner.cli.lockcheck import refuse_stale_locks
    from tuner.layout import ClusterLayout, TrialPaths
    from tuner.profile import probe
    from tuner.space.enumerate import iter_configs, study_violations
    from tuner.spec.file import load_study
    from tuner.study.launchers import make_executor

    spec = load_study(study)
    configs = [c for c in iter_configs(spec) if not study_violations(c, spec)]
    runs = [probe.ProbeRun(c, spec.model.num_layers // (c.pp * c.vp)) for c in configs]
    first = probe.probe_runs(spec) if with_probe else []
    runs, interleave = [*first, *runs], interleave or with_probe
    where = ClusterLayout(Path(results).resolve(), spec.cluster_name).stack_probe(spec.name)
    saved = probe.PROBE_ITERS, probe.INTERLEAVE
    # one config after another, as trials run (and no engine of every config held at once),
    # unless asked to interleave their steps
    probe.PROBE_ITERS, probe.INTERLEAVE = iters, interleave
    executor = make_executor(spec)
    try:  # a stale build lock: tune run's preflight line, not a job waiting on it forever
        if code := refuse_stale_locks(spec, executor, "probe_truth"):
            raise SystemExit(code)
        found = probe.run_stack_probe(spec, executor, TrialPaths(where.dir.with_suffix(".truth")),
                                      runs=runs)  # fmt: skip
    finally:
        executor.close()
        probe.PROBE_ITERS, probe.INTERLEAVE = saved
    probed, rows = found.rows[: len(first)], found.rows[len(first) :]
    if save:

        def plain(kept: Sequence[Any]) -> list[dict[str, Any]]:
            return [{**dataclasses.asdict(r), "samples_s": list(r.samples_s),
                     "rounds": list(r.rounds)} for r in kept]  # fmt: skip

        kept = {"study": study, "rows": plain(rows), "probe_rows": plain(probed) or None}
        Path(save).write_text(json.dumps(kept, indent=1))
    return compare(study, results, rows, probed or None)


def load_rows(path: str) -> tuple[str, list[Any], list[Any] | None]:
    """(study, measured rows, the probe's rows of the same job or None) of a file that
    ``--save`` wrote."""
    from tuner.profile.probe import ProbeRow

    data = json.loads(Path(path).read_text())

    def rows(kept: list[dict[str, Any]]) -> list[Any]:
        return [ProbeRow(**{**r, "samples_s": tuple(r["samples_s"]),
                            "rounds": tuple(r["rounds"])}) for r in kept]  # fmt: skip

    probed = data.get("probe_rows")
    return str(data["study"]), rows(data["rows"]), rows(probed) if probed else None


def require_saved_probe(study: str, results: str) -> None:
    """Exit naming the command to run when ``study`` has no saved probe under ``results``:
    without one the terms were the catalog's, compared and printed as if probed."""
    from tuner.layout import ClusterLayout
    from tuner.spec.file import load_study

    spec = load_study(study)
    layout = ClusterLayout(Path(results).resolve(), spec.cluster_name)
    if not layout.stack_yaml(spec.name).is_file():
        raise SystemExit(f"no saved probe of study {study} under {results}: run tune profile "
                         f"--study {study} --probe first, or give --with-probe")  # fmt: skip


def compare(study: str, results: str, rows: Sequence[Any],
            probe_rows: Sequence[Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The measured ``rows`` (one per valid config, in the space's order) against the models with
    the study's saved probe, under the code this runs: one dict per config. With
    ``probe_rows`` (the probe's rows of the same interleaved job) the terms are derived from
    those instead, and each config is read as the probe's first run (its base point at 1 layer)
    times their paired ratio: the probe and the configs then share one load, and what is left
    is the composition's."""
    from tuner.api import estimate
    from tuner.config.spelling import spell
    from tuner.models.memory.estimate import GIB
    from tuner.profile import probe
    from tuner.profile.paired import paired_ratio
    from tuner.profile.rates import study_rates
    from tuner.profile.stack_terms import derive_terms, study_terms
    from tuner.space.enumerate import iter_configs, study_violations
    from tuner.spec.file import load_study

    spec = load_study(study)
    rates = study_rates(spec, results)
    own = probe_rows
    if not own:
        require_saved_probe(study, results)
    terms = derive_terms(spec, own, rates) if own else study_terms(spec, results, rates)
    configs = [c for c in iter_configs(spec) if not study_violations(c, spec)]
    if [c.key() for c in configs] != [r.key for r in rows]:
        raise SystemExit(f"the measured rows are not study {study}'s valid configs")
    probed = {r.config.key() for r in probe.probe_runs(spec)}
    ref, out = (own or rows)[0], []
    level = statistics.median(ref.samples_s) if own else ref.step_s
    for c, row in zip(configs, rows, strict=True):
        e = estimate(spec, c, rates=rates, terms=terms)
        assert e.time and e.memory
        paired = paired_ratio(row, ref) if row is not ref else (1.0, 0.0)
        step = level * paired[0] if paired is not None else row.step_s
        out.append({"config": spell(c), "probed": c.key() in probed,
                    "step": step / e.time.step, "peak": row.peak_gib * GIB / e.memory.peak,
                    "mbs": c.micro_batch_size, "pp": c.pp})  # fmt: skip
    return out


def by_size(found: Sequence[dict[str, Any]], level: float) -> str:
    """Each micro-batch size's mean step over ``level``, without and with pipeline stages: what
    the composition leaves systematically at each size (one config's own spread under load is
    several percent; a size's mean over its configs is the part that does not average out)."""
    groups: dict[tuple[bool, int], list[float]] = {}
    for r in found:
        groups.setdefault((r["pp"] > 1, r["mbs"]), []).append(r["step"] / level)
    return ", ".join(f"{'pipeline' if pipe else 'flat'} mbs {mbs} {sum(v) / len(v):.3f}"
                     for (pipe, mbs), v in sorted(groups.items()))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True)
    parser.add_argument("--results", default="results")
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--interleave", action="store_true")
    parser.add_argument("--with-probe", action="store_true", help="run the probe's own runs in "
                        "the same job, interleaved, and take the terms from them: the "
                        "composition at one load, without the level between two jobs")  # fmt: skip
    parser.add_argument("--save", metavar="FILE", help="keep the measured rows in FILE (json)")
    parser.add_argument("--rows", metavar="FILE", help="measure nothing: compare the rows that "
                        "--save kept against this code's models")  # fmt: skip
    args = parser.parse_args(argv)
    before = os.getloadavg()[0]
    if args.rows:
        study, rows, probed = load_rows(args.rows)
        if study != args.study:
            raise SystemExit(f"{args.rows} holds study {study}'s rows, not {args.study}'s")
        found = compare(args.study, args.results, rows, probed)
    else:
        if not args.with_probe:  # before the job, not after it
            require_saved_probe(args.study, args.results)
        found = measure(args.study, args.results, args.iters, args.interleave, args.save,
                        args.with_probe)  # fmt: skip
    after = os.getloadavg()[0]
    print(f"measured / predicted at full depth, every config of {args.study} (probe: the probe "
          "ran it at reduced depth)")  # fmt: skip
    print(f"{'config':<40} probe  {'step':>6} {'peak':>6}")
    for r in found:
        print(f"{r['config']:<40} {'yes' if r['probed'] else '-':>5}  {r['step']:6.3f} "
              f"{r['peak']:6.3f}")  # fmt: skip
    for name, band in (("step", 0.10), ("peak", 0.05)):
        values = [r[name] for r in found]
        inside = sum(abs(v - 1) <= band for v in values)
        print(f"{name} measured / predicted: {min(values):.3f}-{max(values):.3f}, {inside} of "
              f"{len(values)} within {band:.0%}")  # fmt: skip
    # the load level: the probed configs' own ratio (the probe's load against this job's), which
    # no composition can know; what is left over it is the composition's own error
    probed = [r["step"] for r in found if r["probed"]]
    if probed:
        level = sorted(probed)[len(probed) // 2]
        rest = [r["step"] / level for r in found]
        inside = sum(abs(v - 1) <= 0.10 for v in rest)
        print(f"step over the probed configs' median ({level:.3f}, the load level): "
              f"{min(rest):.3f}-{max(rest):.3f}, {inside} of {len(rest)} within 10%")  # fmt: skip
        print("the same, mean by micro-batch size: " + by_size(found, level))
    # the machine's load through this job: CPU step times follow it, the probe's saw its own
    if not args.rows:
        print(f"load (1-minute average) {before:.1f} at the start, {after:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
