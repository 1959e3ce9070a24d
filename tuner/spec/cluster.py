"""The ``cluster:`` section of a study: the GPUs, the nodes, and how to reach them (SSH, Slurm)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from tuner._loader import NOT_IN_FILE
from tuner.catalog import GPUSpec
from tuner.errors import ConfigError
from tuner.layout import name_problem
from tuner.spec.bounds import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    _at_most,
    _positive,
    _short,
    _size,
    host_name_problem,
    listed_twice,
)
from tuner.spec.overheads import OverheadsSpec, RecordedStack


@dataclass(frozen=True, kw_only=True, slots=True)
class SSHSpec:
    """How to reach the nodes over SSH (paramiko). The OpenSSH client config is honoured: Host
    aliases, HostName, Port, User, IdentityFile, UserKnownHostsFile, ProxyJump, ProxyCommand.

    Where a host is (address, port, jump hosts) comes from its ssh config first; who logs in and
    with which key comes from here first (``tuner.launch.sshconfig`` has the whole table).
    """

    user: str | None = None
    """Login name on every node (wins over the config's User); default: User, then yours."""
    port: int | None = None
    """Port for hosts whose ssh config gives no Port (a host's own Port wins); then 22."""
    key_file: str | None = None
    """Private key for every node, instead of IdentityFile (default: it, then ~/.ssh/id_*)."""
    config_file: str = "~/.ssh/config"
    """OpenSSH client config to read; this default may be missing, a file you name must exist."""
    known_hosts: str = "~/.ssh/known_hosts"
    """Host keys are verified against this file (at this default, UserKnownHostsFile wins)."""
    accept_new_host_keys: bool = False
    """Trust and record host keys seen for the first time (never a changed key)."""
    connect_timeout_s: float = 10.0
    """TCP + handshake timeout per node (and per jump host)."""

    def __post_init__(self) -> None:
        _positive(self.port, "port")
        _positive(self.connect_timeout_s, "connect_timeout_s")


SlurmMode = Literal["auto", "submit", "allocation"]
_SBATCH_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=.*)?")


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmSpec:
    """How trials run through Slurm (``executor: slurm``; ``tuner.launch.slurm``).

    ``submit``: from a login node, one ``sbatch`` job per trial (Slurm picks the nodes);
    ``allocation``: inside ``salloc``/``sbatch``, trials are job steps on disjoint node subsets
    of the allocation. ``auto`` is ``allocation`` when ``SLURM_JOB_ID`` is set, else ``submit``.
    """

    mode: SlurmMode = "auto"
    """submit | allocation | auto (allocation when ``SLURM_JOB_ID`` is set)."""
    partition: str | None = None
    """``--partition`` of every trial job (default: the cluster's default partition)."""
    account: str | None = None
    """``--account`` to charge (default: yours)."""
    qos: str | None = None
    """``--qos`` of every trial job."""
    time_limit_min: int | None = None
    """Slurm ``--time`` per trial; default ``search.trial_timeout_min`` + 5 (the tuner's own
    limit, counted from RUNNING, fires first; Slurm's is the backstop)."""
    gpus_per_node: int | None = None
    """``--gres=gpu:N`` per node; default: none requested (CPU nodes, or GPUs given to whole
    nodes by ``--exclusive``)."""
    exclusive: bool = True
    """``--exclusive``: a trial measures whole nodes, shared with no other job."""
    extra_sbatch: tuple[str, ...] = ()
    """More sbatch options, one per entry, e.g. ``--constraint=h100`` (become #SBATCH lines)."""
    container_image: str | None = None
    """Run the node scripts in this container (pyxis: ``srun --container-image``)."""
    container_mounts: tuple[str, ...] = ()
    """``SRC:DST`` mounts for the container (pyxis: ``srun --container-mounts``)."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the batch script before ``srun`` (module loads, venv activation)."""
    max_jobs: int = 1
    """Trials in flight at once (queued or running); each trial is one job."""
    poll_interval_s: float = 2.0
    """How often ``scontrol`` is asked for a job's state."""
    pending_limit_min: float = 720.0
    """How long a trial's job may wait in the queue for a reason that can clear (Resources,
    Priority, ...) before it is cancelled and run again later; a reason that can never clear
    (PartitionNodeLimit, InvalidAccount, ...) cancels it at once as a launch error."""

    def __post_init__(self) -> None:
        _positive(self.pending_limit_min, "pending_limit_min")
        _size(self.time_limit_min, 60 * 24 * 365, "time_limit_min", "a year")
        _size(self.gpus_per_node, MAX_GPUS_PER_NODE, "gpus_per_node", "an NVL72 rack has 72")
        _size(self.max_jobs, 4096, "max_jobs", "4096 trials in flight")
        _positive(self.poll_interval_s, "poll_interval_s")
        for i, line in enumerate(self.extra_sbatch):
            if "\n" in line or not _SBATCH_OPTION.fullmatch(line):
                raise ConfigError(
                    f"{_short(line)} is not one sbatch option (like --constraint=h100)",
                    path=f"extra_sbatch[{i}]",
                )
        for name in ("partition", "account", "qos"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]+", value):
                raise ConfigError(f"{_short(value)} is not a Slurm name", path=name)
        for i, line in enumerate((*self.setup, *self.container_mounts)):
            if "\n" in line:
                raise ConfigError("one line per entry", path=f"setup[{i}]")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """The machines trials run on."""

    gpu: str | GPUSpec
    """GPU catalog name, in any case (``tune catalog gpus`` lists them; the study keeps the
    catalog's spelling), ``cpu`` for local CPU ranks, or a
    GPU described by its figures: ``{name, preset?, memory_gib, peak_tflops, fp8_peak_tflops,
    hbm_gbps, intra_node_gbps, inter_node_gbps, compute_capability, ...}``."""
    gpus_per_node: int
    """Ranks per node (torchrun ``--nproc_per_node``)."""
    nodes: tuple[str, ...] | None = None
    """Host names; or give ``hostfile`` or ``num_nodes``."""
    hostfile: str | None = None
    """A file with one host per line (``# comments`` and DeepSpeed's ``slots=N`` allowed)."""
    num_nodes: int | None = None
    """``executor: local``: how many local "nodes" (local-0, local-1, ...); ``executor: slurm``:
    the nodes one trial uses (Slurm picks which). Not for ``ssh``, which names its hosts."""
    executor: Literal["local", "ssh", "slurm"] = "ssh"
    """Where trials run: subprocesses here, over SSH, or through Slurm."""
    ssh: SSHSpec = field(default_factory=SSHSpec)
    """SSH settings for ``executor: ssh``."""
    slurm: SlurmSpec = field(default_factory=SlurmSpec)
    """Slurm settings for ``executor: slurm`` (``num_nodes`` is then the nodes per trial)."""
    gpu_memory_gib: float | None = None
    """Override the catalog's memory per GPU (per rank for ``cpu``)."""
    overheads: OverheadsSpec = field(default_factory=OverheadsSpec)
    """Measured stack overheads replacing the GPU catalog's (CUDA context, NCCL, allocator)."""
    name: str | None = None
    """Names the cluster's profile and calibration (``results/clusters/<name>.*``), shared by
    every study on it; default ``<gpu>-<executor>-<nodes>x<gpus_per_node>``."""
    recorded_stack: RecordedStack | None = field(
        default=None, compare=False, metadata={NOT_IN_FILE: True}
    )
    """The stack's versions the cluster's valid saved profile recorded, where a command read it
    (``tuner.profile.recorded``); they decide the versions' overheads where
    ``overheads.stack`` states none (tuner.models.memory.stack). Set by the reader, not a key of
    the file."""

    @property
    def gpu_name(self) -> str:
        """The GPU's name: the preset's, or the one a GPU described by its figures was given."""
        return self.gpu if isinstance(self.gpu, str) else self.gpu.name

    def __post_init__(self) -> None:
        from tuner.catalog import get_gpu  # the catalog loads lazily, on first use

        get_gpu(self.gpu)
        if self.name is not None and (problem := name_problem(self.name)) is not None:
            raise ConfigError(problem, path="name")
        _size(self.gpus_per_node, MAX_GPUS_PER_NODE, "gpus_per_node", "an NVL72 rack has 72")
        _size(self.num_nodes, MAX_NODES, "num_nodes", "about a million GPUs")
        _positive(self.gpu_memory_gib, "gpu_memory_gib")
        _at_most(self.gpu_memory_gib, 1 << 20, "gpu_memory_gib", "a PiB per GPU")
        given = [n for n in ("nodes", "hostfile", "num_nodes") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ConfigError(
                "give exactly one of nodes, hostfile or num_nodes"
                + (f" (got {', '.join(given)})" if given else ""),
                path="nodes",
            )
        if self.num_nodes is not None and self.executor == "ssh":
            raise ConfigError(
                "num_nodes makes local ranks (local-0, local-1, ...) for executor: local; "
                "with executor: ssh give the hosts in nodes or hostfile",
                path="num_nodes",
            )
        if self.executor == "slurm" and self.num_nodes is None:
            raise ConfigError(
                "executor: slurm takes num_nodes (nodes one trial may use; Slurm picks which)",
                path="num_nodes",
            )
        if self.nodes is not None:
            if not self.nodes:
                raise ConfigError("the list is empty: name at least one host", path="nodes")
            _at_most(len(self.nodes), MAX_NODES, "nodes", "about a million GPUs")
            seen: dict[str, str] = {}
            for i, node in enumerate(self.nodes):
                if (twice := listed_twice(node, seen)) is not None:
                    raise ConfigError(f"node {twice}", path="nodes")
                if (problem := host_name_problem(node)) is not None:
                    raise ConfigError(problem, path=f"nodes[{i}]")
