"""``tune profile``: the real probe (local gloo ranks and loopback SSH nodes), the
saved profile's round trip and the refusal of stale and foreign profiles."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import test_stack_probe as stack_probe
from tests.procs import live_processes
from tuner.cli.main import main
from tuner.layout import ClusterLayout
from tuner.profile.job import attention, bus_factor
from tuner.profile.plan import CPU_STREAM_BYTES, LAUNCH_OPS, attention_shapes, gemm_shapes
from tuner.profile.probe_logs import AGAIN, POINT
from tuner.profile.run import (
    MAX_AGE_DAYS,
    AttentionSample,
    ClusterProfile,
    CollectiveSample,
    GemmSample,
    LaunchSample,
    ProfileError,
    StreamSample,
    check_profile,
    load_profile,
    local_versions,
    save_profile,
    study_profile,
    summary_rows,
)
from tuner.profile.stack_terms import study_terms
from tuner.spec.file import study_from_mapping
from tuner.spec.study import StudySpec

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tools/ is not part of the installed package
    sys.path.insert(0, str(REPO))

from tools.loopback_sshd import LoopbackCluster, sshd_missing_reason  # noqa: E402

CPU_STUDY: dict[str, Any] = {
    "name": "prof",
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "ffn_hidden_size": 256, "seq_length": 32, "vocab_size": 128},
    "training": {"global_batch_size": 4, "precision": "fp32"},
    "cluster": {"gpu": "cpu", "gpus_per_node": 2, "num_nodes": 1, "executor": "local"},
    "framework": "deepspeed",
    "launch": {"template": "deepspeed_gpt", "python": sys.executable, "master_port": 29731},
    "space": {"pp": [1, 2], "micro_batch_size": [1, 2]},
}  # fmt: skip
QUICK = ["--warmup", "1", "--repeats", "2", "--message-bytes", "4096,65536", "--quiet"]


def study(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(CPU_STUDY)
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return data


def write(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def probe_processes(root: Path) -> list[str]:
    """Live processes of a profile job under ``root`` (they run in its probe directory)."""
    return live_processes(lambda p: p.cwd.startswith(str(root)) or str(root) in p.cmdline)


# ----------------------------------------------------------------------------- the probe


def test_bus_bandwidth_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bus_factor("send_recv", 2) == 1.0


def test_the_probe_counts_attention_flops_as_the_time_model_does() -> None:
    """The probe imports no tuner module, so it carries its own copy of the backward ratio."""
    from tuner.models import rates
    from tuner.profile import job as profile_job

    assert profile_job.FLASH_BACKWARD_RATIO == rates.FLASH_BACKWARD_RATIO


@pytest.mark.torch
def test_attention_runs_the_default_kernels_where_cudnn_cannot() -> None:
    """The plan asks for cuDNN's attention under Megatron on Hopper; a device where it cannot run
    (here a CPU: torch raises "No viable backend") measures the default kernels and says so."""
    torch = pytest.importorskip("torch")
    shape = {"label": "a", "batch": 1, "heads": 2, "seq": 16, "head_dim": 8}
    row = attention(shape, torch.float32, torch.device("cpu"), "cudnn", 1, 2)
    assert row is not None and row["backend"] == "default" and len(row["forward_samples_s"]) == 2
    assert row["forward_tflops"] > 0 and row["backward_tflops"] > 0


@pytest.mark.torch
def test_an_attention_shape_that_does_not_fit_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    import tuner.profile.job as job

    def too_big(*args: Any) -> dict[str, Any]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")

    monkeypatch.setattr(job, "_attention", too_big)
    shape = {"label": "a", "batch": 64, "heads": 64, "seq": 32768, "head_dim": 128}
    assert job.attention(shape, torch.float32, torch.device("cpu"), "cudnn", 1, 2) is None


# ----------------------------------------------------------------------------- files


def a_profile(**changes: Any) -> ClusterProfile:
    base = ClusterProfile(
        cluster="c", gpu="h100-sxm-80gb", created="2026-01-01T00:00:00+00:00",
        versions={"torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3", "driver": "570.1",
                  "backend": "nccl", "gpu_name": "NVIDIA H100 80GB HBM3"},
        hosts=2, world_size=16, dtype="bfloat16",
        gemm=(GemmSample(label="qkv", m=4096, k=4096, n=12288, samples_s=(1e-3, 1.1e-3),
                         median_s=1.05e-3, tflops=393.0),),
        collectives=tuple(
            CollectiveSample(op="all_reduce", link="inter", group_size=16,
                             ranks=tuple(range(16)), bytes=b, samples_s=(t,), median_s=t,
                             busbw_gbps=b * 2 * 15 / 16 / t / 1e9)
            for b, t in ((1 << 20, 1e-4), (1 << 24, 5e-4), (1 << 28, 6.5e-3))
        ),
        stream=StreamSample(bytes=3 << 28, samples_s=(3.1e-4, 3.0e-4), median_s=3.05e-4,
                            gbps=(3 << 28) / 3.05e-4 / 1e9),
        launch=LaunchSample(ops=1000, samples_s=(6.1e-3, 6.0e-3), median_s=6.05e-3,
                            per_op_s=6.05e-6),
        attention=(AttentionSample(label="attention mbs=1 tp=8 cp=1", batch=1, heads=8,
                                   seq=4096, head_dim=128, backend="cudnn",
                                   forward_samples_s=(1.1e-3,), forward_backward_samples_s=(4e-3,),
                                   forward_s=1.1e-3, backward_s=2.9e-3, forward_tflops=250.0,
                                   backward_tflops=237.0),),
        tool={"warmup": 3, "repeats": 10},
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_profile_round_trips(tmp_path: Path) -> None:
    profile = a_profile()
    path = tmp_path / "clusters" / "c.yaml"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert "alpha_beta" in yaml.safe_load(path.read_text())  # written for readers
    assert load_profile(path).stream is not None and load_profile(path).attention


def test_a_profile_saved_before_the_stream_attention_and_launch_probes_still_loads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "clusters" / "c.yaml"
    save_profile(a_profile(), path)
    data = yaml.safe_load(path.read_text())
    del data["stream"], data["attention"], data["launch"]  # written before those probes
    path.write_text(yaml.safe_dump(data))
    assert load_profile(path) == a_profile(stream=None, attention=(), launch=None)


def test_alpha_beta_fit_recovers_latency_and_bandwidth() -> None:
    alpha, bw = 20e-6, 100e9  # t = alpha + busbytes / bw
    rows = []
    for b in (1 << 16, 1 << 20, 1 << 24, 1 << 28):
        bus = b * 2 * 7 / 8
        t = alpha + bus / bw
        rows.append(CollectiveSample(op="all_reduce", link="intra", group_size=8,
                                     ranks=tuple(range(8)), bytes=b, samples_s=(t,),
                                     median_s=t, busbw_gbps=bus / t / 1e9))  # fmt: skip
    (fit,) = a_profile(collectives=tuple(rows)).alpha_beta()
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.busbw_gbps == pytest.approx(bw / 1e9, rel=1e-6)


def test_a_size_whose_median_a_busy_cpu_delayed_does_not_set_the_latency() -> None:
    """Gloo's two-rank all-to-all on this project's loaded 2-core machine (load 5, repeats 5):
    at 4 KiB and 1 MiB three of five repeats waited 2-5 ms for a CPU, so those sizes' medians
    are 3.06 and 3.67 ms while the others lie on a line of about 0.2 ms and 1.5 GB/s. Least
    squares put the latency at 1.36 ms (seven all-to-alls of 0.2 ms each); the robust line
    keeps it and the large message's time."""
    measured = ((1 << 12, 3.060e-3), (1 << 14, 0.157e-3), (1 << 16, 0.228e-3),
                (1 << 18, 0.328e-3), (1 << 20, 3.672e-3), (1 << 22, 1.552e-3))  # fmt: skip
    rows = tuple(CollectiveSample(op="all_to_all", link="intra", group_size=2, ranks=(0, 1),
                                  bytes=b, samples_s=(t,), median_s=t, busbw_gbps=b / 2 / t / 1e9)
                 for b, t in measured)  # fmt: skip
    (fit,) = a_profile(collectives=rows).alpha_beta()
    assert 0.15e-3 < fit.alpha_s < 0.25e-3
    for b, t in (measured[2], measured[5]):
        assert fit.alpha_s + b / 2 / (fit.busbw_gbps * 1e9) == pytest.approx(t, rel=0.1)


