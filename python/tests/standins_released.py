"""Stand-ins for the attention modules and models of the papers' released code, written from
their structure (attribute names, submodules, shapes) and their forward computation as read in:

* InLine (LeapLabTHU/InLine, models/inline_deit.py): `InLineAttention` in a DeiT
  `VisionTransformer` (`blocks` of `InLineBlock`, timm's PatchEmbed, `num_tokens` = 1);
* FLatten (LeapLabTHU/FLatten-Transformer, models/flatten_pvt.py): `FocusedLinearAttention` in
  a PVT (`block1`.., `patch_embed1`.. with H and W), stages 'L' (FLatten) or 'S' (PVT softmax);
* Agent attention (LeapLabTHU/Agent-Attention, agent_transformer/models/agent_deit.py): the
  DeiT whose first `agent_layer` blocks use `AgentAttention` and the others DeiT's softmax;
* PolaFormer (PolaLinearAttention, PVT form), RALA (RAVLT's `RALA`, `qkvo` Conv2d) and
  InLine-Swin's window attention (models/inline_swin.py): their attributes only, enough for the
  dumper to recognise and refuse them (it never calls them).

Only what the dumper touches is kept, and the code is this project's own: the forward passes
compute the same quantities in other words (e.g. InLine's W V through the row sums S_i).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from standins import TimmBlock, TimmMlp, TimmPatchEmbed


def _split_heads(t, h):
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).permute(0, 2, 1, 3)


def _join_heads(t):
    b, h, n, d = t.shape
    return t.permute(0, 2, 1, 3).reshape(b, n, h * d)


# ----------------------------------------------------------------------------- InLine (DeiT)
class InLineAttention(nn.Module):
    """W V = c2 q (K^T V) + (1 - S_i)/N sum_j v_j with c2 = scale/N and S_i = c2 q_i.sum_j k_j,
    plus, on the grid tokens, each channel of V filtered by a 3x3 kernel made per image from the
    token mean by `residual`."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, window=14):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)
        self.window = window
        self.residual = nn.Sequential(nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                                      nn.Conv1d(dim, 9 * dim, 1, groups=num_heads))

    def forward(self, x):
        b, n, c = x.shape
        side = int(math.isqrt(n))  # the released code takes int(sqrt(N)) with N counting CLS
        q, k, v = (_split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        kernels = self.residual(x.mean(dim=1)[:, :, None]).reshape(b, c, 3, 3)
        c2 = self.scale / n
        s = c2 * (q @ k.sum(dim=2, keepdim=True).transpose(-2, -1))
        wv = c2 * (q @ (k.transpose(-2, -1) @ v)) + (1 - s) / n * v.sum(dim=2, keepdim=True)
        y = _join_heads(wv)
        grid = _join_heads(v)[:, 1:].transpose(1, 2).reshape(b, c, side, side)
        padded = F.pad(grid, (1, 1, 1, 1))
        local = sum(kernels[:, :, r, t, None, None] * padded[:, :, r:r + side, t:t + side]
                    for r in range(3) for t in range(3))
        y = torch.cat([y[:, :1], y[:, 1:] + local.flatten(2).transpose(1, 2)], dim=1)
        return self.proj_drop(self.proj(y))


class InLineBlock(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = InLineAttention(dim, num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = TimmMlp(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class InLineDeiT(nn.Module):
    """The released DeiT: CLS token (`num_tokens` = 1, no `num_prefix_tokens`), timm's
    PatchEmbed (grid_size), `blocks` of InLineBlock; `softmax_from`: blocks from this index on
    are DeiT's softmax blocks instead (a hybrid in one geometry, as Agent's DeiT mixes them)."""

    def __init__(self, img_size=28, patch_size=2, in_chans=1, num_classes=5, embed_dim=48,
                 depth=2, num_heads=3, softmax_from=None):
        super().__init__()
        self.num_tokens = 1
        self.patch_embed = TimmPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.dist_token = None
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1,
                                                  embed_dim) * 0.02)
        first_softmax = depth if softmax_from is None else softmax_from
        self.blocks = nn.Sequential(*[
            InLineBlock(embed_dim, num_heads) if i < first_softmax
            else TimmBlock(embed_dim, num_heads, qk_norm=False, scale_norm=False)
            for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


# ----------------------------------------------------------------------------- FLatten (PVT)
class FocusedLinearAttention(nn.Module):
    """q, k: ReLU + 1e-6, divided by softplus(scale) (k after the positional encoding), then the
    focused map r -> |r| r^p / |r^p|; linear attention with the 1e-6 of the released z; plus a
    depthwise convolution of V's grid (one kernel per channel of a head, shared by the heads)."""

    def __init__(self, dim, num_patches, num_heads=8, qkv_bias=False, sr_ratio=1,
                 focusing_factor=3, kernel_size=5):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.focusing_factor = focusing_factor
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, padding=kernel_size // 2,
                             groups=head_dim)
        self.scale = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.positional_encoding = nn.Parameter(
            torch.randn(1, num_patches // (sr_ratio * sr_ratio), dim) * 0.1)

    def _focus(self, t):
        t = (F.relu(t) + 1e-6) / F.softplus(self.scale)
        powered = t ** self.focusing_factor
        return powered * (t.norm(dim=-1, keepdim=True) / powered.norm(dim=-1, keepdim=True))

    def forward(self, x, H, W):
        b, n, c = x.shape
        k, v = self.kv(x).chunk(2, dim=-1)
        q = _split_heads(self._focus(self.q(x)), self.num_heads)
        k = _split_heads(self._focus(k + self.positional_encoding), self.num_heads)
        v = _split_heads(v, self.num_heads)
        denominator = q @ k.sum(dim=2, keepdim=True).transpose(-2, -1) + n * 1e-6
        wv = (q @ (k.transpose(-2, -1) @ v)) / denominator
        h, d = self.num_heads, c // self.num_heads
        local = self.dwc(v.reshape(b * h, H, W, d).permute(0, 3, 1, 2))
        local = local.reshape(b, h, d, n).permute(0, 3, 1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(_join_heads(wv) + local))


class PVTAttention(nn.Module):
    """PVT's softmax attention: `q` and `kv` Linears (no fused qkv), optional spatial reduction."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, sr_ratio=1):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.sr_ratio = sr_ratio

    def forward(self, x, H, W):
        q = _split_heads(self.q(x), self.num_heads)
        k, v = (_split_heads(t, self.num_heads) for t in self.kv(x).chunk(2, dim=-1))
        w = torch.softmax(self.scale * q @ k.transpose(-2, -1), dim=-1)
        return self.proj(_join_heads(self.attn_drop(w) @ v))


class PVTBlock(nn.Module):
    def __init__(self, dim, num_patches, num_heads, sr_ratio, attn_type):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = FocusedLinearAttention(dim, num_patches, num_heads, qkv_bias=True,
                                           sr_ratio=sr_ratio) if attn_type == "L" \
            else PVTAttention(dim, num_heads, qkv_bias=True, sr_ratio=sr_ratio)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = TimmMlp(dim, 4 * dim)

    def forward(self, x, H, W):
        x = x + self.attn(self.norm1(x), H, W)
        return x + self.mlp(self.norm2(x))


class PVTPatchEmbed(nn.Module):
    def __init__(self, img_size, patch_size, in_chans, dim):
        super().__init__()
        self.patch_size = patch_size
        self.H = self.W = img_size // patch_size
        self.num_patches = self.H * self.W
        self.proj = nn.Conv2d(in_chans, dim, patch_size, patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x = self.proj(x)
        return self.norm(x.flatten(2).transpose(1, 2)), x.shape[-2:]


class FLattenPVT(nn.Module):
    """Stages of `block{i}` behind `patch_embed{i}` (patch 4, then 2), no CLS token, the mean of
    the last stage's tokens classified; attn_type 'L' (FLatten) or 'S' (PVT softmax) per stage."""

    def __init__(self, img_size=32, in_chans=1, num_classes=5, embed_dims=(16, 32),
                 num_heads=(1, 2), depths=(2, 1), sr_ratios=(1, 1), attn_type="LS"):
        super().__init__()
        self.num_stages = len(depths)
        size = img_size
        for i in range(self.num_stages):
            patch = 4 if i == 0 else 2
            pe = PVTPatchEmbed(size, patch, in_chans if i == 0 else embed_dims[i - 1],
                               embed_dims[i])
            size //= patch
            setattr(self, f"patch_embed{i + 1}", pe)
            setattr(self, f"pos_embed{i + 1}",
                    nn.Parameter(torch.randn(1, pe.num_patches, embed_dims[i]) * 0.02))
            setattr(self, f"block{i + 1}", nn.ModuleList([
                PVTBlock(embed_dims[i], pe.num_patches, num_heads[i], sr_ratios[i], attn_type[i])
                for _ in range(depths[i])]))
        self.head = nn.Linear(embed_dims[-1], num_classes)

    def forward(self, x):
        b = x.shape[0]
        for i in range(1, self.num_stages + 1):
            x, (h, w) = getattr(self, f"patch_embed{i}")(x)
            x = x + getattr(self, f"pos_embed{i}")
            for blk in getattr(self, f"block{i}"):
                x = blk(x, h, w)
            if i != self.num_stages:
                x = x.reshape(b, h, w, -1).permute(0, 3, 1, 2)
        return self.head(x.mean(dim=1))


# ----------------------------------------------------------------------------- Agent (DeiT)
class AgentAttention(nn.Module):
    """The structure the dumper sees (agent tokens pooled from q, their biases). The forward
    keeps the released depthwise term `dwc` of V's grid added after the attention, but plain
    softmax attention stands in for the two agent softmaxes: the dumper refuses the family before
    any image runs, and a user's statement of another family is caught by the self-check."""

    def __init__(self, dim, num_heads=8, agent_num=4, window=4):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)
        self.agent_num, self.window = agent_num, window
        self.dwc = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.an_bias = nn.Parameter(torch.zeros(num_heads, agent_num, 7, 7))
        self.na_bias = nn.Parameter(torch.zeros(num_heads, agent_num, 7, 7))
        side = int(agent_num ** 0.5)
        self.pool = nn.AdaptiveAvgPool2d((side, side))

    def forward(self, x):
        b, n, c = x.shape
        side = int(math.isqrt(n - 1))
        q, k, v = (_split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        y = _join_heads(self.softmax(self.scale * q @ k.transpose(-2, -1)) @ v)
        grid = _join_heads(v)[:, 1:].transpose(1, 2).reshape(b, c, side, side)
        local = self.dwc(grid).flatten(2).transpose(1, 2)
        return self.proj(torch.cat([y[:, :1], y[:, 1:] + local], dim=1))


class AgentBlock(InLineBlock):
    def __init__(self, dim, num_heads, agent_num, window):
        super().__init__(dim, num_heads)
        self.attn = AgentAttention(dim, num_heads, agent_num, window)


class AgentDeiT(InLineDeiT):
    """Agent's DeiT: blocks before `agent_layer` use AgentAttention, the rest DeiT's softmax."""

    def __init__(self, agent_layer=2, depth=4, **kwargs):
        super().__init__(depth=depth, softmax_from=agent_layer, **kwargs)
        dim, heads = self.pos_embed.shape[-1], self.blocks[0].attn.num_heads
        side = self.patch_embed.grid_size[0]
        for i in range(agent_layer):
            self.blocks[i] = AgentBlock(dim, heads, agent_num=4, window=side)


# ----------------------------------------------------------------------------- refused, by structure
class PolaLinearAttention(nn.Module):
    """PolaFormer's attention in the PVT form: `qg` and `kv` Linears, the learnable `power`,
    `alpha`, a depthwise `dwc` and a learnable `scale`."""

    def __init__(self, dim, num_heads=2, kernel_size=5, alpha=4):
        super().__init__()
        self.num_heads, head_dim = num_heads, dim // num_heads
        self.qg = nn.Linear(dim, 2 * dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, padding=kernel_size // 2,
                             groups=head_dim)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, head_dim))
        self.alpha = alpha
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))


class RALA(nn.Module):
    """RAVLT's rank-augmented linear attention: one `qkvo` 1x1 convolution (C -> 4C) over a
    [B, C, H, W] map, `elu`, and a 1x1 convolution `proj`."""

    def __init__(self, dim, num_heads=2):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkvo = nn.Conv2d(dim, 4 * dim, 1)
        self.elu = nn.ELU()
        self.proj = nn.Conv2d(dim, dim, 1)


class RAVLT(nn.Module):
    """RAVLT nests its attentions as layers[i].blocks[j].attn, over 2-D feature maps."""

    def __init__(self, dim=16):
        super().__init__()
        self.layers = nn.ModuleList([nn.Module()])
        self.layers[0].blocks = nn.ModuleList([nn.Module()])
        self.layers[0].blocks[0].attn = RALA(dim)


class OneBlockModel(nn.Module):
    """`blocks[0].attn` holding any attention module (for the refusals)."""

    def __init__(self, attn):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Module()])
        self.blocks[0].attn = attn


class InLineWindowAttention(InLineAttention):
    """InLine-Swin's attention (models/inline_swin.py): InLine's structure called once per window,
    with `window_size`, `shift_size` and a `kernel_func` name (`phi` None for identity)."""

    def __init__(self, dim, window_size=(4, 4), num_heads=2, shift_size=0):
        super().__init__(dim, num_heads, qkv_bias=True)
        del self.window
        self.window_size, self.shift_size = window_size, shift_size
        self.kernel_func, self.phi = "identity", None
