"""A measured cluster profile as the time model's rates, and the study that ranks with them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from tuner.config.parallel import ParallelConfig
from tuner.layout import ClusterLayout
from tuner.models.rates import Rates, catalog_rates
from tuner.models.time.estimate import estimate_time
from tuner.models.uncertainty import CATALOG_STEP_SIGMA
from tuner.profile.rates import attention_table, rates_from_profile, study_rates
from tuner.profile.run import (
    AttentionSample,
    ClusterProfile,
    CollectiveSample,
    GemmSample,
    LaunchSample,
    StreamSample,
    save_profile,
)
from tuner.space.enumerate import enumerate_space, study_gpu
from tuner.spec.file import study_from_mapping

SPEC_DATA = {
    "name": "measured",
    "model": {"preset": "llama2-7b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "executor": "ssh",
                "nodes": ["n0", "n1"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
    "space": {"tp": [1, 2, 4, 8], "micro_batch_size": [1, 2], "sequence_parallel": [True],
              "distributed_optimizer": [True]},
}  # fmt: skip
SPEC = study_from_mapping(SPEC_DATA)
CONFIG = ParallelConfig(tp=2, dp=8, micro_batch_size=2, global_batch_size=64,
                        sequence_parallel=True, distributed_optimizer=True)  # fmt: skip


def all_reduce(link: str, size: int, busbw_gbps: float, alpha_s: float) -> list[CollectiveSample]:
    """Samples that follow time = alpha + bus bytes / busbw exactly, at three message sizes."""
    out = []
    for nbytes in (1 << 20, 1 << 24, 1 << 28):
        bus = nbytes * 2 * (size - 1) / size
        t = alpha_s + bus / (busbw_gbps * 1e9)
        out.append(CollectiveSample(op="all_reduce", link=link, group_size=size,
                                    ranks=tuple(range(size)), bytes=nbytes, samples_s=(t,),
                                    median_s=t, busbw_gbps=bus / t / 1e9))  # fmt: skip
    return out


def profile(
    gemm_tflops: float, created: str | None = None, stream_gbps: float | None = None
) -> ClusterProfile:
    gemm = tuple(
        GemmSample(
            label=f"g{m}", m=m, k=4096, n=4096, samples_s=(1.0,), median_s=1.0, tflops=gemm_tflops
        )  # fmt: skip
        for m in (1024, 4096, 16384)
    )
    return ClusterProfile(
        cluster=SPEC.cluster_name, gpu="a100-80gb",
        created=created or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        versions={}, hosts=2, world_size=16, dtype="bf16", gemm=gemm,
        collectives=tuple(all_reduce("intra", 8, 150.0, 20e-6)
                          + all_reduce("inter", 16, 80.0, 60e-6)),
        stream=None if stream_gbps is None else StreamSample(
            bytes=3 << 28, samples_s=(1.0,), median_s=(3 << 28) / stream_gbps / 1e9,
            gbps=stream_gbps),
    )  # fmt: skip


def test_measured_gemms_and_links_replace_the_catalogs() -> None:
    gpu = study_gpu(SPEC)
    base = catalog_rates(gpu, "bf16")
    rates = rates_from_profile(profile(100.0), gpu, "bf16")
    assert {s[3] for s in rates.gemm_samples} == {100e12}
    assert rates.intra.bandwidth == pytest.approx(150e9, rel=1e-6)
    assert rates.intra.latency == pytest.approx(20e-6, rel=1e-3)
    assert rates.inter.bandwidth == pytest.approx(80e9 / 8, rel=1e-6)  # per GPU: 8 ranks a node
    assert rates.hbm == base.hbm  # not measured: the catalog's
    assert rates.attention == base.attention


def test_a_profile_on_more_nodes_than_its_largest_group_divides_by_the_groups_ranks_a_node() -> (
    None
):
    """``tune profile`` places a group larger than a node on consecutive ranks: on a 6-node
    profile a 16-rank group holds 8 ranks on each of 2 nodes, and its bus bandwidth is those 8
    GPUs' shares (it read 16 // 6 = 2 ranks a node: each GPU's share 4x too high). A group of
    one rank per node (ranks 0, 8, 16, 24) is one GPU's share."""
    gpu = study_gpu(SPEC)
    six = dataclasses.replace(profile(100.0), hosts=6, world_size=48)
    assert rates_from_profile(six, gpu, "bf16").inter.bandwidth == pytest.approx(
        80e9 / 8, rel=1e-6
    )
    spread = tuple(
        dataclasses.replace(s, group_size=4, ranks=(0, 8, 16, 24))
        for s in all_reduce("inter", 4, 30.0, 60e-6)
    )
    one_each = dataclasses.replace(
        six, collectives=tuple(all_reduce("intra", 8, 150.0, 20e-6)) + spread
    )
    assert rates_from_profile(one_each, gpu, "bf16").inter.bandwidth == pytest.approx(
        30e9, rel=1e-6
    )


