"""Render launch templates into per-node scripts and extra files.

A study's ``launch.template: NAME`` names ``NAME.sh.j2``, looked up in ``launch.templates_dir``,
then ``./launch_templates/``, then the templates shipped in the package (``tuner/templates/``).
The script template is rendered once per node. A template that needs more files declares them at
top level, ``{% set extra_files = ["ds_config.json"] %}``, and each one is rendered from
``<file>.j2`` (once, the same for every node) and placed in the trial directory.

Rendering is strict (an undefined name is an error) and every value that reaches a shell goes
through the ``shq`` filter (``shlex.quote``). Templates see: ``spec``, ``model``, ``training``,
``cluster``, ``launch``, ``cfg`` (the :class:`ParallelConfig`), ``nnodes``, ``node_rank``,
``nproc_per_node``, ``hosts``, ``master_addr``, ``master_port``, ``trial_dir``, ``files`` (name ->
path on the node), ``env``, ``extra_args``, ``python``, ``python_bin``, ``cpu``, ``ds_config`` and
``megatron_flags`` (the parallelism, batch, recompute and optimizer flags of ``cfg``, each a tuple
of the flag and its values: :func:`tuner.launch.megatron_flags.megatron_parallel_flags`),
``megatron_model_flags`` (precision and MoE flags, from the same module),
``deepspeed_moe_flags`` (the DeepSpeed workload's MoE flags, same module) and
``megatron_deepspeed_flags`` (the same in Megatron-DeepSpeed's names,
:func:`~tuner.launch.megatron_flags.megatron_deepspeed_parallel_flags`),
``deepspeed_script_flags`` (the DeepSpeed workload's shape, length and MoE flags),
``torchtitan_flags`` (torchtitan's overrides, the activation-checkpoint subcommand last:
:func:`tuner.launch.torchtitan_flags.torchtitan_flags`), ``bridge_overrides`` (a recipe trial's
``field=value`` words,
:func:`tuner.launch.bridge.trial_overrides`), ``full_run`` (true when ``tune best`` renders the
full run) and ``train_args`` (``launch.train_args`` in a full run, empty in a trial).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2

from tuner.config.parallel import ParallelConfig
from tuner.config.pipeline import deepspeed_method
from tuner.errors import ConfigError, LaunchError, TemplateError
from tuner.launch.bridge import override_words, trial_overrides
from tuner.launch.megatron_flags import (
    deepspeed_moe_flags,
    deepspeed_script_flags,
    megatron_deepspeed_parallel_flags,
    megatron_loss_flags,
    megatron_moe_flags,
    megatron_parallel_flags,
    megatron_precision_flags,
)
from tuner.launch.torchtitan_flags import inexpressible, torchtitan_flags
from tuner.spec.bounds import _ENV_NAME
from tuner.spec.frameworks import traits
from tuner.spec.study import LaunchSpec, StudySpec
from tuner.spec.template_owner import SCRIPT_SUFFIX, template_dirs

TRAIN_ARGS_HINT = (
    "the full run needs the study's data, tokenizer and schedule (e.g. --data-path PREFIX "
    "--tokenizer-type ... --lr ...); a short trial's mock data is no training run (put "
    "--mock-data there to train on it anyway)"
)
"""Why a Megatron template's full run refuses an empty ``launch.train_args``."""


@dataclass(frozen=True, slots=True)
class RenderedLaunch:
    """What one trial runs: a script per node (node-rank order) and the extra files."""

    scripts: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)


class _AnyFile(dict[str, str]):
    def __init__(self, trial_dir: str) -> None:
        super().__init__()
        self._dir = trial_dir

    def __missing__(self, name: str) -> str:
        return str(PurePosixPath(self._dir) / name)


def _shq(value: object) -> str:
    if value is None:
        raise LaunchError("a template passed None to shq (an unset setting?)")
    if isinstance(value, bool):
        value = int(value)
    return shlex.quote(str(value))


def _envname(name: object) -> str:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise ConfigError(f"{name!r} is not a valid environment variable name", path="launch.env")
    return name


def _required(value: object, setting: str, why: str = "") -> object:
    if value is None or (isinstance(value, str | list | tuple) and not value):
        raise ConfigError(why or "this launch template needs it; set it there", path=setting)
    return value


def _combine(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _combine(out[key], value)
        else:
            out[key] = value
    return out


def _tojson_pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=False) + "\n"


