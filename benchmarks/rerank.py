"""The model sampler's first ranking against its re-ranking after measurements (issue 36).

    python benchmarks/rerank.py [--studies llama3-8b,mixtral-8x7b,gpt-70b] [--measured 4,16,48]
                                [--running 16] [--repeat 3]

For each shipped study: the first ranking (the enumeration and the sampler's candidate arrays,
in a fresh sampler), then ``ModelGuidedSampler.choose`` after N measured trials (one in four an
OOM) with ``--running`` more still running, as an ask of the study loop pays it: with the
posterior kept in the rows' space (``tuner.search.ranking``, now) and fitted in the weights'
space (``tuner.calibrate.correction.fit``, before), on the same trials in the same process; best
of ``--repeat`` (a shared machine's load only adds). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.calibrate import correction  # noqa: E402
from tuner.outcome import Outcome  # noqa: E402
from tuner.search import ranking  # noqa: E402
from tuner.search import sampler as sampler_module  # noqa: E402
from tuner.search.sampler import ModelGuidedSampler  # noqa: E402
from tuner.space.trials import distributions  # noqa: E402
from tuner.spec.file import load_study  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402


def trials_after(s: StudySpec, sampler: ModelGuidedSampler, measured: int, running: int) -> Any:
    """An in-memory study with ``measured`` told trials (every fourth an OOM) and ``running``
    more asked, the configs taken down the model's ranking (what the loop's first asks are)."""
    sampler._candidates()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    dists = distributions(s)
    configs = sampler._configs or []
    for n in range(min(measured + running, len(configs))):
        i, config = n, configs[n]
        trial = study.ask(dists)  # its params are Optuna's; the sampler reads the key
        trial.set_user_attr("key", config.key())
        trial.set_user_attr("config", dataclasses.asdict(config))
        if n >= measured:
            continue
        if n % 4 == 3:
            trial.set_user_attr("outcome", str(Outcome.OOM))
            trial.set_user_attr("predicted_peak_gib", float(sampler._peak_gib[i]))
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        trial.set_user_attr("outcome", str(Outcome.OK))
        alloc = float(sampler._alloc_gib[i])
        trial.set_user_attr("peak_memory_gib", 1.1 * alloc)
        trial.set_user_attr("predicted_allocated_gib", alloc)
        study.tell(trial, math.exp(float(sampler._log_pred[i])) * (1.2 + 0.05 * (n % 5)))
    return study.get_trials(deepcopy=False)


def best_of(repeat: int, fn: Any) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", default="llama3-8b,mixtral-8x7b,gpt-70b")
    p.add_argument("--measured", default="4,16,48")
    p.add_argument("--running", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(f"{'study':14s}{'configs':>8s}{'features':>9s}{'first s':>9s}{'measured':>9s}"
          f"{'before s':>10s}{'now s':>8s}{'now/first':>10s}{'before/now':>11s}")  # fmt: skip
    for name in args.studies.split(","):
        s = load_study(name)
        t0 = time.perf_counter()
        sampler = ModelGuidedSampler(s, seed=0)
        sampler.choose([])  # the first ranking: enumerate, estimate, cache
        first = time.perf_counter() - t0
        n, f = sampler._x.shape
        for k in (int(v) for v in args.measured.split(",")):
            trials = trials_after(s, sampler, k, args.running)
            now = best_of(args.repeat, lambda t=trials, m=sampler: m.choose(t))
            sampler_module.fit, sampler_module.fit_memory = correction.fit, correction.fit_memory
            try:
                before = best_of(args.repeat, lambda t=trials, m=sampler: m.choose(t))
            finally:
                sampler_module.fit, sampler_module.fit_memory = ranking.fit, ranking.fit_memory
            print(f"{name:14s}{n:8d}{f:9d}{first:9.2f}{k:9d}{before:10.3f}{now:8.3f}"
                  f"{now / first:10.1%}{before / now:10.0f}x")  # fmt: skip
    print(
        f"({args.running} more running in each; before: every fit in the weights' space; "
        f"best of {args.repeat})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
