"""The Megatron stand-in: Megatron's flags and validation texts, and logs our parsers read back."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tuner.logs import find_failure, parse_log
from tuner.outcome import Outcome

STANDIN = Path(__file__).resolve().parent / "pretrain_gpt.py"

BASE = [
    "--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
    "--seq-length", "2048", "--max-position-embeddings", "2048",
    "--micro-batch-size", "1", "--global-batch-size", "16",
    "--train-iters", "10", "--log-interval", "1", "--eval-iters", "0",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000",
    "--bf16", "--log-throughput",
]  # fmt: skip


# selective recompute on an 8-expert model; the modules follow
SELECTIVE_MOE = [*BASE, "--num-experts", "8", "--recompute-granularity", "selective",
                 "--recompute-modules"]  # fmt: skip


def _env(world: int | None = 8, surface: Path | str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(TUNER_STANDIN_TIME_SCALE="0.0001", CUDA_DEVICE_MAX_CONNECTIONS="1")
    if world is not None:
        env["WORLD_SIZE"] = str(world)
    if surface is not None:
        env["TUNER_STANDIN_SURFACE"] = str(surface)
    env.update(extra)
    return env


def _run(
    flags: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STANDIN), *flags],
        env=env if env is not None else _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _surface(tmp_path: Path, spec: dict[str, Any]) -> Path:
    path = tmp_path / "surface.json"
    path.write_text(json.dumps(spec))
    return path


def _with(flags: list[str], **changes: str) -> list[str]:
    """BASE with ``--flag value`` pairs replaced (``tensor_model_parallel_size="2"``)."""
    out = list(flags)
    for name, value in changes.items():
        flag = "--" + name.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def test_unknown_flag_fails_like_megatrons_argparse() -> None:
    result = _run([*BASE, "--virtual-pipeline-model-parallel-size", "2"])
    assert result.returncode == 2
    assert result.stderr.startswith("usage: pretrain_gpt.py")
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "pretrain_gpt.py: error: unrecognized arguments: --virtual-pipeline-model-parallel-size 2"
    )
    metrics = parse_log(result.stderr, exit_codes=[2])
    assert metrics.outcome is Outcome.LAUNCH_ERROR and metrics.reason == last


def test_abbreviated_flag_is_unknown() -> None:
    result = _run([*BASE, "--tensor-model", "2"])
    assert result.returncode == 2
    assert "unrecognized arguments: --tensor-model 2" in result.stderr


# (flags, environment changes, world size, exception line)
RULES: list[tuple[list[str], dict[str, str], int, str]] = [
    (
        _with(BASE, tensor_model_parallel_size="4", pipeline_model_parallel_size="2"),
        {}, 12,
        "AssertionError: world size (12) is not divisible by total_model_size "
        "(total_model_size=8)",
    ),
    (
        _with(BASE, tensor_model_parallel_size="8", num_attention_heads="12", hidden_size="768"),
        {}, 8,
        "ValueError: num_attention_heads (12) must be a multiple of tensor_model_parallel_size "
        "(8).",
    ),
    (
        [*_with(BASE, tensor_model_parallel_size="4"), "--group-query-attention",
         "--num-query-groups", "2"],
        {}, 8,
        "ValueError: num_query_groups (2) must be a multiple of tensor_model_parallel_size (4).",
    ),
    (
        _with(BASE, pipeline_model_parallel_size="3", num_layers="8"),
        {}, 6,
        "AssertionError: Number of layers should be divisible by the pipeline-model-parallel size",
    ),
    (
        _with(BASE, pipeline_model_parallel_size="3", num_layers_per_virtual_pipeline_stage="1"),
        {}, 6,
        "AssertionError: number of layers of the model must be divisible pipeline model parallel "
        "size",
    ),
    (
        _with(BASE, pipeline_model_parallel_size="2", num_layers_per_virtual_pipeline_stage="3"),
        {}, 8,
        "AssertionError: number of layers per pipeline stage must be divisible number of layers "
        "per virtual pipeline stage",
    ),
    (
        _with(BASE, num_layers_per_virtual_pipeline_stage="2"),
        {}, 8,
        "AssertionError: When interleaved schedule is used, pipeline-model-parallel size should "
        "be greater than 1",
    ),
    (
        _with(BASE, global_batch_size="12"),
        {}, 8,
        "AssertionError: global batch size (12) is not divisible by micro batch size (1) times "
        "data parallel size (8)",
    ),
    (
        _with(BASE, context_parallel_size="4", seq_length="2052", max_position_embeddings="4096"),
        {}, 8,
        "AssertionError: seq-length should be a multiple of 2 * context-parallel-size if "
        "context-parallel-size > 1.",
    ),
    (
        _with(BASE, recompute_granularity="selective", recompute_method="uniform"),
        {}, 8,
        "AssertionError: recompute method is not yet supported for selective recomputing "
        "granularity",
    ),
    (
        _with(BASE, recompute_granularity="full"),
        {}, 8,
        'ValueError: Using recompute_granularity: full so recompute_method must be "block" or '
        '"uniform"',
    ),
    (
        _with(BASE, pipeline_model_parallel_size="2", recompute_granularity="full",
              recompute_method="block", recompute_num_layers="5"),
        {}, 8,
        "ValueError: When using recompute_granularity: full recompute_num_layers must be between "
        "1 and num_layers_per_pipeline_rank: 4",
    ),
    (
        _with(BASE, tensor_model_parallel_size="2"),
        {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, 8,
        "AssertionError: Using tensor model parallelism or context parallelism require setting "
        "the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1",
    ),
    (
        [*BASE, "--data-path", "/data/corpus_text_document"],
        {}, 8,
        "AssertionError: A single data source must be provided in training mode, else None",
    ),
    (
        [f for f in BASE if f not in ("--hidden-size", "1024")],
        {}, 8,
        "AssertionError: hidden_size argument is None",
    ),
    (
        _with(BASE, max_position_embeddings="1024"),
        {}, 8,
        "AssertionError: max_position_embeddings (1024) must be greater than or equal to "
        "seq_length (2048).",
    ),
    (
        [*BASE, "--overlap-param-gather", "--overlap-grad-reduce"],
        {}, 8,
        "AssertionError: --overlap-param-gather only supported with distributed optimizer or "
        "megatron fsdp",
    ),
    (
        [*BASE, "--overlap-param-gather", "--use-distributed-optimizer"],
        {}, 8,
        "AssertionError: Must use --overlap-param-gather with --overlap-grad-reduce",
    ),
    (
        [*_with(BASE, tensor_model_parallel_size="2"), "--tp-comm-overlap"],
        {}, 8,
        "AssertionError: Tensor parallel communication/GEMM overlap can happen only when sequence "
        "parallelism is enabled",
    ),
    (
        _with(BASE, ffn_hidden_size="4098", tensor_model_parallel_size="4"),
        {}, 8,
        "AssertionError: 4098 is not divisible by 4",
    ),
    (
        _with(BASE, expert_model_parallel_size="2"),
        {}, 8,
        "AssertionError: num_experts must be non None to use expert model parallelism",
    ),
    (
        _with(BASE, num_experts="6", expert_model_parallel_size="4"),
        {}, 8,
        "AssertionError: Number of experts should be a multiple of expert model parallel_size.",
    ),
    (
        [*(f if f != "--bf16" else "--fp16" for f in BASE), "--num-experts", "8",
         "--expert-model-parallel-size", "2"],
        {}, 8,
        "AssertionError: Expert parallelism is not supported with fp16 training.",
    ),
    (
        _with(BASE, num_experts="8", expert_model_parallel_size="8",
              tensor_model_parallel_size="2"),
        {}, 8,
        "RuntimeError: world_size (8) is not divisible by expert_tensor_model_pipeline_parallel "
        "size (16)",
    ),
    (
        _with(BASE, num_experts="8", tensor_model_parallel_size="2"),
        {}, 8,
        "ValueError: During training, performance may degrade if MoE and tensor parallelismare "
        "enabled without also enabling sequence parallelism.",
    ),
    (
        _with(BASE, num_experts="8", moe_router_topk="1"),
        {}, 8,
        "ValueError: Please use --moe-router-pre-softmax when topk is 1.",
    ),
    (
        _with(BASE, num_experts="8", moe_token_dispatcher_type="flex"),
        {}, 1,
        "AssertionError: Flex token dispatcher requires TPxEP > 1",
    ),
    (
        [*_with(BASE, num_experts="8", moe_ffn_hidden_size="1002", tensor_model_parallel_size="2",
                expert_tensor_parallel_size="8"), "--sequence-parallel"],
        {}, 8,
        "AssertionError: 1002 is not divisible by 8",
    ),
    (
        [*SELECTIVE_MOE, "moe_act"],
        {}, 8,
        "ValueError: moe_act in recompute_modules is only supported with moe_grouped_gemm.",
    ),
    (
        [*SELECTIVE_MOE, "mla_up_proj"],
        {}, 8,
        "ValueError: mla_up_proj in recompute_modules is only supported with "
        "multi_latent_attention.",
    ),
    (
        ["--moe-shared-expert-intermediate-size", "1024", "--moe-shared-expert-overlap",
         *SELECTIVE_MOE, "shared_experts"],
        {}, 8,
        "ValueError: shared_experts recompute cannot work with --moe-shared-expert-overlap.",
    ),
    (
        ["--fp8-format", "hybrid", *SELECTIVE_MOE, "layernorm"],
        {}, 8,
        "ValueError: Delayed scaling does not support moe_act and layernorm recompute for fp8.",
    ),
    (
        ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--moe-grouped-gemm",
         *SELECTIVE_MOE, "moe_act"],
        {"TUNER_STANDIN_TE_VERSION": "2.5.0"}, 8,
        "ValueError: moe_act and layernorm recompute for fp8 needs transformer-engine>=2.6.0dev0, "
        "but your version is 2.5.0.",
    ),
    (
        [*_with(BASE, num_experts="8", recompute_granularity="full", recompute_method="uniform",
                recompute_num_layers="1"), "--moe-layer-recompute"],
        {}, 8,
        "ValueError: Do not set --moe-layer-recompute with full recompute granularity.",
    ),
    (
        _with(BASE, recompute_granularity="selective", recompute_num_layers="1"),
        {}, 8,
        "ValueError: When using recompute_granularity: selective recompute_num_layers must be "
        "None.",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "env", "world", "line"), RULES, ids=[r[3][:60] for r in RULES])
def test_validation_rule_fails_with_megatrons_text(
    flags: list[str], env: dict[str, str], world: int, line: str
) -> None:
    result = _run(flags, _env(world, **env))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == line
    assert "Traceback (most recent call last):" in result.stderr
    metrics = parse_log(result.stdout + result.stderr, exit_codes=[1])
    assert metrics.outcome is Outcome.LAUNCH_ERROR
    assert metrics.reason == line


def test_recompute_modules_are_megatrons() -> None:
    """Megatron's allowed modules run; an unknown one fails with its assertion (the allowed set
    prints in Python's set order, so only its start is fixed)."""
    ok = _run([*SELECTIVE_MOE, "core_attn", "moe_act", "layernorm", "moe", "--moe-grouped-gemm"])
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = _run([*SELECTIVE_MOE, "core_attn", "attn"])
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 1
    assert last.startswith("AssertionError: Invalid choices for recompute_modules: {'attn'}. "
                           "Allowed modules are: {")  # fmt: skip
    assert parse_log(bad.stdout + bad.stderr, exit_codes=[1]).outcome is Outcome.LAUNCH_ERROR
    deprecated = _run([*_with(BASE, num_experts="8"), "--moe-layer-recompute"])
    assert deprecated.returncode == 0 and "--moe-layer-recompute is deprecated" in (
        deprecated.stderr
    )


