"""Replays of measured clusters for ``search_efficiency.py``: searches over configs whose step
times were measured on a real cluster.

A replay is one group of ``benchmarks/data/step_times.csv`` at one global batch: one model on one
cluster at one GPU count, several parallel configs measured by the same people in one session.
The study is the group's: its model (as ``time_rows.py`` reads the rows for the time model's
accuracy), its GPU with the row's network, its framework and ZeRO stage, its precision, its
global batch, its node count; the space's knob lists are the measured values. Every method
searches the same configs:

* **the measured configs and no other.** The knob lists' product holds configs nobody measured
  (the 02-25 BLOOM table measured 13 of the 27 TP x PP x micro-batch combinations); their step
  time is not known, and inventing one (from our time model, or any fit to the measured ones)
  would replay our model, not the cluster. The study is built with
  ``build_loop(keep=...)`` (:class:`tuner.space.enumerate.SharedSpace`): the configs outside
  are never candidates for the sampler, the screen or the anchors;
* **each config's true step is its published figure**, run through the Megatron-DeepSpeed
  stand-in (``tests/standins/megatron_deepspeed``) as a ``"kind": "table"`` surface, with the
  stand-in's own noise (+-1 % per iteration, seeded per config and seed) as on the synthetic
  surfaces; a config missing from the table fails the trial, so nothing unmeasured can run;
* **a config the source reports out of memory is out of memory** (the stand-in raises torch's
  OutOfMemoryError in its first iteration); :data:`REPLAYS` lists those rows with where they
  are printed;
* the peak each run reports is our memory model's own prediction for it: the source's memory
  column (nvidia-smi's per-process total on the first and last nodes, where printed) is not the
  allocator peak Megatron's report prints, so the replay tells the memory correction nothing
  either way. A config the memory screen keeps out stays out (as on the synthetic surfaces,
  the target is the best config the screen admits).

Every launch is charged as on the synthetic surfaces: start-up plus the trial's iterations at
the config's true step, on the group's node count (``search_efficiency.launch_node_hours``).

**The cluster as a profiled one** (``search_efficiency.py --replay-network profile``, the
default): a user runs ``tune profile`` before a study, and the saved profile's collective
measurements replace the catalog's link rates in the time model (``tuner.profile.rates``).
Where the group's rows cite a measured inter-node all-reduce bandwidth
(``network_measured_gbps_per_node``: BigScience's 135 Gb/s on Jean Zay, measured between two
nodes), :func:`measured_profile` is the profile that measurement makes: an inter-node
all-reduce over two whole nodes at that bus bandwidth, with the catalog's latency (the source
states none) and nothing else measured, so GEMMs, NVLink and memory stay the catalog's. The
search writes it where ``tune profile`` saves one (``results/clusters/<name>.yaml``) and
``build_loop`` reads it as it reads any (``study_rates``): the same rates ``time_accuracy.py``
prints as the measured link. ``--replay-network catalog`` writes none: the catalog's line rate
x NETWORK_BUS_EFFICIENCY, as before.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime as dt
import hashlib
import importlib.util
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.time_rows import CSV, GPUS, _model, _precision, _sharding  # noqa: E402
from tuner.config.parallel import ParallelConfig  # noqa: E402
from tuner.launch import render_launch  # noqa: E402
from tuner.layout import ClusterLayout  # noqa: E402
from tuner.models.memory.estimate import GIB  # noqa: E402
from tuner.models.rates import catalog_rates  # noqa: E402
from tuner.profile.run import ClusterProfile, CollectiveSample, save_profile  # noqa: E402
from tuner.space.enumerate import enumerate_space, study_gpu  # noqa: E402
from tuner.spec.file import study_from_mapping  # noqa: E402
from tuner.spec.study import StudySpec  # noqa: E402

STANDIN = REPO / "tests" / "standins" / "megatron_deepspeed" / "pretrain_gpt.py"
CHRONICLE = "bigscience-workshop/bigscience@053adafee8 train/tr11-176B-ml/chronicles-prequel.md"


@dataclass(frozen=True)
class Replay:
    """One measured group at one global batch."""

    group: str
    global_batch: int
    ooms: tuple[tuple[int, int, int], ...] = ()
    """(tp, pp, micro-batch) of the rows the source reports as out of memory."""
    oom_source: str = ""


REPLAYS: dict[str, Replay] = {
    # BLOOM's 181B prequel model (h 14336, 72 layers, 64 heads) on 48 Jean Zay nodes, 02-25:
    # 'GBS Variations' and 'Tweaking TP'; the table prints DP 32, TP 2, PP 6 at MBS 1 and 2 as
    # OOM at global batch 2048, DP 48, TP 8, PP 1 at MBS 1 as OOM at 2016.
    "bloom-181b-0225": Replay(
        "jeanzay-bloom-prequel-181b-02-25", 2048, ((2, 6, 2), (2, 6, 1)),
        f"{CHRONICLE} 'GBS Variations / Tweaking TP'",
    ),
    "bloom-181b-0225-gbs2016": Replay(
        "jeanzay-bloom-prequel-181b-02-25", 2016, ((8, 1, 1),),
        f"{CHRONICLE} 'GBS Variations / some more configs with lower PP'",
    ),
    # the same model on 02-21, before the 02-25 PCIe/NUMA change ("do not compare today's
    # numbers to yesterday's"): a replay of its own
    "bloom-181b-0221": Replay("jeanzay-bloom-prequel-181b-02-21", 2048),
    "bloom-196b-0221": Replay("jeanzay-bloom-prequel-196b-02-21", 2048),
    "bloom-187b-0220": Replay("jeanzay-bloom-prequel-187b-02-20", 2048),
}  # fmt: skip
"""The groups that measured at least four configs of one model on one cluster at one global
batch and GPU count (docs/node-hours.md, "Replays of measured clusters", says why the others do
not qualify)."""


def rows_of(name: str) -> list[dict[str, str]]:
    """The replay's measured rows (its group at its global batch)."""
    replay = REPLAYS[name]
    with CSV.open(newline="") as f:
        return [r for r in csv.DictReader(f) if r["group"] == replay.group
                and int(r["global_batch"]) == replay.global_batch]  # fmt: skip


