"""The public memory calibration set (benchmarks/data/memory_peaks.csv) parses and covers what the
memory benchmark needs: cited rows from several sources, both GPU generations, both frameworks,
pipeline parallelism, an uneven split, runs that went out of memory and mixture-of-experts runs
(expert parallelism, expert TP, both dispatchers)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tuner.models.uncertainty import Z_BAND

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
CSV = DATA / "memory_peaks.csv"
METRICS = {"allocated", "reserved", "device"}
UNITS = {"bytes", "MiB", "GiB", "GB", "GB-smi"}
POSITIVE = ("value", "n_layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "seq_len",
            "gpus", "tp", "pp", "dp", "cp", "vp", "micro_batch", "global_batch")  # fmt: skip
# A citation names a repository at a commit and a file, or an issue / paper / document.
CITATION = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{7,40} \S+|issue #\d+|arXiv:\d|https?://")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    with CSV.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_row_is_complete_and_cited(rows: list[dict[str, str]]) -> None:
    for i, row in enumerate(rows, start=2):
        where = f"memory_peaks.csv line {i}"
        assert None not in row and None not in row.values(), f"{where}: wrong column count"
        assert CITATION.search(row["citation"]), f"{where}: no citation"
        assert row["metric"] in METRICS, f"{where}: metric {row['metric']!r}"
        assert row["unit"] in UNITS, f"{where}: unit {row['unit']!r}"
        assert row["outcome"] in ("ok", "oom"), f"{where}: outcome {row['outcome']!r}"
        assert row["gpu_type"] and row["framework"] and row["stage"], where
        for key in POSITIVE:
            assert float(row[key]) > 0, f"{where}: {key} must be > 0, got {row[key]!r}"
        world = int(row["tp"]) * int(row["pp"]) * int(row["dp"]) * int(row["cp"])
        assert world == int(row["gpus"]), f"{where}: tp*pp*dp*cp = {world} != gpus"
        assert int(row["hidden"]) % int(row["heads"]) == 0, where
        assert row["recompute"] in ("none", "selective", "full"), where
        assert row["precision"] in ("bf16", "fp16", "fp32"), where


DISPATCHERS = {"alltoall", "allgather", "flex"}


def test_moe_rows_are_consistent(rows: list[dict[str, str]]) -> None:
    """An MoE row names its experts and a Megatron-valid expert grid; a dense row leaves every
    MoE column empty."""
    moe_columns = ("ep", "etp", "num_experts", "moe_topk", "moe_ffn_hidden", "moe_shared_ffn",
                   "moe_layer_freq", "moe_dispatcher", "moe_grouped_gemm", "moe_router_dtype",
                   "moe_load_balancing")  # fmt: skip
    for i, row in enumerate(rows, start=2):
        where = f"memory_peaks.csv line {i}"
        if not row["num_experts"]:
            assert not any(row[k] for k in moe_columns), f"{where}: MoE fields on a dense row"
            continue
        experts, ep, topk = int(row["num_experts"]), int(row["ep"]), int(row["moe_topk"])
        etp = int(row["etp"] or row["tp"])
        assert experts % ep == 0 and 1 <= topk <= experts, where
        assert int(row["gpus"]) % (etp * ep * int(row["pp"])) == 0, f"{where}: expert grid"
        assert row["moe_dispatcher"] in DISPATCHERS, where
        assert row["moe_grouped_gemm"] in ("yes", "no"), where
        assert row["moe_router_dtype"] in ("", "fp32", "fp64"), where
        assert row["moe_load_balancing"], where
        if int(row["tp"]) > 1:  # Megatron refuses MoE with TP but no sequence parallelism
            assert row["sequence_parallel"] == "yes", where


def test_moe_coverage(rows: list[dict[str, str]]) -> None:
    """Measured MoE peaks with expert parallelism, expert TP different from TP, both the
    all-to-all and all-gather dispatchers, shared experts and PP; rows with a feature the tuner
    cannot express say which."""
    moe = [r for r in rows if r["num_experts"]]
    plain = [r for r in moe if not r["unmodelled"]]
    assert len(plain) >= 40
    assert any(int(r["ep"]) > 1 for r in plain)
    assert any(r["etp"] and r["etp"] != r["tp"] for r in plain)
    assert {r["moe_dispatcher"] for r in plain} >= {"alltoall", "allgather"}
    assert any(r["moe_shared_ffn"] for r in plain) and any(int(r["pp"]) > 1 for r in plain)
    assert all(r["unmodelled"] for r in moe if r not in plain)
    assert all(not r["unmodelled"] for r in rows if not r["num_experts"])


def test_coverage(rows: list[dict[str, str]]) -> None:
    assert len(rows) >= 40
    assert len({r["source"] for r in rows}) >= 3
    gpus = {r["gpu_type"] for r in rows}
    assert any(g.startswith("A100") for g in gpus) and any(g.startswith("H100") for g in gpus)
    frameworks = {r["framework"] for r in rows}
    assert "megatron" in frameworks
    assert frameworks & {"deepspeed", "megatron-deepspeed"}
    assert any(int(r["pp"]) > 1 for r in rows)
    assert any(r["pipeline_split"] for r in rows)
    assert any(r["outcome"] == "oom" for r in rows)
    assert {r["metric"] for r in rows} == METRICS


def test_uneven_split_adds_up(rows: list[dict[str, str]]) -> None:
    for row in rows:
        match = re.match(r"megatron:first=(\d+),last=(\d+)", row["pipeline_split"])
        if match is None:
            continue
        first, last = int(match.group(1)), int(match.group(2))
        rest, middle = int(row["n_layers"]) - first - last, int(row["pp"]) - 2
        assert rest > 0 and rest % middle == 0, row["model"]


def _benchmark(name: str = "memory_accuracy") -> ModuleType:
    """A script of benchmarks/, imported as it runs: its own directory on sys.path (the two
    accuracy benchmarks share benchmarks/held_out.py)."""
    if str(DATA.parent) not in sys.path:
        sys.path.insert(0, str(DATA.parent))
    path = DATA.parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_rows_build_model_inputs(rows: list[dict[str, str]]) -> None:
    """Every row is a valid ModelSpec, and every even-split row a valid ParallelConfig."""
    bench = _benchmark("memory_rows")
    for row in rows:
        model = bench.row_model(row)
        assert model.num_layers == int(row["n_layers"])
        assert (model.moe is None) == (not row["num_experts"])
        assert row["gpu_type"] in bench.GPUS and row["framework"] in bench.FRAMEWORKS
        if not row["pipeline_split"]:
            config = bench.row_config(row)
            assert config.world_size == int(row["gpus"])
            assert config.ep == int(row["ep"] or 1)


class _Figures:
    def __init__(self, allocated: float, reserved: float | None = None) -> None:
        self.allocated, self.peak = allocated, allocated + 10
        if reserved is not None:
            self.reserved = self.device = reserved


def test_unmodelled_rows_stay_out_of_the_targets() -> None:
    """A row whose ``unmodelled`` column names a feature, or whose framework the tuner cannot
    express, is reported apart from the targets."""
    bench = _benchmark()
    assert bench._unmodelled({"framework": "megatron", "unmodelled": "Muon optimizer"})
    assert bench._unmodelled({"framework": "torchtitan-fsdp2", "unmodelled": ""})
    assert not bench._unmodelled({"framework": "megatron", "unmodelled": ""})


def test_benchmark_compares_like_with_like() -> None:
    """A last-stage row reads the model's last stage; reserved and device rows read those
    figures, allocated rows the allocated one."""
    bench = _benchmark("memory_rows")
    first, last = _Figures(8.0, 9.0), _Figures(3.0, 4.0)
    new = _Figures(8.0, 9.0)
    new.stages = (first, last)  # type: ignore[attr-defined]
    part, which = bench._stage_part(new, "last pipeline stage (rank 7)")
    assert (part, which) == (last, "last")
    assert bench._figure(part, "device") == 4.0 and bench._figure(part, "allocated") == 3.0
    assert bench._stage_part(new, "pipeline stage 0 (rank 0)") == (first, "0")
    assert bench._stage_part(new, "rank 0") == (new, "peak")


def test_the_step_time_set_has_an_moe_row_predicted_as_moe() -> None:
    """benchmarks/data/step_times.csv: the MoE rows name a catalog preset and an EP size, and
    time_accuracy predicts them with the experts (not as the dense model of the same shape)."""
    bench = _benchmark("time_accuracy")
    cases, skipped = bench.load_cases(DATA / "step_times.csv")
    assert not skipped
    moe = [c for c in cases if c.row["preset"]]
    assert moe, "no MoE row in step_times.csv"
    for case in moe:
        assert case.model.moe is not None and case.config.ep == int(case.row["ep"]) > 1
        assert case.predicted > 0


def test_rows_carry_their_runs_cublas_workspace_config(rows: list[dict[str, str]]) -> None:
    """``cublas_workspace_config`` is PyTorch's ``:SIZE:COUNT`` syntax (SIZE KiB, summed over
    pairs) or empty; a set value resizes the GPU's per-handle cuBLAS workspace."""
    bench = _benchmark("memory_rows")
    assert bench.cublas_workspace_mib(":4096:8") == 32.0  # Megatron-LM CI's ENV_VARS
    assert bench.cublas_workspace_mib(":4096:2:16:8") == 8.125  # PyTorch's pre-sm90 default
    assert bench.cublas_workspace_mib("") is None
    for row in rows:
        value = row["cublas_workspace_config"]
        assert not value or bench.cublas_workspace_mib(value), value
    ci = next(r for r in rows if r["cublas_workspace_config"] and r["gpu_type"].startswith("A100"))
    assert bench.row_gpu(ci).cublas_workspace_mib == 32.0
    assert bench.row_gpu({**ci, "cublas_workspace_config": ""}).cublas_workspace_mib == 8.125


