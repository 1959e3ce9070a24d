"""How long ``tune report`` takes and how large its page is for a 500-trial study.

Usage: python benchmarks/report_size.py [--study gpt-70b] [--trials 500] [--seed 0] [--out F]
Target (issue 16): under 5 s and under 10 MB for 500 trials.

The study is synthetic: configs of the study's space with the models' predictions as recorded
by the loop, "measured" step times and peaks scattered around them, real OOMs, pruned and failed
trials, written in one go into a SQLite study in a temporary folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState, create_trial

from tuner.layout import ResultsLayout
from tuner.models.memory.estimate import GIB
from tuner.report.build import build_report
from tuner.space.enumerate import Candidate, enumerate_space
from tuner.space.trials import config_params, distributions
from tuner.spec.file import load_study
from tuner.spec.study import StudySpec
from tuner.study.storage import open_storage


def synthetic_trial(
    spec: StudySpec, cand: Candidate, dists: dict[str, BaseDistribution], number: int,
    rng: random.Random,
) -> optuna.trial.FrozenTrial:  # fmt: skip
    c = cand.config
    start = datetime(2026, 1, 1) + timedelta(minutes=10 * number)
    attrs: dict[str, Any] = {
        "config": dataclasses.asdict(c), "key": c.key(), "launched": True,
        "hosts": [f"gpu{i:03d}" for i in range(spec.nodes_per_trial)], "duration_s": 540.0,
        "predicted_step_s": cand.time.step if cand.time else None,
        "predicted_peak_gib": cand.memory.peak / GIB, "predicted_mfu": 0.4,
        "predicted_step_sd": round(cand.time.sigma, 4) if cand.time else None,
        "predicted_peak_sd": round(cand.memory.sigma, 4),
    }  # fmt: skip
    roll = rng.random()
    state, value = TrialState.PRUNED, None
    if not cand.fits:
        attrs.update(outcome="pruned_memory", reason="predicted peak over the limit",
                     launched=False, duration_s=0.0)  # fmt: skip
    elif roll < 0.1:
        attrs.update(outcome="oom", reason="torch.OutOfMemoryError: CUDA out of memory.")
    elif roll < 0.15:
        attrs.update(outcome="nccl_timeout", reason="Watchdog caught collective operation timeout")
    else:
        step = (cand.time.step if cand.time else 1.0) * rng.uniform(0.8, 1.3)
        tokens = spec.training.global_batch_size * spec.model.seq_length / step
        peak = cand.memory.peak / GIB * rng.uniform(0.85, 1.1)
        attrs.update(outcome="ok", step_time_s=step, tokens_per_s=tokens, tflops_per_gpu=300.0,
                     mfu=0.35, peak_memory_gib=peak)  # fmt: skip
        state, value = TrialState.COMPLETE, step
    trial = create_trial(state=state, value=value, params=config_params(c), distributions=dists,
                         user_attrs=attrs)  # fmt: skip
    trial.datetime_start = start
    trial.datetime_complete = start + timedelta(seconds=attrs["duration_s"])
    return trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="gpt-70b")
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the page here")
    args = parser.parse_args()
    spec = load_study(args.study)
    rng = random.Random(args.seed)
    space = enumerate_space(spec, keep_oom=True)
    pool = space.viable + space.oom
    picks = rng.sample(pool, min(args.trials, len(pool)))
    dists = distributions(spec)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        layout = ResultsLayout(Path(tmp), spec.name)
        study = optuna.create_study(study_name=spec.name, storage=open_storage(None, layout))
        study.set_user_attr("space_counts", space.counts())  # as the loop records them
        study.add_trials([synthetic_trial(spec, c, dists, i, rng) for i, c in enumerate(picks)])
        start = time.perf_counter()
        path, parts = build_report(spec, results=tmp, out=args.out)
        took = time.perf_counter() - start
        size = path.stat().st_size
    figures = sum(len(s.figures) for s in parts)
    print(f"study {spec.name}: {len(picks)} synthetic trials ({len(space.viable)} viable configs)")
    print(f"report: built in {took:.2f} s (target < 5 s), {size / 1e6:.2f} MB (target < 10 MB), "
          f"{figures} figures")  # fmt: skip
    return 0 if took < 5 and size < 10e6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
