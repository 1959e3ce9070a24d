"""The FSDP2 workload for real: the rendered torchtitan command line, run by torchrun on 2 CPU
ranks over gloo (fully_shard over dp_shard 2, full checkpointing, no resharding after forward;
and two pipeline stages), read back by the torchtitan parser. The whole demo study is ``make
demo-fsdp``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tuner.config.parallel import ParallelConfig
from tuner.launch.torchtitan_flags import torchtitan_args
from tuner.logs import parse_log
from tuner.outcome import Outcome
from tuner.spec.file import study_from_mapping

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "tuner" / "studies" / "demo-fsdp.yaml"


@pytest.mark.slow
@pytest.mark.torch
def test_fsdp2_workload_runs_the_rendered_options(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the workload trains for real: needs the train extra")
    raw = yaml.safe_load(DEMO.read_text())
    raw["launch"].update(train_iters=3)
    raw["model"].update(seq_length=64)  # the demo's GPT on short sequences: states ~0.06 GiB
    spec = study_from_mapping(raw)
    c = ParallelConfig(
        dp=2, micro_batch_size=2, global_batch_size=8, recompute="full",
        recompute_method="uniform", recompute_num_layers=1, reshard_after_forward="never",
    )  # fmt: skip
    args = torchtitan_args(spec, c)
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", "29761", str(REPO / "workloads" / "gpt_fsdp2.py"), *args]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, shlex.join(cmd) + "\n" + proc.stderr[-3000:]
    tokens = 8 * 64 / 2  # global tokens per step over the ranks
    m = parse_log(proc.stdout, "torchtitan", warmup=1, step_tokens=tokens)
    assert m.outcome == Outcome.OK and m.iterations == 3
    assert m.step_time_s is not None and m.step_time_s > 0
    assert m.peak_reserved_gib is not None and m.peak_reserved_gib > 0  # counted in step 2


@pytest.mark.slow
@pytest.mark.torch
def test_fsdp2_workload_pipelines_two_stages_on_gloo(tmp_path: Path) -> None:
    """pp 2 on the 2 ranks: torch.distributed.pipelining's 1F1B over the rendered local batch
    (the whole DP rank's batch, 8 micro-batches of 1); rank 0 holds the first stage and prints
    loss -1 as torchtitan's non-last stages do; the step time still follows from tps."""
    pytest.importorskip("torch", reason="the workload trains for real: needs the train extra")
    raw = yaml.safe_load(DEMO.read_text())
    raw["launch"].update(train_iters=3)
    raw["model"].update(seq_length=64)
    spec = study_from_mapping(raw)
    c = ParallelConfig(pp=2, dp=1, micro_batch_size=1, global_batch_size=8, pp_schedule="1F1B")
    args = torchtitan_args(spec, c)
    assert "--parallelism.pipeline-parallel-degree" in args
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", "29762", str(REPO / "workloads" / "gpt_fsdp2.py"), *args]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, shlex.join(cmd) + "\n" + proc.stderr[-3000:]
    assert "loss: -1.00000" in proc.stdout
    m = parse_log(proc.stdout, "torchtitan", warmup=1, step_tokens=8 * 64 / 2)
    assert m.outcome == Outcome.OK and m.iterations == 3
    assert m.step_time_s is not None and m.step_time_s > 0
    assert m.peak_reserved_gib is not None and m.peak_reserved_gib > 0