def test_rows_carry_their_stacks_versions(rows: list[dict[str, str]]) -> None:
    """``stack`` parses on every row (``name=version`` words or empty); BigScience's tr11 stack
    (PyTorch 1.11, CUDA 11.5) predates lazy module loading, so its rows' GPU carries the eager
    CUDA context, and a row without versions keeps the catalog's."""
    from tuner.models.memory.stack import EAGER_CONTEXT_GIB
    from tuner.spec.overheads import StackVersions

    bench = _benchmark("memory_rows")
    for row in rows:
        StackVersions.parse(row["stack"])
    tr11 = next(r for r in rows if r["source"] == "bigscience-tr11-prequel")
    assert tr11["stack"] == "torch=1.11 cuda=11.5"
    assert bench.row_gpu(tr11).cuda_context_gib == EAGER_CONTEXT_GIB
    catalog = bench.row_gpu({**tr11, "stack": ""}).cuda_context_gib
    assert catalog < EAGER_CONTEXT_GIB
    lazy = next(r for r in rows if r["source"] == "llm-action-megatron-gpt2")
    assert bench.row_gpu(lazy).cuda_context_gib == catalog


def test_resident_rows_compare_with_the_step_phase(rows: list[dict[str, str]]) -> None:
    """``resident`` (Megatron-LM CI's mem-allocated-bytes, bytes) sits only on Megatron rows that
    also carry a peak, and is below it; the benchmark reads the compared stage's step phase."""
    bench = _benchmark("memory_rows")
    held = [r for r in rows if r["resident"]]
    assert len(held) > 100
    for row in held:
        assert row["source"].startswith("megatron-ci") and row["metric"] == "allocated"
        assert 0 < int(row["resident"]) < float(row["value"]) * bench.UNITS[row["unit"]]

    class _Phase:
        def __init__(self, allocated: float) -> None:
            self.allocated = allocated

    class _Stage:
        def __init__(self, fwd: float, step: float) -> None:
            self.phases = (_Phase(fwd), _Phase(step))

    class _Breakdown:
        stages = (_Stage(9.0, 4.0), _Stage(7.0, 5.0))

    assert bench._resident(_Stage(9.0, 4.0)) == 4.0
    assert bench._resident(_Breakdown()) == 5.0  # a whole breakdown: its largest step phase


