"""The pinned torchtitan release (0.3.0) as the oracle: its own config parsing reads every rendered
command line as the config meant, its ParallelDims and trainer checks refuse what tune's rules
refuse with the same words, and its stage split is tune's. Skipped where torchtitan is absent
(``pip install -e '.[titan]'`` brings the pinned release and what its config registry imports)."""

from __future__ import annotations

import itertools
import random
import re
import shlex
from typing import Any

import pytest

from tests.test_torchtitan_space import titan
from tuner.config.parallel import ParallelConfig
from tuner.launch.torchtitan_flags import torchtitan_args
from tuner.space.enumerate import study_violations
from tuner.spec.torchtitan import local_batch, stage_layer_counts

try:
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part
except ImportError as exc:  # torchtitan, or what its llama3 registry imports, is not installed
    pytest.skip(f"torchtitan 0.3.0 not importable: {exc}", allow_module_level=True)


def parse(spec: Any, c: ParallelConfig) -> Any:
    return ConfigManager().parse_args(torchtitan_args(spec, c))


TRAIN_ARGS = ("--dump-folder", "/out/run", "--checkpoint.enable", "--checkpoint.interval", "500",
              "--lr_scheduler.warmup_steps", "200")  # fmt: skip
EXTRA_ARGS = ("--metrics.enable-tensorboard", "--training.max-norm=0.5")


