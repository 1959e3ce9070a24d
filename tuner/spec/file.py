"""Reading a study file: presets, ``${NAME}`` expansion, hostfiles, paths relative to the
study file, and finding a study by name (``studies/NAME.yaml``, then the shipped ones).

Everything here turns text the user wrote into a :class:`~tuner.spec.study.StudySpec`, refusing
what cannot be one with a :class:`~tuner.errors.ConfigError` that names the file and the field.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tuner._loader import load_dataclass, load_yaml, yaml_problem
from tuner.errors import ConfigError, UnknownKeyError
from tuner.spec.bounds import MAX_GPUS_PER_NODE, host_name_problem, listed_twice
from tuner.spec.model import ModelSpec
from tuner.spec.paths import study_relative
from tuner.spec.sections import with_home
from tuner.spec.study import _ENV_NAME, MAX_FILE_BYTES, StudySpec
from tuner.spec.template_owner import check_template_framework


@functools.cache
def _model_presets() -> dict[str, dict[str, Any]]:
    text = resources.files("tuner.catalog").joinpath("models.yaml").read_text()
    data: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return data


def model_preset_names() -> list[str]:
    """Names of the model presets shipped with the package."""
    return sorted(_model_presets())


def _expand_model(raw: object) -> object:
    if not isinstance(raw, Mapping) or "preset" not in raw:
        return raw
    name = raw["preset"]
    presets = _model_presets()
    if isinstance(name, str):  # any case, as the catalog spells it (as a GPU's name)
        name = {n.casefold(): n for n in presets}.get(name.casefold(), name)
    if not isinstance(name, str) or name not in presets:
        raise ConfigError(
            f"unknown preset {name!r} (available: {', '.join(sorted(presets))})",
            path="model.preset",
        )
    merged = {"name": name, **presets[name]}
    merged.update({k: v for k, v in raw.items() if k != "preset"})
    return merged


def study_model(raw: Mapping[str, Any]) -> ModelSpec:
    """A ``model:`` section (a preset and overrides, or every field) as a ModelSpec."""
    return load_dataclass(ModelSpec, _expand_model(raw), "model")


def read_text(path: Path, what: str, limit: int | None = MAX_FILE_BYTES) -> str:
    """A UTF-8 text file of at most ``limit`` bytes (a study, a hostfile; a cluster's saved
    profile or calibration, which grow with the cluster, have none); ConfigError naming
    ``what`` otherwise."""
    try:  # exists() itself raises for a name the system refuses (too long: ENAMETOOLONG)
        if path.exists() and not path.is_file() and not path.is_dir():
            raise ConfigError(f"cannot read {what}: not a regular file")  # a FIFO would block
        with path.open("rb") as f:
            data = f.read(-1 if limit is None else limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror or exc}") from None
    if limit is not None and len(data) > limit:
        raise ConfigError(f"{what} is larger than {limit // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_yaml(path: Path, what: str, shown: str | None = None) -> object:
    """The one YAML document of the user's file ``path`` (``what``: "the study file"), parsed
    strictly (:func:`load_yaml`: no aliases, no duplicate keys). Every way it cannot be read or
    parsed is one :class:`ConfigError` naming the file (as ``shown``, else ``path``) and, for
    bad YAML, the line."""
    file = str(path) if shown is None else shown
    text = ""
    try:
        text = read_text(path, what)
        return load_yaml(text)
    except yaml.reader.ReaderError as exc:  # a NUL, an ESC: said "invalid YAML", not where
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(f"a character YAML does not allow ({chr(exc.character)!r}) at line "
                          f"{line}", file=file) from None  # fmt: skip
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(exc), file=file) from None
    except ConfigError as exc:
        raise ConfigError(exc.reason, file=file) from None
    except (ValueError, RecursionError) as exc:  # an int of 5000 digits, [[[[...]]]] nesting
        raise ConfigError(f"invalid YAML: {yaml_problem(exc)}", file=file) from None


def _read_hostfile(path: Path, yaml_path: str, gpus_per_node: object = None) -> tuple[str, ...]:
    """The hosts of a hostfile, one a line, as DeepSpeed's runner reads it (``host slots=N``,
    ``# comments``). Lines end at a newline only (``\\r\\n`` and ``\\r`` as Python's text files):
    ``str.splitlines`` also split at a form feed and U+2028, where DeepSpeed (and the exported
    script's awk) read one line with two words on it. A ``slots=N`` below ``gpus_per_node``
    (the study's, when it is a number) is refused: the study would start more ranks on the
    host than it has GPUs. One above it is not: the study uses that many of them, as
    DeepSpeed's ``--num_gpus`` does."""
    try:
        text = read_text(path, f"hostfile {str(path)!r}")
    except ConfigError as exc:
        raise ConfigError(exc.reason, path=yaml_path) from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    per_node = None  # a count that is no whole number is the study's check to refuse
    if isinstance(gpus_per_node, int) and not isinstance(gpus_per_node, bool):
        per_node = gpus_per_node
    hosts: list[str] = []
    seen: dict[str, str] = {}  # a list's "in" made 100,000 hosts a quadratic hang
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].startswith("slots=")):
            raise ConfigError(f"{path}:{number}: bad entry {line!r}", path=yaml_path)
        if len(parts) == 2 and not _slots_ok(parts[1].removeprefix("slots=")):
            raise ConfigError(
                f"{path}:{number}: {parts[1]!r}: slots must be a whole number of GPUs, 1 to "
                f"{MAX_GPUS_PER_NODE}",
                path=yaml_path,
            )
        if len(parts) == 2 and per_node is not None and int(parts[1][6:]) < per_node:
            raise ConfigError(
                f"{path}:{number}: {parts[1]!r}: fewer GPUs than cluster.gpus_per_node "
                f"({per_node}): the study starts that many ranks on each host",
                path=yaml_path,
            )
        if (twice := listed_twice(parts[0], seen)) is not None:
            raise ConfigError(f"{path}:{number}: host {twice}", path=yaml_path)
        if (problem := host_name_problem(parts[0])) is not None:  # the hostfile's line, not
            raise ConfigError(f"{path}:{number}: {problem}", path=yaml_path)  # cluster.nodes
        hosts.append(parts[0])
    if not hosts:
        raise ConfigError(f"hostfile {str(path)!r} lists no host", path=yaml_path)
    return tuple(hosts)