def test_measured_gemm_rates_are_cited_and_below_the_datasheet_peak() -> None:
    """benchmarks/data/gemm_rates.csv: every row cites its table, names a catalog GPU, and its
    rate is a dense GEMM's (at most the catalog peak of its precision)."""
    from tuner.catalog import get_gpu

    with (DATA / "gemm_rates.csv").open(newline="") as fh:
        gemms = list(csv.DictReader(fh))
    assert {r["precision"] for r in gemms} >= {"bf16", "fp8"}
    for i, row in enumerate(gemms, start=2):
        where = f"gemm_rates.csv line {i}"
        assert CITATION.search(row["citation"]), f"{where}: no citation"
        gpu = get_gpu(row["catalog_gpu"])
        peak = gpu.fp8_peak_tflops if row["precision"] == "fp8" else gpu.peak_tflops
        assert 0 < float(row["tflops"]) <= peak, f"{where}: {row['tflops']} > peak {peak}"
        assert all(int(row[k]) > 0 for k in ("batch", "m", "n", "k")), where


def test_repeat_bound_is_what_an_exact_model_of_repeated_setups_reaches() -> None:
    """Where one setup was measured twice at different speeds, a model can only predict their
    mean: the bound's best gap is the repeat below the best, and groups without repeats have
    no bound (benchmarks/time_accuracy.py ``repeat_bound``)."""
    bench = _benchmark("time_accuracy")
    cases, _ = bench.load_cases(DATA / "step_times.csv")
    bridge = [c for c in cases if c.row["group"] == "megatron-bridge-dgx-h100-fp8cs"]
    bound = bench.repeat_bound(bridge)
    assert bound is not None
    rho, best_gap = bound
    speeds = {}
    for case in bridge:
        speeds.setdefault(bench._key(case), []).append(case.speed("measured"))
    best = max(speeds.values(), key=lambda v: sum(v) / len(v))
    fastest = max(c.speed("measured") for c in bridge)
    assert best_gap == pytest.approx(1.0 - best[0] / fastest)
    assert rho < 1.0  # the repeats' spread costs rank correlation
    single = [c for c in cases if c.row["group"] == "selene-narayanan2021-t1"]
    assert bench.repeat_bound(single) is None