def _knob(config: ParallelConfig) -> tuple[int, int, int]:
    return config.tp, config.pp, config.micro_batch_size


def _row_knob(row: dict[str, str]) -> tuple[int, int, int]:
    return int(row["tp"]), int(row["pp"]), int(row["micro_batch"])


def study_mapping(name: str, search: dict[str, Any], seed: int) -> dict[str, Any]:
    """The replay's study (its stand-in surface table written on first use)."""
    data = _base_mapping(name, search, seed)
    data["launch"]["env"]["TUNER_STANDIN_SURFACE"] = str(surface_table(name))
    return data


def _base_mapping(name: str, search: dict[str, Any], seed: int) -> dict[str, Any]:
    rows = rows_of(name)
    row = rows[0]
    framework, _, zero = _sharding(row)
    model = {k: v for k, v in dataclasses.asdict(_model(row, [])).items() if v is not None}
    model.pop("name", None)
    gpn, gpus = int(row["gpus_per_node"]), int(row["gpus"])
    knobs = [_row_knob(r) for r in rows] + list(REPLAYS[name].ooms)
    gpu: Any = GPUS[row["gpu_type"]]
    if row["network_gbps_per_gpu"]:  # the cluster's own network, as the user would state it
        gpu = {"preset": gpu, "name": f"{gpu}-{name}",
               "inter_node_gbps": float(row["network_gbps_per_gpu"])}  # fmt: skip
    env = {"TUNER_STANDIN_TIME_SCALE": "0", "TUNER_STANDIN_NOISE_SEED": str(seed)}
    return {
        "name": f"replay-{name}-{seed}",
        "model": model,
        "training": {"global_batch_size": REPLAYS[name].global_batch,
                     "precision": _precision(row)},
        "cluster": {"gpu": gpu, "gpus_per_node": gpn, "num_nodes": gpus // gpn,
                    "executor": "local"},
        "framework": framework,
        "launch": {"template": "megatron_deepspeed_gpt", "megatron_path": str(STANDIN.parent),
                   "python": sys.executable, "env": env,
                   "extra_args": ["--data-path", "replay"]},
        "space": {"tp": sorted({k[0] for k in knobs}), "pp": sorted({k[1] for k in knobs}),
                  "micro_batch_size": sorted({k[2] for k in knobs}),
                  "recompute": sorted({_recompute(r) for r in rows}), "zero_stage": [zero]},
        "search": search,
    }  # fmt: skip