def test_moe_flags_are_accepted_and_the_aux_loss_is_logged() -> None:
    flags = _with(BASE, num_experts="8", expert_model_parallel_size="4", moe_router_topk="2",
                  moe_ffn_hidden_size="2048", moe_token_dispatcher_type="alltoall",
                  moe_aux_loss_coeff="0.01", moe_layer_freq="([0]*1+[1]*7)",
                  fp8_format="hybrid", fp8_recipe="delayed")  # fmt: skip
    result = _run([*flags, "--moe-grouped-gemm", "--moe-permute-fusion"])
    assert result.returncode == 0, result.stderr
    assert "load_balancing_loss:" in result.stdout
    metrics = parse_log(result.stdout, exit_codes=[0])
    assert metrics.outcome is Outcome.OK


def test_query_groups_flag_pair_is_accepted() -> None:
    flags = [*_with(BASE, tensor_model_parallel_size="2"), "--group-query-attention"]
    result = _run([*flags, "--num-query-groups", "4", "--swiglu"])
    assert result.returncode == 0, result.stderr


FORMULA = {
    "kind": "formula",
    "step_s": {"base": 10.0, "powers": {"tp": -1}, "factors": {"recompute": {"full": 1.3}}},
    "memory_gib": {"base": 40.0, "terms": {"mbs": 2.0}, "factors": {"distopt": {"1": 0.75}}},
    "tflops": {"base": 400.0, "factors": {"sp": {"1": 1.1}}},
    "noise": 0.01,
}


