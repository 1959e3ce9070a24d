"""``tune catalog gpus|models``: the presets a study can name, with their figures."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tuner.cli import help_text, render
from tuner.cli.tables import _console, _emit_json
from tuner.report import units

GPU_COLUMNS = (
    render.Column(name="name", header="name", right=False, meaning="cluster.gpu"),
    render.Column(name="memory_gib", header="memory\nGiB", meaning="device memory"),
    render.Column(name="peak_tflops", header="16-bit\nTFLOP/s",
                  meaning="peak dense BF16/FP16 tensor TFLOP/s"),
    render.Column(name="fp8_peak_tflops", header="FP8\nTFLOP/s",
                  meaning="peak dense FP8 TFLOP/s (blank: no FP8 tensor cores)"),
    render.Column(name="hbm_gbps", header="HBM\nGB/s", meaning="device memory bandwidth"),
    render.Column(name="intra_node_gbps", header="NVLink\nGB/s",
                  meaning="per GPU, per direction, to GPUs of the same node"),
    render.Column(name="inter_node_gbps", header="NIC\nGB/s",
                  meaning="per GPU share of the network to other nodes"),
    render.Column(name="compute_capability", header="compute\ncap.",
                  meaning="CUDA compute capability (blank: not a CUDA GPU)"),
    render.Column(name="sm_count", header="SMs", meaning="streaming multiprocessors"),
)  # fmt: skip
MODEL_COLUMNS = (
    render.Column(name="name", header="name", right=False, meaning="model.preset"),
    render.Column(name="params_b", header="params\nB",
                  meaning="parameters, billions (dense models; MoE: see experts)"),
    render.Column(name="experts", header="experts", right=False,
                  meaning="MoE: routed experts, top-k"),
    render.Column(name="num_layers", header="layers", meaning="transformer layers"),
    render.Column(name="hidden_size", header="hidden", meaning="model width h"),
    render.Column(name="ffn_hidden_size", header="ffn", meaning="MLP inner width"),
    render.Column(name="num_attention_heads", header="heads", meaning="attention heads"),
    render.Column(name="query_groups", header="kv\nheads", meaning="key/value heads (GQA)"),
    render.Column(name="vocab_size", header="vocab", meaning="tokenizer vocabulary"),
    render.Column(name="seq_length", header="seq", meaning="training sequence length"),
)  # fmt: skip


def _figure(name: str, value: float) -> str:
    if not value:
        return ""
    return f"{value:.1f}" if name == "compute_capability" else f"{value:g}"


def gpu_rows() -> list[dict[str, Any]]:
    """Every GPU preset's figures (JSON keys are :class:`tuner.catalog.GPUSpec`'s fields)."""
    from tuner.catalog import gpu_presets

    return [dataclasses.asdict(gpu) for gpu in gpu_presets()]


def model_rows() -> list[dict[str, Any]]:
    """Every model preset's shape and, for a dense one, its parameter count."""
    from tuner.models.memory.terms import param_counts
    from tuner.spec.file import model_preset_names, study_model

    out = []
    for name in model_preset_names():
        model = study_model({"preset": name})
        row = dataclasses.asdict(model) | {"name": name, "query_groups": model.query_groups}
        moe = model.moe
        params = param_counts(model).total(model.num_layers, model.vocab_size,
                                           model.tied_embeddings)  # fmt: skip
        row["params"] = None if moe is not None else params
        row["experts"] = f"{moe.num_experts} top-{moe.router_topk}" if moe is not None else ""
        out.append(row)
    return out


def _cmd_catalog(args: argparse.Namespace) -> int:
    chosen = render.parse_columns(args.columns, args.format)
    rows = gpu_rows() if args.what == "gpus" else model_rows()
    if args.format == "json":
        _emit_json(rows)
        return 0
    columns = GPU_COLUMNS if args.what == "gpus" else MODEL_COLUMNS
    cells = []
    for row in rows:
        if args.what == "models":
            params = row["params"]
            row = row | {"params_b": "" if params is None else f"{params / 1e9:.1f}"}
        cells.append(tuple(
            row[c.name] if isinstance(row[c.name], str) else _figure(c.name, row[c.name])
            for c in columns
        ))  # fmt: skip
    noun = "GPU preset" if args.what == "gpus" else "model preset"
    title = f"{units.plural(len(rows), noun)} (--format json: every field)"
    render.render(_console(), render.Grid(title=title, columns=columns, rows=tuple(cells)),
                  chosen)  # fmt: skip
    return 0


def add_parser(sub: Any, handlers: dict[str, Any], add_format_option: Any,
               add_columns_option: Any) -> None:  # fmt: skip
    """Register ``tune catalog``."""
    p = sub.add_parser(
        "catalog", help="list the GPU or model presets with their figures",
        epilog=help_text.epilog(GPU_COLUMNS + MODEL_COLUMNS[1:]),
        formatter_class=help_text.EpilogFormatter,
    )  # fmt: skip
    p.add_argument("what", choices=["gpus", "models"],
                   help="which presets to list: the GPUs or the models")  # fmt: skip
    add_format_option(p)
    add_columns_option(p, ["see below"])
    handlers["catalog"] = _cmd_catalog