def test_pair_order_counts_the_pairs_a_search_ranks() -> None:
    """benchmarks/time_accuracy.py ``pair_order``: pairs of one model on one GPU type and count
    within a group count once each; a pair the model orders wrongly is not counted right, and
    the ratio's error is the log of predicted over measured speed ratios; repeats of one setup
    (Megatron-Bridge's releases) and single rows have no pair."""
    bench = _benchmark("time_accuracy")
    cases, _ = bench.load_cases(DATA / "step_times.csv")
    group = [c for c in cases if c.row["group"] == "dgxc-eos-llama3.1-8b"]
    pair = [c for c in group if c.row["gpus"] == "8"]
    assert len(pair) == 2 and len({c.row["precision"] for c in pair}) == 2
    right, n, ratio = bench.pair_order(pair)
    measured = math.log(pair[0].speed("measured") / pair[1].speed("measured"))
    predicted = math.log(pair[0].speed("predicted") / pair[1].speed("predicted"))
    assert (right, n) == (1, 1) and ratio == pytest.approx(abs(predicted - measured))
    assert bench.pair_order(group)[1] == 2  # 8 and 128 GPUs: one pair each, none across
    a, b = pair  # each row predicted as the other: the model names the slower one faster
    swapped = [
        dataclasses.replace(a, predicted=b.predicted, predicted_step=b.predicted_step),
        dataclasses.replace(b, predicted=a.predicted, predicted_step=a.predicted_step),
    ]
    assert bench.pair_order(swapped)[:2] == (0, 1)
    bridge = [c for c in cases if c.row["group"] == "megatron-bridge-dgx-h100-fp8cs"]
    again = [c for c in bridge if c.row["gpus"] == "64" and c.row["global_batch"] == "256"]
    assert len(again) == 2 and bench.pair_order(again) is None  # 26.02 and 26.04.01
    assert bench.pair_order(again + [c for c in bridge if c.row["global_batch"] == "128"])


def test_a_measured_network_replaces_only_the_inter_node_link() -> None:
    """benchmarks/time_rows.py: rows that cite their cluster's measured inter-node bandwidth
    (Jean Zay's, Gb/s per node) are predicted with it only when asked, as a cluster profile's
    measured link: the catalog's rates but the inter-node link, whose bandwidth per GPU is the
    node's figure over its GPUs; compute is untouched, the cross-node terms grow (the measured
    rate is below the catalog's share of the line rate) and every other row is predicted as
    before."""
    from tuner.catalog import get_gpu
    from tuner.models.rates import catalog_rates

    bench = _benchmark("time_rows")
    catalog, _ = bench.load_cases(DATA / "step_times.csv")
    measured, _ = bench.load_cases(DATA / "step_times.csv", measured_network=True)
    cited = 0
    for plain, linked in zip(catalog, measured, strict=True):
        rates = bench.measured_network_rates(plain.row, plain.gpu, plain.gpus_per_node)
        if rates is None:
            assert linked.predicted == plain.predicted, plain.row["group"]
            continue
        cited += 1
        assert plain.row["group"].startswith("jeanzay-")
        per_gpu = float(plain.row["network_measured_gbps_per_node"]) / 8 * 1e9 / 8
        assert rates.inter.bandwidth == pytest.approx(per_gpu)
        base = catalog_rates(plain.gpu, plain.row["precision"])
        assert (rates.intra, rates.gemm, rates.hbm) == (base.intra, base.gemm, base.hbm)
        assert rates.inter.latency == base.inter.latency
        assert rates.inter.bandwidth < base.inter.bandwidth
        a, b = plain.breakdown, linked.breakdown
        assert a is not None and b is not None
        assert b.compute == a.compute and b.tp_comm == a.tp_comm
        assert b.dp_comm > a.dp_comm and b.step > a.step
    assert cited == 39
    assert bench.measured_network_rates({}, get_gpu("a100-80gb"), 8) is None


