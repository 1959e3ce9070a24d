"""``tune best --emit torchtitan``: the winning config as the pinned torchtitan release reads it.

torchtitan 0.3.0 reads no config file of tune's making: its trainer takes ``--module/--config``
(the study's ``launch.script_args``) and ``--section.option`` overrides on the command line
(``tuner.launch.torchtitan_flags``). The export is that argument list, shell-quoted on one line,
for ``torchrun ... -m torchtitan.train``, with the study's ``launch.train_args`` (the full run's
data, checkpoints, schedule) and ``launch.extra_args`` where the launch template puts them; a word
of theirs the line cannot hold beside tune's own is refused, naming it
(:func:`tuner.launch.torchtitan_flags.inexpressible`).
"""

from __future__ import annotations

import shlex

from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.launch.torchtitan_flags import inexpressible, torchtitan_args
from tuner.spec.frameworks import traits
from tuner.spec.study import StudySpec


def torchtitan_export(spec: StudySpec, config: ParallelConfig) -> str:
    """The trainer's arguments for ``config``, one shell-quoted line."""
    if not traits(spec.framework).fsdp2:
        raise ConfigError(
            f"--emit torchtitan needs a torchtitan study; this one's framework is "
            f"{spec.framework}",
            path="framework",
        )
    if (problem := inexpressible(spec, config)) is not None:
        raise ConfigError(problem[1], path=problem[0])
    return shlex.join(torchtitan_args(spec, config, full_run=True)) + "\n"
