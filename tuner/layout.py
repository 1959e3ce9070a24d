"""Where a study's results live on disk. Nothing else in tuner builds these paths.

::

    <root>/<study>/study.db                     default Optuna storage (SQLite)
    <root>/<study>/trials/<n>/launch-node-<k>.sh the rendered script node k ran
    <root>/<study>/trials/<n>/config.yaml        the parallel configuration of the trial
    <root>/<study>/trials/<n>/node-<k>.log       stdout + stderr of node k, streamed live
    <root>/<study>/trials/<n>/metrics.json       what the log parser made of the logs
    <root>/<study>/trials/<n>/<file>             rendered extra files (ds_config.json, ...)
    <root>/<study>/exports/trial-<n>/launch.sh   a trial's config as a full run (tune best;
                                                 :class:`ExportPaths` names every kind's files)
    <root>/clusters/                             cluster profiles (:class:`ClusterLayout`), so
                                                 no study may be named ``clusters``

The same layout, rooted elsewhere, describes the trial directory on a remote node
(:meth:`ResultsLayout.rebase`), so templates can point at files the node will really have.

How those files are kept consistent when several processes (workers of one study, studies of
one cluster, a reader and a writer) touch one at once is here too, one definition each: a file
written whole (:func:`write_atomic`) and a file held alone (:func:`held`, on a lock file
:func:`beside` it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import IO, TypeVar

# The one rule for names that become a directory or file name (study names, extra files,
# template names): ASCII only, so a name means the same bytes on every filesystem and shell.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: Longest plain name. Why: the name is one path component; filesystems refuse components over
#: 255 bytes (ENAMETOOLONG) and SQLite adds "-journal" beside study.db; 100 leaves room and still
#: fits a table column.
MAX_NAME_LENGTH = 100


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain name (a single safe path component), or None when it is."""
    shown = repr(name) if len(name) <= 40 else repr(name[:37]) + "..."
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"{shown} is {len(name)} characters long; a plain name has at most {MAX_NAME_LENGTH}"
        )
    if not _PLAIN_NAME.fullmatch(name) or ".." in name:
        return (
            f"{shown} must be a plain name, not a path: it may only hold ASCII letters, digits, "
            "'.', '_' and '-', start with a letter or digit and not contain '..'"
        )
    return None


CLUSTERS_DIR = "clusters"
"""The results root's directory of cluster profiles and calibrations (:class:`ClusterLayout`)."""

RESERVED_STUDY_NAMES = frozenset({CLUSTERS_DIR})
"""Directories of the results root that are not a study's, so no study may take their name."""


def study_name_problem(name: str) -> str | None:
    """:func:`name_problem`, and a study name must not be one of :data:`RESERVED_STUDY_NAMES`
    (compared without case: a case-insensitive filesystem would collide ``Clusters`` too)."""
    problem = name_problem(name)
    if problem is None and name.lower() in RESERVED_STUDY_NAMES:
        return (
            f"{name!r} is reserved: <results>/{name.lower()}/ holds the cluster profiles; "
            "choose another study name"
        )
    return problem