def test_the_catalogs_stated_step_time_error_is_the_held_out_one() -> None:
    """``tuner.models.uncertainty.CATALOG_STEP_SIGMA`` (what tune estimate and tune space say of
    the catalog's rates) is the held-out sd of an all-compute catalog step as time_accuracy fits
    it (within a stack and a stack's own bias), not the in-sample rms, which is smaller."""
    from tuner.models.uncertainty import CATALOG_STEP_SIGMA, TIME_SIGMA_FLOORS

    bench = _benchmark("time_accuracy")
    ho = _benchmark("held_out")
    cases, _ = bench.load_cases(DATA / "step_times.csv")
    terms = ho.load_terms(DATA / "time_terms.csv")
    fit = ho.fit_sigmas([bench.residual(c) for c in cases], terms, TIME_SIGMA_FLOORS, True)
    held = ho.band_sigma({"compute": 1.0}, fit)
    assert CATALOG_STEP_SIGMA == pytest.approx(held, rel=0.05)
    assert CATALOG_STEP_SIGMA > bench.rms_step_error(cases)
    slow = next(c for c in cases if c.row["metric"] == "iter_time_s")
    assert bench.step_log_error(slow) == pytest.approx(math.log(slow.published / slow.predicted))


def test_the_proxy_pairs_keep_per_replica_work_and_say_their_hierarchy() -> None:
    """benchmarks/data/proxy_pairs.csv: each pair is one config at two DP sizes with the same
    tp, pp, cp, micro-batch and micro-batches per step (weak scaling in DP), cites its source,
    states truly whether the smaller run's DP group crosses nodes as the larger's does, and
    proxy_accuracy extrapolates every pair."""
    from tuner.config.parallel import ParallelConfig
    from tuner.space.proxy import dp_crosses_nodes

    bench = _benchmark("proxy_accuracy")
    pairs: dict[str, dict[str, dict[str, str]]] = {}
    with (DATA / "proxy_pairs.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            assert row["citation"] and row["value"]
            pairs.setdefault(row["pair"], {})[row["role"]] = row
    assert len(pairs) >= 2
    for sides in pairs.values():
        small, big = sides["proxy"], sides["full"]
        for key in ("model", "tp", "pp", "cp", "micro_batch", "seq_len", "gpus_per_node",
                    "recompute", "optimizer_sharding", "compile"):  # fmt: skip
            assert small[key] == big[key], key
        per_step = [int(r["global_batch"]) // (int(r["micro_batch"]) * int(r["dp"]))
                    for r in (small, big)]  # fmt: skip
        assert per_step[0] == per_step[1] and int(small["dp"]) < int(big["dp"])
        gpn = int(big["gpus_per_node"])
        cross = [dp_crosses_nodes(ParallelConfig(tp=int(r["tp"]), dp=int(r["dp"])), gpn)
                 for r in (small, big)]  # fmt: skip
        assert (cross[0] == cross[1]) == (small["hierarchy_kept"] == "yes")
    rows = bench.pair_errors()
    assert len(rows) == len(pairs) and all(math.isfinite(float(r["error"])) for r in rows)


# ----------------------------------------------------------------------------- held out (issue 35)


def test_coverage_counts_rows_inside_the_band_and_loso_fits_without_the_source() -> None:
    """benchmarks/held_out.py: coverage is the share of log errors within z90 x sd; a source's
    band is fitted on the other sources (a source far off its neighbours is not covered by
    them), and a term developed on a source is left out of that source's held-out figure."""
    ho = _benchmark("held_out")
    assert ho.coverage([0.0, 0.1, -0.2], [0.1, 0.1, 0.1]) == pytest.approx(2 / 3)
    rng = __import__("random").Random(0)
    rows = [ho.Residual(s, rng.gauss(0.0, 0.05), {"g": 1.0}) for s in "abc" for _ in range(40)]
    rows += [ho.Residual("far", 0.5, {"g": 1.0}, {"t": 0.2}) for _ in range(5)]
    sds = ho.fit_sigmas([r for r in rows if r.source != "far"], [], {"g": 0.01})
    assert sds["g"] == pytest.approx(0.05, rel=0.25)
    figures = {f.source: f for f in ho.loso(rows, [], {"g": 0.01})}
    assert figures["far"].coverage == 0.0 and figures["a"].coverage > 0.8
    term = ho.Term("t", ("far",), "test")
    assert ho.held_out(rows[-1], [term]) == pytest.approx(0.5 - math.log(0.8))
    assert ho.held_out(rows[0], [term]) == rows[0].log_error


def test_a_terms_effect_is_judged_against_each_sources_held_out_prediction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """benchmarks/held_out.py print_term_effects: on a source another term was developed on,
    that term is left out of both figures (it is no baseline there). Source "s": log error 0
    with both terms in, u (developed on s) 10% of the prediction, t (developed elsewhere) 20%:
    held out, with t the error is exp(-log 0.9) - 1 = 11.1%, without it 1 / 0.7 - 1 = 42.9%;
    judged in sample it would read 0% and 25%."""
    ho = _benchmark("held_out")
    rows = [ho.Residual("s", 0.0, {"g": 1.0}, {"t": 0.2, "u": 0.1})]
    ho.print_term_effects("m", rows, [ho.Term("t", ("o",), "x"), ho.Term("u", ("s",), "x")])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("t "))
    assert line.split()[3:5] == ["11.1%", "42.9%"], line


