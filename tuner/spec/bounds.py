"""Bounds and checks every part of the study file shares (one definition of each limit)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping

from tuner.errors import ConfigError

# Upper bounds on sizes. Why: the space is enumerated from these numbers (divisors of num_layers,
# products of the axes), so an absurd value (num_layers: 10**30) would hang `tune` instead of
# failing at load. Each bound is far above any model or cluster built so far.
MAX_LAYERS = 4096  # the deepest published dense LLMs have 96-128 layers
MAX_WIDTH = 1 << 20  # hidden / FFN width: GPT-3 12288, Llama-3-405B 16384 / 53248
MAX_HEADS = 4096  # attention heads and query groups: published models have <= 128
MAX_VOCAB = 1 << 24  # vocabularies are 32k-256k tokens
MAX_SEQ_LENGTH = 1 << 24  # 16M tokens: above every long-context run published
MAX_GPUS_PER_NODE = 1024  # 8 on DGX/HGX, 72 for an NVL72 rack used as one node
MAX_NODES = 1 << 17  # 131072 nodes: about a million GPUs at 8 per node
MAX_BATCH = 1 << 24  # sequences per step; published runs use a few thousand
MAX_ITERS = 1_000_000  # iterations of one short trial run (tens are typical)
MAX_TRIALS = 100_000  # launched runs of one study; each costs node-minutes
MAX_MINUTES = 7 * 24 * 60  # one trial or process-group timeout: a week
MAX_FILE_BYTES = 1 << 20  # a study or hostfile is a few kB; more is not one (or is /dev/zero)
MAX_REPEATS = 1000  # tune profile --warmup/--repeats (default 3/10); the job is killed at 15 min
MAX_SEED = 2**32 - 1  # numpy's legacy seeding, which every Optuna sampler's RandomState takes
LAST_PORT = 65535  # the highest TCP port (16 bits): a master port may be this one
MAX_ARG_BYTES = 32 * 4096
"""Linux's MAX_ARG_STRLEN (``include/uapi/linux/binfmts.h``: 32 pages, 4 KiB on x86-64): the most
bytes, the closing NUL included, of one argument or ``NAME=value`` environment string execve
takes. A longer one fails every exec of the trial's script with E2BIG ("Argument list too long",
bash's exit status 126): each trial was a launch_error naming nothing."""


# Host names, IPv4 and IPv6 addresses, ~/.ssh/config aliases: never a quote, blank or '$'.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
"""A shell identifier: environment variable names and ``${NAME}`` references (``\\Z``, not
``$``, which matches before a final line break: ``export NAME\\n=value`` is two commands)."""
_HOST_NAME = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9._:\[\]-]*|::[0-9A-Fa-f:.]*")


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


def host_name_problem(node: str) -> str | None:
    """Why ``node`` is not a host name (of ``cluster.nodes`` or a hostfile), or None."""
    if len(node) > 253 or not _HOST_NAME.fullmatch(node):
        return (
            f"{_short(node)} is not a host name (letters, digits, '.', '-', '_', ':' for IPv6, "
            "at most 253 characters)"
        )
    if ":" in node and not _ipv6(node.removeprefix("[").removesuffix("]")):
        # gpu1:2222 was taken for a host of that name, and only the preflight's connection
        # said "cannot connect to user@gpu1:2222:22"
        return (
            f"{_short(node)} is not a host name: ':' is only in an IPv6 address (a port is "
            "cluster.ssh.port, or the host's Port in the ssh config)"
        )
    return None


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def listed_twice(node: str, seen: dict[str, str]) -> str | None:
    """Why ``node`` repeats a host already in ``seen`` (its :func:`host_key` -> as first given),
    or None, then noting it. Host names ignore case (RFC 4343): ``n1`` and ``N1`` are one
    machine, and two "nodes" on it would run two trials' ranks on the same GPUs; so are
    ``n1.example.com.`` and ``n1.example.com`` (a final dot names the DNS root, RFC 1034 3.1)."""
    key = host_key(node)
    first = seen.get(key)
    if first is None:
        seen[key] = node
        return None
    if first == node:
        return f"{_short(node)} is listed twice"
    why = "host names ignore case" if first.lower() == node.lower() else (
        "a final '.' names the same host")  # fmt: skip
    return f"{_short(node)} is listed twice (first as {_short(first)}: {why})"


