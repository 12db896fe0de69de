"""The project's DeiT-style ViT with a selectable attention family.

Its attention module keeps timm's structure and attribute names (`blocks[i].attn` with a fused
`qkv` Linear, `num_heads`, `head_dim`, `scale`, `q_norm`/`k_norm`, `attn_drop`, `proj`), so the
dumper reads it through the same hooks as a timm model. The attention weights pass through
`attn_drop` (an Identity here), which is where the dumper captures them.

Two shapes are used: the 7x7 models of data/models/vit7-* (the ViTConfig defaults) and the
DeiT-T-shaped 14x14 models (DEIT_T: patch 2, 197 tokens, 3 heads of 64, MLP ratio 4, depth 6).
`local_residual=True` adds InLine's local residual (eq. 6, `LocalResidual`) to every attention.

The attention core (weights, W V and the local residual) always runs in float32, also under
autocast: the families' denominators and the (s/N) factors are not for bfloat16, and the model is
analysed in float32 on the CPU.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
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
    local_residual: bool = False  # InLine eq. 6 beside every attention (LocalResidual)

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return 1 + self.grid * self.grid

    def to_dict(self) -> dict:
        return asdict(self)


# The DeiT-T attention shape on Fashion-MNIST: 28/2 = 14, a 14x14 grid plus CLS = 197 tokens,
# embedding 192, 3 heads of 64, MLP 768; depth 6 (DeiT-T has 12).
DEIT_T = dict(patch_size=2, embed_dim=192, depth=6, num_heads=3, mlp_ratio=4.0)


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)  # torch >= 2.4
    except TypeError:
        return torch.is_autocast_enabled() if device_type == "cuda" \
            else torch.is_autocast_cpu_enabled()


def _float32_core(x: torch.Tensor):
    """Switches autocast off where it is on (training in mixed precision); a no-op otherwise."""
    return torch.autocast(device_type=x.device.type, enabled=False) \
        if _autocast_on(x.device.type) else contextlib.nullcontext()


class LocalResidual(nn.Module):
    """InLine's local residual (eq. 6) as the released DeiT code computes it: the attention input
    x [B, N, C] is averaged over all N tokens (prefix tokens included); that vector passes through
    a 1x1 grouped convolution C -> C (groups = heads), GELU, and a 1x1 grouped convolution
    C -> 9C (groups = heads), giving one 3x3 kernel per channel (channel c: outputs 9c .. 9c+8,
    row by row). V's grid tokens, laid out on the grid, are filtered with their channel's kernel
    (cross-correlation, zero padding 1) and the result is added to the grid tokens' attention
    output W V; prefix tokens (CLS) get none."""

    def __init__(self, dim: int, num_heads: int, grid: int, prefix_tokens: int = 1):
        super().__init__()
        self.grid, self.prefix_tokens = grid, prefix_tokens
        self.conv1 = nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads)
        self.act = nn.GELU()
        self.conv2 = nn.Conv1d(dim, 9 * dim, kernel_size=1, groups=num_heads)

    def kernels(self, x: torch.Tensor) -> torch.Tensor:
        """[B, N, C] attention input -> [B, C, 3, 3], one kernel per channel."""
        b, _, c = x.shape
        return self.conv2(self.act(self.conv1(x.mean(dim=1).unsqueeze(-1)))).reshape(b, c, 3, 3)

    def filtered(self, v: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
        """v [B, H, N, d] -> the filtered grid tokens [B, grid*grid, H*d], row by row."""
        b, h, _, d = v.shape
        g, p = self.grid, self.prefix_tokens
        grid = v[:, :, p:, :].transpose(1, 2).reshape(b, g, g, h * d).permute(0, 3, 1, 2)
        padded = F.pad(grid, (1, 1, 1, 1))
        # A depthwise 3x3 filter with a different kernel per image: nine shifted products.
        out = sum(kernels[:, :, i, j, None, None] * padded[:, :, i:i + g, j:j + g]
                  for i in range(3) for j in range(3))
        return out.flatten(2).transpose(1, 2)

    def forward(self, out: torch.Tensor, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """out: the merged attention output W V [B, N, C]; v [B, H, N, d]; x the attention input
        [B, N, C]. Returns out with the filtered V added to its grid tokens."""
        p = self.prefix_tokens
        res = self.filtered(v, self.kernels(x))
        return torch.cat([out[:, :p], out[:, p:] + res], dim=1)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, family: str, feature_map: str | None = None,
                 local_residual_grid: int | None = None):
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
        # Added to W V before `proj`: the dumper reads the per-head output at its input.
        self.local_residual = None if local_residual_grid is None \
            else LocalResidual(dim, num_heads, local_residual_grid)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        with _float32_core(x):
            q, k, v = q.float(), k.float(), v.float()  # no-ops on float32 tensors
            w = attention_weights(self.attention_family, q, k, self.scale, self.feature_map)
            w = self.attn_drop(w)
            o = (w @ v).transpose(1, 2).reshape(b, n, c)
            if self.local_residual is not None:
                o = self.local_residual(o, v, x.float())
        return self.proj(o)


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
                 feature_map: str | None = None, local_residual_grid: int | None = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, family, feature_map, local_residual_grid)
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
            [Block(dim, cfg.num_heads, hidden, cfg.family, cfg.feature_map,
                   cfg.grid if cfg.local_residual else None)
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