def _slots_ok(text: str) -> bool:
    """DeepSpeed's ``slots=N``: N GPUs on the host (ASCII digits, 1..MAX_GPUS_PER_NODE)."""
    return text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_GPUS_PER_NODE


_ENV_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")


def expand_env(raw: object, environ: Mapping[str, str] | None = None, path: str = "") -> object:
    """Replace ``${NAME}`` in every string value of a parsed study with the variable's value.

    Why: a study names paths on the nodes (the interpreter, the training script, a shared
    checkout, ssh keys) that differ between users and checkouts; ``${NAME}`` lets one study file
    serve them all. Variables come from the environment of ``tune`` when the study is loaded (not
    from the nodes), so the values are part of the study's fingerprint. ``$${`` is a literal
    ``${``; any other ``$`` is left alone. An unset or empty variable is a ConfigError naming the
    field, never an empty path.
    """
    env = os.environ if environ is None else environ
    if isinstance(raw, str):
        return _ENV_REF.sub(lambda m: _env_value(m, env, path), raw)
    if isinstance(raw, Mapping):
        return {k: expand_env(v, env, f"{path}.{k}" if path else str(k)) for k, v in raw.items()}
    if isinstance(raw, list):
        return [expand_env(v, env, f"{path}[{i}]") for i, v in enumerate(raw)]
    return raw


def env_references(raw: object) -> tuple[str, ...]:
    """The environment variables the string values of a parsed study refer to as ``${NAME}``,
    each once, in the order they first appear (``$${`` is a literal; comments are not values).

    Why: the commands ``tune run`` prints for such a study (``tune best --study X``...) load it
    again, and fail as printed in a shell that lacks the variables ``make demo-ssh`` set for
    the run alone; the run names them so the next command can be given them."""
    if isinstance(raw, str):
        names = (m.group(1) for m in _ENV_REF.finditer(raw) if m.group(1))
        return tuple(n for n in names if _ENV_NAME.match(n))
    values: Iterable[object] = ()
    if isinstance(raw, Mapping):
        values = raw.values()
    elif isinstance(raw, list):
        values = raw
    return tuple(dict.fromkeys(n for v in values for n in env_references(v)))


