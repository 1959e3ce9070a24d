"""Mixture-of-experts settings of a model, and Megatron's rules for expert parallelism.

A model with ``moe:`` replaces the dense MLP of its MoE layers by ``num_experts`` routed experts
(each a SwiGLU or GeLU MLP of width ``ffn_hidden_size``), ``router_topk`` of which see each
token, plus optional shared experts every token sees. The names follow Megatron-LM's flags
(core_v0.15 megatron/training/arguments.py ``_add_moe_args``); the rules below are the checks of
that file's ``validate_args``, of megatron/core/transformer/transformer_config.py, of
megatron/core/transformer/moe/moe_layer.py and of megatron/core/parallel_state.py, with their
messages. The rules take plain numbers: tuner.parallel calls them (this module sits below it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tuner.errors import ConfigError

TokenDispatcher = Literal["alltoall", "allgather", "flex"]
"""Megatron ``--moe-token-dispatcher-type`` (flex: DeepEP, ``--moe-enable-deepep``)."""
TokenDropPolicy = Literal["probs", "position"]
RouterDtype = Literal["fp32", "fp64"]
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]
"""Megatron ``--moe-router-load-balancing-type`` (core_v0.15 arguments.py choices)."""

MAX_EXPERTS = 1 << 14  # published MoEs route over 8-384 experts (DeepSeek-V3: 256, Kimi K2: 384)
_PATTERN = re.compile(r"\(?\[([01])\]\*(\d+)(?:\+\[([01])\]\*(\d+))?\)?(?:\*(\d+))?")


@dataclass(frozen=True, kw_only=True, slots=True)
class MoESpec:
    """The mixture-of-experts part of a model (Megatron's ``--num-experts`` and friends)."""

    num_experts: int
    """Routed experts per MoE layer (``--num-experts``)."""
    router_topk: int = 2
    """Experts each token is routed to (``--moe-router-topk``)."""
    ffn_hidden_size: int | None = None
    """Width of one routed expert (``--moe-ffn-hidden-size``); None: the model's FFN width."""
    shared_expert_ffn_hidden_size: int | None = None
    """Total width of the shared experts every token sees
    (``--moe-shared-expert-intermediate-size`` = shared experts x their width); None: none."""
    layer_freq: int | str = 1
    """Which layers are MoE (``--moe-layer-freq``): N = every N-th layer (layer i is MoE when
    i % N == 0), or a pattern ``([0]*1+[1]*27)`` / ``([1]*3+[0]*1)*3`` (1 = MoE layer)."""
    capacity_factor: float | None = None
    """``--moe-expert-capacity-factor``: each expert takes at most factor x tokens x topk /
    experts tokens and drops the rest; None: dropless."""
    pad_to_capacity: bool = False
    """``--moe-pad-expert-input-to-capacity``: every expert computes its full capacity."""
    token_drop_policy: TokenDropPolicy = "probs"
    """``--moe-token-drop-policy``: which tokens an over-full expert drops."""
    router_dtype: RouterDtype | None = None
    """``--moe-router-dtype``: router logits in fp32 / fp64; None: the model's dtype."""
    router_pre_softmax: bool = False
    """``--moe-router-pre-softmax`` (Megatron requires it at top-1 with softmax scores)."""
    load_balancing: LoadBalancing = "aux_loss"
    """``--moe-router-load-balancing-type``: GShard's auxiliary loss (aux_loss), per sequence
    (seq_aux_loss) or global (global_aux_loss), S-BASE's sinkhorn balancing, or none."""
    aux_loss_coeff: float = 0.0
    """``--moe-aux-loss-coeff``: load-balancing loss weight (logged as load_balancing_loss)."""
    grouped_gemm: bool = True
    """``--moe-grouped-gemm``: one grouped GEMM over the local experts instead of a loop."""
    permute_fusion: bool = False
    """``--moe-permute-fusion``: fused token permutation kernels (Transformer Engine)."""
    imbalance: float = 1.0
    """Stated load imbalance: tokens of the busiest expert rank / the mean (>= 1). Dropless
    routing with an auxiliary loss leaves some; with a capacity factor it is at most that
    factor. Used by the memory and time models for expert activations and GEMMs."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts <= MAX_EXPERTS:
            raise ConfigError(
                f"must be in 1..{MAX_EXPERTS} (num_moe_experts must be non-negative), "
                f"got {self.num_experts}",
                path="num_experts",
            )
        if not 1 <= self.router_topk <= self.num_experts:
            raise ConfigError(
                f"must be in 1..num_experts ({self.num_experts}), got {self.router_topk}",
                path="router_topk",
            )
        for name in ("ffn_hidden_size", "shared_expert_ffn_hidden_size"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1 << 20:
                # transformer_config.py: "moe_shared_expert_intermediate_size must be
                # num_shared_experts * ffn_size_of_each_shared_expert, but got ..."
                raise ConfigError(f"must be in 1..{1 << 20}, got {value}", path=name)
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ConfigError(
                f"must be > 0 (or left out for dropless), got {self.capacity_factor}",
                path="capacity_factor",
            )
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ConfigError(
                "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity",
                path="pad_to_capacity",
            )
        # transformer_config.py: sinkhorn routing is exempt (it normalises the scores itself)
        sinkhorn = self.load_balancing == "sinkhorn"
        if self.router_topk == 1 and not self.router_pre_softmax and not sinkhorn:
            raise ConfigError(
                "Please use --moe-router-pre-softmax when topk is 1. (set router_pre_softmax, "
                "or load_balancing: sinkhorn)",
                path="router_topk",
            )
        if not 1.0 <= self.imbalance <= self.num_experts:
            raise ConfigError(
                f"must be in 1..num_experts ({self.num_experts}), got {self.imbalance}",
                path="imbalance",
            )
        if isinstance(self.layer_freq, int):
            if not 1 <= self.layer_freq <= 4096:
                raise ConfigError(f"must be in 1..4096, got {self.layer_freq}", path="layer_freq")
        else:
            parse_pattern(self.layer_freq)

    def moe_layers(self, num_layers: int) -> tuple[bool, ...]:
        """Per layer, whether it is an MoE layer (Megatron ``moe_layer_freq`` semantics)."""
        if isinstance(self.layer_freq, int):
            return tuple(i % self.layer_freq == 0 for i in range(num_layers))
        pattern = parse_pattern(self.layer_freq)
        if len(pattern) != num_layers:
            raise ConfigError(
                f"Invalid length of moe_layer_pattern: {len(pattern)}, expected {num_layers}, "
                f"current moe layer pattern: {self.layer_freq}",
                path="moe.layer_freq",
            )
        return pattern

    @property
    def shared(self) -> int:
        """Shared-expert width (0: none)."""
        return self.shared_expert_ffn_hidden_size or 0


def parse_pattern(text: str) -> tuple[bool, ...]:
    """``([0]*1+[1]*27)`` or ``([1]*3+[0]*1)*3`` -> per-layer MoE flags (the two shapes Megatron's
    ``moe_freq_type`` help shows; a plain 0/1 list ``[0,1,1]`` also works). Never ``eval``."""
    compact = text.replace(" ", "")
    if re.fullmatch(r"\[[01](,[01])*\]", compact):
        return tuple(ch == "1" for ch in compact[1:-1].split(","))
    match = _PATTERN.fullmatch(compact)
    if not match:
        raise ConfigError(
            f"{text!r} is not a layer pattern like ([0]*1+[1]*27), ([1]*3+[0]*1)*3 or [0,1,1]",
            path="moe.layer_freq",
        )
    a, na, b, nb, rep = match.groups()
    unit = [a == "1"] * int(na) + ([b == "1"] * int(nb) if b is not None else [])
    out = tuple(unit * int(rep or 1))
    if not out or len(out) > 4096:
        raise ConfigError(f"{text!r} gives {len(out)} layers", path="moe.layer_freq")
    return out


def moe_rule_violations(
    moe: MoESpec | None,
    ffn_hidden_size: int,
    *,
    tp: int,
    pp: int,
    ep: int,
    etp: int,
    sp: bool,
    dispatcher: str,
    world: int,
) -> list[tuple[str, str]]:
    """(rule id, Megatron's message) for every expert-parallel rule the sizes break."""
    out: list[tuple[str, str]] = []
    if moe is None:
        if ep > 1:  # arguments.py validate_args
            out.append(("ep_needs_moe", "num_experts must be non None to use expert model "
                        f"parallelism (ep={ep})"))  # fmt: skip
        if etp != tp:
            out.append(("etp_needs_moe", f"expert_tensor_parallel_size ({etp}) differs from "
                        f"tensor parallel size ({tp}) but the model has no experts"))  # fmt: skip
        return out
    if moe.num_experts % ep:  # arguments.py validate_args
        out.append(("experts_ep", "Number of experts should be a multiple of expert model "
                    f"parallel_size. (num_experts={moe.num_experts}, ep={ep})"))  # fmt: skip
    if tp > 1 and not sp:  # moe_layer.py MoELayer.forward (ValueError while training)
        out.append(("moe_tp_needs_sp", "During training, performance may degrade if MoE and "
                    "tensor parallelismare enabled without also enabling sequence parallelism. "
                    f"(tp={tp})"))  # fmt: skip
    grid = etp * ep * pp  # parallel_state.py initialize_model_parallel: the expert rank grid
    if world % grid:
        out.append(("expert_grid", f"world_size ({world}) is not divisible by "
                    f"expert_tensor_model_pipeline_parallel size ({grid})"))  # fmt: skip
    width = moe.ffn_hidden_size or ffn_hidden_size
    if width % etp:  # megatron/core/utils.py ensure_divisibility in the experts' shards
        out.append(("moe_ffn_etp", f"{width} is not divisible by {etp}"))
    if moe.shared % tp:  # shared experts are a TP-sharded MLP
        out.append(("shared_ffn_tp", f"{moe.shared} is not divisible by {tp}"))
    if dispatcher == "flex" and tp * ep == 1:
        # token_dispatcher.py MoEFlexTokenDispatcher: DeepEP needs an expert/tensor group.
        out.append(("flex_needs_ep", "Flex token dispatcher requires TPxEP > 1"))
    if dispatcher == "flex" and moe.pad_to_capacity:  # transformer_config.py
        out.append(("flex_padding", "Flex token dispatcher does not support "
                    "moe_pad_expert_input_to_capacity"))  # fmt: skip
    return out