def test_a_latency_the_fit_does_not_resolve_is_not_printed_as_a_measured_nil() -> None:
    """Message sizes whose line meets nil time below nil bytes (small messages faster than the
    line through the large ones: noise or a protocol switch) clip the latency at nil: the
    summary says the latency is unresolved instead of printing "0.0 us"."""

    def sample(b: int, t: float) -> CollectiveSample:
        return CollectiveSample(op="all_gather", link="intra", group_size=2, ranks=(0, 1),
                                bytes=b, samples_s=(t,), median_s=t,
                                busbw_gbps=b / t / 1e9)  # fmt: skip

    clipped = (sample(1 << 12, 1e-6), sample(1 << 24, 10e-3), sample(1 << 26, 70e-3))
    resolved = (sample(1 << 12, 300e-6), sample(1 << 24, 20e-3), sample(1 << 26, 70e-3))
    lines = {p: dict(summary_rows(a_profile(collectives=p))) for p in (clipped, resolved)}
    assert a_profile(collectives=clipped).alpha_beta()[0].alpha_s == 0.0
    assert lines[clipped]["all_gather intra n=2"].endswith("unresolved latency")
    assert "0.0 us" not in lines[clipped]["all_gather intra n=2"]
    assert lines[resolved]["all_gather intra n=2"].endswith(" us latency")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(extra=1), r"not a cluster profile \(unknown keys \['extra'\]\)"),
        (
            lambda d: d["gemm"][0].pop("tflops"),
            r"malformed cluster profile: gemm\[0\]\.tflops is missing",
        ),
        (
            lambda d: d["stream"].update(samples_s=["fast"]),
            r"malformed cluster profile: stream\.samples_s is not tuple\[float, \.\.\.\]",
        ),
        (
            lambda d: d["attention"][0].update(seq="long"),
            r"malformed cluster profile: attention\[0\]\.seq is not int: 'long'",
        ),
        (lambda d: d.update(launch=[1, 2]), "malformed cluster profile: launch is not a mapping"),
        (lambda d: d.pop("gpu"), "malformed cluster profile: gpu is missing"),
        (lambda d: d.update(hosts="two"), "malformed cluster profile: hosts is not int: 'two'"),
        (
            lambda d: d.update(collectives={"a": 1}),
            "malformed cluster profile: collectives is not a list",
        ),
    ],
)
def test_a_malformed_profile_is_one_line_naming_the_file(
    tmp_path: Path, edit: Any, message: str
) -> None:
    path = tmp_path / "clusters" / "c.yaml"
    save_profile(a_profile(), path)
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_large_messages_need_large_samples() -> None:
    """Gloo's two-rank all-reduce on this project's 2-core machine (4 KiB ... 64 MiB, measured
    with torch.distributed): its bandwidth keeps rising past 1 MiB, so a fit over the old CPU
    ladder (4 KiB ... 1 MiB) puts a 16 MiB bucket at 2.47x its time; with the ladder reaching the
    study's bucket (tuner.profile.plan.message_sizes) the large messages are within 10%."""
    measured = ((1 << 12, 0.914e-3), (1 << 16, 1.638e-3), (1 << 20, 4.026e-3),
                (1 << 22, 6.975e-3), (1 << 24, 19.06e-3), (1 << 26, 72.0e-3))  # fmt: skip
    rows = tuple(CollectiveSample(op="all_reduce", link="intra", group_size=2, ranks=(0, 1),
                                  bytes=b, samples_s=(t,), median_s=t, busbw_gbps=b / t / 1e9)
                 for b, t in measured)  # fmt: skip

    def predict(fitted: tuple[CollectiveSample, ...], nbytes: int) -> float:
        (fit,) = a_profile(collectives=fitted).alpha_beta()
        return fit.alpha_s + nbytes / (fit.busbw_gbps * 1e9)

    assert predict(rows[:3], 1 << 24) / 19.06e-3 > 2.4
    for b, t in measured[-2:]:
        assert abs(predict(rows, b) / t - 1) < 0.1