def search_path(spec: StudySpec | None = None, cwd: Path | None = None) -> list[Path]:
    """The directories searched for templates before the package's own, in order."""
    return template_dirs(spec.launch.templates_dir if spec is not None else None, cwd)


@functools.lru_cache(maxsize=16)
def _renderer(dirs: tuple[Path, ...]) -> TemplateRenderer:
    return TemplateRenderer(dirs)


class TemplateRenderer:
    """A Jinja2 environment over the user's template directories and the package's templates."""

    def __init__(self, dirs: Sequence[Path] = ()) -> None:
        self.dirs = [d for d in dirs if d.is_dir()]
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(
                [
                    jinja2.FileSystemLoader([str(d) for d in self.dirs]),
                    jinja2.PackageLoader("tuner", "templates"),
                ]
            ),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        self.env.filters.update(
            shq=_shq,
            envname=_envname,
            required=_required,
            combine=_combine,
            tojson_pretty=_tojson_pretty,
        )

    @classmethod
    def for_study(cls, spec: StudySpec, cwd: Path | None = None) -> TemplateRenderer:
        """Look in the study's ``launch.templates_dir``, ``./launch_templates``, the package.

        One renderer per search path is kept, so a template is compiled once per process (Jinja2
        still reloads a template file that changed on disk).
        """
        return _renderer(tuple(d for d in search_path(spec, cwd) if d.is_dir()))

    def available(self) -> list[str]:
        """Names of the launch templates found (without ``.sh.j2``)."""
        names = self.env.list_templates(filter_func=lambda n: n.endswith(SCRIPT_SUFFIX))
        return sorted({n[: -len(SCRIPT_SUFFIX)] for n in names})

    def render(
        self,
        spec: StudySpec,
        config: ParallelConfig,
        *,
        hosts: Sequence[str],
        master_addr: str,
        master_port: int,
        trial_dir: str | PurePosixPath,
        full_run: bool = False,
    ) -> RenderedLaunch:
        """Render ``spec.launch.template`` for one trial on ``hosts``.

        ``trial_dir`` is the trial directory as the nodes see it (extra files are placed there).
        ``full_run``: render the full run of ``tune best`` instead (``launch.train_args`` in
        place of what a short trial uses).
        Raises :class:`ConfigError` for a missing setting, :class:`LaunchError` for a broken or
        unknown template.
        """
        try:
            return self._render_launch(spec, config, hosts, master_addr, master_port, trial_dir,
                                       full_run)  # fmt: skip
        except ConfigError as exc:  # a setting the study lacks: name the file to add it to
            if exc.file or spec.source_file is None:
                raise
            raise ConfigError(exc.reason, path=exc.path, file=spec.source_file) from None

    def _render_launch(
        self, spec: StudySpec, config: ParallelConfig, hosts: Sequence[str], master_addr: str,
        master_port: int, trial_dir: str | PurePosixPath, full_run: bool,
    ) -> RenderedLaunch:  # fmt: skip
        if full_run and traits(spec.framework).fsdp2:  # tune best: what its line cannot hold
            if (problem := inexpressible(spec, config)) is not None:
                raise ConfigError(problem[1], path=problem[0])
        name = spec.launch.template
        template = self._get(name + SCRIPT_SUFFIX, name)
        base = context(
            spec,
            config,
            hosts=hosts,
            master_addr=master_addr,
            master_port=master_port,
            trial_dir=trial_dir,
            extra_files=(),
            full_run=full_run,
        )
        declared = self._extra_files(template, base, name)
        ctx = {**base, "files": {f: str(PurePosixPath(trial_dir) / f) for f in declared}}
        files = {f: self._render(self._get(f + ".j2", name), ctx, f) for f in declared}
        scripts = tuple(
            self._render(template, {**ctx, "node_rank": k}, name) for k in range(len(hosts))
        )
        return RenderedLaunch(scripts=scripts, files=files)

    def _get(self, filename: str, template: str) -> jinja2.Template:
        try:
            return self.env.get_template(filename)
        except jinja2.TemplateNotFound:
            where = ", ".join(str(d) for d in self.dirs) or "no template directory"
            raise ConfigError(
                f"no template {filename!r} for launch template {template!r} (searched {where} "
                f"and the package; available: {', '.join(self.available())})",
                path="launch.template",
            ) from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"template {exc.filename}:{exc.lineno}: {exc.message}") from None
        except UnicodeDecodeError as exc:  # Jinja reads templates as UTF-8
            raise TemplateError(
                f"template {template!r}: {filename} is not UTF-8 text (byte "
                f"0x{exc.object[exc.start]:02x} at offset {exc.start})"
            ) from None
        except (RecursionError, ArithmeticError, ValueError) as exc:  # Jinja folds constants
            first = str(exc).splitlines()[0] if str(exc) else "recursion too deep"
            raise TemplateError(f"template {template!r}: {filename}: {first}") from None

    def _extra_files(self, template: jinja2.Template, ctx: dict[str, Any], name: str) -> list[str]:
        # Rendering as a module exposes the template's top-level {% set extra_files = [...] %};
        # until we know them, any file name resolves (the real render is strict).
        probe = {**ctx, "node_rank": 0, "files": _AnyFile(str(ctx["trial_dir"]))}
        module = self._guard(lambda: template.make_module(probe), name)
        declared = getattr(module, "extra_files", [])
        if not isinstance(declared, list | tuple) or not all(isinstance(f, str) for f in declared):
            raise TemplateError(f"template {name!r}: extra_files must be a list of file names")
        for f in declared:
            if "/" in f or f.startswith("."):
                raise TemplateError(f"template {name!r}: extra file {f!r} must be a plain name")
        return list(declared)

    def _render(self, template: jinja2.Template, ctx: dict[str, Any], name: str) -> str:
        return str(self._guard(lambda: template.render(ctx), name))

    @staticmethod
    def _guard(fn: Any, name: str) -> Any:
        try:
            return fn()
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"template {name!r}: {exc.message}") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {name!r}: {exc}") from None
        except RecursionError:  # a template that includes itself, a macro that calls itself
            raise TemplateError(f"template {name!r}: recursion too deep") from None
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # {{ 1 / 0 }}
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise TemplateError(f"template {name!r}: {type(exc).__name__}: {first}") from None