def test_a_stacks_shared_bias_is_estimated_between_sources() -> None:
    """benchmarks/held_out.py between_source_sd: rows of one source share their stack's bias;
    with sources whose biases spread by 0.1 and rows by 0.03 around them, the within sd is the
    rows' and the between-source sd the biases' (times t/z for the few sources); sources with
    no bias of their own give none."""
    ho = _benchmark("held_out")
    rng = __import__("random").Random(1)
    biased, unbiased = [], []
    for s in range(12):
        b = rng.gauss(0.0, 0.1)
        biased += [ho.Residual(str(s), b + rng.gauss(0.0, 0.03), {"g": 1.0}) for _ in range(20)]
        unbiased += [ho.Residual(str(s), rng.gauss(0.0, 0.03), {"g": 1.0}) for _ in range(20)]
    fit = ho.fit_sigmas(biased, [], {"g": 0.01}, between=True)
    assert fit["g"] == pytest.approx(0.03, rel=0.25)
    assert fit[ho.STACK] == pytest.approx(0.1, rel=0.4)
    assert ho.fit_sigmas(biased, [], {"g": 0.01})["g"] > 2 * fit["g"]  # pooled: bias as noise
    assert ho.fit_sigmas(unbiased, [], {"g": 0.01}, between=True)[ho.STACK] < 0.02
    assert ho.band_sigma({"g": 1.0}, fit) == pytest.approx(math.hypot(fit["g"], fit[ho.STACK]))


def test_a_known_oom_is_censored_in_the_fit() -> None:
    """A known OOM says the peak was at least the GPU's memory: its bound pulls the sd up."""
    ho = _benchmark("held_out")
    ok = [ho.Residual("a", e, {"g": 1.0}) for e in (0.01, -0.01, 0.02, -0.02)]
    oom = [ho.Residual("b", 0.3, {"g": 1.0}, censored=True)]
    assert ho.fit_sigmas(ok + oom, [], {"g": 0.01})["g"] > ho.fit_sigmas(ok, [], {"g": 0.01})["g"]


@pytest.fixture(scope="module")
def memory_results() -> tuple[Any, list[Any]]:
    bench = _benchmark()
    with CSV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    results = []
    for row in rows:
        if bench._unmodelled(row):
            continue
        try:
            results.append(bench.predict(row, 0.92))
        except bench.Skip:
            continue
    return bench, results


