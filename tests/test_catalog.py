"""Any GPU and any dense model: a GPU described by its figures, the QKV-only bias, and
``tune catalog gpus|models``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.api import estimate
from tuner.catalog import get_gpu, gpu_names
from tuner.cli.main import main
from tuner.config.parallel import ParallelConfig
from tuner.errors import ConfigError
from tuner.models.memory.terms import param_counts
from tuner.spec.file import study_from_mapping, study_model

STUDY: dict[str, Any] = {
    "name": "anygpu",
    "model": {"preset": "llama3-8b"},
    "training": {"global_batch_size": 64},
    "cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": ["a"]},
    "framework": "megatron",
    "launch": {"template": "megatron_gpt", "megatron_path": "/opt/megatron"},
    "space": {"tp": [1, 2, 4, 8]},
}
H100_NVL = {  # NVIDIA H100 NVL datasheet figures (dense, no sparsity)
    "name": "h100-nvl", "memory_gib": 94, "peak_tflops": 835, "fp8_peak_tflops": 1671,
    "hbm_gbps": 3900, "intra_node_gbps": 300, "inter_node_gbps": 50, "compute_capability": 9.0,
}  # fmt: skip


def study_with(gpu: object, **model: object) -> dict[str, Any]:
    data = copy.deepcopy(STUDY)
    data["cluster"]["gpu"] = gpu
    data["model"].update(model)
    return data


def test_a_gpu_described_by_its_figures_drives_the_models() -> None:
    spec = study_from_mapping(study_with(H100_NVL))
    gpu = get_gpu(spec.cluster.gpu)
    assert spec.cluster.gpu_name == "h100-nvl" and gpu.memory_gib == 94
    assert spec.cluster_name.startswith("h100-nvl-")
    config = ParallelConfig(tp=2, dp=4, global_batch_size=64)
    nvl = estimate(spec, config)
    sxm = estimate(study_from_mapping(STUDY), config)
    assert nvl.gpu_memory_gib == 94 and sxm.gpu_memory_gib == get_gpu("h100-sxm-80gb").memory_gib
    assert nvl.time is not None and sxm.time is not None
    assert nvl.time.compute > sxm.time.compute  # 835 TFLOP/s against the SXM's 989


def test_a_preset_fills_what_is_not_given() -> None:
    spec = study_from_mapping(study_with({"name": "h100-94", "preset": "h100-sxm-80gb",
                                          "memory_gib": 94}))  # fmt: skip
    gpu, base = get_gpu(spec.cluster.gpu), get_gpu("h100-sxm-80gb")
    assert gpu.memory_gib == 94 and gpu.peak_tflops == base.peak_tflops
    assert gpu.cuda_context_gib == base.cuda_context_gib


@pytest.mark.parametrize(("gpu", "words"), [
    ({k: v for k, v in H100_NVL.items() if k != "peak_tflops"},
     "cluster.gpu.peak_tflops: required field is missing"),
    ({**H100_NVL, "hbm_gbps": 0}, "cluster.gpu.hbm_gbps: must be > 0"),
    ({**H100_NVL, "nvlink": 1}, "cluster.gpu.nvlink: unknown key"),
    ({**H100_NVL, "name": "h100-sxm-80gb"}, "cluster.gpu.name: 'h100-sxm-80gb' is a preset's"),
    ({**H100_NVL, "name": "H100-SXM-80GB"}, "'H100-SXM-80GB' is a preset's name: write preset: "
     "h100-sxm-80gb"),  # in capitals it is the preset still
    ({**H100_NVL, "preset": "h99"}, "cluster.gpu.preset: unknown GPU preset 'h99'"),
    ({**H100_NVL, "compute_capability": 8.0}, "FP8 tensor cores need compute capability 8.9"),
    ({**H100_NVL, "name": "../x"}, "cluster.gpu.name"),
    ({k: v for k, v in H100_NVL.items() if k != "name"}, "cluster.gpu.name: a GPU given"),
    ("h99", "cluster.gpu: unknown GPU 'h99'"),
])  # fmt: skip
def test_a_bad_gpu_is_one_line_naming_the_field(
    gpu: object, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as exc:
        study_from_mapping(study_with(gpu))
    assert words in str(exc.value) and "\n" not in str(exc.value)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study_with(gpu)))
    assert main(["estimate", "--study", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_a_gpu_name_in_any_case_is_the_catalogs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``H100-SXM-80GB`` (as a datasheet prints it) was refused with a list naming
    ``h100-sxm-80gb``. A GPU name is case-insensitive: the study stores the catalog's spelling,
    so both spellings are one cluster (one profile, one calibration) and one study."""
    folded = [name.casefold() for name in gpu_names()]
    assert len(set(folded)) == len(folded)  # no two names differ only in case: never a guess
    plain = study_from_mapping(STUDY)
    for spelling in ("H100-SXM-80GB", "H100-sxm-80GB"):
        spec = study_from_mapping(study_with(spelling))
        assert spec.cluster.gpu == "h100-sxm-80gb" and spec.cluster_name == plain.cluster_name
        assert spec.fingerprint() == plain.fingerprint()
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(study_with(spelling)))
        assert main(["estimate", "--study", str(path), "--set", "tp=2", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["gpu_memory_gib"] == get_gpu("h100-sxm-80gb").memory_gib
    described = study_from_mapping(study_with({**H100_NVL, "preset": "H100-SXM-80GB"}))
    base = get_gpu("h100-sxm-80gb")
    assert get_gpu(described.cluster.gpu).cuda_context_gib == base.cuda_context_gib
    with pytest.raises(ConfigError, match="unknown GPU 'H100-SXM-80GB-x'"):
        study_from_mapping(study_with("H100-SXM-80GB-x"))  # the rest as before


def test_a_model_preset_in_any_case_is_the_catalogs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model: {preset: Llama3-8B}`` was refused with a list naming ``llama3-8b`` (the GPU's
    name had been made case-insensitive, the model's not): the same study now."""
    from tuner.spec.file import model_preset_names

    folded = [name.casefold() for name in model_preset_names()]
    assert len(set(folded)) == len(folded)  # no two names differ only in case: never a guess
    plain = study_from_mapping({**STUDY, "model": {"preset": "llama3-8b"}})
    spec = study_from_mapping({**STUDY, "model": {"preset": "Llama3-8B"}})
    assert spec.model == plain.model and spec.fingerprint() == plain.fingerprint()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "model": {"preset": "LLAMA3-8B"}}))
    assert main(["space", "--study", str(path), "--json"]) == 0, capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown preset 'Llama3-8B-x'"):
        study_from_mapping({**STUDY, "model": {"preset": "Llama3-8B-x"}})


