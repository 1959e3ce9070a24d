"""The GPT: pre-LN blocks (some with a DeepSpeed-MoE MLP), embedding and head, as one module
for the plain engine or as a DeepSpeed ``PipelineModule`` layer list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpt_deepspeed_args import ModelShape, RunPlan


class MLP(nn.Module):
    """fc1 -> GELU -> fc2 (the dense MLP, and each DeepSpeed-MoE expert)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h = shape.hidden_size
        self.heads = shape.num_attention_heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.mlp = self.make_mlp(shape)

    def make_mlp(self, shape: ModelShape) -> nn.Module:
        return MLP(shape.hidden_size, shape.ffn_hidden_size)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(att.transpose(1, 2).reshape(b, s, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        return x + self.mlp(self.ln2(x))


class MoEBlock(Block):
    """A block whose MLP is ``deepspeed.moe.layer.MoE`` over copies of the MLP; returns the
    output and the gate's load-balancing loss (``l_aux``)."""

    def make_mlp(self, shape: ModelShape) -> nn.Module:
        from deepspeed.moe.layer import MoE

        moe = shape.moe
        if moe is None:
            raise ValueError("MoEBlock needs ModelShape.moe")
        cf = moe.capacity_factor
        return MoE(
            hidden_size=shape.hidden_size,
            expert=MLP(shape.hidden_size, moe.ffn_hidden_size),
            num_experts=moe.num_experts,
            ep_size=moe.ep_size,
            k=moe.top_k,
            capacity_factor=cf or 1.0,
            eval_capacity_factor=cf or 1.0,
            min_capacity=moe.min_capacity,
            drop_tokens=cf is not None,
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = self.attention(x)
        out, l_aux, _ = self.mlp(self.ln2(x))
        return x + out, l_aux


class Embedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.tok = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.pos = nn.Embedding(shape.seq_length, shape.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


class Head(nn.Module):
    """Final LayerNorm and the (untied) output projection to logits."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(shape.hidden_size)
        self.out = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    """The whole model for the non-pipeline engine; forward returns the LM loss."""

    def __init__(self, shape: ModelShape, checkpoint: Callable[..., Any] | None) -> None:
        super().__init__()
        self.embed = Embedding(shape)
        moe = shape.moe.layers if shape.moe else (False,) * shape.num_layers
        self.blocks = nn.ModuleList(MoEBlock(shape) if m else Block(shape) for m in moe)
        self.head = Head(shape)
        self.checkpoint = checkpoint
        self.aux_loss_coeff = shape.moe.aux_loss_coeff if shape.moe else 0.0
        self.last_aux_loss = 0.0  # the MoE layers' summed l_aux of the last forward

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        aux = torch.zeros((), device=x.device)
        for block in self.blocks:
            out = self.checkpoint(block, x) if self.checkpoint else block(x)
            if isinstance(out, tuple):  # an MoEBlock: (output, l_aux)
                x, l_aux = out
                aux = aux + l_aux
            else:
                x = out
        self.last_aux_loss = float(aux.detach())
        loss = lm_loss(self.head(x), labels)
        return loss + self.aux_loss_coeff * aux if self.aux_loss_coeff else loss


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def configure_checkpointing(config: dict[str, Any]) -> Callable[..., Any]:
    """DeepSpeed's activation checkpointing, set from the config section (no model parallel)."""
    import deepspeed

    section = config["activation_checkpointing"]
    deepspeed.checkpointing.configure(
        None,
        partition_activations=False,
        contiguous_checkpointing=bool(section.get("contiguous_memory_optimization", False)),
        num_checkpoints=section.get("number_checkpoints"),
        checkpoint_in_cpu=False,
        synchronize=bool(section.get("synchronize_checkpoint_boundary", False)),
        profile=bool(section.get("profile", False)),
    )
    return deepspeed.checkpointing.checkpoint


def build_model(shape: ModelShape, plan: RunPlan, config: dict[str, Any], seed: int) -> Any:
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(seed)
    checkpoint = configure_checkpointing(config) if plan.checkpointing else None
    if plan.pipeline_stages == 1:
        return GPT(shape, checkpoint)
    layers = [LayerSpec(Embedding, shape)]
    layers += [LayerSpec(Block, shape) for _ in range(shape.num_layers)]
    layers.append(LayerSpec(Head, shape))
    return PipelineModule(
        layers=layers,
        num_stages=plan.pipeline_stages,
        loss_fn=lm_loss,
        partition_method=plan.partition_method,
        activation_checkpoint_interval=1 if checkpoint else 0,
        checkpointable_layers=["Block"],  # never the embedding (integer input) or the head
        base_seed=seed,
    )