def test_the_catalogs_memory_sds_are_the_held_out_fit(
    memory_results: tuple[Any, list[Any]],
) -> None:
    """tuner.models.uncertainty.CATALOG_MEMORY_SIGMA is what memory_accuracy fits on every
    source's held-out residuals, and that band holds >= 90% of the held-out rows (each source's
    band fitted without it): a change to the model or the data that moves it must restate it."""
    from tuner.models.uncertainty import CATALOG_MEMORY_SIGMA, MEMORY_SIGMA_FLOORS

    bench, results = memory_results
    ho = _benchmark("held_out")
    terms = ho.load_terms(DATA / "memory_terms.csv")
    fit = [r for r in results if r.row["outcome"] == "ok"]
    rows = [bench.residual(r) for r in results]
    every = ho.fit_sigmas(rows, terms, MEMORY_SIGMA_FLOORS)
    for group, sd in every.items():
        assert CATALOG_MEMORY_SIGMA[group] == pytest.approx(sd, rel=0.05), group
    figures = ho.loso(rows, terms, MEMORY_SIGMA_FLOORS)
    assert sum(f.inside for f in figures) / sum(f.n for f in figures) >= 0.9
    assert sum(f.n for f in figures) == len(fit)


def test_the_issues_oom_that_passes_the_fit_check_is_flagged_at_risk(
    memory_results: tuple[Any, list[Any]],
) -> None:
    """BLOOM-prequel h14336 L82, tp4 pp12 dp8 mbs2 ran out of memory on an 80 GB A100; the model
    predicts about 60 GiB, within the 92% headroom: with the held-out sd it is at risk, not a
    sure fit. Every known OOM is pruned or flagged."""
    _, results = memory_results
    ooms = [r for r in results if r.row["outcome"] == "oom"]
    case = next(r for r in ooms if r.row["model"] == "BLOOM-prequel h14336 L82 a128")
    assert case.fits and 55 < case.predicted / 2**30 < 65
    assert case.risk
    assert all(not r.fits or r.risk for r in ooms)


def _time_rows() -> tuple[ModuleType, list[Any], Any]:
    """The held-out module, every step-time row's residual against the catalog and the terms
    each row's shares are split into (what time_accuracy fits its sds on)."""
    bench = _benchmark("time_accuracy")
    ho = _benchmark("held_out")
    cases, _ = bench.load_cases(DATA / "step_times.csv")
    return ho, [bench.residual(c) for c in cases], ho.load_terms(DATA / "time_terms.csv")


def test_the_catalogs_time_sds_are_the_held_out_fit() -> None:
    """CATALOG_TIME_SIGMA (within a stack) and CATALOG_TIME_STACK_SIGMA (a stack's own bias) are
    what time_accuracy fits on every source's held-out residuals, and that band holds >= 90% of
    the rows as stated."""
    from tuner.models.uncertainty import (
        CATALOG_TIME_SIGMA,
        CATALOG_TIME_STACK_SIGMA,
        TIME_SIGMA_FLOORS,
    )

    ho, rows, terms = _time_rows()
    every = ho.fit_sigmas(rows, terms, TIME_SIGMA_FLOORS, between=True)
    assert every.pop(ho.STACK) == pytest.approx(CATALOG_TIME_STACK_SIGMA, rel=0.05)
    for group, sd in every.items():
        assert CATALOG_TIME_SIGMA[group] == pytest.approx(sd, rel=0.05), group
    figures = ho.loso(rows, terms, TIME_SIGMA_FLOORS, between=True)
    # the band as stated (these sds) on every held-out row
    stated = CATALOG_TIME_SIGMA | {ho.STACK: CATALOG_TIME_STACK_SIGMA}
    inside = [abs(ho.held_out(r, terms)) <= Z_BAND * ho.band_sigma(r.shares, stated)
              for r in rows]  # fmt: skip
    assert sum(inside) / len(inside) >= 0.9
    assert sum(f.n for f in figures) == len(rows)


def test_the_time_band_fitted_on_other_sources_holds_90_percent_of_each() -> None:
    """Each source's rows against the band fitted without it (a stack never seen): with a
    between-source sd for a stack's own bias, >= 90% of the held-out rows are inside, and
    BigScience's stack, 15% slow on every row, is covered better than without it."""
    from tuner.models.uncertainty import TIME_SIGMA_FLOORS

    ho, rows, terms = _time_rows()
    figures = ho.loso(rows, terms, TIME_SIGMA_FLOORS, between=True)
    assert sum(f.inside for f in figures) / sum(f.n for f in figures) >= 0.9
    plain = {f.source: f for f in ho.loso(rows, terms, TIME_SIGMA_FLOORS)}
    assert {f.source: f for f in figures}["[B]"].coverage > plain["[B]"].coverage