def test_normal_run_reads_back_to_the_surface(tmp_path: Path) -> None:
    flags = [*_with(BASE, tensor_model_parallel_size="2", pipeline_model_parallel_size="2")]
    flags += ["--use-distributed-optimizer", "--sequence-parallel"]
    result = _run(flags, _env(8, _surface(tmp_path, FORMULA)))
    assert result.returncode == 0, result.stderr
    assert "using world size: 8, data-parallel size: 2, context-parallel size: 1" in result.stdout
    assert "setting number of microbatches to constant 8" in result.stdout
    metrics = parse_log(result.stdout, exit_codes=[0])
    assert metrics.outcome is Outcome.OK
    assert metrics.iterations == 10
    assert metrics.step_time_s == pytest.approx(5.0, rel=0.011)  # 10 / tp, +-1 % noise
    assert metrics.peak_memory_gib == pytest.approx((40 + 2) * 0.75, rel=1e-6)
    assert metrics.tflops_per_gpu == pytest.approx(440.0, rel=0.011)
    assert metrics.tflops_includes_recompute is False
    assert metrics.samples_per_s == pytest.approx(16 / 5.0, rel=0.011)
    assert result.stdout.count("(after 1 iterations) memory (MB)") == 4  # one per TP x PP rank
    assert " > number of parameters on (tensor, pipeline) model parallel rank (1, 1): " in (
        result.stdout
    )


