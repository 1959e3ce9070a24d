"""From a node name to an SSH destination: the study's ``cluster.ssh`` and the OpenSSH config.

The ssh config (``cluster.ssh.config_file``, default ``~/.ssh/config``) is read with
``paramiko.SSHConfig``, so ``Host`` patterns, ``Match`` blocks and "first value wins" work as in
OpenSSH. For each setting the first source that gives a value wins:

==============  ===================================================================================
address         the host's ``HostName``; the node name itself
port            the host's ``Port``; ``cluster.ssh.port``; 22
how to get in   the host's ``ProxyJump`` or ``ProxyCommand`` (whichever comes first, as in OpenSSH)
user            ``cluster.ssh.user``; the host's ``User``; the local user
keys            ``cluster.ssh.key_file`` (instead of the config's); the host's ``IdentityFile``\\s;
                ``~/.ssh/id_*`` when neither names one. Agent keys are offered alongside, unless
                the host says ``IdentitiesOnly yes`` or ``IdentityAgent none``
host keys       ``cluster.ssh.known_hosts`` when it names another file than the default; the
                host's ``UserKnownHostsFile`` (the first one); ``~/.ssh/known_hosts``
==============  ===================================================================================

Why two directions: where a host is and how to reach it is a fact about each host that only the
per-host config can know (one study-wide port cannot be right for hosts that listen on different
ones); who logs in, with which key and trusting which host keys is the study's choice for all of
its nodes (as ``ssh -l`` and ``-i`` override the config).

A jump host (``ProxyJump``, one or more hops) is resolved the same way, except that the study's
user and key are only its fallbacks (a bastion usually has its own login and key), and the
``user@`` and ``:port`` written in the hop win over everything. As with OpenSSH, the last hop is
reached through the hops before it, and the first hop through its own config. In a
``ProxyCommand``, ``%p`` and ``%r`` are the config's Port and User (or 22 and the local user):
paramiko expands them before ``cluster.ssh`` is applied.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import paramiko

from tuner.errors import ConfigError
from tuner.spec.study import SSHSpec

MAX_HOPS = 10
"""More jump hosts than this in one chain is taken for a ``ProxyJump`` loop."""


def spec_default(name: str) -> Any:
    """The default of the ``SSHSpec`` field ``name`` (one definition: the spec's)."""
    return next(f.default for f in fields(SSHSpec) if f.name == name)


@dataclass(frozen=True, slots=True)
class SSHTarget:
    """Where a node name really leads once the ssh config is applied."""

    name: str
    """The name the study uses (a node, or a hop as written in ``ProxyJump``)."""
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: Path
    """The host keys of this host are checked against (and new ones saved to) this file."""
    agent: bool = True
    """Offer the keys of a running ssh-agent (``SSH_AUTH_SOCK``)."""
    jump: tuple[str, ...] = ()
    """``ProxyJump`` hops, first to last (the last one opens the connection to this host)."""
    proxy_command: str | None = None
    """``ProxyCommand``, its ``%h``/``%p``/``%r`` already expanded."""

    @property
    def where(self) -> str:
        """``user@host:port``, for messages."""
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def look_for_keys(self) -> bool:
        """Try ``~/.ssh/id_*`` (only when no key is named, as OpenSSH)."""
        return not self.key_files


class SSHResolver:
    """Resolves node names and jump hops with the study's settings and the ssh config."""

    def __init__(self, spec: SSHSpec) -> None:
        self.spec = spec
        self.config = load_ssh_config(spec.config_file)
        self._found: dict[str, dict[str, Any]] = {}

    def lookup(self, host: str) -> dict[str, Any]:
        """The ssh config's options for ``host`` (lower-case keys), ``{}`` without a config.

        Looked up once per host: a ``Match exec`` block runs its command on every lookup.
        """
        if host not in self._found:
            found = self.config.lookup(host) if self.config is not None else {}
            self._found[host] = dict(found)
        return dict(self._found[host])

    def node(self, name: str) -> SSHTarget:
        """The destination of the study's node ``name``."""
        found = self.lookup(name)
        keys = [self.spec.key_file] if self.spec.key_file else _identity_files(found)
        return self._target(name, found, user=self.spec.user or found.get("user"), keys=keys)

    def hop(self, hop: str, *, via: tuple[str, ...] | None = None) -> SSHTarget:
        """The destination of the jump host ``hop`` (``[user@]host[:port]``, as in ProxyJump).

        ``via``: the hops before it in the same ``ProxyJump`` (they replace its own proxy
        settings); None for the first hop, which is reached as its own config says.
        """
        user, host, port = parse_hop(hop)
        found = self.lookup(host)
        keys = _identity_files(found) or ([self.spec.key_file] if self.spec.key_file else [])
        target = self._target(
            hop, found, user=user or found.get("user") or self.spec.user, keys=keys, port=port
        )
        if via is not None:
            target = replace(target, jump=via, proxy_command=None)
        return target

    def _target(
        self,
        name: str,
        found: dict[str, Any],
        *,
        user: str | None,
        keys: list[str],
        port: int | None = None,
    ) -> SSHTarget:
        jump, command = _proxy(found)
        return SSHTarget(
            name=name,
            hostname=_unbracketed(str(found.get("hostname") or name)),
            port=port or self._config_port(name, found) or self.spec.port or 22,
            user=str(user or getpass.getuser()),
            key_files=tuple(os.path.expanduser(k) for k in keys),
            known_hosts=self._known_hosts(found),
            agent=str(found.get("identitiesonly", "no")).lower() != "yes"
            and str(found.get("identityagent", "")).lower() != "none",
            jump=jump,
            proxy_command=command,
        )

    def _config_port(self, name: str, found: dict[str, Any]) -> int | None:
        text = found.get("port")
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise ConfigError(
                f"Port {text!r} of host {name} in {self.spec.config_file} is not a number",
                path="cluster.ssh.config_file",
            ) from None

    def _known_hosts(self, found: dict[str, Any]) -> Path:
        chosen = self.spec.known_hosts
        from_config = str(found.get("userknownhostsfile") or "").split()
        if chosen == spec_default("known_hosts") and from_config:
            chosen = from_config[0]
        return Path(os.path.expanduser(chosen))


def load_ssh_config(path: str | None) -> paramiko.SSHConfig | None:
    """The OpenSSH client config at ``path``; None when the default one does not exist.

    A file the study names itself must exist (a typo would otherwise silently drop every alias).
    """
    if not path:
        return None
    full = Path(os.path.expanduser(path))
    if not full.is_file():
        if path == spec_default("config_file"):
            return None
        raise ConfigError(f"no such ssh config file: {full}", path="cluster.ssh.config_file")
    try:
        return paramiko.SSHConfig.from_path(str(full))
    except (OSError, ValueError, paramiko.ConfigParseError) as exc:
        raise ConfigError(f"{full}: {exc}", path="cluster.ssh.config_file") from exc


def parse_hop(hop: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` (``[v6addr]:port`` too) -> (user, host, port)."""
    text = hop.strip().removeprefix("ssh://")
    user, _, rest = text.rpartition("@")
    port_text = ""
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host = rest
    if not host or (port_text and not port_text.isdigit()):
        raise ConfigError(f"bad ProxyJump hop {hop!r}", path="cluster.ssh.config_file")
    return user or None, host, int(port_text) if port_text else None


def _unbracketed(host: str) -> str:
    """``[fe80::1]`` -> ``fe80::1``: a node may be an IPv6 address in brackets (as in a URL), but
    the brackets are no part of the address a connection is made to or a rendezvous names."""
    if host.startswith("[") and host.endswith("]") and ":" in host:
        return host[1:-1]
    return host


def _identity_files(found: dict[str, Any]) -> list[str]:
    return [str(k) for k in found.get("identityfile") or []]


def _proxy(found: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """(ProxyJump hops, ProxyCommand): only the one the config gives first counts (OpenSSH)."""
    for key in found:  # paramiko keeps the order in which values were first obtained
        value = found[key]
        if key == "proxyjump" and value:
            if str(value).lower() == "none":
                return (), None
            return tuple(h.strip() for h in str(value).split(",") if h.strip()), None
        if key == "proxycommand":
            return (), (str(value) if value and str(value).lower() != "none" else None)
    return (), None