def test_every_term_names_its_sources_and_evidence() -> None:
    """benchmarks/data/{memory,time}_terms.csv: each term's development sources are sources of
    its data set (or none), and its evidence names the commit that introduced it."""
    ho = _benchmark("held_out")
    with CSV.open(newline="") as fh:
        memory_sources = {r["source"] for r in csv.DictReader(fh)}
    time_sources = {"[B]", "[D]", "[E]", "[G]", "[K]", "[L]", "[M]", "[N]", "[T]", "[X]"}
    for name, known in (("memory_terms.csv", memory_sources), ("time_terms.csv", time_sources)):
        for term in ho.load_terms(DATA / name):
            assert set(term.developed_on) <= known, (name, term.name)
            assert re.match(r"[0-9a-f]{7} \(", term.evidence), (name, term.name)


def test_held_out_sources_are_in_the_set_and_say_what_was_developed_on_them(
    rows: list[dict[str, str]],
) -> None:
    """memory_accuracy.HELD_OUT_SOURCES (sources added after every term, issue 35) each have
    measured rows and are marked held out in the data README. A term developed on one of them
    since is named on that source's line of the benchmark (its figures there are in sample for
    that term; its leave-one-source-out row leaves it out), and the data README says so; at
    least one held-out source develops no term, so some figures still say how the model does
    on a stack never seen."""
    bench, ho = _benchmark(), _benchmark("held_out")
    readme = (DATA / "README.md").read_text()
    sources = {r["source"] for r in rows}
    terms = ho.load_terms(DATA / "memory_terms.csv")
    assert len(bench.HELD_OUT_SOURCES) >= 2
    untouched = 0
    for source in bench.HELD_OUT_SOURCES:
        assert source in sources, source
        entry = re.search(rf"\| `{re.escape(source)}` \| \*\*Held out\*\*[^|]*", readme)
        assert entry, source
        used = [t.name for t in terms if source in t.developed_on]
        note = bench.held_out_note(source)
        for name in used:
            assert name in note and f"`{name}`" in entry.group(0), (source, name)
        untouched += not used
        assert note == "never used to develop a term" or used
    assert untouched >= 1
    # the stacks the held-out sources add: nvidia-smi device figures and an fp16 Megatron-LM run
    # of the legacy model on A800s beside the calibration set's
    held = [r for r in rows if r["source"] in bench.HELD_OUT_SOURCES]
    assert {r["metric"] for r in held} == METRICS
    assert any(r["framework"] == "megatron" and r["precision"] == "fp16" for r in held)


def test_the_fsdp2_page_states_what_the_fsdp2_benchmark_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/torchtitan.md's accuracy table is ``benchmarks/fsdp2_accuracy.py``'s summary, source
    by source in its order: the torchtitan model's median and max error and the baseline's
    (the rows predicted as DeepSpeed ZeRO-3, before the framework). The page's last column was
    another baseline (the torchtitan model's earlier figures) under the name "previous model"."""
    bench = _benchmark("fsdp2_accuracy")
    bench.memory_table()
    bench.time_table()
    printed = re.findall(r"^  (.+?) \((torchtitan|as DeepSpeed ZeRO-3, before)\)\s+\d+\s+"
                         r"([\d.]+)%\s+([\d.]+)%$", capsys.readouterr().out, re.M)  # fmt: skip
    model = [(m, x) for _, who, m, x in printed if who == "torchtitan"]
    before = [(m, x) for _, who, m, x in printed if who != "torchtitan"]
    assert len(model) == len(before) == 6  # memory; H100 eager, compile, float8, CP; A100
    page = (DATA.parents[1] / "docs" / "torchtitan.md").read_text()
    head = "| source | metric | rows | median error | max error | as DeepSpeed ZeRO-3, before"
    table = page[page.index(head) :].split("\n\n")[0].splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in table]
    assert [(c[3].rstrip("%"), c[4].rstrip("%")) for c in cells] == model
    assert [tuple(v.strip().rstrip("%") for v in c[5].split("/")) for c in cells] == before