def with_args(spec: Any, train: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> Any:
    """``spec`` with ``launch.train_args`` and ``launch.extra_args``, unchecked: a study file
    setting an option tune sets is refused as it loads (``tuner.spec.controlled``); the export
    refuses it again (``inexpressible``), which these tests read on their own."""
    import copy
    import dataclasses

    out = copy.copy(spec)
    launch = dataclasses.replace(spec.launch, train_args=train, extra_args=extra)
    object.__setattr__(out, "launch", launch)
    return out


def configs() -> list[ParallelConfig]:
    out = []
    for tp, pp, cp, r, mbs, rc, sched, reshard, comp in itertools.product(
        (1, 2), (1, 2), (1, 2), (1, 2), (1, 3), ("none", "selective", "full"),
        ("1F1B", "Interleaved1F1B"), ("default", "never"), (False, True),
    ):  # fmt: skip
        if pp == 1 and sched != "1F1B":
            continue
        shard = max(8 // (tp * pp * cp * r), 1)
        out.append(ParallelConfig(
            tp=tp, pp=pp, cp=cp, dp=shard * r, dp_replicate=r, micro_batch_size=mbs,
            global_batch_size=48, sequence_parallel=tp > 1, recompute=rc,  # type: ignore[arg-type]
            recompute_method="uniform" if rc == "full" else None,
            recompute_num_layers=1 if rc == "full" else None,
            pp_schedule=sched if pp > 1 else None, vp=2 if sched == "Interleaved1F1B" else 1,
            reshard_after_forward=reshard, compile=comp, tp_comm_overlap=comp and tp > 1,
        ))  # fmt: skip
    # a fixed sample of 16: each parse builds torchtitan's whole command line (about 1 s)
    return random.Random(0).sample(out, 16)


def test_the_release_reads_every_rendered_command_line_as_meant() -> None:
    """Each config's ``tune best --emit torchtitan`` line, the study's ``train_args`` and
    ``extra_args`` in it (they were left out), read by the release: every word as meant."""
    from tuner.report.torchtitan_export import torchtitan_export

    spec = with_args(titan(), TRAIN_ARGS, EXTRA_ARGS)
    for c in configs():
        try:
            got = ConfigManager().parse_args(shlex.split(torchtitan_export(spec, c)))
        except ValueError as exc:  # Trainer.Config.__post_init__ refused it: so must tune
            assert str(exc) in [v.message for v in study_violations(c, spec)], c.key()
            continue
        p, t = got.parallelism, got.training
        assert (t.local_batch_size, t.global_batch_size, t.seq_len) == (
            local_batch(48, c.micro_batch_size, c.dp, c.pp), 48, spec.model.seq_length,
        )  # fmt: skip
        assert (p.data_parallel_shard_degree, p.data_parallel_replicate_degree) == (
            c.dp_shard, c.dp_replicate,
        )  # fmt: skip
        assert (p.tensor_parallel_degree, p.pipeline_parallel_degree) == (c.tp, c.pp)
        assert (p.context_parallel_degree, p.enable_sequence_parallel) == (
            c.cp, c.sequence_parallel,
        )  # fmt: skip
        assert p.fsdp_reshard_after_forward == c.reshard_after_forward
        if c.pp > 1:
            assert p.pipeline_parallel_schedule == c.pp_schedule
            assert p.pipeline_parallel_microbatch_size == c.micro_batch_size
        assert (got.compile.enable, got.compile.enable_async_tensor_parallel) == (
            c.compile, c.tp_comm_overlap,
        )  # fmt: skip
        assert got.metrics.log_freq == 1
        assert (got.dump_folder, got.checkpoint.enable, got.checkpoint.interval) == (
            "/out/run", True, 500)  # fmt: skip
        assert got.lr_scheduler.warmup_steps == 200
        assert (got.metrics.enable_tensorboard, got.training.max_norm) == (True, 0.5)
        ac = got.activation_checkpoint
        kind = "none" if ac is None else type(ac).__qualname__.split(".")[0]
        assert kind == {"none": "none", "full": "FullAC", "selective": "SelectiveAC"}[c.recompute]


def test_parallel_dims_refuses_what_the_rules_refuse_in_its_words() -> None:
    spec = titan()
    for c in configs():
        if c.pp > 1 and local_batch(48, c.micro_batch_size, c.dp, c.pp) % c.micro_batch_size:
            continue  # the trainer's own check refuses it before ParallelDims runs
        p = parse(spec, c).parallelism
        for world in (8, 6):
            ours = [v.message for v in study_violations(c, spec) if v.rule == "world_divisible"]
            ours = [m.replace("WORLD_SIZE(8)", f"WORLD_SIZE({world})") for m in ours]
            try:
                ParallelDims.from_config(p, world)
                theirs: list[str] = []
            except AssertionError as exc:
                theirs = [str(exc)]
            if world == 8:
                assert theirs == ours, c.key()
            else:
                assert theirs, c.key()  # no product of these degrees makes 6


def test_stage_split_is_the_release_s() -> None:
    for layers, stages in ((32, 2), (32, 4), (32, 6), (80, 8), (6, 4), (26, 8)):
        parts = _generate_llm_fqn_per_model_part(stages, layers)
        counts = tuple(sum(n.startswith("layers.") for n in part) for part in parts)
        assert counts == stage_layer_counts(layers, stages), (layers, stages)


def test_the_export_refuses_what_its_line_cannot_hold_as_the_release_would_misread_it() -> None:
    """A word of ``train_args`` or ``extra_args`` the trainer's line cannot hold beside tune's
    own is refused naming it; unrefused, the release changes the config (tyro keeps the last
    value of an option) or does not parse the line at all (one subcommand, its options after
    it)."""
    from tuner.errors import ConfigError
    from tuner.report.torchtitan_export import torchtitan_export

    spec = titan()
    c = next(c for c in configs() if c.tp == 2 and c.pp == 1)
    for train, extra, field in (
        ((), ("--parallelism.tensor_parallel_degree=4",), "launch.extra_args[0]"),
        (("--compile.no-enable",), (), "launch.train_args[0]"),
        ((), ("--config", "llama3_8b"), "launch.extra_args[0]"),
        (("activation-checkpoint:full",), (), "launch.train_args[0]"),
        ((), ("--activation-checkpoint.debug",), "launch.extra_args[0]"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=f"^{re.escape(field)}: "):
            torchtitan_export(with_args(spec, train, extra), c)
    line = torchtitan_args(with_args(spec, (), ("--parallelism.tensor_parallel_degree=4",)), c,
                           full_run=True)  # fmt: skip
    assert ConfigManager().parse_args(line).parallelism.tensor_parallel_degree == 4 != c.tp
    twice = with_args(spec, ("activation-checkpoint:full",))
    with pytest.raises(SystemExit):  # tyro: "Unrecognized options: activation-checkpoint:full"
        ConfigManager().parse_args(torchtitan_args(twice, c, full_run=True))