def test_noise_is_deterministic(tmp_path: Path) -> None:
    env = _env(8, _surface(tmp_path, FORMULA))
    first, second = (parse_log(_run(BASE, env).stdout) for _ in range(2))
    assert first.step_times_s == second.step_times_s
    assert len(set(first.step_times_s)) > 1


def test_table_surface_and_missing_entry(tmp_path: Path) -> None:
    key = "tp=1,pp=1,cp=1,vp=1,mbs=1,recompute=none,sp=0,distopt=0"
    spec = {"kind": "table", "configs": {key: {"step_s": 2.5, "memory_gib": 12.0}}}
    env = _env(8, _surface(tmp_path, spec))
    metrics = parse_log(_run(BASE, env).stdout)
    assert metrics.step_time_s == pytest.approx(2.5, rel=0.011)
    assert metrics.peak_memory_gib == pytest.approx(12.0, rel=1e-6)
    missing = _run(_with(BASE, micro_batch_size="2"), env)
    assert missing.returncode == 1
    assert "RuntimeError: stand-in surface has no entry for tp=1,pp=1,cp=1,vp=1,mbs=2" in (
        missing.stderr
    )


def test_python_function_surface(tmp_path: Path) -> None:
    module = tmp_path / "my_surface.py"
    module.write_text(
        "def surface(v):\n    return {'step_s': 1.0 + v['pp'], 'memory_gib': 30.0 / v['pp']}\n"
    )
    flags = _with(BASE, pipeline_model_parallel_size="4")
    result = _run(flags, _env(8, f"{module}:surface"))
    metrics = parse_log(result.stdout)
    assert metrics.step_time_s == pytest.approx(5.0, rel=0.011)
    assert metrics.peak_memory_gib == pytest.approx(7.5, rel=1e-6)