def study_env_names(source_path: str | None) -> tuple[str, ...]:
    """:func:`env_references` of the study file at ``source_path`` (none for a study not read
    from a file, or a file no longer readable as YAML)."""
    if source_path is None:
        return ()
    try:
        return env_references(load_yaml(Path(source_path).read_text()))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ()


def _env_value(match: re.Match[str], env: Mapping[str, str], path: str) -> str:
    if match.group(0) == "$${":
        return "${"
    name = match.group(1)
    if name is None:
        raise ConfigError("unterminated '${' (write '$${' for a literal '${')", path=path)
    if not _ENV_NAME.match(name):
        raise ConfigError(
            f"'${{{name}}}' is not an environment variable reference; only ${{NAME}} is expanded "
            "(write '$${' for a literal '${')",
            path=path,
        )
    value = env.get(name, "")
    if not value:
        raise ConfigError(
            f"environment variable {name} is {'empty' if name in env else 'not set'} "
            f"(the study refers to it as ${{{name}}})",
            path=path,
        )
    return value


def study_from_mapping(
    raw: object, *, base_dir: Path | None = None, found_by: str | None = None,
    cluster_file: bool = False, source_path: str | None = None,
) -> StudySpec:  # fmt: skip
    """Build a StudySpec from parsed YAML. Relative paths are relative to ``base_dir``;
    ``found_by``: the name or path the file was found by (:attr:`StudySpec.found_by`), a
    cluster file where ``cluster_file`` (:attr:`StudySpec.cluster_file`); ``source_path``: the
    study file's full path (:attr:`StudySpec.source_path`).

    ``${NAME}`` in any string value is first replaced with that environment variable
    (:func:`expand_env`). Without ``base_dir`` (a study not read from a file) relative paths stay
    as written: see :mod:`tuner.spec.paths`.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("a study file must be a mapping of sections")
    data = {k: expand_env(v, path=str(k)) for k, v in raw.items()}
    if base_dir is not None:
        data = study_relative(data, base_dir)
    if "model" in data:
        data["model"] = _expand_model(data["model"])
    cluster = data.get("cluster")
    if isinstance(cluster, Mapping) and isinstance(cluster.get("hostfile"), str):
        hf = _expand_user(cluster["hostfile"], "cluster.hostfile")
        data["cluster"] = {
            **{k: v for k, v in cluster.items() if k != "hostfile"},
            "nodes": list(_read_hostfile(hf, "cluster.hostfile", cluster.get("gpus_per_node"))),
        }
    cluster = data.get("cluster")
    if isinstance(cluster, Mapping) and isinstance(cluster.get("gpu"), Mapping):
        from tuner.catalog import gpu_from_mapping  # a GPU given by its figures

        data["cluster"] = {**cluster, "gpu": gpu_from_mapping(cluster["gpu"])}
    elif isinstance(cluster, Mapping) and isinstance(cluster.get("gpu"), str):
        from tuner.catalog import catalog_gpu_name  # any case, stored as the catalog spells it

        data["cluster"] = {**cluster, "gpu": catalog_gpu_name(cluster["gpu"])}
    try:
        return load_dataclass(
            StudySpec, data,
            given={"found_by": found_by, "cluster_file": cluster_file, "source_path": source_path},
        )  # fmt: skip
    except UnknownKeyError as exc:  # a key of another section: name the field it is
        raise with_home(exc, StudySpec) from None


def _expand_user(path: str, yaml_path: str) -> Path:
    if "\0" in path:
        raise ConfigError("a path must not contain a NUL character", path=yaml_path)
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~user with no such user
        raise ConfigError(f"cannot expand {path!r}: no such user", path=yaml_path) from None


def shipped_study_names() -> list[str]:
    """Studies shipped inside the package."""
    root = resources.files("tuner.studies")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _is_file(path: Path, name: str) -> bool:
    """``path.is_file()``; a name the system refuses (too long: ENAMETOOLONG) is a ConfigError."""
    try:
        return path.is_file()
    except OSError as exc:
        raise ConfigError(f"cannot read study {name!r}: {exc.strerror or exc}") from None


def _not_a_file(path: Path) -> str:
    """Why ``path``, which is not a regular file, cannot be a study: it is missing or a folder."""
    if path.is_dir():
        return "is a directory; give the study's YAML file"
    if path.exists():  # /dev/zero, a FIFO, a socket: said "does not exist"
        return "is not a regular file; give the study's YAML file"
    if path.is_symlink():
        return "is a symbolic link to nothing (or a loop)"
    return "does not exist"


def resolve_study_path(name: str, cwd: Path | None = None) -> Path:
    """``NAME`` -> ./studies/NAME.yaml, then the package's studies; a path to a file also works."""
    cwd = cwd or Path.cwd()
    as_path = _expand_user(name, "--study")
    if name.endswith((".yaml", ".yml")) or "/" in name:
        full = as_path if as_path.is_absolute() else cwd / as_path
        if _is_file(full, name):
            return full
        raise ConfigError(f"study file {name!r} {_not_a_file(full)}")
    local = cwd / "studies" / f"{name}.yaml"
    if _is_file(local, name):
        return local
    shipped = resources.files("tuner.studies").joinpath(f"{name}.yaml")
    if _is_file(Path(str(shipped)), name):
        return Path(str(shipped))
    if (cwd / as_path).is_dir():  # `--study .`, `--study studies`: said "unknown study"
        raise ConfigError(f"study {name!r} {_not_a_file(cwd / as_path)}")
    available = known_studies(cwd)
    raise ConfigError(f"unknown study {name!r}{_unknown_study_hint(name, cwd, available)}")