def test_a_measured_all_to_all_is_its_own_link_and_the_all_reduces_otherwise() -> None:
    """The EP dispatch's all-to-all is priced at the profile's own all-to-all fit where it has
    one (gloo's all-to-all of small messages is one exchange with each peer, its all-reduce
    several steps), at the all-reduce's link where it has none."""
    gpu = study_gpu(SPEC)
    plain = profile(100.0)
    assert rates_from_profile(plain, gpu, "bf16").all_to_all is None
    a2a = [dataclasses.replace(s, op="all_to_all", median_s=s.median_s / 2 + 5e-6)
           for s in all_reduce("intra", 8, 150.0, 10e-6)]  # fmt: skip
    rows = tuple(dataclasses.replace(s, busbw_gbps=s.bytes * 7 / 8 / s.median_s / 1e9)
                 for s in a2a)  # fmt: skip
    rates = rates_from_profile(dataclasses.replace(plain, collectives=plain.collectives + rows),
                               gpu, "bf16")  # fmt: skip
    assert rates.all_to_all is not None and rates.intra.latency == pytest.approx(20e-6, rel=1e-3)
    assert rates.all_to_all.latency == pytest.approx(10e-6, rel=1e-3)


def test_measured_memory_streaming_replaces_the_datasheet_bandwidth() -> None:
    gpu = study_gpu(SPEC)
    base = catalog_rates(gpu, "bf16")
    assert rates_from_profile(profile(200.0, stream_gbps=1500.0), gpu, "bf16").hbm == 1500e9
    assert base.hbm != 1500e9  # the catalog's is the datasheet's times HBM_EFFICIENCY

    def step(gbps: float) -> tuple[float, float]:
        rates = rates_from_profile(profile(200.0, stream_gbps=gbps), gpu, "bf16")
        t = estimate_time(SPEC.model, SPEC.training, CONFIG, gpu, 8, "megatron", rates)
        return t.step, t.compute

    (slow, slow_compute), (fast, fast_compute) = step(500.0), step(2000.0)
    # the element-wise kernels (norms, residual adds, dropouts, softmax, the loss) stream memory:
    # a slower memory makes the step slower, and only through them
    assert slow > fast and slow_compute > fast_compute


def attention(seq: int, fwd: float, bwd: float, batch: int = 1) -> AttentionSample:
    return AttentionSample(label=f"a{seq}x{batch}", batch=batch, heads=16, seq=seq, head_dim=128,
                           backend="default", forward_samples_s=(1.0,),
                           forward_backward_samples_s=(2.0,), forward_s=1.0, backward_s=1.0,
                           forward_tflops=fwd, backward_tflops=bwd)  # fmt: skip