def test_qkv_bias_adds_the_qkv_bias_of_every_layer() -> None:
    plain = study_model({"preset": "llama3-8b"})
    qkv = study_model({"preset": "llama3-8b", "add_qkv_bias": True})
    a, g, d = plain.num_attention_heads, plain.query_groups, plain.kv_channels
    assert qkv.qkv_bias == (a + 2 * g) * d == 4096 + 2 * 8 * 128 and plain.qkv_bias == 0
    layers, vocab = plain.num_layers, plain.vocab_size
    more = param_counts(qkv).total(layers, vocab, False) - param_counts(plain).total(
        layers, vocab, False
    )  # fmt: skip
    assert more == layers * qkv.qkv_bias
    full = study_model({"preset": "llama3-8b", "add_bias_linear": True, "add_qkv_bias": True})
    assert full.qkv_bias == qkv.qkv_bias  # with every bias on, the flag adds nothing more


def test_qkv_bias_reaches_megatron_and_is_refused_elsewhere(tmp_path: Path) -> None:
    from tuner.launch import render_launch

    spec = study_from_mapping(study_with("h100-sxm-80gb", add_qkv_bias=True))
    config = ParallelConfig(tp=2, dp=4, global_batch_size=64)
    script = render_launch(spec, config, hosts=["a"], master_addr="a", master_port=29500,
                           trial_dir=str(tmp_path)).scripts[0]  # fmt: skip
    assert "--add-qkv-bias" in script and "--disable-bias-linear" in script
    data = study_with("h100-sxm-80gb", add_qkv_bias=True)
    data["framework"] = "megatron-deepspeed"
    data["launch"] = {"template": "megatron_deepspeed_gpt", "megatron_path": "/opt/mds"}
    with pytest.raises(ConfigError, match="model.add_qkv_bias: --add-qkv-bias is a Megatron-Core"):
        study_from_mapping(data)


def test_catalog_lists_the_presets_with_their_figures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.catalog import gpu_names
    from tuner.spec.file import model_preset_names

    monkeypatch.setenv("COLUMNS", "160")
    assert main(["catalog", "gpus"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:1].isalnum()}
    assert set(gpu_names()) <= set(rows)
    assert rows["h100-sxm-80gb"][1:4] == ["79.6", "989", "1979"]  # memory, BF16, FP8
    assert main(["catalog", "gpus", "--json"]) == 0
    gpus = {g["name"]: g for g in json.loads(capsys.readouterr().out)}
    assert gpus["a100-80gb"]["fp8_peak_tflops"] == 0 and gpus["a100-80gb"]["hbm_gbps"] == 2039
    assert main(["catalog", "models", "--json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert set(models) == set(model_preset_names())
    assert models["llama3-8b"]["params"] == pytest.approx(8.03e9, rel=0.005)  # Meta's 8.03B
    assert models["llama2-70b"]["params"] == pytest.approx(68.98e9, rel=0.005)
    assert models["mixtral-8x7b"]["params"] is None and models["mixtral-8x7b"]["experts"]
    assert main(["catalog", "models"]) == 0
    assert "llama3-8b" in capsys.readouterr().out


@pytest.mark.parametrize(("given", "meant"), [
    ("h100-80gb", "h100-sxm-80gb"),  # spelling alone says a100-80gb: another chip
    ("H100", "h100-sxm-80gb"),
    ("nvidia-h100-sxm5-80gb", "h100-sxm-80gb"),
    ("h100-96gb", "h100-hbm2e-96gb-500w"),  # the memory token picks among the H100 entries
    ("h200", "h200-141gb"),
    ("a10o-80gb", "a100-80gb"),  # no model named: the nearest spelling, when close
    ("h20", None),  # another chip, not a typo of h200
    ("mi300x", None),
])  # fmt: skip
def test_an_unknown_gpu_suggests_the_entry_of_its_model(
    given: str, meant: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An unknown GPU name listed the catalog and suggested nothing; the nearest spelling would
    suggest a100-80gb for h100-80gb. The suggestion keeps the chip's model token."""
    from tuner.catalog import nearest_gpu

    assert nearest_gpu(given) == meant
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study_with(given)))
    assert main(["estimate", "--study", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cluster.gpu: unknown GPU {given!r}" in err[0]
    assert (f"; did you mean {meant!r}? (catalog: " in err[0]) == (meant is not None), err[0]
    assert ("did you mean" in err[0]) == (meant is not None)
    if meant is not None:  # a GPU described by its figures names its preset the same way
        with pytest.raises(ConfigError, match=f"preset {given!r}; did you mean {meant!r}"):
            study_from_mapping(study_with({**H100_NVL, "preset": given}))