def context(
    spec: StudySpec,
    config: ParallelConfig,
    *,
    hosts: Sequence[str],
    master_addr: str,
    master_port: int,
    trial_dir: str | PurePosixPath,
    extra_files: Sequence[str],
    full_run: bool = False,
) -> dict[str, Any]:
    """The variables every template sees (``node_rank`` and ``files`` are added per render)."""
    launch = _local_paths(spec)
    python = launch.python
    return {
        "spec": spec,
        "model": spec.model,
        "training": spec.training,
        "cluster": spec.cluster,
        "launch": launch,
        "framework": spec.framework,
        "cfg": config,
        "nnodes": len(hosts),
        "nproc_per_node": spec.cluster.gpus_per_node,
        "hosts": list(hosts),
        "master_addr": master_addr,
        "master_port": master_port,
        "trial_dir": str(trial_dir),
        "files": {f: str(PurePosixPath(trial_dir) / f) for f in extra_files},
        "env": dict(launch.env),
        "extra_args": list(launch.extra_args),
        "python": python,
        "python_bin": str(PurePosixPath(python).parent) if "/" in python else None,
        "cpu": spec.cluster.gpu == "cpu",
        "ds_config": deepspeed_config(spec, config),
        "megatron_flags": megatron_parallel_flags(config, spec.model.num_layers),
        # MoE flags first: with the parallel ones they are ``tune best --emit args``
        "megatron_model_flags": megatron_moe_flags(spec.model, config)
        + megatron_precision_flags(spec.training)
        + megatron_loss_flags(spec.training),
        "deepspeed_moe_flags": deepspeed_moe_flags(spec.model, config),
        "deepspeed_script_flags": deepspeed_script_flags(spec.model, config, launch.train_iters),
        "full_run": full_run,
        "train_args": list(launch.train_args) if full_run else [],
        "TRAIN_ARGS_HINT": TRAIN_ARGS_HINT,
        "megatron_deepspeed_flags": megatron_deepspeed_parallel_flags(
            config, str(traits("megatron-deepspeed").default_partition)
        ),
        "bridge_overrides": _bridge_words(spec, config, full_run),
        "torchtitan_flags": torchtitan_flags(spec, config) if traits(spec.framework).fsdp2 else [],
    }


def _bridge_words(spec: StudySpec, config: ParallelConfig, full_run: bool) -> list[str]:
    """A recipe trial's (or full run's) overrides (:func:`tuner.launch.bridge.trial_overrides`);
    empty for other frameworks, whose precision Bridge may have no recipe for."""
    if not traits(spec.framework).recipe_launch:
        return []
    return override_words(trial_overrides(spec, config, full_run=full_run))