def _recompute(row: dict[str, str]) -> str:
    return next((k for k in ("none", "selective", "full") if row["recompute"].startswith(k)),
                "none")  # fmt: skip


@dataclass(frozen=True)
class Measured:
    """The replay's configs as the study enumerates them."""

    configs: dict[str, ParallelConfig]
    """Every measured or OOM config that is valid in the study's space, by key."""
    step: dict[str, float]
    """Published step time of each measured config."""
    oom: frozenset[str]
    peak_gib: dict[str, float]
    """Our memory model's predicted peak of each."""
    admitted: frozenset[str]
    """The configs our memory screen admits."""
    left_out: tuple[str, ...]
    """Rows that name no valid config of the space (with the reason)."""


def measured(spec: StudySpec, name: str) -> Measured:
    """Match the replay's rows to the study's enumerated configs by (tp, pp, micro-batch)."""
    report = enumerate_space(spec, keep_oom=True, with_time=False)
    admitted = {_knob(c.config): c.config.key() for c in report.viable}
    every = {_knob(c.config): c for c in [*report.viable, *report.oom]}
    configs, step, oom, peak, left = {}, {}, set(), {}, []
    targets = [(_row_knob(r), float(r["value"])) for r in rows_of(name)]
    targets += [(k, None) for k in REPLAYS[name].ooms]
    for knob, value in targets:
        cand = every.get(knob)
        if cand is None:
            left.append(f"tp {knob[0]} pp {knob[1]} mbs {knob[2]}: not a valid config")
            continue
        key = cand.config.key()
        configs[key], peak[key] = cand.config, cand.memory.peak / GIB
        if value is None:
            oom.add(key)
        else:
            step[key] = value
    keys = {admitted[k] for k in admitted if admitted[k] in configs}
    return Measured(configs, step, frozenset(oom), peak, frozenset(keys), tuple(left))


def standin_module() -> Any:
    """The Megatron-DeepSpeed stand-in as a module (its parser, checks and shared machinery)."""
    module_spec = importlib.util.spec_from_file_location("tuner_mds_standin", STANDIN)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def standin_key(spec: StudySpec, config: ParallelConfig, standin: Any) -> str:
    """The key the stand-in looks ``config`` up by in its surface table: the template's flags
    parsed and validated as the stand-in does."""
    import shlex

    script = render_launch(
        spec, config, hosts=("n0",), master_addr="n0", master_port=29500, trial_dir="/nonexistent"
    ).scripts[0]
    args = standin.build_parser().parse_args(
        shlex.split(script.split("args=(", 1)[1].split("\n)\n", 1)[0]))  # fmt: skip
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # the stand-in checks it under TP
    with contextlib.redirect_stdout(io.StringIO()):
        topo = standin.validate_args(args, spec.world_size, None)
    base = standin.base
    return str(base.config_key(base.surface_variables(args, topo, base.padded_vocab_size(args))))


