"""The rules of Megatron's ``--tp-comm-overlap`` (Transformer Engine userbuffers), which judge a
config before any model runs; what the overlap costs and saves is
:mod:`tuner.models.time.tp_overlap`, whose docstring cites where these facts come from."""

from __future__ import annotations

from tuner.spec.frameworks import traits
from tuner.spec.moe import MoESpec


def tp_overlap_rule_violations(
    enabled: bool,
    tp: int,
    sequence_parallel: bool,
    framework: str,
    moe: MoESpec | None,
    gpus_per_node: int | None = None,
) -> list[tuple[str, str]]:
    """(rule, message) for each rule ``--tp-comm-overlap`` breaks (empty: none or not asked)."""
    if not enabled:
        return []
    t = traits(framework)
    if not t.megatron_model or t.deepspeed_pipeline:
        return [("tp_overlap_framework", "tp_comm_overlap is Megatron-LM core's "
                 "(--tp-comm-overlap, Transformer Engine userbuffers)")]  # fmt: skip
    out: list[tuple[str, str]] = []
    if tp == 1 or not sequence_parallel:
        out.append(("tp_overlap_sp", "Tensor parallel communication/GEMM overlap can happen "
                    "only when sequence parallelism is enabled"))  # fmt: skip
    if moe is not None:
        out.append(("tp_overlap_moe", "tp_comm_overlap with MoE layers is not modelled (the "
                    "tuner prices userbuffers for dense layers only)"))  # fmt: skip
    if gpus_per_node is not None and tp > gpus_per_node:
        text = f"tp={tp} > {gpus_per_node} GPUs per node"
        out.append(("tp_overlap_node", "tp_comm_overlap needs the TP group inside one node "
                    f"(userbuffers over NVLink): {text}"))  # fmt: skip
    return out