def _local_paths(spec: StudySpec) -> LaunchSpec:
    """``launch`` with relative ``python``/``script``/``workdir`` made absolute for local runs.

    Why: the local executor starts each node's script in the trial directory
    (results/<study>/trials/<n>/), where a relative path would not be found. A study loaded from
    a file has its paths made relative to the file's folder already (:mod:`tuner.spec.paths`);
    this covers a study built in code (``study_from_mapping`` without ``base_dir``), whose paths
    are relative to where ``tune`` runs. Local "nodes" share this filesystem, so resolving them
    against the current directory is what the user meant. Remote executors keep them as written.
    """
    launch = spec.launch
    if spec.cluster.executor != "local":
        return launch

    def absolute(path: str | None) -> str | None:
        if not path or Path(path).expanduser().is_absolute():
            return path
        return str(Path.cwd() / path)

    return dataclasses.replace(
        launch,
        # a bare "python" is looked up on PATH: only a path with a directory is resolved
        python=(absolute(launch.python) or launch.python)
        if "/" in launch.python
        else launch.python,
        script=absolute(launch.script),
        workdir=absolute(launch.workdir),
    )


def deepspeed_config(spec: StudySpec, config: ParallelConfig) -> dict[str, Any]:
    """The ds_config.json of a trial: batch sizes consistent with DP, ZeRO, precision, pipeline.

    ``train_batch_size = micro x grad_accum x dp`` (DeepSpeed checks it against the data-parallel
    world size). ``wall_clock_breakdown`` is off with pipeline stages (it breaks the pipeline
    engine); ``torch_adam`` avoids compiling FusedAdam on CPU runs.
    """
    c = config
    gas = c.num_microbatches
    adam: dict[str, Any] = {"lr": 3.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}
    if spec.cluster.gpu == "cpu":
        adam["torch_adam"] = True
    ds: dict[str, Any] = {
        "train_batch_size": c.micro_batch_size * gas * c.dp,
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "steps_per_print": 1,
        "log_level": "info",
        "wall_clock_breakdown": c.pp == 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": adam},
        "zero_optimization": {"stage": c.zero_stage},
        "bf16": {"enabled": spec.training.precision == "bf16"},
    }
    if spec.training.precision == "fp16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16}
    if c.recompute != "none":
        ds["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    if spec.framework == "megatron-deepspeed":
        return _megatron_deepspeed_config(ds, spec, c)
    if c.pp > 1:
        # DeepSpeed's own pipeline section: the workload builds its PipelineModule with
        # partition_method = this "partition" (tuner.spec.pipeline_split)
        ds["pipeline"] = {"stages": c.pp, "partition": deepspeed_method(c, spec.framework)}
    return ds


def _megatron_deepspeed_config(
    ds: dict[str, Any], spec: StudySpec, c: ParallelConfig
) -> dict[str, Any]:
    """Megatron-DeepSpeed's ds_config: Megatron builds the optimizer (``--optimizer adam``, the
    learning-rate flags) and GPTModelPipe its own partition, so there is no ``optimizer`` or
    ``pipeline`` section (the fork's examples_deepspeed/*.sh configs have neither). bf16 with
    ZeRO-1 accumulates gradients in fp32 (``data_types.grad_accum_dtype``), which makes DeepSpeed
    pick its BF16_Optimizer (runtime/engine.py ``_do_optimizer_sanity_check``), as BLOOM ran."""
    del ds["optimizer"]
    if spec.training.precision == "bf16" and c.zero_stage == 1:
        ds["data_types"] = {"grad_accum_dtype": "fp32"}
    return ds


def render_launch(
    spec: StudySpec,
    config: ParallelConfig,
    *,
    hosts: Sequence[str],
    master_addr: str,
    master_port: int,
    trial_dir: str | PurePosixPath,
    cwd: Path | None = None,
    full_run: bool = False,
) -> RenderedLaunch:
    """Shortcut: :meth:`TemplateRenderer.for_study` then :meth:`TemplateRenderer.render`."""
    return TemplateRenderer.for_study(spec, cwd).render(
        spec,
        config,
        hosts=hosts,
        master_addr=master_addr,
        master_port=master_port,
        trial_dir=trial_dir,
        full_run=full_run,
    )