def test_single_rank_prints_only_its_own_lines(tmp_path: Path) -> None:
    env = _env(8, _surface(tmp_path, FORMULA), RANK="3")
    flags = _with(BASE, pipeline_model_parallel_size="2")
    middle = _run(flags, env)
    assert middle.returncode == 0
    assert "iteration" not in middle.stdout and "memory (MB)" not in middle.stdout
    env["RANK"] = "7"
    last = _run(flags, env)
    assert parse_log(last.stdout).iterations == 10
    assert "[Rank 7] (after 1 iterations)" not in last.stdout  # dp rank 3: no memory report


def test_oom_when_memory_exceeds_the_gpu(tmp_path: Path) -> None:
    spec = {**FORMULA, "memory_gib": 95.0, "gpu_memory_gib": 80}
    result = _run(BASE, _env(8, _surface(tmp_path, spec)))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    # 95 GiB wanted, 79.10 GiB usable of which 78.25 GiB already allocated by PyTorch
    assert last.startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.75 GiB. GPU 0 has a "
        "total capacity of 79.10 GiB of which 117.56 MiB is free."
    )
    metrics = parse_log(result.stdout + result.stderr, exit_codes=[1])
    assert metrics.outcome is Outcome.OOM
    assert metrics.iterations == 0


def _behaviour(tmp_path: Path, **behaviour: Any) -> dict[str, str]:
    spec = {**FORMULA, "behaviours": [{"when": {"tp": 1}, **behaviour}]}
    return _env(8, _surface(tmp_path, spec))


def test_crash_behaviour(tmp_path: Path) -> None:
    env = _behaviour(tmp_path, kind="crash", after_iterations=3, message="boom at step 4")
    result = _run(BASE, env)
    assert result.returncode == 1
    metrics = parse_log(result.stdout + result.stderr, exit_codes=[1])
    assert metrics.iterations == 3
    assert (metrics.outcome, metrics.reason) == (
        Outcome.LAUNCH_ERROR,
        "RuntimeError: boom at step 4",
    )


def test_nccl_timeout_behaviour(tmp_path: Path) -> None:
    env = _behaviour(tmp_path, kind="nccl_timeout", after_iterations=2)
    result = _run([*BASE, "--distributed-timeout-minutes", "1"], env)
    assert result.returncode == -signal.SIGABRT
    metrics = parse_log(result.stdout + result.stderr, exit_codes=[result.returncode])
    assert metrics.outcome is Outcome.NCCL_TIMEOUT
    assert metrics.reason is not None and "Timeout(ms)=60000)" in metrics.reason
    assert metrics.iterations == 2


