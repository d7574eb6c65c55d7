"""A small Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU, causal attention.

Written for this project after the Llama papers (Touvron et al. 2023): pre-norm blocks
`x + attn(norm(x))`, `x + mlp(norm(x))`, no biases, untied input and output embeddings (a tied
pair would appear twice in the state_dict and be averaged twice on the server).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    dim: int = 128
    num_layers: int = 2
    num_heads: int = 4
    hidden_dim: int = 352  # SwiGLU width ≈ 8/3·dim, rounded to a multiple of 32
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ValueError(f"dim={self.dim} must split into {self.num_heads} heads of even size")
        for name in ("vocab_size", "dim", "num_layers", "num_heads", "hidden_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")


class RMSNorm(nn.Module):
    """x / rms(x) · w: LayerNorm without centring or bias."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_angles(seq_len: int, head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """[T, head_dim/2] angles t·base^(-2i/head_dim): pair i of every position rotates by these."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    return torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the (first half, second half) coordinate pairs of x [B, H, T, D] by `angles`.

    Rotations make q·k depend only on the positions' difference: relative position for free.
    """
    first, second = x.chunk(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        # [B, T, 3D] -> three [B, H, T, D/H]
        q, k, v = self.qkv(x).view(batch, seq, 3, self.num_heads, dim // self.num_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = apply_rotary(q, angles), apply_rotary(k, angles)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(batch, seq, dim))
        return out


class SwiGLU(nn.Module):
    """down(silu(gate(x)) ⊙ up(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(F.silu(self.gate(x)) * self.up(x))
        return out


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), angles)
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class LlamaDecoder(nn.Module):
    """Token ids [B, T] -> next-token logits [B, T, vocab]."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02); residual outputs shrunk by 1/sqrt(2·layers) so the residual
        # stream's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        for block in cast(list[Block], self.blocks):  # __init__ fills the ModuleList with Blocks only
            for proj in (block.attn.out, block.mlp.down):
                nn.init.normal_(proj.weight, std=0.02 / (2 * self.cfg.num_layers) ** 0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be integer [B, T], got {tokens.dtype} {tuple(tokens.shape)}")
        head_dim = self.cfg.dim // self.cfg.num_heads
        angles = rotary_angles(tokens.shape[1], head_dim, self.cfg.rope_base, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, angles)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits
