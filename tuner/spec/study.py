"""The study file: frozen typed dataclasses and the strict YAML loader.

A study names the model, the training batch, the cluster, the framework and how to launch it, the
knobs to search and the search budget. ``load_study`` reads ``studies/NAME.yaml`` (or a path, or a
study shipped with the package) and raises :class:`~tuner.errors.ConfigError` naming the YAML path
of anything wrong. See ``studies/gpt-70b.yaml`` for a documented example.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tuner._loader import NOT_IN_FILE
from tuner.errors import ConfigError
from tuner.layout import name_problem, study_name_problem
from tuner.spec.bounds import _ENV_NAME as _ENV_NAME
from tuner.spec.bounds import MAX_FILE_BYTES as MAX_FILE_BYTES
from tuner.spec.bounds import (
    MAX_ITERS,
    MAX_MINUTES,
    MAX_SEED,
    MAX_TRIALS,
    _at_most,
    _positive,
    _size,
    launch_string_problem,
)
from tuner.spec.cluster import ClusterSpec as ClusterSpec
from tuner.spec.cluster import SlurmSpec as SlurmSpec
from tuner.spec.cluster import SSHSpec as SSHSpec
from tuner.spec.controlled import controlled_problem
from tuner.spec.frameworks import LENGTH_ARGS, length_problem, traits
from tuner.spec.frameworks import Framework as Framework
from tuner.spec.model import ModelSpec as ModelSpec
from tuner.spec.model import Precision as Precision
from tuner.spec.model import TrainingSpec as TrainingSpec
from tuner.spec.model import model_data
from tuner.spec.moe import ep_auto, moe_study_problem
from tuner.spec.pipeline_split import parse_split
from tuner.spec.recompute import module_rule_violations, parse_recompute
from tuner.spec.space import Auto as Auto
from tuner.spec.space import RecomputeGranularity as RecomputeGranularity
from tuner.spec.space import RecomputeMethod as RecomputeMethod
from tuner.spec.space import SpaceSpec as SpaceSpec
from tuner.spec.torchtitan import FSDP_DEFAULT, KNOBS, not_torchtitan


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSpec:
    """How one trial is started: the template and what it needs."""

    template: str
    """Launch template name (``megatron_gpt``, ``deepspeed_gpt`` or one of yours)."""
    python: str = "python"
    """Interpreter on the nodes; its bin/ directory is put first on PATH."""
    megatron_path: str | None = None
    """Megatron-LM checkout holding pretrain_gpt.py (Megatron templates)."""
    bridge_path: str | None = None
    """Megatron-Bridge checkout holding scripts/training/run_recipe.py (megatron_bridge)."""
    recipe: str | None = None
    """Megatron-Bridge recipe function the trials run (framework megatron-bridge)."""
    dataset: str | None = "mock"
    """Megatron-Bridge ``--dataset`` preset (``mock``: synthetic data; None: the recipe's own)."""
    script: str | None = None
    """Training script for DeepSpeed templates."""
    script_args: tuple[str, ...] = ()
    """Extra arguments for ``script``."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment exported on every node before launch."""
    extra_args: tuple[str, ...] = ()
    """Extra framework arguments appended verbatim (quoted)."""
    train_args: tuple[str, ...] = ()
    """Arguments of the full run only (``tune best``): data, tokenizer, schedule. They replace
    what a short trial uses instead (Megatron: mock data, NullTokenizer, a fixed schedule)."""
    probe_one_process: bool = False
    """The training script runs a framework probe's points one after another in one process
    when given ``--probe-points FILE`` (DeepSpeed templates; the project's workload does): the
    probe (``tune profile --probe``) then starts once per node, not once per point."""
    train_iters: int = 30
    """Iterations per short trial run."""
    warmup_iters: int = 5
    """Iterations always dropped as warm-up before a trial's step time is measured: the floor
    of the warm-up, which the steady-state estimator (``tuner.logs.steady``) extends while the
    first records are still slow (compilation, allocator growth)."""
    distributed_timeout_minutes: int = 10
    """Process-group timeout (Megatron ``--distributed-timeout-minutes``)."""
    master_port: int = 29500
    """First rendezvous port; concurrent trials get the next ones."""
    workdir: str | None = None
    """Directory the command runs in on the nodes (default: the current directory)."""
    templates_dir: str | None = None
    """Where your own templates live (default: ./launch_templates, then the package's)."""

    def __post_init__(self) -> None:
        problem = _template_problem(self.template)
        if problem is not None:
            raise ConfigError(problem, path="template")
        for key in self.env:
            if not _ENV_NAME.match(key):
                raise ConfigError(
                    f"{key!r} is not an environment variable name (ASCII letters, digits and "
                    "'_', not starting with a digit)",
                    path="env",
                )
        if (unlaunchable := launch_string_problem(dataclasses.asdict(self))) is not None:
            raise ConfigError(unlaunchable[1], path=unlaunchable[0])
        _size(self.train_iters, MAX_ITERS, "train_iters", "a short trial run")
        _size(
            self.distributed_timeout_minutes, MAX_MINUTES, "distributed_timeout_minutes",
            "a week",
        )  # fmt: skip
        if self.warmup_iters < 0 or self.warmup_iters >= self.train_iters:
            raise ConfigError(
                f"must be >= 0 and < train_iters ({self.train_iters}), got {self.warmup_iters}",
                path="warmup_iters",
            )
        if not 1024 <= self.master_port <= 65000:
            raise ConfigError(
                f"must be in 1024..65000, got {self.master_port}", path="master_port"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpec:
    """How the search runs and when it stops."""

    sampler: Literal["model", "tpe", "gp", "random", "grid"] = "model"
    """``model``: the time model's ranking corrected by each measurement
    (``tuner.search.sampler``); or one of Optuna's: ``tpe``, ``gp``, ``random``, ``grid``."""
    n_trials: int = 20
    """Budget of launched runs (pruned and invalid configs do not count)."""
    nodes_per_trial: int | Literal["all"] = "all"
    """Nodes per trial; fewer than all lets several trials run at once on disjoint nodes."""
    trial_timeout_min: float | None = None
    """A trial running longer is ended: recorded with its figure when its log already holds
    ``min_batches`` steady batches, else as timeout. Unset: per config, 1.5 x its predicted
    shortest useful trial (``tuner.space.cost``)."""
    precision: float = 0.02
    """A trial ends, recorded ok, once the 95 % interval of its steady step time is within this
    fraction of the mean (``tuner.logs.steady``); ``launch.train_iters`` is the cap."""
    min_batches: int = 4
    """Fewest batches of the steady-state estimator before a step time counts as known."""
    race: bool = True
    """End a trial as soon as its interval lies entirely above the best measured one's."""
    startup_min: float = 3.0
    """Predicted minutes from launch to the first iteration (processes, rendezvous, model build,
    data loaders), for the time limit and the cost preview: an estimate until launches of the
    same setup ran on the cluster, whose measured start-up the trial costs, the preview, each
    later trial's time limit and the ``max_node_hours`` check then read instead
    (``tuner.space.cost``)."""
    memory_headroom: float = 0.92
    """Prune when the predicted peak exceeds this fraction of GPU memory (but see
    ``memory_probes``)."""
    memory_probes: int = 2
    """At most this many configs predicted over the headroom, yet within the memory model's
    error of the GPU's capacity and predicted faster than every config that fits, are launched
    as memory probes (``tuner.space.probes``); 0 never launches a config predicted over the
    headroom."""
    seed: int | None = None
    """Sampler seed, for reproducible searches."""
    max_wall_time_min: float | None = None
    """Stop launching after this much wall time."""
    max_node_hours: float | None = None
    """Stop launching after this many node-hours were spent."""
    early_stop_trials: int | None = 10
    """Stop when the best has not improved by 1% in this many launched trials."""
    stop_chance: float | None = 0.1
    """Model sampler: stop when the untried configs together have less than this chance of
    beating the best measured by 1%, or when no launch is worth its node-hours
    (``train_node_hours``; :mod:`tuner.search.stopping`); null: neither, only
    ``early_stop_trials``."""
    train_node_hours: float | None = None
    """Node-hours of the training run the answer is for: the model sampler launches a config
    only while its expected step-time gain (the expected improvement, a fraction of the step)
    times this exceeds its predicted trial node-hours (:mod:`tuner.search.value`); null: 200
    trials of the model's fastest config, i.e. a launch must be expected to gain 0.5 %."""
    enqueue_top: int = 3
    """With Optuna's samplers: how many of the best predicted configs run before the sampler
    takes over (the ``model`` sampler starts from the model's ranking by itself)."""
    proxy: bool | Literal["auto"] = False
    """Measure each config first as a *proxy*: the same per-rank work at a smaller data-parallel
    size on fewer nodes, DP still crossing nodes (``tuner.space.proxy``); its full-scale step is
    extrapolated (``tuner.models.time.proxy``) and the best few run again at full scale
    (``proxy_confirm``) before one is called best. ``on``, ``off``, or ``auto``: on for a config
    whose proxy takes at most half of a trial's nodes when a trial takes at least 4."""
    proxy_confirm: int = 2
    """With proxies: how many of the best extrapolated configs run at full scale at the end."""
    fewer_microbatches: bool = True
    """Under ``trial_timeout_min``: a config whose shortest useful trial does not fit the limit
    is measured with fewer micro-batches per step (same tp, pp, dp and micro-batch, a smaller
    global batch) and its full step extrapolated (``tuner.space.shorten``); off: it is never
    launched (``pruned_time``)."""
    heartbeat_s: float = 30.0
    """How often a worker marks its running trials and node leases alive; a worker silent for
    four periods is taken as dead (its trials re-run, its nodes are cleaned and freed)."""

    def __post_init__(self) -> None:
        _size(self.n_trials, MAX_TRIALS, "n_trials", "each launched run costs node-minutes")
        _positive(self.heartbeat_s, "heartbeat_s")  # 1e30 overflowed the heartbeat's wait
        _at_most(self.heartbeat_s, MAX_MINUTES * 60, "heartbeat_s", "a week")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:  # numpy: a traceback
            raise ConfigError(f"must be from 0 to {MAX_SEED:,}, got {self.seed:,}", path="seed")
        if isinstance(self.nodes_per_trial, int):
            _positive(self.nodes_per_trial, "nodes_per_trial")
        _positive(self.trial_timeout_min, "trial_timeout_min")
        _at_most(self.trial_timeout_min, MAX_MINUTES, "trial_timeout_min", "a week")
        if not 0 < self.precision < 1:
            raise ConfigError(f"must be in (0, 1), got {self.precision}", path="precision")
        if not 2 <= self.min_batches <= 100:
            raise ConfigError(f"must be in 2..100, got {self.min_batches}", path="min_batches")
        _positive(self.startup_min, "startup_min")
        _at_most(self.startup_min, MAX_MINUTES, "startup_min", "a week")
        if not 0 < self.memory_headroom <= 1:
            raise ConfigError(
                f"must be in (0, 1], got {self.memory_headroom}", path="memory_headroom"
            )
        _positive(self.max_wall_time_min, "max_wall_time_min")
        _positive(self.max_node_hours, "max_node_hours")
        _positive(self.early_stop_trials, "early_stop_trials")
        _positive(self.train_node_hours, "train_node_hours")
        if self.memory_probes < 0:
            raise ConfigError(f"must be >= 0, got {self.memory_probes}", path="memory_probes")
        _at_most(self.memory_probes, MAX_TRIALS, "memory_probes", "more than any budget")
        if self.stop_chance is not None and not 0 < self.stop_chance < 1:
            raise ConfigError(f"must be in (0, 1), got {self.stop_chance}", path="stop_chance")
        if self.enqueue_top < 0:
            raise ConfigError(f"must be >= 0, got {self.enqueue_top}", path="enqueue_top")
        _at_most(self.enqueue_top, MAX_TRIALS, "enqueue_top", "more than any budget")
        if not 1 <= self.proxy_confirm <= MAX_TRIALS:
            raise ConfigError(f"must be in 1..{MAX_TRIALS}, got {self.proxy_confirm}",
                              path="proxy_confirm")  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class StudySpec:
    """A whole study file."""

    name: str
    """Study name: results go to results/<name>/."""
    description: str | None = None
    """Free text shown by ``tune`` commands."""
    model: ModelSpec
    """The model (a preset name plus overrides, or every field)."""
    training: TrainingSpec
    """Global batch and precision."""
    cluster: ClusterSpec
    """Nodes, GPUs and executor."""
    framework: Framework
    """megatron, deepspeed, megatron-deepspeed, megatron-bridge or torchtitan
    (``tuner.spec.frameworks``)."""
    launch: LaunchSpec
    """How a trial is launched."""
    space: SpaceSpec = field(default_factory=SpaceSpec)
    """The knobs to search."""
    search: SearchSpec = field(default_factory=SearchSpec)
    """Sampler and budget."""
    found_by: str | None = field(default=None, compare=False, metadata={NOT_IN_FILE: True})
    """The name or path :func:`~tuner.spec.file.load_study` found this study by (the
    ``--study`` given); None for a study not read that way. Set by the reader, not a key of the
    file; :attr:`study_arg` repeats it."""
    cluster_file: bool = field(default=False, compare=False, metadata={NOT_IN_FILE: True})
    """Whether :attr:`found_by` is a cluster file (``tune profile --cluster FILE``, a study
    made of its cluster and model) rather than a study. Set by the reader, not a key of the
    file."""
    source_path: str | None = field(default=None, compare=False, metadata={NOT_IN_FILE: True})
    """The full path of the study file :attr:`found_by` names, as the reader resolved it; None
    for a cluster file or a study not read from a file. Set by the reader."""

    def __post_init__(self) -> None:
        problem = study_name_problem(self.name)  # the results layout's: the name is a directory
        if problem is not None:
            raise ConfigError(problem, path="name")
        if self.model.add_qkv_bias and not traits(self.framework).megatron_core:
            raise ConfigError(f"--add-qkv-bias is a Megatron-Core setting (Megatron-LM, "
                              f"Megatron-Bridge); {self.framework} has no QKV-only bias",
                              path="model.add_qkv_bias")  # fmt: skip
        splits = () if self.space.pipeline_split == "auto" else self.space.pipeline_split
        for i, text in enumerate(splits):
            owner = parse_split(text).framework
            if owner not in (None, traits(self.framework).split_family):
                raise ConfigError(
                    f"{text!r} is a {owner} pipeline split; this study's framework is "
                    f"{self.framework}",
                    path=f"space.pipeline_split[{i}]",
                )
        self._check_moe_and_fp8()
        words = {n: getattr(self.launch, n) for n in LENGTH_ARGS}
        for found in (length_problem(self.framework, words),
                      controlled_problem(self.framework, words)):  # fmt: skip
            if found is not None:
                raise ConfigError(found[1], path=found[0])
        self._check_recompute_modules()
        self._check_torchtitan_knobs()
        n = len(self.node_names)
        if isinstance(self.search.nodes_per_trial, int) and self.search.nodes_per_trial > n:
            raise ConfigError(
                f"{self.search.nodes_per_trial} is more than the cluster's {n} nodes",
                path="search.nodes_per_trial",
            )

    def _check_moe_and_fp8(self) -> None:
        """Study-wide rules of expert parallelism and FP8 (per-config ones:
        tuner.config.parallel)."""
        from tuner.catalog import get_gpu
        from tuner.spec.fp8 import fp8_problem

        eps = self.space.ep
        if eps == "auto":  # what the space's axis will hold (1 alone for a dense model)
            eps = ep_auto(self.model.moe, self.world_size)
        found = moe_study_problem(
            self.framework, self.training.precision, self.model.moe, eps,
            self.space.etp or (None,), self.space.moe_token_dispatcher,
        )  # fmt: skip
        if found is not None:
            raise ConfigError(found[1], path=found[0])
        if traits(self.framework).recipe_launch and not self.launch.recipe:
            raise ConfigError(
                f"framework {self.framework} runs a recipe: name its function (for example "
                "llama3_8b_pretrain_config)",
                path="launch.recipe",
            )
        if self.launch.probe_one_process and self.framework != "deepspeed":
            raise ConfigError(
                "only a DeepSpeed study's script runs a probe's points in one process (the "
                f"project's workload takes --probe-points); {self.framework}'s probe launches "
                "once per point: leave it false",
                path="launch.probe_one_process",
            )
        if self.training.cross_entropy_fusion and not traits(self.framework).megatron_core:
            raise ConfigError(
                "cross_entropy_fusion is Megatron-LM's --cross-entropy-loss-fusion (Core's "
                "cross_entropy_loss_fusion); "
                f"{self.framework} has no such switch",
                path="training.cross_entropy_fusion",
            )
        if self.training.precision == "fp8":
            if self.framework == "megatron-bridge":
                raise ConfigError(
                    "fp8 is not rendered for megatron-bridge yet: set the recipe's "
                    "mixed_precision in launch.extra_args and study bf16",
                    path="training.precision",
                )
            if self.framework != "megatron":
                raise ConfigError(
                    "fp8 runs through Transformer Engine in Megatron-LM; the DeepSpeed "
                    "workload has no FP8 path",
                    path="training.precision",
                )
            problem = fp8_problem(self.training.fp8_recipe, get_gpu(self.cluster.gpu))
            if problem is not None:
                raise ConfigError(problem, path="training.precision")

    def _check_torchtitan_knobs(self) -> None:
        """torchtitan's knobs only in a torchtitan study; there, none of the others' knobs."""
        sp = self.space
        titan = {name: (default,) for name, default in zip(KNOBS, FSDP_DEFAULT, strict=True)}
        if not traits(self.framework).fsdp2:
            for name, default in titan.items():
                if getattr(sp, name) != default:
                    raise ConfigError(not_torchtitan(self.framework), path=f"space.{name}")
            return
        if not {"--module", "--config"} <= {a.split("=")[0] for a in self.launch.script_args}:
            raise ConfigError(
                "torchtitan's trainer needs --module and --config (the config function that "
                "builds the model), e.g. [--module, llama3, --config, llama3_8b]",
                path="launch.script_args",
            )
        if self.training.precision not in ("bf16", "fp32"):
            raise ConfigError(
                "torchtitan trains bf16 (mixed_precision_param bfloat16) or fp32; its float8 is a "
                "model converter chosen by the config function (launch.script_args)",
                path="training.precision",
            )
        others = {"vp": (1,), "distributed_optimizer": (False,), "zero_stage": (0,)}
        why = {
            "vp": "torchtitan's stages per rank follow space.pp_schedule",
            "distributed_optimizer": "torchtitan shards with FSDP2: search space.dp_shard",
            "zero_stage": "torchtitan shards with FSDP2: search space.dp_shard",
        }
        for name, default in others.items():
            if getattr(sp, name) != default:
                raise ConfigError(f"{why[name]}; list only {list(default)}", path=f"space.{name}")
        if sp.pipeline_split != ("even",):
            raise ConfigError(
                "torchtitan splits stages by its own rule (embedding and output weigh one layer "
                "each); list only ['even']",
                path="space.pipeline_split",
            )

    def _check_recompute_modules(self) -> None:
        """Selective-recompute modules the model, precision or framework rules out for every
        config (the same rules tuner.config.parallel applies to one config)."""
        for i, text in enumerate(self.space.recompute):
            knobs = parse_recompute(text)
            found = module_rule_violations(
                knobs.granularity, knobs.modules, self.model.moe, self.model.num_layers,
                self.framework,
                self.training.precision, self.training.fp8_recipe,
            )  # fmt: skip
            if found:
                raise ConfigError(found[0][1], path=f"space.recompute[{i}]")

    @property
    def node_names(self) -> tuple[str, ...]:
        """The cluster's hosts (local executor: local-0, local-1, ...)."""
        c = self.cluster
        if c.nodes is not None:
            return c.nodes
        if c.executor == "slurm" and c.num_nodes is not None:
            # Abstract slots: leases and parallelism work as for named nodes; Slurm picks hosts.
            return tuple(f"slurm-{i}" for i in range(c.num_nodes * c.slurm.max_jobs))
        if c.num_nodes is not None:
            return tuple(f"local-{i}" for i in range(c.num_nodes))
        return ()  # hostfile: resolved by load_study

    @property
    def nodes_per_trial(self) -> int:
        """Nodes each trial uses."""
        n = self.search.nodes_per_trial
        if n == "all" and self.cluster.executor == "slurm" and self.cluster.num_nodes:
            return self.cluster.num_nodes  # "all" of one trial's nodes, not of every slot
        return len(self.node_names) if n == "all" else n

    @property
    def cluster_name(self) -> str:
        """``cluster.name``, or one made of the GPU, executor and node count: the key of the
        cluster's saved profile and calibration."""
        c = self.cluster
        return c.name or f"{c.gpu_name}-{c.executor}-{len(self.node_names)}x{c.gpus_per_node}"

    @property
    def study_arg(self) -> str:
        """The ``--study`` value a command tuner prints repeats, shell-quoted: the name or path
        the study was found by (a study file outside ``studies/`` is not found by the name
        inside it), else its name."""
        return shlex.quote(self.found_by or self.name)

    def command_args(self, results: str | Path = "results") -> str:
        """``--study X``, and ``--results DIR`` where the results are not under the default
        ``./results``: what a printed hint's command needs to find this study's trials."""
        args = f"--study {self.study_arg}"
        if Path(results).resolve() != Path("results").resolve():
            args += f" --results {shlex.quote(str(results))}"
        return args

    @property
    def source_file(self) -> str | None:
        """The file this study was read from, for an error about a setting it lacks: the
        cluster file, else the study file :attr:`found_by` names (as given where it cannot be
        found again); None for a study not read from a file."""
        if self.found_by is None or self.cluster_file:
            return self.found_by
        return self.source_path or self.found_by

    @property
    def profile_command(self) -> str:
        """The ``tune profile`` command that measures this study's cluster again, as the user
        gave it: ``--cluster FILE`` for a cluster file, else ``--study`` (:attr:`study_arg`)."""
        option = "--cluster" if self.cluster_file else "--study"
        return f"tune profile {option} {self.study_arg}"

    @property
    def world_size(self) -> int:
        """Ranks in one trial: nodes_per_trial x gpus_per_node."""
        return self.nodes_per_trial * self.cluster.gpus_per_node

    def fingerprint(self) -> str:
        """A hash of everything that changes what a trial measures (not the search budget)."""
        data = dataclasses.asdict(self)
        data["model"] = model_data(self.model)
        data.pop("search")
        data.pop("description")
        data.pop("found_by")  # where the file was found from, not what it says
        data.pop("cluster_file")
        data.pop("source_path")
        data["cluster"].pop("name")  # names the saved calibration; changes no measurement
        data["cluster"].pop("recorded_stack")  # the cluster profile's record, not the study's
        data["launch"].pop("train_args")  # the full run's only: no trial sees them
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _template_problem(template: str) -> str | None:
    """Why ``template`` is not a template name inside the template folders, or None."""
    parts = template.split("/")
    for part in parts:
        if name_problem(part) is not None:
            return (
                f"{template!r} must name a template inside the template folders: plain names "
                "(ASCII letters, digits, '.', '_', '-') joined by '/', no '..', not absolute"
            )
    return None