def _check_name(kind: str, name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(f"{kind} {problem}")
    return name


@dataclass(frozen=True, slots=True)
class TrialPaths:
    """The files of one trial, all inside :attr:`dir`."""

    dir: Path
    """The trial directory, ``<root>/<study>/trials/<n>``."""

    def launch_script(self, node_rank: int) -> Path:
        """The rendered launch script of node ``node_rank`` (``launch-node-<k>.sh``)."""
        return self.dir / f"launch-node-{_rank(node_rank)}.sh"

    def node_log(self, node_rank: int) -> Path:
        """stdout and stderr of node ``node_rank`` (``node-<k>.log``)."""
        return self.dir / f"node-{_rank(node_rank)}.log"

    def pid_file(self, node_rank: int) -> Path:
        """Where the executor records the process group of node ``node_rank``."""
        return self.dir / f".node-{_rank(node_rank)}.pid"

    @property
    def config_yaml(self) -> Path:
        """The trial's parallel configuration as YAML."""
        return self.dir / "config.yaml"

    @property
    def metrics_json(self) -> Path:
        """The parsed :class:`RunMetrics` of the trial."""
        return self.dir / "metrics.json"

    @property
    def result_json(self) -> Path:
        """The executor's account of the run (exit codes, node errors, duration)."""
        return self.dir / "result.json"

    @property
    def files_dir(self) -> Path:
        """Where rendered extra files (``ds_config.json``, ...) go: the trial directory itself."""
        return self.dir

    def file(self, name: str) -> Path:
        """The path of the extra file ``name``; ``name`` must be a plain file name."""
        return self.files_dir / _check_name("extra file name", name)


def _rank(node_rank: int) -> int:
    if node_rank < 0:
        raise ValueError(f"node rank must be >= 0, got {node_rank}")
    return node_rank


EXPORT_KINDS = (
    "script", "sbatch", "args", "ds-config", "bridge-overrides", "bridge-recipe", "torchtitan",
)  # fmt: skip
"""What ``tune best --emit`` writes; :class:`ExportPaths` names each one's files."""


@dataclass(frozen=True, slots=True)
class ExportPaths:
    """The exports of one trial's config (``tune best``): each kind has its own files, so writing
    one kind never rewrites another's."""

    dir: Path
    """``<root>/<study>/exports/trial-<n>``."""

    @property
    def script(self) -> Path:
        """``--emit script``: one launch script for every node of the full run."""
        return self.dir / "launch.sh"

    @property
    def script_files(self) -> Path:
        """The extra files (``ds_config.json``, ...) the launch script reads."""
        return self.dir / "launch-files"

    @property
    def sbatch(self) -> Path:
        """``--emit sbatch``: the Slurm batch script of the full run."""
        return self.dir / "sbatch.sh"

    @property
    def sbatch_node(self) -> Path:
        """What the batch script starts on every node of its job."""
        return self.dir / "sbatch-node.sh"

    @property
    def sbatch_files(self) -> Path:
        """The extra files the batch job's node script reads."""
        return self.dir / "sbatch-files"

    @property
    def args(self) -> Path:
        """``--emit args``: the framework's own arguments."""
        return self.dir / "args.txt"

    @property
    def args_files(self) -> Path:
        """The DeepSpeed config the arguments of a DeepSpeed study name."""
        return self.dir / "args-files"

    @property
    def ds_config(self) -> Path:
        """``--emit ds-config``: the DeepSpeed config."""
        return self.dir / "ds_config.json"

    @property
    def torchtitan(self) -> Path:
        """``--emit torchtitan``: the pinned torchtitan release's trainer arguments."""
        return self.dir / "torchtitan-args.txt"

    @property
    def bridge_overrides(self) -> Path:
        """``--emit bridge-overrides``: the config as Megatron-Bridge recipe overrides."""
        return self.dir / "bridge-overrides.txt"

    @property
    def bridge_recipe(self) -> Path:
        """``--emit bridge-recipe``: a Python function that sets the config on a recipe."""
        return self.dir / "bridge_recipe.py"


@dataclass(frozen=True, slots=True)
class ResultsLayout:
    """The results directory of one study: ``<root>/<study>/``."""

    root: Path
    """The results root (``./results`` by default)."""
    study: str
    """The study name; a plain name, used as a directory name."""

    def __post_init__(self) -> None:
        problem = study_name_problem(self.study)
        if problem is not None:
            raise ValueError(f"study name {problem}")

    @property
    def study_dir(self) -> Path:
        """``<root>/<study>``."""
        return self.root / self.study

    @property
    def storage_path(self) -> Path:
        """The default SQLite file of the Optuna study."""
        return self.study_dir / "study.db"

    @property
    def storage_url(self) -> str:
        """:attr:`storage_path` as an SQLAlchemy URL."""
        return f"sqlite:///{self.storage_path.absolute()}"

    @property
    def trials_dir(self) -> Path:
        """``<root>/<study>/trials``."""
        return self.study_dir / "trials"

    def trial(self, number: int) -> TrialPaths:
        """The paths of trial ``number`` (Optuna's trial number)."""
        if number < 0:
            raise ValueError(f"trial number must be >= 0, got {number}")
        return TrialPaths(self.trials_dir / str(number))

    def trial_numbers(self) -> list[int]:
        """The numbers of the trials that have a directory, in ascending order."""
        if not self.trials_dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.trials_dir.iterdir() if p.name.isdigit())

    def fresh_trial(self, number: int) -> tuple[TrialPaths, Path | None]:
        """The paths of trial ``number``, about to be launched, its folder empty: one that
        already holds files is an earlier run's under the same number (the study's storage
        made anew, or another ``--storage`` on these results) and is moved aside, not mixed in
        (the node logs are appended to: the new trial measured both runs' steps). Returns the
        paths and where the earlier files went (None: there were none)."""
        paths = self.trial(number)
        if not paths.dir.is_dir() or not any(paths.dir.iterdir()):
            return paths, None
        aside = paths.dir.with_name(f"{number}.earlier-{uuid.uuid4().hex[:8]}")
        paths.dir.rename(aside)
        return paths, aside

    def export(self, number: int) -> ExportPaths:
        """Where ``tune best`` writes the full run of trial ``number``."""
        if number < 0:
            raise ValueError(f"trial number must be >= 0, got {number}")
        return ExportPaths(self.study_dir / "exports" / f"trial-{number}")

    def rebase(self, root: Path) -> ResultsLayout:
        """The same study laid out under another root (a remote node's work directory)."""
        return ResultsLayout(root, self.study)


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """What tuner keeps about one cluster, shared by every study on it::

    <root>/clusters/<name>.yaml              the measured cluster profile (tune profile)
    <root>/clusters/<name>.calibration.yaml  model corrections learned from measured trials
    <root>/clusters/<name>.probe/            the profile job's files (scripts, node logs)
    <root>/clusters/<name>.<study>.stack.yaml  a study's framework probe (tune profile --probe)
    <root>/clusters/<name>.<study>.stack/      its job's files
    """

    root: Path
    """The results root (``./results`` by default)."""
    name: str
    """The cluster name (``cluster.name`` or its default); a plain name."""

    def __post_init__(self) -> None:
        _check_name("cluster name", self.name)

    @property
    def dir(self) -> Path:
        """``<root>/clusters``."""
        return self.root / CLUSTERS_DIR

    @property
    def profile_yaml(self) -> Path:
        """The cluster profile."""
        return self.dir / f"{self.name}.yaml"

    @property
    def calibration_yaml(self) -> Path:
        """The saved calibration."""
        return self.dir / f"{self.name}.calibration.yaml"

    @property
    def probe(self) -> TrialPaths:
        """The profile job's directory, laid out as a trial's."""
        return TrialPaths(self.dir / f"{self.name}.probe")

    def stack_yaml(self, study: str) -> Path:
        """The framework probe's measurements for ``study``."""
        return self.dir / f"{self.name}.{study}.stack.yaml"

    def stack_probe(self, study: str) -> TrialPaths:
        """The framework probe's job directory, laid out as a trial's."""
        return TrialPaths(self.dir / f"{self.name}.{study}.stack")


