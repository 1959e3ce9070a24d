"""Mixture-of-experts settings of a model, and Megatron's rules for expert parallelism.

A model with ``moe:`` replaces the dense MLP of its MoE layers by ``num_experts`` routed experts
(each a SwiGLU or GeLU MLP of width ``ffn_hidden_size``), ``router_topk`` of which see each
token, plus optional shared experts every token sees. The names follow Megatron-LM's flags
(core_v0.15 megatron/training/arguments.py ``_add_moe_args``); the rules below are the checks of
that file's ``validate_args``, of megatron/core/transformer/transformer_config.py, of
megatron/core/transformer/moe/moe_layer.py and of megatron/core/parallel_state.py, with their
messages. The rules take plain numbers: tuner.config.parallel calls them (this module sits below
it).

DeepSpeed-MoE (framework ``deepspeed``: ``deepspeed.moe.layer.MoE`` in the repo's workload) takes
the same section with DeepSpeed's rules and messages (DeepSpeed 0.19.8, :data:`DS_SOURCES`): the
fields that have no DeepSpeed counterpart are refused by name (:func:`deepspeed_moe_problems`),
the per-config rules are :func:`deepspeed_moe_rule_violations`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from tuner.errors import ConfigError
from tuner.spec.frameworks import traits

TokenDispatcher = Literal["alltoall", "allgather", "flex"]
"""Megatron ``--moe-token-dispatcher-type`` (flex: DeepEP, ``--moe-enable-deepep``)."""
TokenDropPolicy = Literal["probs", "position"]
RouterDtype = Literal["fp32", "fp64"]
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]
"""Megatron ``--moe-router-load-balancing-type`` (core_v0.15 arguments.py choices)."""

DS_SOURCES = (
    "deepspeed/moe/layer.py MoE.__init__; deepspeed/moe/sharded_moe.py TopKGate, top1gating, "
    "MOELayer; deepspeed/moe/experts.py Experts; deepspeed/utils/groups.py "
    "_create_expert_and_data_parallel; deepspeed/runtime/engine.py "
    "_validate_zero3_moe_compatibility"
)
"""Where DeepSpeed-MoE's rules below come from (DeepSpeed 0.19.8)."""
DS_MIN_CAPACITY = 4
"""deepspeed/moe/layer.py MoE.__init__ default ``min_capacity``."""
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
    min_capacity: int | None = None
    """DeepSpeed-MoE's ``min_capacity`` (framework deepspeed only; None: DeepSpeed's MoE
    default, 4): an expert's capacity is at least this many tokens."""
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
        if self.min_capacity is not None and not 0 <= self.min_capacity <= 1 << 20:
            raise ConfigError(
                f"must be in 0..{1 << 20}, got {self.min_capacity}", path="min_capacity"
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
    def deepspeed_min_capacity(self) -> int:
        """``min_capacity`` as DeepSpeed's MoE layer takes it (its default: 4)."""
        return DS_MIN_CAPACITY if self.min_capacity is None else self.min_capacity

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


def deepspeed_moe_problems(
    moe: MoESpec, etps: tuple[int | None, ...], dispatchers: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(field path, message) for every MoE setting DeepSpeed-MoE has no counterpart of."""
    checks = [
        (
            moe.shared > 0,
            "model.moe.shared_expert_ffn_hidden_size",
            "DeepSpeed-MoE has no shared experts (its use_residual is the gated Residual-MoE, "
            "not a shared MLP)",
        ),
        (
            moe.router_dtype == "fp64",
            "model.moe.router_dtype",
            "DeepSpeed's TopKGate computes the gate in fp32 (sharded_moe.py); set fp32 or "
            "leave it out",
        ),
        (
            moe.grouped_gemm,
            "model.moe.grouped_gemm",
            "DeepSpeed-MoE's Experts runs its local experts one after another "
            "(deepspeed/moe/experts.py): set grouped_gemm: false",
        ),
        (
            moe.permute_fusion,
            "model.moe.permute_fusion",
            "fused permutation is Transformer Engine's (Megatron); DeepSpeed-MoE has none",
        ),
        (
            any(e not in (None, 1) for e in etps),
            "space.etp",
            "DeepSpeed-MoE here has no expert tensor parallelism (the DeepSpeed workload has "
            "no tensor parallelism): leave etp out",
        ),
        (
            any(d != "alltoall" for d in dispatchers),
            "space.moe_token_dispatcher",
            "DeepSpeed-MoE dispatches with one all-to-all over the EP group (sharded_moe.py "
            "_AllToAll); the dispatcher is Megatron's knob: leave it out",
        ),
    ]
    return [(path, message) for broken, path, message in checks if broken]


def deepspeed_moe_rule_violations(
    moe: MoESpec | None,
    *,
    ep: int,
    etp: int | None,
    dispatcher: str,
    dp: int,
    pp: int,
    zero_stage: int,
    tokens: int,
) -> list[tuple[str, str]]:
    """(rule id, DeepSpeed's message) for every DeepSpeed-MoE rule the sizes break (``dp``: the
    data-parallel world, world / pp; ``tokens``: one rank's micro-batch x sequence)."""
    knobs = [
        (
            etp not in (None, 1),
            "deepspeed_etp",
            f"DeepSpeed-MoE here has no expert tensor parallelism (etp={etp})",
        ),
        (
            dispatcher != "alltoall",
            "deepspeed_dispatcher",
            f"DeepSpeed-MoE has one all-to-all dispatcher (moe_token_dispatcher={dispatcher})",
        ),
    ]
    out = [(rule, message) for broken, rule, message in knobs if broken]
    if moe is None:
        if ep > 1:
            out.append(("ep_needs_moe", f"ep_size ({ep}) > 1 needs model.moe (a dense model "
                        "has no experts to split)"))  # fmt: skip
        return out
    min_cap = moe.deepspeed_min_capacity
    checks = [
        (  # moe/layer.py MoE.__init__
            moe.num_experts % ep != 0,
            "experts_ep",
            f"Number of experts ({moe.num_experts}) should be divisible by expert parallel "
            f"size ({ep})",
        ),
        (  # utils/groups.py _create_expert_and_data_parallel: _ensure_divisibility(world/pp, ep)
            dp % ep != 0,
            "ep_dp",
            f"{dp} is not divisible by {ep} (DeepSpeed's expert-parallel groups split the "
            f"data-parallel ranks: dp={dp}, ep={ep})",
        ),
        (  # runtime/engine.py _validate_zero3_moe_compatibility
            zero_stage == 3,
            "moe_zero3",
            "Native DeepSpeed MoE is not supported with ZeRO Stage 3. Use AutoEP or choose "
            "ZeRO stage 1/2.",
        ),
        (  # the workload's PipelineModule passes one tensor between stages
            pp > 1,
            "moe_pipeline",
            f"the DeepSpeed workload's MoE layers run without pipeline stages (pp={pp}): no "
            "path for their aux loss between stages",
        ),
        (  # moe/sharded_moe.py top1gating asserts it
            moe.router_topk == 1 and tokens < min_cap,
            "moe_min_capacity",
            "No. of tokens (batch-size) should be greater than min_capacity. "
            f"(tokens={tokens}, min_capacity={min_cap})",
        ),
    ]
    return out + [(rule, message) for broken, rule, message in checks if broken]


DENSE_DISPATCHER = (
    "a token dispatcher sends tokens to experts; this model is dense (no model.moe): leave it out"
)
"""A dispatcher chosen for a dense model, in the study file's space or with ``--set``: only
Megatron's MoE layer has one (megatron/core/transformer/moe/token_dispatcher.py)."""
DENSE_EP = (
    "expert parallelism splits the experts across ranks; this model is dense (no model.moe): "
    "leave it out or give 1"
)
"""``ep`` > 1 for a dense model: Megatron refuses it ("num_experts must be non None to use
expert model parallelism", arguments.py validate_args), DeepSpeed has no experts to split."""
DENSE_ETP = (
    "expert tensor parallelism splits each expert's weights; this model is dense (no "
    "model.moe): leave it out (its MLP is split by tp)"
)
"""``etp`` given for a dense model: it sizes only the experts' tensor parallel group
(``--expert-tensor-parallel-size``); unset, it is the tensor parallel size."""


def ep_auto(moe: MoESpec | None, world_size: int) -> tuple[int, ...]:
    """``ep: auto``: the powers of two dividing ``num_experts`` within ``world_size`` ranks, and
    1 alone for a dense model (no experts to split). One rule for the space's axes
    (:mod:`tuner.space.enumerate`) and the study's MoE checks (:mod:`tuner.spec.study`)."""
    if moe is None:
        return (1,)
    powers = (1 << k for k in range(world_size.bit_length()))  # 1, 2, 4, ... <= world_size
    return tuple(e for e in powers if moe.num_experts % e == 0)


def dense_knob_problem(key: str, value: object) -> str | None:
    """Why an expert knob at ``value`` means nothing for a dense model, or None (any other knob,
    or an expert knob at its default: ep 1, etp unset, the all-to-all dispatcher). One rule for
    the study file's space and ``--set``."""
    if key == "ep" and value != 1:
        return DENSE_EP
    if key == "etp" and value is not None:
        return DENSE_ETP
    if key == "moe_token_dispatcher" and value != "alltoall":
        return DENSE_DISPATCHER
    return None


def moe_study_problem(
    framework: str,
    precision: str,
    moe: MoESpec | None,
    eps: tuple[int, ...],
    etps: tuple[int | None, ...],
    dispatchers: tuple[str, ...],
) -> tuple[str, str] | None:
    """(field path, message) of the first study-wide MoE rule the study breaks, or None (the
    per-config rules: :func:`moe_rule_violations`, :func:`deepspeed_moe_rule_violations`)."""
    if moe is None:  # an expert knob off its default: first, as the others follow from it
        knobs = (("ep", eps), ("etp", etps), ("moe_token_dispatcher", dispatchers))
        for key, values in knobs:
            for value in values:
                if (problem := dense_knob_problem(key, value)) is not None:
                    return f"space.{key}", problem
    megatron = traits(framework).megatron_core
    if megatron and precision == "fp16" and any(e > 1 for e in eps):
        # megatron/training/arguments.py (core_v0.15) validate_args
        return "space.ep", "Expert parallelism is not supported with fp16 training. (use bf16)"
    if framework == "megatron-deepspeed" and (moe is not None or max(eps) > 1):
        return "model.moe", (
            "MoE runs with framework megatron or deepspeed (DeepSpeed-MoE); the "
            "megatron-deepspeed template passes no expert flags"
        )
    if moe is None:
        return None
    if megatron and moe.min_capacity is not None:
        return "model.moe.min_capacity", (
            "min_capacity is DeepSpeed-MoE's; Megatron's capacity has no minimum"
        )
    if framework == "deepspeed":
        problems = deepspeed_moe_problems(moe, etps, dispatchers)
        if problems:
            return problems[0]
    return None