def surface_table(name: str) -> Path:
    """The stand-in's surface for the replay (``"kind": "table"``: a config missing from it
    fails), written once per content under the temporary folder."""
    spec = study_from_mapping(_base_mapping(name, {"seed": 0}, 0))
    m = measured(spec, name)
    standin = standin_module()
    table: dict[str, Any] = {}
    for key, config in m.configs.items():
        entry: dict[str, Any] = {"step_s": m.step.get(key, 1.0), "memory_gib": m.peak_gib[key]}
        if key in m.oom:
            entry["behaviour"] = {"kind": "oom", "after_iterations": 0}
        table[standin_key(spec, config, standin)] = entry
    text = json.dumps({"kind": "table", "configs": table}, indent=1, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"tuner-replay-{name}-{digest}.json"
    if not path.exists():
        path.write_text(text + "\n")
    return path


NETWORKS = ("profile", "catalog")
"""How a replay states its cluster's network: as a cluster profile would measure it (where the
rows cite a measured figure), or the catalog's figures alone."""
PROBE_HOSTS = 2
"""Nodes of the measured all-reduce (BigScience's was between two Jean Zay nodes)."""
PROBE_MESSAGE_BYTES = (2**26, 2**28, 2**30, 2**32)
"""Message sizes of the profile's samples (64 MiB-4 GiB, the large end of ``tune profile``'s)."""


def measured_profile(spec: StudySpec, name: str, now: dt.datetime | None = None
                     ) -> ClusterProfile | None:  # fmt: skip
    """The cluster profile the replay's cited network measurement makes (module docstring), or
    None where its rows cite none. Each sample is Hockney's line at the measured bus bandwidth
    and the catalog's inter-node latency: ``tuner.profile.run.ClusterProfile.alpha_beta`` fits
    both back exactly."""
    row = rows_of(name)[0]
    measured = row.get("network_measured_gbps_per_node", "")
    if not measured:
        return None
    precision = spec.training.precision
    latency = catalog_rates(study_gpu(spec), precision).inter.latency
    busbw = float(measured) / 8.0 * 1e9  # Gb/s per node -> bytes/s of a ring over whole nodes
    ranks = PROBE_HOSTS * spec.cluster.gpus_per_node
    samples = []
    for size in PROBE_MESSAGE_BYTES:
        bus = size * 2.0 * (ranks - 1) / ranks  # nccl-tests' all-reduce bus bytes
        seconds = latency + bus / busbw
        samples.append(CollectiveSample(
            op="all_reduce", link="inter", group_size=ranks, ranks=tuple(range(ranks)),
            bytes=size, samples_s=(seconds,), median_s=seconds, busbw_gbps=bus / seconds / 1e9,
        ))  # fmt: skip
    when = (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds")
    return ClusterProfile(
        cluster=spec.cluster_name, gpu=spec.cluster.gpu_name, created=when, versions={},
        hosts=PROBE_HOSTS, world_size=ranks, dtype=precision, gemm=(),
        collectives=tuple(samples),
        tool={"source": f"network_measured_gbps_per_node {measured} ({row['group']})"},
    )  # fmt: skip


def save_measured_profile(spec: StudySpec, profile: ClusterProfile, results: Path) -> Path:
    """Write ``profile`` where ``tune profile`` saves the cluster's (``build_loop`` reads it)."""
    path = ClusterLayout(Path(results).resolve(), spec.cluster_name).profile_yaml
    save_profile(profile, path)
    return path


def main() -> int:
    """List each replay: its configs, the published steps, which the screen admits."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", default=",".join(REPLAYS))
    args = parser.parse_args()
    for name in args.replays.split(","):
        spec = study_from_mapping(_base_mapping(name, {"seed": 0}, 0))
        m = measured(spec, name)
        sys.stdout.write(f"{name}: {len(m.configs)} configs, {len(m.oom)} OOM, "
                         f"{len(m.admitted)} admitted\n")  # fmt: skip
        for key in m.configs:
            step = "OOM" if key in m.oom else f"{m.step[key]:.2f} s"
            mark = "" if key in m.admitted else "  (screened out)"
            sys.stdout.write(f"  {key}: {step}, predicted peak {m.peak_gib[key]:.1f} GiB{mark}\n")
        for line in m.left_out:
            sys.stdout.write(f"  left out: {line}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