def folder_problem(text: str) -> str | None:
    """Why the folder ``text`` (``--results DIR``, the default ``./results``, an export's) cannot
    hold files, None when it can (made when missing): a symbolic link loop on the way, a link
    to nothing (a write through it made its target, a folder where the user meant another file
    system), a file ("Not a directory" from ``tune profile``, exit 1; "no results yet" from
    ``tune leaderboard``), a ``~user`` this machine has no home for."""
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # `--results=~x/r` (the shell expands no `~` after `=`)
        return f"no home folder for {text.split('/')[0]}"
    try:
        path.resolve()  # Python 3.11: RuntimeError on a loop; 3.13: OSError (ELOOP)
        given = path.absolute()
        for p in (given, *given.parents):
            where = "" if p == given else f"{p} is "
            if p.is_symlink() and not p.exists():
                return f"{where}a symbolic link to nothing ({os.readlink(p)})"
            if p.exists():
                return None if p.is_dir() else f"{where}a file, not a folder"
    except (RuntimeError, OSError) as exc:
        return (
            exc.strerror if isinstance(exc, OSError) and exc.strerror else "a symbolic link loop"
        )
    return None


# ----------------------------------------------------------------------------- files kept whole

P = TypeVar("P", bound=PurePath)


def write_atomic(path: Path, content: str, *, mode: int = 0o644) -> os.stat_result:
    """``path`` holds ``content`` whole or is as it was: written beside it, then renamed over it
    (a loopback node may be reading the same file while another writes it; a Ctrl-C or a full
    disk mid-write left a file cut short). The half-written copy is removed on any failure, and
    an error names ``path``, not the hidden copy no one asked for.

    Returns the written file's status as the rename left it (the rename keeps the inode, size
    and times): a cache of what the file holds is keyed by it without a second ``stat`` that
    another writer's rename could already have overtaken."""
    tmp = temp_beside(path)
    try:
        tmp.write_text(content, encoding="utf-8")
        tmp.chmod(mode)
        written = tmp.stat()
        tmp.replace(path)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # a read-only file system refuses even this
            tmp.unlink()
        if isinstance(exc, OSError) and exc.filename == str(tmp):  # the file asked for, named
            exc.filename = str(path)
        raise
    return written


def temp_beside(path: P) -> P:
    """A name for a copy of ``path`` being written, beside it and hidden; each writer its own
    (two writers that shared one name wrote into each other's copy). Also for a node's file
    written over SFTP, hence any kind of path."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def beside(path: Path, suffix: str) -> Path:
    """The file next to ``path`` named ``path``'s name and ``suffix`` (``x.db.create-lock``):
    where a lock on ``path`` is held (:func:`held`). The lock file is left after: removing a
    file another process has open, or is about to open, would let two hold "the" lock."""
    return path.with_name(path.name + suffix)


@contextlib.contextmanager
def held(f: IO[str]) -> Iterator[IO[str]]:
    """The open file ``f`` held alone for the block: an exclusive ``flock``, waited for, and
    released at the end (closing the file would release it too)."""
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
        yield f
    finally:
        fcntl.flock(f, fcntl.LOCK_UN)