def test_hang_behaviour_until_sigterm(tmp_path: Path) -> None:
    env = _behaviour(tmp_path, kind="hang", after_iterations=2)
    out = tmp_path / "out.log"
    with out.open("w") as sink:
        proc = subprocess.Popen([sys.executable, str(STANDIN), *BASE], env=env, stdout=sink)
        try:
            deadline = time.monotonic() + 30
            while "iteration        2/" not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            assert proc.poll() is None
        finally:
            proc.terminate()
            code = proc.wait(timeout=10)
    assert code == -signal.SIGTERM
    metrics = parse_log(out.read_text(), exit_codes=[code], timed_out=True)
    assert (metrics.outcome, metrics.iterations) == (Outcome.TIMEOUT, 2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun(flags: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nnodes", "1", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
    return subprocess.run(
        [*command, str(STANDIN), *flags],
        env={k: v for k, v in env.items() if k != "WORLD_SIZE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch (and so torchrun) is not installed"
)


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_under_torchrun_two_ranks(tmp_path: Path) -> None:
    flags = [
        *_with(BASE, tensor_model_parallel_size="2", global_batch_size="4"),
        "--sequence-parallel",
    ]
    result = _torchrun(flags, _env(None, _surface(tmp_path, FORMULA)))
    assert result.returncode == 0, result.stderr[-2000:]
    log = result.stdout + result.stderr
    metrics = parse_log(log, exit_codes=[result.returncode])
    assert metrics.outcome is Outcome.OK
    assert metrics.iterations == 10  # only the last rank prints iteration lines
    assert metrics.step_time_s == pytest.approx(5.0, rel=0.011)
    assert "[Rank 0] (after 1 iterations)" in log and "[Rank 1] (after 1 iterations)" in log
    assert metrics.peak_memory_gib == pytest.approx(42.0, rel=1e-6)


@pytest.mark.slow
@pytest.mark.torch
@needs_torch
def test_under_torchrun_oom_is_an_oom(tmp_path: Path) -> None:
    spec = {**FORMULA, "memory_gib": 120.0}
    result = _torchrun(BASE, _env(None, _surface(tmp_path, spec)))
    assert result.returncode != 0
    log = result.stdout + result.stderr
    assert "ChildFailedError" in log
    failure = find_failure(log)
    assert failure is not None and failure.outcome is Outcome.OOM
    assert parse_log(log, exit_codes=[result.returncode]).outcome is Outcome.OOM


@pytest.mark.parametrize(
    "extra",
    [
        (["--num-layers", "10", "--decoder-first-pipeline-num-layers", "2",
          "--decoder-last-pipeline-num-layers", "2"]),
        (["--num-layers", "12", "--decoder-first-pipeline-num-layers", "2",
          "--decoder-last-pipeline-num-layers", "2", "--num-virtual-stages-per-pipeline-rank",
          "2"]),
        (["--num-layers", "10", "--account-for-embedding-in-pipeline-split",
          "--account-for-loss-in-pipeline-split"]),
        (["--pipeline-model-parallel-layout", "Et|t|t|t|t|t|t|tL"]),
    ],
)  # fmt: skip
def test_uneven_pipeline_flags_are_accepted(extra: list[str]) -> None:
    """Megatron's real flag names for uneven splits; the layout sets the virtual size."""
    layers = extra[1] if extra[0] == "--num-layers" else "8"
    flags = _with(BASE, pipeline_model_parallel_size="4", num_layers=layers)
    extra = extra[2:] if extra[0] == "--num-layers" else extra
    result = _run([*flags, *extra], _env(8))
    assert result.returncode == 0, result.stderr[-2000:]


def test_layers_per_virtual_stage_flag_is_refused_with_first_last_counts() -> None:
    flags = _with(BASE, pipeline_model_parallel_size="4")
    extra = ["--decoder-first-pipeline-num-layers", "1", "--num-layers-per-virtual-pipeline-stage",
             "1"]  # fmt: skip
    result = _run([*flags, *extra], _env(8))
    assert result.returncode == 1
    assert "please use --num-virtual-stages-per-pipeline-rank" in result.stderr
