"""A measured trial as a record, and its config exported as a full run (``tune best``).

:func:`trial_record` reads one trial (the fastest measured one unless a number is given) into a
:class:`TrialRecord`: the config, the figures the leaderboard shows for it, the hosts it ran on
and the software versions its logs name. :meth:`TrialRecord.export` writes one kind of export
into the trial's own export folder (:class:`tuner.layout.ExportPaths`), each kind to its own
files:

- ``script``: ``launch.sh``, one script for every node, which finds this node's rank and the
  master address when it runs (:mod:`tuner.launch.export_script`);
- ``sbatch``: ``sbatch.sh``, a Slurm batch job running ``sbatch-node.sh`` (the same script) on
  every node of its allocation;
- ``args``: ``args.txt``, the framework's own arguments (Megatron's flags; for DeepSpeed the
  launcher line of the training script, and the ds_config it names in ``args-files/``);
- ``ds-config``: ``ds_config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import spell
from tuner.errors import ConfigError
from tuner.launch.base import write_atomic
from tuner.launch.export_script import MasterSources, comment_block, launch_script
from tuner.launch.megatron_flags import deepspeed_script_flags
from tuner.launch.slurm_script import MASTER_PLACEHOLDER, best_batch_script
from tuner.launch.templates import TemplateRenderer, deepspeed_config
from tuner.layout import EXPORT_KINDS, ExportPaths, ResultsLayout, folder_problem
from tuner.logs.versions import tuner_version, versions_in_logs
from tuner.outcome import Outcome
from tuner.report import units
from tuner.report.leaderboard import (
    SHOWN_ATTRS,
    best_trial,
    board_trials,
    leaderboard_row,
    megatron_args,
    whole_trial,
)
from tuner.spec.frameworks import traits
from tuner.spec.study import StudySpec

MEASURED = ("measured_step_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
            "measured_peak_gib", "measured_reserved_gib", "duration_s",
            "step_measure", "scale", "proxy_dp", "proxy_nodes", "proxy_step_s")  # fmt: skip
"""The leaderboard columns that hold a trial's measurement (``scale`` ``proxy``: its step is
extrapolated from a run of the config at a smaller DP, :mod:`tuner.study.proxy`)."""
PREDICTED = ("predicted_step_s", "predicted_mfu", "predicted_peak_gib", "predicted_allocated_gib",
             "predicted_reserved_gib")  # fmt: skip
"""The leaderboard columns that hold what the models predicted for it."""
STEP_MEASURES = {"steady": "steady-state mean", "median": "median"}
"""How the header names a trial's measured step (the leaderboard's ``step_measure``)."""
NOT_MEASURED = (
    "A short trial does not measure: evaluation, checkpoint saving and loading, data loading at "
    "scale (trials read mock or cached data), the learning-rate schedule's effect on "
    "convergence, or a long run's stability (memory growth, stragglers, failing nodes)."
)


@dataclass(frozen=True, slots=True)
class Export:
    """One kind of export, written: its main file and every file written with it."""

    kind: str
    path: Path
    text: str
    """The main file's content (what ``tune best`` prints)."""
    files: tuple[Path, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One measured trial, as ``tune best`` shows it; :meth:`export` writes its full run."""

    study: str
    trial: int
    """The trial's number (Optuna's)."""
    config: ParallelConfig
    measured: Mapping[str, Any]
    """The leaderboard's measured figures (step time s, tokens/s, TFLOP/s per GPU, MFU, peak)."""
    predicted: Mapping[str, Any]
    """What the memory and time models predicted for the config."""
    hosts: tuple[str, ...]
    """The nodes the trial ran on."""
    versions: Mapping[str, str]
    """Software versions the trial's logs name (``{}`` when they name none)."""
    best: bool
    """Whether this is the fastest measured trial of the study."""
    spec: StudySpec = field(repr=False, compare=False)
    results: str = field(default="results", repr=False, compare=False)

    @property
    def proxy(self) -> bool:
        """Whether the trial ran the config as a proxy, on fewer nodes than the config needs."""
        return self.measured.get("scale") == "proxy"

    def run_hosts(self) -> list[str]:
        """The full run's nodes: the trial's, or for a proxy the study's full count (the config
        is the full-scale one; the proxy ran it at a smaller DP on part of the nodes)."""
        if self.proxy or not self.hosts:
            return list(self.spec.node_names[: self.spec.nodes_per_trial])
        return list(self.hosts)

    @property
    def paths(self) -> ExportPaths:
        """Where this trial's exports go."""
        return ResultsLayout(Path(self.results), self.study).export(self.trial)

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data (``tune best --format json``)."""
        return {
            "study": self.study, "trial": self.trial, "best": self.best,
            "config": self.config.to_dict(), "key": self.config.key(),
            "measured": dict(self.measured), "predicted": dict(self.predicted),
            "hosts": list(self.hosts), "versions": dict(self.versions),
        }  # fmt: skip

    def export(self, kind: str = "script", *, train_iters: int | None = None) -> Export:
        """Write the ``kind`` export (``script``, ``sbatch``, ``args``, ``ds-config``) of this
        trial's config; ``train_iters`` sets the full run's length (the study's otherwise)."""
        if kind not in EXPORT_KINDS:
            raise ConfigError(f"unknown export {kind!r}; one of {', '.join(EXPORT_KINDS)}",
                              path="--emit")  # fmt: skip
        if train_iters is not None and train_iters <= 0:
            raise ConfigError(f"must be > 0, got {train_iters}", path="--train-iters")
        spec = self.spec
        if train_iters is not None:  # warm-up only shapes a trial's median: keep it valid
            warmup = min(spec.launch.warmup_iters, train_iters - 1)
            launch = dataclasses.replace(spec.launch, train_iters=train_iters, warmup_iters=warmup)
            spec = dataclasses.replace(spec, launch=launch)
        try:
            self.paths.dir.mkdir(parents=True, exist_ok=True)
        except OSError:  # "trial-3: Not a directory" for a file named exports, "File exists"
            if (problem := folder_problem(str(self.paths.dir))) is None:
                raise
            raise ConfigError(f"cannot write the export to {self.paths.dir}: {problem}") from None
        writer = {
            "script": _script, "sbatch": _sbatch, "args": _args, "ds-config": _ds_config,
            "bridge-overrides": _bridge_overrides, "bridge-recipe": _bridge_recipe,
            "torchtitan": _torchtitan,
        }  # fmt: skip
        return writer[kind](self, spec)


def trial_record(
    spec: StudySpec, trial: int | None = None, *, storage: str | None = None,
    results: str = "results",
) -> TrialRecord:  # fmt: skip
    """Trial ``trial`` of ``spec`` (the fastest measured one when None) as a record.

    A trial that measured nothing (failed, pruned, running, or answered from another trial)
    raises :class:`ConfigError` naming its outcome.
    """
    fastest = best_trial(spec, storage, results)
    if trial is None or trial == fastest.number:
        t = fastest
    else:
        t = _measured_trial(spec, trial, storage, results)
    row = leaderboard_row(t, spec.world_size)
    paths = ResultsLayout(Path(results), spec.name).trial(t.number)
    logs = sorted(paths.dir.glob("node-*.log")) if paths.dir.is_dir() else []
    return TrialRecord(
        study=spec.name, trial=t.number, config=ParallelConfig(**t.user_attrs["config"]),
        measured={k: row[k] for k in MEASURED}, predicted={k: row[k] for k in PREDICTED},
        hosts=tuple(t.user_attrs.get("hosts", ())), versions=versions_in_logs(logs),
        best=t.number == fastest.number, spec=spec, results=results,
    )  # fmt: skip


def _measured_trial(
    spec: StudySpec, number: int, storage: str | None, results: str
) -> FrozenTrial:
    found = [t for t in board_trials(spec, storage, results, SHOWN_ATTRS) if t.number == number]
    if not found:
        raise ConfigError(f"study {spec.name!r} has no trial {number}", path="--trial")
    t = whole_trial(spec, storage, results, found[0])  # that one whole, not every trial
    outcome = t.user_attrs.get("outcome") or t.state.name.lower()
    if "duplicate_of" in t.user_attrs:
        raise ConfigError(f"trial {number} ran no config of its own: it repeats trial "
                          f"{t.user_attrs['duplicate_of']}", path="--trial")  # fmt: skip
    if outcome != Outcome.OK or t.value is None:
        raise ConfigError(f"trial {number} measured nothing (outcome {outcome})", path="--trial")
    return t


def emit_best(
    spec: StudySpec, what: str, storage: str | None = None, results: str = "results",
    train_iters: int | None = None, trial: int | None = None,
) -> str:  # fmt: skip
    """The text of one export of the best trial (or of ``trial``), written to its files."""
    record = trial_record(spec, trial, storage=storage, results=results)
    return record.export(what, train_iters=train_iters).text


# ----------------------------------------------------------------------------- the header


def _figure(value: Any, form: Callable[[float], str], unit: str) -> str | None:
    """``value`` in ``form`` (one of :mod:`tuner.report.units`, the tables' formats) and its
    ``unit``; None when the trial recorded none."""
    return None if value is None else f"{form(value)}{unit}"


def _share(value: float) -> str:
    return f"{units.percent(value)}%"


def header(
    record: TrialRecord, spec: StudySpec, nodes: int, script: str = "launch.sh"
) -> list[str]:
    """What the export says about itself: which config and trial, what was measured, with which
    software, how long the run is, what a short trial does not measure, and how to run
    ``script`` (its own file name: ``sbatch-node.sh`` said to run ``launch.sh``)."""
    m, p = record.measured, record.predicted
    which = "the fastest measured trial" if record.best else "chosen with --trial"
    measure = STEP_MEASURES.get(str(m.get("step_measure")), "median")
    got = [_figure(m["measured_step_s"], units.seconds, f" s/step ({measure})"),
           _figure(m["tokens_per_s"], units.rate, " tokens/s"),
           _figure(m["tflops_per_gpu"], units.tflops, " TFLOP/s per GPU"),
           _figure(m["mfu"], _share, " MFU"),
           _figure(m["measured_peak_gib"], units.gib, " GiB peak allocated")]  # fmt: skip
    want = [_figure(p["predicted_step_s"], units.seconds, " s/step"),
            _figure(p["predicted_peak_gib"], units.gib, " GiB peak")]  # fmt: skip
    software = ", ".join([f"tuner {tuner_version()}"]
                         + [f"{k} {v}" for k, v in record.versions.items()])  # fmt: skip
    if not record.versions:
        software += " (the trial's logs name no framework version)"
    gpus = spec.cluster.gpus_per_node
    return [
        f"Full run of study {spec.name}, trial {record.trial} ({which}).",
        f"Config: {spell(record.config)}",
        f"Config key: {record.config.key()}",
        f"Framework: {spec.framework}, template {spec.launch.template}; {nodes} node(s) x {gpus} "
        f"GPUs per node.",
        f"Measured by trial {record.trial} over {record.spec.launch.train_iters} iterations "
        f"(the first {record.spec.launch.warmup_iters} skipped): "
        + ", ".join(x for x in got if x) + ".",
        *_proxy_line(record, nodes),
        "Predicted: " + (", ".join(x for x in want if x) or "nothing recorded") + ".",
        f"Software: {software}.",
        f"This run: {spec.launch.train_iters} iterations (tune best --train-iters N to change); "
        + ("launch.train_args: " + shlex.join(spec.launch.train_args) if spec.launch.train_args
           else "no launch.train_args (the training script's own data and schedule)") + ".",
        "Environment: " + (", ".join(f"{k}={v}" for k, v in sorted(spec.launch.env.items()))
                           or "none set by the study") + " (as the trial ran; see each node).",
        NOT_MEASURED,
        f"Run on every node: NODE_RANK=<k> bash {script} (one node: bash {script}; in a Slurm "
        "job SLURM_NODEID is the rank). Master address: MASTER_ADDR, else the first node of the "
        "Slurm allocation, else the first host of the file HOSTFILE names, else "
        "the study's first SSH node (the address its trials used), else 127.0.0.1 for one "
        "node.",
    ]  # fmt: skip


def _proxy_line(record: TrialRecord, nodes: int) -> list[str]:
    """For a proxy trial: what ran, and that the step above is its extrapolation."""
    m = record.measured
    if not record.proxy:
        return []
    ran = _figure(m["proxy_step_s"], units.seconds, " s/step") or "its step"
    return [f"Measured as a proxy: trial {record.trial} ran this config at DP {m['proxy_dp']} on "
            f"{m['proxy_nodes']} node(s), {ran}; the step above is that run extrapolated to "
            f"the {nodes} node(s) of this run, where no trial ran it."]  # fmt: skip


# ----------------------------------------------------------------------------- the kinds


def _render_run(
    record: TrialRecord, spec: StudySpec, files_dir: Path, script: Path
) -> tuple[str, list[Path]]:
    """The launch script of the full run (to be written to ``script``), with its extra files
    written into ``files_dir``."""
    hosts = record.run_hosts()
    rendered = TemplateRenderer.for_study(spec).render(
        spec, record.config, hosts=hosts, master_addr=MASTER_PLACEHOLDER,
        master_port=spec.launch.master_port, trial_dir=str(files_dir.resolve()), full_run=True,
    )  # fmt: skip
    written = []
    if rendered.files:
        files_dir.mkdir(parents=True, exist_ok=True)
    for name, content in rendered.files.items():
        write_atomic(files_dir / name, content)
        written.append(files_dir / name)
    sources = MasterSources(study_host=_trials_master(spec), port=spec.launch.master_port)
    lines = header(record, spec, len(rendered.scripts), script.name)
    text = launch_script(lines, rendered.scripts, sources)
    return text, written


def _trials_master(spec: StudySpec) -> str | None:
    """For an SSH study, the master address its trials used: the first node's address in the
    ssh config (a node name may be an alias only this machine knows), or the node's name where
    that config cannot be read here; else None."""
    if spec.cluster.executor != "ssh":
        return None
    from tuner.launch.ssh import SSHExecutor

    try:
        with SSHExecutor(spec.cluster.ssh) as executor:
            return executor.master_addr(spec.node_names[:1])
    except ConfigError:  # the study's ssh config is not on this machine
        return spec.node_names[0]


def _script(record: TrialRecord, spec: StudySpec) -> Export:
    paths = record.paths
    text, files = _render_run(record, spec, paths.script_files, paths.script)
    write_atomic(paths.script, text, mode=0o755)
    return Export("script", paths.script, text, (paths.script, *files))


def _sbatch(record: TrialRecord, spec: StudySpec) -> Export:
    paths = record.paths
    node_text, files = _render_run(record, spec, paths.sbatch_files, paths.sbatch_node)
    write_atomic(paths.sbatch_node, node_text, mode=0o755)
    nodes = len(record.run_hosts())
    text = best_batch_script(
        spec.cluster.slurm, study=spec.name, nodes=nodes,
        comments=comment_block(header(record, spec, nodes)[:-1]),
        node_script=str(paths.sbatch_node.resolve()),
    )  # fmt: skip
    write_atomic(paths.sbatch, text)
    return Export("sbatch", paths.sbatch, text, (paths.sbatch, paths.sbatch_node, *files))


def framework_args(record: TrialRecord, spec: StudySpec) -> list[str]:
    """The framework's own arguments: Megatron's flags, or (DeepSpeed) the training script's
    arguments after its ``--deepspeed_config``."""
    if traits(spec.framework).fsdp2:  # torchtitan's trainer options
        from tuner.launch.torchtitan_flags import torchtitan_args

        return torchtitan_args(spec, record.config)
    if not traits(spec.framework).megatron_model:
        flags = deepspeed_script_flags(spec.model, record.config, spec.launch.train_iters)
        words = [w for flag in flags for w in flag]
        return [*words, *spec.launch.script_args, *spec.launch.train_args,
                *spec.launch.extra_args]  # fmt: skip
    return megatron_args(spec, record.config)


def _args(record: TrialRecord, spec: StudySpec) -> Export:
    paths = record.paths
    words = framework_args(record, spec)
    if traits(spec.framework).megatron_model:
        write_atomic(paths.args, shlex.join(words) + "\n")
        return Export("args", paths.args, paths.args.read_text(), (paths.args,))
    nodes = ["--nnodes", str(len(record.run_hosts())),
             "--nproc_per_node", str(spec.cluster.gpus_per_node)]  # fmt: skip
    if traits(spec.framework).fsdp2:  # torchtitan's trainer after torchrun, as its template
        from tuner.report.torchtitan_export import torchtitan_export

        target = [spec.launch.script] if spec.launch.script else ["-m", "torchtitan.train"]
        trainer = shlex.split(torchtitan_export(spec, record.config))  # refused: cannot say
        launcher = ["torchrun", *nodes, *target, *trainer]
        write_atomic(paths.args, shlex.join(launcher) + "\n")
        return Export("args", paths.args, paths.args.read_text(), (paths.args,))
    # DeepSpeed: the training script's launcher line and the ds_config it names
    paths.args_files.mkdir(exist_ok=True)
    config = paths.args_files / "ds_config.json"
    write_atomic(config, json.dumps(deepspeed_config(spec, record.config), indent=2) + "\n")
    script = spec.launch.script or "<launch.script>"
    launcher = ["torchrun", *nodes, script, "--deepspeed_config", str(config.resolve()), *words]
    write_atomic(paths.args, shlex.join(launcher) + "\n")
    return Export("args", paths.args, paths.args.read_text(), (paths.args, config))


def _ds_config(record: TrialRecord, spec: StudySpec) -> Export:
    if not traits(spec.framework).deepspeed_optimizer:
        raise ConfigError(f"a {spec.framework} study has no DeepSpeed config; use --emit args",
                          path="--emit")  # fmt: skip
    paths = record.paths
    text = json.dumps(deepspeed_config(spec, record.config), indent=2) + "\n"
    write_atomic(paths.ds_config, text)
    return Export("ds-config", paths.ds_config, text, (paths.ds_config,))


def _bridge_overrides(record: TrialRecord, spec: StudySpec) -> Export:
    return _bridge(record, spec, "bridge-overrides")


def _bridge_recipe(record: TrialRecord, spec: StudySpec) -> Export:
    return _bridge(record, spec, "bridge-recipe")


def _bridge(record: TrialRecord, spec: StudySpec, kind: str) -> Export:
    """Megatron-Bridge's overrides or a recipe function, for any Megatron-Core config."""
    from tuner.launch import bridge

    paths = record.paths
    path = paths.bridge_overrides if kind == "bridge-overrides" else paths.bridge_recipe
    text = bridge.emit(spec, record.config, kind, trial=None if record.best else record.trial)
    write_atomic(path, text)
    return Export(kind, path, text, (path,))


def _torchtitan(record: TrialRecord, spec: StudySpec) -> Export:
    """The pinned torchtitan release's trainer arguments, one shell-quoted line."""
    from tuner.report.torchtitan_export import torchtitan_export

    path = record.paths.torchtitan
    text = torchtitan_export(spec, record.config)
    write_atomic(path, text)
    return Export("torchtitan", path, text, (path,))