def gpu_spec() -> StudySpec:
    data = study(cluster={"name": "c", "gpu": "h100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 2})
    data["training"]["precision"] = "bf16"
    return study_from_mapping(data)


def test_a_foreign_profile_is_refused() -> None:
    spec = gpu_spec()
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    assert check_profile(a_profile(), spec, now=now) is not None
    with pytest.raises(ProfileError, match="foreign profile: measured on a100-80gb"):
        check_profile(a_profile(gpu="a100-80gb"), spec, now=now)
    with pytest.raises(
        ProfileError, match="foreign profile: its cluster is 'd', the study's is 'c'"
    ):
        check_profile(a_profile(cluster="d"), spec, now=now)


def test_a_stale_profile_is_refused() -> None:
    spec, profile = gpu_spec(), a_profile()
    late = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(days=MAX_AGE_DAYS + 1)
    with pytest.raises(ProfileError, match=f"stale profile.*more than {MAX_AGE_DAYS}"):
        check_profile(profile, spec, now=late)
    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    with pytest.raises(ProfileError, match="stale profile: measured with nccl 2.27.3.*2.28.1"):
        check_profile(profile, spec, now=now, versions={"nccl": "2.28.1", "torch": "2.13.0"})
    assert check_profile(profile, spec, now=now, versions={"torch": "2.13.0"}) == profile


# ----------------------------------------------------------------------------- for real


def run_profile(args: list[str]) -> int:
    return main(["profile", *args])


@pytest.mark.torch
def test_profile_runs_on_local_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch", reason="the probe runs torch.distributed (gloo)")
    path, results = write(tmp_path, study()), tmp_path / "results"
    rc = run_profile(["--study", str(path), "--results", str(results), *QUICK])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert probe_processes(tmp_path) == [], "profile processes left behind"
    spec = study_from_mapping(study())
    layout = ClusterLayout(results.resolve(), spec.cluster_name)
    profile = load_profile(layout.profile_yaml)
    assert (profile.gpu, profile.world_size, profile.hosts) == ("cpu", 2, 1)
    assert profile.versions["backend"] == "gloo" and profile.versions["torch"]
    assert dt.datetime.fromisoformat(profile.created).tzinfo is not None
    assert len(profile.gemm) == len(gemm_shapes(spec))
    assert all(g.tflops > 0 and len(g.samples_s) == 2 for g in profile.gemm)
    ops = {(c.op, c.link, c.group_size) for c in profile.collectives}
    # dp=2 (all-reduce / ZeRO's reduce-scatter + all-gather) and pp=2 (send/recv) on one node
    assert ops == {("all_reduce", "intra", 2), ("all_gather", "intra", 2),
                   ("reduce_scatter", "intra", 2), ("send_recv", "intra", 2)}  # fmt: skip
    for c in profile.collectives:
        factor = bus_factor(c.op, c.group_size)
        assert c.busbw_gbps == pytest.approx(c.bytes / c.median_s * factor / 1e9)
    assert "all_reduce intra n=2" in out.out
    # every rank streamed 3 fp32 buffers of CPU_STREAM_BYTES at once (STREAM's add)
    assert profile.stream is not None and profile.stream.gbps > 0
    assert profile.stream.bytes == 3 * CPU_STREAM_BYTES and len(profile.stream.samples_s) == 2
    assert profile.stream.gbps == pytest.approx(
        profile.stream.bytes / profile.stream.median_s / 1e9
    )
    assert "memory stream (add, 3 x 64 MiB)" in out.out
    # causal SDPA on each (mbs, heads / tp, seq / cp): forward, and forward + backward
    shapes = attention_shapes(spec)
    assert [(a.batch, a.heads, a.seq) for a in profile.attention] == [
        (s["batch"], s["heads"], s["seq"]) for s in shapes
    ] and len(shapes) == 2  # micro-batch 1 and 2
    for a in profile.attention:
        assert a.backend == "default" and a.forward_tflops > 0 and a.backward_tflops > 0
        flops = 0.5 * 4 * a.batch * a.seq**2 * a.heads * a.head_dim
        assert a.forward_tflops == pytest.approx(flops / a.forward_s / 1e12)
        assert a.backward_tflops == pytest.approx(2.5 * flops / a.backward_s / 1e12)
    assert "attention (2 shapes, causal, default)" in out.out
    # LAUNCH_OPS tiny multiplications forward, as many backward: microseconds each
    assert profile.launch is not None and profile.launch.ops == 2 * LAUNCH_OPS
    assert 0 < profile.launch.per_op_s == pytest.approx(profile.launch.median_s / (2 * LAUNCH_OPS))
    assert profile.launch.per_op_s < 1e-3
    assert f"kernel launch ({2 * LAUNCH_OPS} tiny ops, forward and backward)" in out.out
    # --show checks and prints the saved profile (in 80 columns: folded, nothing cut); a foreign
    # one is refused with exit 2
    with monkeypatch.context() as narrow:
        narrow.setenv("COLUMNS", "80")
        assert run_profile(["--study", str(path), "--results", str(results), "--show"]) == 0
    shown = capsys.readouterr().out
    assert "…" not in shown and max(len(line) for line in shown.splitlines()) <= 80
    assert "kernel launch" in shown and "us per op" in shown
    other = write(tmp_path, study(cluster={"gpu": "a100-80gb"}))
    capsys.readouterr()
    assert run_profile(["--study", str(other), "--results", str(results), "--show",
                        "--quiet"]) == 2  # fmt: skip
    # the default cluster name holds the GPU, so a foreign profile needs a shared cluster.name
    assert "no cluster profile" in capsys.readouterr().err


def test_a_stale_saved_profile_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = study(cluster={"name": "c"})  # a_profile's
    path, results = write(tmp_path, data), tmp_path / "results"
    target = ClusterLayout(results.resolve(), "c").profile_yaml
    spec = study_from_mapping(data)
    assert study_profile(spec, results) is None  # none saved: the time model uses the catalog
    fresh = a_profile(gpu="cpu", created=dt.datetime.now(dt.UTC).isoformat(),
                      versions=local_versions())  # fmt: skip
    save_profile(fresh, target)
    assert study_profile(spec, results) == fresh
    save_profile(dataclasses.replace(fresh, versions={**fresh.versions, "torch": "1.0"}), target)
    with pytest.raises(ProfileError, match="stale profile: measured with torch 1.0"):
        study_profile(spec, results)  # the local executor's own torch is compared
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=MAX_AGE_DAYS + 2)
    save_profile(a_profile(gpu="cpu", created=old.isoformat(timespec="seconds")), target)
    assert run_profile(["--study", str(path), "--results", str(results), "--show"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stale profile" in err and str(target) in err
    save_profile(a_profile(gpu="a100-80gb"), target)
    assert run_profile(["--study", str(path), "--results", str(results), "--show"]) == 2
    assert "foreign profile: measured on a100-80gb, the study's cluster.gpu is cpu" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.ssh
def test_profile_runs_on_loopback_ssh_nodes(tmp_path: Path) -> None:
    reason = sshd_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("torch", reason="the probe runs torch.distributed (gloo)")
    cluster = LoopbackCluster(tmp_path / "nodes", 2)
    data = study(
        cluster={"gpus_per_node": 1, "nodes": list(cluster.addresses), "executor": "ssh",
                 "ssh": {"config_file": str(cluster.base / "ssh_config"),
                         "known_hosts": str(cluster.base / "known_hosts")}},
        launch={"env": {"GLOO_SOCKET_IFNAME": "lo"}, "master_port": 29741},
    )  # fmt: skip
    del data["cluster"]["num_nodes"]
    path, results = write(tmp_path, data), tmp_path / "results"
    # the framework probe on the same nodes: the Megatron stand-in (tests/test_stack_probe.py)
    # at 1 and 4 layers, both 2-node points in one SSH session per node
    probe_data = stack_probe.study_data(tmp_path)
    probe_data["cluster"] = {**data["cluster"]}
    probe_data["space"]["distributed_optimizer"] = [False]
    probe_data["search"]["nodes_per_trial"] = 2
    probe_path = tmp_path / "probe.yaml"
    probe_path.write_text(yaml.safe_dump(probe_data))
    cluster.start()
    try:
        rc = run_profile(["--study", str(path), "--results", str(results), *QUICK])
        probe_rc = run_profile(["--study", str(probe_path), "--results", str(results), "--probe"])
        left = probe_processes(results)
    finally:
        survivors = cluster.stop()
    assert rc == 0 and probe_rc == 0
    probe_spec = study_from_mapping(probe_data)
    terms = study_terms(probe_spec, results)
    # the base point and the pipeline point, every one of the probe's four runs on both nodes
    assert [p.pp for p in terms.points] == [1, 2] and terms.points[0].layer_scale is not None
    job = ClusterLayout(results.resolve(), probe_spec.cluster_name).stack_probe(probe_spec.name)
    logs = [job.node_log(n).read_text() for n in (0, 1)]

    # four first runs on each node, and every run there (a point a burst of load slowed is run
    # again in the same job: tuner.profile.recheck) ended with status 0
    def framed(log: str, word: str) -> int:
        return len(re.findall(rf"^{POINT} \d+ {word}$", log, re.M))

    assert [framed(log, "start") for log in logs] == [4, 4]
    again = [framed(log, AGAIN) for log in logs]
    assert [log.count("rc=0") for log in logs] == [4 + a for a in again] and again[0] == again[1]
    assert left == [], "profile processes left on the nodes"
    assert survivors == [] and probe_processes(tmp_path) == [], "sshd left running"
    spec = study_from_mapping(data)
    profile = load_profile(ClusterLayout(results.resolve(), spec.cluster_name).profile_yaml)
    assert spec.cluster_name == "cpu-ssh-2x1" and profile.world_size == 2
    # one rank per node: every group spans the two nodes
    assert {c.link for c in profile.collectives} == {"inter"}
    assert {c.op for c in profile.collectives} == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "send_recv",
    }


def _bomb(top: str) -> str:
    """A "billion laughs" under ``top``: nine levels of nine aliases of the level below (43
    million leaves once walked; a few hundred bytes of YAML)."""
    levels = [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]" for i in range(9)]
    nested = "[" + ", ".join(levels[:-1]) + ", " + levels[-1] + "]"
    return f"{top}: {nested}\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field", ["dtype", "created", "tool"])
def test_an_alias_bomb_in_a_profile_is_one_short_line(tmp_path: Path, field: str) -> None:
    """str() of the bomb (a text field) and its repr in the message built all of it: seconds,
    a GB, and a message of hundreds of MB; then each field's check was made safe, but the
    free-form ``tool`` was kept as it was (``tune profile --show --json`` walked it). tuner
    writes no alias: none is read."""
    words = "not YAML: aliases (*name) are not allowed"
    path = tmp_path / "clusters" / "c.yaml"
    save_profile(a_profile(), path)
    data = yaml.safe_load(path.read_text())
    data.pop(field)
    path.write_text(yaml.safe_dump(data) + _bomb(field))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert words in str(info.value) and len(str(info.value)) < 300, str(info.value)[:500]


def test_a_profile_save_stopped_mid_write_keeps_the_last_one_and_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save stopped by a full disk or a Ctrl-C left its fixed-name ``c.tmp`` beside the
    profile (and two writers shared that name): the last good profile stays, nothing else."""
    path = tmp_path / "clusters" / "c.yaml"
    save_profile(a_profile(), path)
    before = path.read_bytes()

    def full_disk(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_profile(a_profile(tool={"warmup": 1, "repeats": 2}), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.yaml"]