def host_key(node: str) -> str:
    """The name two spellings of one host share: lower case, without a final dot."""
    return node.lower().removesuffix(".")


MASTER_PLACEHOLDER = "@TUNER_MASTER_ADDR@"
"""Stands for the master address in node scripts rendered before the job has nodes (a Slurm
trial's, ``tune best``'s), replaced there: no study value may hold it."""


def placeholder_field(values: Mapping[str, object]) -> str | None:
    """The path (``env.X``, ``extra_args[1]``) of the first string of ``values`` (a field's
    string, strings or mapping of them) that holds :data:`MASTER_PLACEHOLDER`, else None."""
    for name, value in values.items():
        items: Iterable[tuple[str, object]] = (
            [(f"{name}.{k}", v) for k, v in value.items()] if isinstance(value, Mapping)
            else [(f"{name}[{i}]", v) for i, v in enumerate(value)]
            if isinstance(value, tuple | list) else [(name, value)]
        )  # fmt: skip
        for path, text in items:
            if isinstance(text, str) and MASTER_PLACEHOLDER in text:
                return path
    return None


def read_integer(raw: str) -> int | None:
    """``raw`` as an integer as the study file's YAML reads one, else None: ASCII digits only
    (``int`` takes any Unicode digit, so ``４`` or an Arabic-Indic ``٤`` was 4 on the command line
    and refused in the study file; ``+4``, ``-1``, ``1_0`` are read as YAML 1.1 reads them)."""
    if not raw.isascii():
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def read_float(raw: str) -> float | None:
    """``raw`` as a number in ASCII, else None (``float`` too takes any Unicode digit: ``４.５``
    was 4.5)."""
    if not raw.isascii():
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _positive(value: float | None, path: str) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"must be > 0, got {value}", path=path)


def _at_most(value: float | None, limit: float, path: str, why: str) -> None:
    if value is not None and value > limit:
        raise ConfigError(f"must be at most {limit:,} ({why}), got {value:,}", path=path)


def _size(value: int | None, limit: int, path: str, why: str) -> None:
    """A positive size with a sane upper bound."""
    _positive(value, path)
    _at_most(value, limit, path, why)


def exec_limit_problem(values: Mapping[str, object]) -> tuple[str, str] | None:
    """``(path, why)`` for the first string of ``values`` (a section's fields: a mapping is
    environment variables, ``env.NAME``; a list arguments, ``extra_args[i]``) longer than
    :data:`MAX_ARG_BYTES` as execve counts it, else None."""
    tail = "on Linux (MAX_ARG_STRLEN): every launch would fail with 'Argument list too long'"
    for name, value in values.items():
        if isinstance(value, Mapping):
            for key, text in value.items():
                if (size := len(f"{key}={text}".encode()) + 1) > MAX_ARG_BYTES:
                    return f"{name}.{key}", (
                        f"{size:,} bytes as {key}=value, more than the {MAX_ARG_BYTES:,} one "
                        f"environment string may hold {tail}"
                    )
        items = enumerate(value) if isinstance(value, tuple | list) else ()
        for i, arg in items:
            if isinstance(arg, str) and (size := len(arg.encode()) + 1) > MAX_ARG_BYTES:
                return f"{name}[{i}]", (
                    f"{size:,} bytes, more than the {MAX_ARG_BYTES:,} one argument may hold {tail}"
                )
    return None


def launch_string_problem(values: Mapping[str, object]) -> tuple[str, str] | None:
    """``(path, why)`` for the first string of the launch section's ``values`` that no trial
    could launch with: one longer than execve takes (:func:`exec_limit_problem`), or one holding
    :data:`MASTER_PLACEHOLDER` (:func:`placeholder_field`); else None."""
    if (too_long := exec_limit_problem(values)) is not None:
        return too_long
    if (where := placeholder_field(values)) is not None:
        why = "stands for the master address in the scripts tuner writes (it is replaced)"
        return where, f"holds {MASTER_PLACEHOLDER}, which {why}"
    return None