def test_the_measured_launch_cost_replaces_the_catalogs_kernel_latency() -> None:
    gpu = study_gpu(SPEC)
    base = catalog_rates(gpu, "bf16")

    def rates(per_op_s: float) -> Rates:
        launch = LaunchSample(ops=1000, samples_s=(per_op_s * 1000,), median_s=per_op_s * 1000,
                              per_op_s=per_op_s)  # fmt: skip
        return rates_from_profile(dataclasses.replace(profile(200.0), launch=launch), gpu, "bf16")

    assert rates(9e-6).op_latency == 9e-6 and base.op_latency != 9e-6
    assert rates_from_profile(profile(200.0), gpu, "bf16").op_latency == base.op_latency

    def step(r: Rates) -> float:
        return estimate_time(SPEC.model, SPEC.training, CONFIG, gpu, 8, "megatron", r).step

    assert step(rates(50e-6)) > step(rates(5e-6))  # every kernel pays it


def test_measured_attention_replaces_the_catalogs_efficiency() -> None:
    gpu = study_gpu(SPEC)
    samples = (attention(4096, 150.0, 120.0), attention(4096, 170.0, 140.0, batch=2),
               attention(4096, 160.0, 100.0, batch=4), attention(1024, 90.0, 80.0))  # fmt: skip
    slow = dataclasses.replace(profile(200.0), attention=samples)
    # one row per call length, ascending, the median of the shapes measured at it
    assert attention_table(slow) == ((1024.0, 90e12, 80e12), (4096.0, 160e12, 120e12))
    assert rates_from_profile(slow, gpu, "bf16").attention == attention_table(slow)
    assert rates_from_profile(profile(200.0), gpu, "bf16").attention == (
        catalog_rates(gpu, "bf16").attention  # nothing measured: the catalog's
    )
    fast = dataclasses.replace(slow, attention=tuple(
        dataclasses.replace(a, forward_tflops=2 * a.forward_tflops,
                            backward_tflops=2 * a.backward_tflops) for a in samples))  # fmt: skip

    def attention_time(p: ClusterProfile) -> float:
        t = estimate_time(SPEC.model, SPEC.training, CONFIG, gpu, 8, "megatron",
                          rates_from_profile(p, gpu, "bf16"))  # fmt: skip
        return t.compute

    assert attention_time(slow) > attention_time(fast)


def test_a_slower_cluster_predicts_slower_steps() -> None:
    gpu = study_gpu(SPEC)

    def step(tflops: float) -> float:
        rates = rates_from_profile(profile(tflops), gpu, "bf16")
        return estimate_time(SPEC.model, SPEC.training, CONFIG, gpu, 8, "megatron", rates).step

    catalog = estimate_time(SPEC.model, SPEC.training, CONFIG, gpu, 8, "megatron").step
    assert step(100.0) > catalog > step(300.0)
    assert step(100.0) / step(200.0) > 1.5  # the compute-bound step scales with the GEMM rate


def test_the_study_ranks_with_its_saved_profile(tmp_path: Path) -> None:
    assert study_rates(SPEC, tmp_path) is None  # none saved: the catalog
    save_profile(profile(100.0), ClusterLayout(tmp_path, SPEC.cluster_name).profile_yaml)
    rates = study_rates(SPEC, tmp_path)
    assert rates is not None and rates is study_rates(SPEC, tmp_path)  # one object per profile
    slow = enumerate_space(SPEC, rates=rates).ranked()[0]
    fast = enumerate_space(SPEC).ranked()[0]
    assert slow.time is not None and fast.time is not None
    assert slow.time.step > fast.time.step


def test_the_dry_run_ranks_with_the_profile_the_run_would_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune run --dry-run`` shows what the run starts from: the saved profile's rates, as
    ``tune space`` and the loop use (it ranked with the catalog's)."""
    import json

    import yaml

    from tuner.cli.main import main

    study = tmp_path / "measured.yaml"
    study.write_text(yaml.safe_dump(SPEC_DATA))
    results = str(tmp_path / "results")
    save_profile(profile(100.0), ClusterLayout(Path(results), SPEC.cluster_name).profile_yaml)

    def first_step(*command: str) -> float:
        assert main([*command, "--study", str(study), "--json", "--results", results]) == 0
        out = json.loads(capsys.readouterr().out)
        return float((out.get("launch_first") or out["top"])[0]["step_s"])

    rates = study_rates(SPEC, results)
    assert rates is not None
    measured = enumerate_space(SPEC, rates=rates).ranked()[0].time
    assert measured is not None
    dry = first_step("run", "--dry-run")
    assert dry == pytest.approx(first_step("space", "--top", "1"), rel=1e-9)
    assert dry == pytest.approx(measured.step, rel=1e-6)
    catalog = enumerate_space(SPEC).ranked()[0].time
    assert catalog is not None and dry > catalog.step * 1.2  # the slow profile, not the catalog


def test_a_stale_profile_is_refused_in_one_line(tmp_path: Path) -> None:
    from tuner.profile.run import ProfileError

    old = (dt.datetime.now(dt.UTC) - dt.timedelta(days=400)).isoformat(timespec="seconds")
    save_profile(
        profile(100.0, created=old), ClusterLayout(tmp_path, SPEC.cluster_name).profile_yaml
    )
    with pytest.raises(ProfileError) as info:
        study_rates(SPEC, tmp_path)
    assert "\n" not in str(info.value)


def test_estimate_and_space_say_which_rates_they_used(tmp_path: Path) -> None:
    from tuner.cli.profile import time_source

    rates, said = time_source(SPEC, str(tmp_path))
    assert rates is None and said.startswith("catalog") and "tune profile" in said
    assert "measured matmul ceiling" in said  # the A100's MAMF figure (tuner.models.rates)
    # the held-out figure (a stack never seen), not the in-sample rms of the published runs
    assert f"off by {CATALOG_STEP_SIGMA:.0%} sd on a stack never seen" in said
    cpu = dataclasses.replace(SPEC, cluster=dataclasses.replace(SPEC.cluster, gpu="cpu"))
    assert "ceiling" not in time_source(cpu, str(tmp_path))[1]  # no measurement: datasheet only
    save_profile(profile(100.0), ClusterLayout(tmp_path, SPEC.cluster_name).profile_yaml)
    rates, said = time_source(SPEC, str(tmp_path))
    assert rates is not None and said.startswith(f"cluster profile {SPEC.cluster_name}")
    assert "never seen" not in said  # the catalog's error is not a profile's
    assert "HBM bandwidth" in said and "memory streaming" not in said  # before the stream probe
    assert (
        "; attention, HBM bandwidth, kernel launches and framework overheads from the catalog"
        in (said)
    )
    save_profile(profile(100.0, stream_gbps=1500.0),
                 ClusterLayout(tmp_path, SPEC.cluster_name).profile_yaml)  # fmt: skip
    said = time_source(SPEC, str(tmp_path))[1]
    assert "memory streaming" in said and "HBM" not in said
    with_attention = dataclasses.replace(profile(100.0, stream_gbps=1500.0),
                                         attention=(attention(4096, 150.0, 120.0),))  # fmt: skip
    save_profile(with_attention, ClusterLayout(tmp_path, SPEC.cluster_name).profile_yaml)
    said = time_source(SPEC, str(tmp_path))[1]
    assert said.endswith(
        "GEMMs by shape, all-reduce latency and bandwidth, fused attention by call length, "
        "memory streaming; kernel launches and framework overheads from the catalog"
    )
    launch = LaunchSample(ops=10, samples_s=(1e-4,), median_s=1e-4, per_op_s=1e-5)
    save_profile(dataclasses.replace(with_attention, launch=launch),
                 ClusterLayout(tmp_path, SPEC.cluster_name).profile_yaml)  # fmt: skip
    said = time_source(SPEC, str(tmp_path))[1]
    assert said.endswith("memory streaming, kernel launches; framework overheads from the catalog")
