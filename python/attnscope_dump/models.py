"""The project's DeiT-style ViT with a selectable attention family.

Its attention module keeps timm's structure and attribute names (`blocks[i].attn` with a fused
`qkv` Linear, `num_heads`, `head_dim`, `scale`, `q_norm`/`k_norm`, `attn_drop`, `proj`), so the
dumper reads it through the same hooks as a timm model. The attention weights pass through
`attn_drop` (an Identity here), which is where the dumper captures them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .attention import attention_weights, family as family_entry


@dataclass
class ViTConfig:
    family: str = "softmax"
    feature_map: str | None = None  # a feature-map spec; None: the family's own (FEATURE_MAPS)
    image_size: int = 28
    patch_size: int = 4
    in_chans: int = 1
    num_classes: int = 10
    embed_dim: int = 64
    depth: int = 4
    num_heads: int = 2
    mlp_ratio: float = 2.0

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return 1 + self.grid * self.grid

    def to_dict(self) -> dict:
        return asdict(self)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, family: str, feature_map: str | None = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed dim {dim} not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.attention_family = family
        # Canonical spec (what the dump records and the C++ parses), "none" for a family without
        # one; an unknown family or map, or a map the family does not take, is a ValueError here.
        phi = family_entry(family).resolve_map(feature_map)
        self.feature_map = phi.name if phi is not None else "none"
        self.fused_attn = False  # weights are always formed explicitly; kept for timm's interface
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        w = attention_weights(self.attention_family, q, k, self.scale, self.feature_map)
        w = self.attn_drop(w)
        x = (w @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, family: str,
                 feature_map: str | None = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, family, feature_map)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, mlp_hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, in_chans: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, grid*grid, dim], row by row


class VisionTransformer(nn.Module):
    """CLS token first, then the patch grid row by row (the dump format's token order)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.config = cfg
        dim = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_tokens, dim))
        hidden = int(dim * cfg.mlp_ratio)
        self.blocks = nn.ModuleList(
            [Block(dim, cfg.num_heads, hidden, cfg.family, cfg.feature_map)
             for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, cfg.num_classes)
        self._init_weights()

    # Attributes the dumper records (same names as in the dump format).
    @property
    def grid_size(self):
        return (self.config.grid, self.config.grid)

    num_prefix_tokens = 1

    def _init_weights(self):
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def build_model(cfg: ViTConfig, seed: int | None = None) -> VisionTransformer:
    if seed is not None:
        torch.manual_seed(seed)
    return VisionTransformer(cfg)
