"""How well a proxy's measured step predicts the full-scale step (``tuner.models.time.proxy``).

Reads ``benchmarks/data/proxy_pairs.csv``: pairs of published runs of one model and config that
keep every rank's work constant across two DP sizes (weak scaling in DP: same tp, pp, cp,
micro-batch and micro-batches per step, the global batch growing with DP), in
``step_times.csv``'s columns plus ``pair``, ``role`` (proxy / full), ``hierarchy_kept`` (whether
the smaller run's DP group crosses nodes as the larger one's does, the rule
``tuner.space.proxy`` keeps) and ``compile``. Per pair it prints the measured full-scale step, the
one extrapolated from the measured proxy step, and, for comparison, the proxy's step taken as is
and the time model alone (no measurement); then the median and largest extrapolation error over
the pairs that keep the hierarchy, and over all. Run:

    .venv/bin/python benchmarks/proxy_accuracy.py

``--demo`` also runs the check for real on this machine's CPUs: the SSH demo's small GPT
(``studies/demo-ssh.yaml``, DeepSpeed on two loopback sshd "nodes", one rank each), once on
both nodes and once as a one-node proxy (dp 1, half the global batch), and extrapolates the
2-node step from the 1-node one (a check of the bookkeeping: dp 1 is no proxy the study would
choose, and both "nodes" share one machine's cores).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import time_rows as ta  # noqa: E402  (the step_times.csv readers: one definition)

from tuner.catalog import GPUSpec, get_gpu  # noqa: E402
from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.models.time.estimate import estimate_time  # noqa: E402
from tuner.models.time.proxy import extrapolate  # noqa: E402

CSV = Path(__file__).resolve().parent / "data" / "proxy_pairs.csv"
GPUS = {**ta.GPUS, "H200-141GB": "h200-141gb"}


def _gpu(row: dict[str, str]) -> GPUSpec:
    gpu = get_gpu(GPUS[row["gpu_type"]])
    if row["network_gbps_per_gpu"]:
        gpu = dataclasses.replace(gpu, inter_node_gbps=float(row["network_gbps_per_gpu"]))
    return gpu


def _step_s(row: dict[str, str], config: ParallelConfig) -> float:
    """The row's step time: tokens per step per GPU over its tokens/s/GPU, or the step itself."""
    value = float(row["value"])
    if row["metric"] == "iter_time_s":
        return value
    tokens = config.global_batch_size * int(row["seq_len"]) / config.world_size
    return tokens / value


def _side(row: dict[str, str]) -> tuple[ParallelConfig, float]:
    config, _ = ta._config(row, [])
    config = dataclasses.replace(config, compile=row["compile"] == "yes")
    return config, _step_s(row, config)


def pair_errors(path: Path = CSV) -> list[dict[str, object]]:
    """One dict per pair: its name, hierarchy flag, measured full step and the three errors."""
    pairs: dict[str, dict[str, dict[str, str]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            pairs.setdefault(row["pair"], {})[row["role"]] = row
    out: list[dict[str, object]] = []
    for name, sides in pairs.items():
        full_row, proxy_row = sides["full"], sides["proxy"]
        model = ta._model(full_row, [])
        _, framework = ta._config(full_row, [])
        full, full_s = _side(full_row)
        proxy, proxy_s = _side(proxy_row)
        gpu, gpn = _gpu(full_row), int(full_row["gpus_per_node"])
        training = ta._training(full_row, full)
        found = extrapolate(model, training, full, proxy, proxy_s, gpu, gpn, framework)
        alone = estimate_time(model, training, full, gpu, gpn, framework).step
        out.append({
            "pair": name, "hierarchy": proxy_row["hierarchy_kept"] == "yes",
            "dp": f"{proxy.dp}->{full.dp}", "proxy_s": proxy_s, "full_s": full_s,
            "extrapolated_s": found.step_s, "error": found.step_s / full_s - 1,
            "as_is": proxy_s / full_s - 1, "model": alone / full_s - 1, "scale": found.scale,
        })  # fmt: skip
    return out


def _summary(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: no pairs"
    absolute = [abs(e) for e in errors]
    return (f"{label}: {len(errors)} pairs, median |error| {100 * statistics.median(absolute):.1f}"
            f" %, max {100 * max(absolute):.1f} %")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true", help="also run the 2-node CPU check")
    args = parser.parse_args()
    rows = pair_errors()
    print(f"{'pair':<28} {'hier':>4} {'dp':>9} {'proxy s':>8} {'full s':>8} {'extrap s':>8}"
          f" {'error':>7} {'as is':>7} {'model':>7} {'s':>5}")  # fmt: skip
    for r in rows:
        print(f"{r['pair']:<28} {'yes' if r['hierarchy'] else 'no':>4} {r['dp']:>9} "
              f"{r['proxy_s']:8.4f} {r['full_s']:8.4f} {r['extrapolated_s']:8.4f} "
              f"{100 * r['error']:+6.2f}% {100 * r['as_is']:+6.2f}% {100 * r['model']:+6.1f}% "
              f"{r['scale']:5.2f}")  # type: ignore[operator]  # fmt: skip
    kept = [float(r["error"]) for r in rows if r["hierarchy"]]  # type: ignore[arg-type]
    print(_summary("hierarchy kept", kept))
    print(_summary("all pairs", [float(r["error"]) for r in rows]))  # type: ignore[arg-type]
    if args.demo:
        from proxy_demo import run_demo

        run_demo()


if __name__ == "__main__":
    main()