def known_studies(cwd: Path | None = None) -> list[str]:
    """The names ``--study`` finds: ``studies/*.yaml`` under ``cwd``, and the shipped ones."""
    local = (cwd or Path.cwd()) / "studies"
    return sorted({p.stem for p in local.glob("*.yaml")} | set(shipped_study_names()))


def _unknown_study_hint(name: str, cwd: Path, available: list[str]) -> str:
    """What to type instead of an unknown study name: the file of that name in the current
    folder (the README saves ``llama3-70b.yaml`` there, and ``--study llama3-70b`` looks in
    ``studies/`` and the shipped studies only), else the nearest known name (a typo) and the
    known ones (a name in another case is the nearest: ``GPT-70B`` is ``gpt-70b``)."""
    for suffix in (".yaml", ".yml"):
        if (cwd / f"{name}{suffix}").is_file():
            return (f": a name is looked up as studies/{name}.yaml here, then among the shipped "
                    f"studies; for the file {name}{suffix} give "
                    f"--study {shlex.quote(name + suffix)}")  # fmt: skip
    known = f" (available: {', '.join(available)}; or the path of a YAML file)"
    close = nearest_name(name, available)
    return f"; did you mean {close!r}?{known}" if close is not None else known


def nearest_name(name: str, available: Iterable[str]) -> str | None:
    """The study name of ``available`` nearest a mistyped ``name`` (a name in another case is
    the nearest: ``GPT-70B`` is ``gpt-70b``), or None when none is close."""
    folded = {n.casefold(): n for n in available}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1)
    return folded[close[0]] if close else None


def load_study(name: str, cwd: Path | None = None) -> StudySpec:
    """Load and strictly check a study by name or path. Errors name the file and the YAML path."""
    path = resolve_study_path(name, cwd)
    raw = read_yaml(path, "the study file")
    try:
        # the folder the file really is in: studies/ may be a link (it is, in this repository)
        spec = study_from_mapping(raw, base_dir=path.resolve().parent, found_by=name,
                                  source_path=str(path))  # fmt: skip
        launch = spec.launch
        check_template_framework(spec.framework, launch.template, launch.templates_dir, cwd)
        return spec
    except ConfigError as exc:
        raise ConfigError(exc.reason, path=exc.path, file=str(path)) from None
    except RecursionError:
        raise ConfigError("nested too deeply", file=str(path)) from None
