"""Stand-ins for the attention modules and models of the papers' released code, written from
their structure (attribute names, submodules, shapes) and their forward computation as read in:

* InLine (LeapLabTHU/InLine, models/inline_deit.py): `InLineAttention` in a DeiT
  `VisionTransformer` (`blocks` of `InLineBlock`, timm's PatchEmbed, `num_tokens` = 1);
* FLatten (LeapLabTHU/FLatten-Transformer, models/flatten_pvt.py): `FocusedLinearAttention` in
  a PVT (`block1`.., `patch_embed1`.. with H and W), stages 'L' (FLatten) or 'S' (PVT softmax);
* Agent attention (LeapLabTHU/Agent-Attention, agent_transformer/models/agent_deit.py): the
  DeiT whose first `agent_layer` blocks use `AgentAttention` and the others DeiT's softmax;
* PolaFormer (PolaLinearAttention, PVT form, as in third-party copies of its pola_pvt code; the
  official repository ZacharyMeng/PolaFormer holds no model file in the index read),
  MLLA (LeapLabTHU/MLLA models/mlla.py: LinearAttention with its RoPE buffer), RALA (qhfan/RALA
  classfication/RALA.py: GateLinearAttentionNoSilu) and MALA as released (qhfan/MALA
  classfication_release/model.py: AddLinearAttention), the last two called with the stage's RoPE
  sine and cosine;
* InLine's PVT attention (models/inline_pvt.py) and FLatten's PVT attention with spatial
  reduction, in the same PVT, with PVT's softmax `Attention` for 'S' stages;
* Swin (InLine models/inline_swin.py, FLatten models/flatten_swin.py): `layers` of blocks that
  roll and cut the map into windows, with patch merging between stages, and per stage InLine's
  or FLatten's window attention or Swin's softmax WindowAttention with its relative position
  bias;
* RAVLT's nesting: its attributes only, enough for the dumper to recognise and refuse it.

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
        k, v = self.kv(_reduced(self, x, H, W)).chunk(2, dim=-1)
        m = k.shape[1]  # key tokens: n, or the reduced grid's
        q = _split_heads(self._focus(self.q(x)), self.num_heads)
        k = _split_heads(self._focus(k + self.positional_encoding), self.num_heads)
        v = _split_heads(v, self.num_heads)
        denominator = q @ k.sum(dim=2, keepdim=True).transpose(-2, -1) + m * 1e-6
        wv = (q @ (k.transpose(-2, -1) @ v)) / denominator
        h, d = self.num_heads, c // self.num_heads
        if m != n:  # the DWC reads v stretched back to n tokens along the token order
            v = F.interpolate(v.transpose(-2, -1).reshape(b * h, d, m), size=n, mode="linear")
            v = v.reshape(b, h, d, n).transpose(-2, -1)
        local = self.dwc(v.reshape(b * h, H, W, d).permute(0, 3, 1, 2))
        local = local.reshape(b, h, d, n).permute(0, 3, 1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(_join_heads(wv) + local))


def _reduced(attn, x, H, W):
    """PVT's spatial reduction: the map through `sr` (kernel = stride = sr_ratio), then `norm`."""
    if attn.sr_ratio <= 1:
        return x
    b, n, c = x.shape
    return attn.norm(attn.sr(x.transpose(1, 2).reshape(b, c, H, W)).flatten(2).transpose(1, 2))


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
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x, H, W):
        q = _split_heads(self.q(x), self.num_heads)
        k, v = (_split_heads(t, self.num_heads)
                for t in self.kv(_reduced(self, x, H, W)).chunk(2, dim=-1))
        w = torch.softmax(self.scale * q @ k.transpose(-2, -1), dim=-1)
        return self.proj(_join_heads(self.attn_drop(w) @ v))


class PVTBlock(nn.Module):
    def __init__(self, dim, num_patches, num_heads, sr_ratio, attn_type):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        if attn_type == "P":
            self.attn = PolaLinearAttention(dim, num_patches, num_heads)
        elif attn_type == "I":
            self.attn = InLinePVTAttention(dim, num_heads, qkv_bias=True, sr_ratio=sr_ratio)
        elif attn_type == "L":
            self.attn = FocusedLinearAttention(dim, num_patches, num_heads, qkv_bias=True,
                                               sr_ratio=sr_ratio)
        else:
            self.attn = PVTAttention(dim, num_heads, qkv_bias=True, sr_ratio=sr_ratio)
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
    the last stage's tokens classified; attn_type 'L' (FLatten), 'P' (PolaFormer), 'I' (InLine's
    PVT form) or 'S' (PVT softmax) per stage."""

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
    """Agent tokens pooled from q's grid; agents gather from the tokens (softmax over keys, with
    the agent biases), tokens read from the agents (softmax over agents, with the token biases);
    the depthwise `dwc` of V's grid is added to the grid tokens after the attention."""

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
        h, a = num_heads, agent_num
        for name, shape in (("an_bias", (h, a, 7, 7)), ("na_bias", (h, a, 7, 7)),
                            ("ah_bias", (1, h, a, window, 1)), ("aw_bias", (1, h, a, 1, window)),
                            ("ha_bias", (1, h, window, 1, a)), ("wa_bias", (1, h, 1, window, a)),
                            ("ac_bias", (1, h, a, 1)), ("ca_bias", (1, h, 1, a))):
            setattr(self, name, nn.Parameter(torch.randn(shape) * 0.3))
        side = int(agent_num ** 0.5)
        self.pool = nn.AdaptiveAvgPool2d((side, side))

    def forward(self, x):
        b, n, c = x.shape
        side, h, a = int(math.isqrt(n - 1)), self.num_heads, self.agent_num
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        grid_q = q[:, 1:].transpose(1, 2).reshape(b, c, side, side)
        agents = _split_heads(self.pool(grid_q).flatten(2).transpose(1, 2), h)
        q, k, v = (_split_heads(t, h) for t in (q, k, v))
        # agents <- tokens: CLS column from ac_bias, grid columns from the resized table + row/col
        table = F.interpolate(self.an_bias, size=(self.window, self.window), mode="bilinear")
        to_tokens = table.reshape(1, h, a, -1) + (self.ah_bias + self.aw_bias).reshape(1, h, a, -1)
        to_tokens = torch.cat([self.ac_bias, to_tokens], dim=-1)
        gather = self.softmax(self.scale * agents @ k.transpose(-2, -1) + to_tokens)
        table = F.interpolate(self.na_bias, size=(self.window, self.window), mode="bilinear")
        to_agents = table.reshape(1, h, a, -1).transpose(-2, -1) \
            + (self.ha_bias + self.wa_bias).reshape(1, h, -1, a)
        to_agents = torch.cat([self.ca_bias, to_agents], dim=-2)
        read = self.softmax(self.scale * q @ agents.transpose(-2, -1) + to_agents)
        y = _join_heads(read @ (gather @ v))
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
    """PolaFormer's attention in the PVT form (sr_ratio 1): `qg` gives q and a gate, `kv` gives k
    (plus `positional_encoding`) and v; both divided by softplus(`scale`), split by sign and
    raised to 1 + alpha sigmoid(`power`); same-sign features read the first half of v, opposite-
    sign ones the second, each normalised with the released 1e-6 per key; `dwc` of v's grid added,
    the sum gated before `proj`."""

    def __init__(self, dim, num_patches=16, num_heads=2, kernel_size=5, alpha=4):
        super().__init__()
        self.num_heads, head_dim = num_heads, dim // num_heads
        self.qg = nn.Linear(dim, 2 * dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.sr_ratio = 1
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, padding=kernel_size // 2,
                             groups=head_dim)
        self.power = nn.Parameter(torch.randn(1, num_heads, 1, head_dim))
        self.alpha = alpha
        self.scale = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.positional_encoding = nn.Parameter(torch.randn(1, num_patches, dim) * 0.1)

    def forward(self, x, H, W):
        b, n, c = x.shape
        h = self.num_heads
        q, g = self.qg(x).chunk(2, dim=-1)
        k, v = self.kv(x).chunk(2, dim=-1)
        a = F.softplus(self.scale)
        p = 1 + self.alpha * torch.sigmoid(self.power)
        q, k = _split_heads(q / a, h), _split_heads((k + self.positional_encoding) / a, h)
        v = _split_heads(v, h)
        keys = torch.cat([F.relu(k) ** p, F.relu(-k) ** p], dim=-1)
        halves = torch.chunk(v, 2, dim=-1)
        outs = []
        for first, half in ((1, halves[0]), (-1, halves[1])):
            feats = torch.cat([F.relu(first * q) ** p, F.relu(-first * q) ** p], dim=-1)
            den = feats @ keys.mean(dim=2, keepdim=True).transpose(-2, -1) + 1e-6
            outs.append(feats @ (keys.transpose(-2, -1) @ half / n) / den)
        y = _join_heads(torch.cat(outs, dim=-1))
        d = c // h
        local = self.dwc(v.reshape(b * h, H, W, d).permute(0, 3, 1, 2))
        local = local.reshape(b, h, d, n).permute(0, 3, 1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj((y + local) * g))


class PolaWindowAttention(nn.Module):
    """PolaFormer's Swin form: one `qkvg` Linear, called once per window (attributes only)."""

    def __init__(self, dim, num_heads=2, window_size=(4, 4), alpha=4):
        super().__init__()
        self.num_heads, self.window_size, self.alpha = num_heads, window_size, alpha
        self.qkvg = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(dim, dim)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, dim // num_heads))
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


def _inline_wv(q, k, v, scale):
    """InLine's W V through the row sums: c2 q (K^T V) + (1 - S_i)/N sum_j v_j, c2 = scale/N."""
    n = k.shape[2]
    c2 = scale / n
    s = c2 * (q @ k.sum(dim=2, keepdim=True).transpose(-2, -1))
    return c2 * (q @ (k.transpose(-2, -1) @ v)) + (1 - s) / n * v.sum(dim=2, keepdim=True)


def _inline_local(x, v, kernels_of, gh, gw):
    """InLine's local residual over a gh x gw grid without prefix tokens: per image and channel
    a 3x3 kernel made from the token mean, applied with zero padding (written as 9 shifts)."""
    b, n, c = x.shape
    kernels = kernels_of(x.mean(dim=1)[:, :, None]).reshape(b, c, 3, 3)
    padded = F.pad(_join_heads(v).transpose(1, 2).reshape(b, c, gh, gw), (1, 1, 1, 1))
    local = sum(kernels[:, :, r, t, None, None] * padded[:, :, r:r + gh, t:t + gw]
                for r in range(3) for t in range(3))
    return local.flatten(2).transpose(1, 2)


class InLinePVTAttention(nn.Module):
    """InLine's attention in PVT (models/inline_pvt.py): `q` and `kv` Linears, `residual`, the
    sr/norm pair where sr_ratio > 1 (whose forward the released code cannot run: it reshapes k
    and v to the queries' token count; this one refuses likewise)."""

    def __init__(self, dim, num_heads=2, qkv_bias=False, sr_ratio=1):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
            self.norm = nn.LayerNorm(dim)
        self.residual = nn.Sequential(nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                                      nn.Conv1d(dim, 9 * dim, 1, groups=num_heads))

    def forward(self, x, H, W):
        if self.sr_ratio > 1:
            raise RuntimeError("k and v of the reduced grid do not reshape to the query tokens")
        h = self.num_heads
        q = _split_heads(self.q(x), h)
        k, v = (_split_heads(t, h) for t in self.kv(x).chunk(2, dim=-1))
        y = _join_heads(_inline_wv(q, k, v, self.scale)) + _inline_local(x, v, self.residual, H, W)
        return self.proj_drop(self.proj(y))


# ----------------------------------------------------------------------------- Swin
class InLineWindowAttention(nn.Module):
    """InLine-Swin's attention (models/inline_swin.py), called once per window with the block's
    mask, which it does not read: fused `qkv`, `window_size`, `shift_size` (never set by the
    block: 0), `phi` None for kernel_func 'identity'; InLine's W V and local residual over the
    window's square grid."""

    def __init__(self, dim, window_size=(4, 4), num_heads=2, shift_size=0, qkv_bias=True):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)
        self.shift_size = shift_size
        self.kernel_func, self.phi = "identity", None
        self.residual = nn.Sequential(nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                                      nn.Conv1d(dim, 9 * dim, 1, groups=num_heads))

    def forward(self, x, mask=None):
        b, n, c = x.shape
        side = int(math.isqrt(n))
        q, k, v = (_split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        y = _join_heads(_inline_wv(q, k, v, self.scale))
        return self.proj_drop(self.proj(y + _inline_local(x, v, self.residual, side, side)))


class FocusedWindowAttention(FocusedLinearAttention):
    """FLatten-Swin's FocusedLinearAttention (models/flatten_swin.py): fused `qkv`, a
    `positional_encoding` over the window's tokens, the block's mask not read; FLatten's linear
    attention per window and `dwc` over the window's square grid."""

    def __init__(self, dim, window_size=(4, 4), num_heads=2, focusing_factor=3, kernel_size=3):
        nn.Module.__init__(self)
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        head_dim = dim // num_heads
        self.focusing_factor = focusing_factor
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)
        self.dwc = nn.Conv2d(head_dim, head_dim, kernel_size, padding=kernel_size // 2,
                             groups=head_dim)
        self.scale = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.positional_encoding = nn.Parameter(
            torch.randn(1, window_size[0] * window_size[1], dim) * 0.1)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        h, d, side = self.num_heads, c // self.num_heads, int(math.isqrt(n))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = _split_heads(self._focus(q), h)
        k = _split_heads(self._focus(k + self.positional_encoding), h)
        v = _split_heads(v, h)
        wv = (q @ (k.transpose(-2, -1) @ v)) / (q @ k.sum(dim=2, keepdim=True).transpose(-2, -1)
                                                + n * 1e-6)
        local = self.dwc(v.reshape(b * h, side, side, d).permute(0, 3, 1, 2))
        local = local.reshape(b, c, n).transpose(1, 2)
        return self.proj_drop(self.proj(_join_heads(wv) + local))


class WindowAttention(nn.Module):
    """Swin's softmax window attention: fused `qkv`, a `relative_position_bias_table` indexed by
    the pairs' offsets and added to the logits, the block's mask added too."""

    def __init__(self, dim, window_size=(4, 4), num_heads=2):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.scale = (dim // num_heads) ** -0.5
        wh, ww = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.randn((2 * wh - 1) * (2 * ww - 1), num_heads) * 0.02)
        rows, cols = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")
        dr = rows.flatten()[:, None] - rows.flatten()[None, :] + wh - 1
        dc = cols.flatten()[:, None] - cols.flatten()[None, :] + ww - 1
        self.register_buffer("relative_position_index", dr * (2 * ww - 1) + dc)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        b, n, c = x.shape
        q, k, v = (_split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))
        logits = self.scale * q @ k.transpose(-2, -1) + self.relative_position_bias_table[
            self.relative_position_index].permute(2, 0, 1)
        if mask is not None:
            nw = mask.shape[0]
            logits = (logits.reshape(b // nw, nw, self.num_heads, n, n) + mask[:, None]) \
                .reshape(b, self.num_heads, n, n)
        return self.proj(_join_heads(self.attn_drop(self.softmax(logits)) @ v))


class SwinBlock(nn.Module):
    """Swin's block: roll the map by -shift, cut it into windows (images first, then windows row
    by row), attend per window with the shifted-window mask (-100 between regions of the rolled
    grid), put the windows back and roll by +shift; a window as large as the map: no shift."""

    def __init__(self, dim, input_resolution, num_heads, window_size, shift_size, attn_type):
        super().__init__()
        self.dim, self.input_resolution = dim, input_resolution
        self.window_size, self.shift_size = window_size, shift_size
        if min(input_resolution) <= window_size:
            self.window_size, self.shift_size = min(input_resolution), 0
        ws = (self.window_size, self.window_size)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = {"I": lambda: InLineWindowAttention(dim, ws, num_heads),
                     "L": lambda: FocusedWindowAttention(dim, ws, num_heads),
                     "S": lambda: WindowAttention(dim, ws, num_heads)}[attn_type]()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = TimmMlp(dim, 4 * dim)
        mask = None
        if self.shift_size > 0:
            h, w = input_resolution
            region = torch.zeros(h, w)
            cuts = (0, h - self.window_size, h - self.shift_size, h)
            for i in range(3):
                for j in range(3):
                    region[cuts[i]:cuts[i + 1], cuts[j]:cuts[j + 1]] = 3 * i + j
            labels = self._partition(region[None, :, :, None]).flatten(1)
            mask = (labels[:, None, :] != labels[:, :, None]).float() * -100.0
        self.register_buffer("attn_mask", mask)

    def _partition(self, x):
        b, h, w, c = x.shape
        ws = self.window_size
        x = x.reshape(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, ws * ws, c)

    def forward(self, x):
        h, w = self.input_resolution
        b, n, c = x.shape
        ws, s = self.window_size, self.shift_size
        y = torch.roll(self.norm1(x).reshape(b, h, w, c), (-s, -s), (1, 2))
        y = self.attn(self._partition(y), mask=self.attn_mask)
        y = y.reshape(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        x = x + torch.roll(y, (s, s), (1, 2)).reshape(b, n, c)
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    """2x2 neighbours concatenated (C -> 4C), normalised, reduced to 2C."""

    def __init__(self, input_resolution, dim):
        super().__init__()
        self.input_resolution = input_resolution
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        h, w = self.input_resolution
        b, _, c = x.shape
        x = x.reshape(b, h, w, c)
        x = torch.cat([x[:, r::2, t::2] for t in (0, 1) for r in (0, 1)], dim=-1)
        return self.reduction(self.norm(x.reshape(b, -1, 4 * c)))


class BasicLayer(nn.Module):
    def __init__(self, dim, resolution, depth, num_heads, window_size, attn_type, merge):
        super().__init__()
        self.blocks = nn.ModuleList([
            SwinBlock(dim, resolution, num_heads, window_size,
                      0 if i % 2 == 0 else window_size // 2, attn_type) for i in range(depth)])
        self.downsample = PatchMerging(resolution, dim) if merge else None

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x if self.downsample is None else self.downsample(x)


class SwinModel(nn.Module):
    """Swin: a 4x4 patch embedding, `layers` of BasicLayer (blocks alternating shift 0 and
    window // 2, then patch merging), the tokens' mean classified; attn_type per stage: 'I'
    (InLine-Swin), 'L' (FLatten-Swin) or 'S' (Swin's softmax), e.g. 'IS' as InLine's 'IIIS'."""

    def __init__(self, img_size=32, in_chans=1, num_classes=5, embed_dim=16, depths=(2, 2),
                 num_heads=(2, 4), window_size=4, attn_type="II"):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, 4, 4)
        res = img_size // 4
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            self.layers.append(BasicLayer(embed_dim * 2 ** i, (res // 2 ** i, res // 2 ** i),
                                          depth, num_heads[i], window_size, attn_type[i],
                                          merge=i < len(depths) - 1))
        self.head = nn.Linear(embed_dim * 2 ** (len(depths) - 1), num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


# ----------------------------------------------------------------------------- RoPE families
class MllaRoPE(nn.Module):
    """MLLA's RoPE over a gh x gw grid of C channels, kept as float32 cos/sin in `rotations`
    [gh, gw, C/2, 2]: pair P < C/4 turns by row * theta_P, the others by col * theta_(P - C/4),
    theta_m = 10000^(-m / (C/4)), all in float32 as the released module builds them."""

    def __init__(self, gh, gw, dim, base=10000):
        super().__init__()
        k_max = dim // 4
        theta = 1 / (base ** (torch.arange(k_max) / k_max))  # float32
        rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        angles = torch.cat([rows[..., None] * theta, cols[..., None] * theta], dim=-1)
        self.register_buffer("rotations", torch.stack([angles.cos(), angles.sin()], dim=-1))

    def forward(self, x):  # x [b, gh, gw, C]
        pairs = x.float().reshape(*x.shape[:-1], -1, 2)
        c, s = self.rotations[..., 0], self.rotations[..., 1]
        turned = torch.stack([pairs[..., 0] * c - pairs[..., 1] * s,
                              pairs[..., 0] * s + pairs[..., 1] * c], dim=-1)
        return turned.flatten(-2)


class LinearAttention(nn.Module):
    """MLLA's linear attention: `qk` Linear, v the input itself, ELU+1, the numerator rotated,
    z = 1 / (q . mean k + 1e-6) unrotated, plus `lepe` (3x3 depthwise) of v's grid."""

    def __init__(self, dim, grid, num_heads):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.qk = nn.Linear(dim, 2 * dim)
        self.elu = nn.ELU()
        self.lepe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.rope = MllaRoPE(grid[0], grid[1], dim)

    def forward(self, x):
        b, n, c = x.shape
        side, h = int(n ** 0.5), self.num_heads
        q, k = self.qk(x).chunk(2, dim=-1)
        q, k = self.elu(q) + 1.0, self.elu(k) + 1.0
        rq = _split_heads(self.rope(q.reshape(b, side, side, c)).reshape(b, n, c), h)
        rk = _split_heads(self.rope(k.reshape(b, side, side, c)).reshape(b, n, c), h)
        q, k, v = _split_heads(q, h), _split_heads(k, h), _split_heads(x, h)
        z = 1 / (q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) + 1e-6)
        y = _join_heads(rq @ (rk.transpose(-2, -1) @ v / n) * z)
        return y + self.lepe(x.transpose(1, 2).reshape(b, c, side, side)).flatten(2).transpose(1, 2)


class MllaBlock(nn.Module):
    def __init__(self, dim, grid, num_heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, dim)
        self.attn = LinearAttention(dim, grid, num_heads)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.out_proj(self.attn(self.in_proj(self.norm1(x))))


class MllaModel(nn.Module):
    """One stage of MLLA blocks over timm's PatchEmbed grid, no prefix token."""

    def __init__(self, img_size=16, patch_size=2, in_chans=1, num_classes=5, dim=32, depth=2,
                 num_heads=2):
        super().__init__()
        self.num_prefix_tokens = 0
        self.patch_embed = TimmPatchEmbed(img_size, patch_size, in_chans, dim)
        self.blocks = nn.ModuleList([MllaBlock(dim, self.patch_embed.grid_size, num_heads)
                                     for _ in range(depth)])
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x.mean(dim=1))


def _turn_every_two(x, sin, cos):
    """RetNet-style rotation: pairs (2p, 2p+1) -> (x0 c - x1 s, x1 c + x0 s), sin/cos per channel."""
    pairs = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos + pairs * sin


class StageRoPE(nn.Module):
    """RALA's and MALA's RoPE: per head f = d/4 frequencies 10000^-linspace(0, 1, f), each used
    for a pair; rows on the first half of the channels, columns on the second; float32."""

    def __init__(self, dim, num_heads):
        super().__init__()
        freq = 1.0 / (10000 ** torch.linspace(0, 1, dim // num_heads // 4))
        self.register_buffer("freq", freq.repeat_interleave(2))

    def forward(self, gh, gw):
        rows = torch.arange(gh).to(self.freq)[:, None] * self.freq
        cols = torch.arange(gw).to(self.freq)[:, None] * self.freq
        ang = torch.cat([rows[:, None].expand(gh, gw, -1), cols[None].expand(gh, gw, -1)], -1)
        return ang.sin().flatten(0, 1), ang.cos().flatten(0, 1)


class _QkvoAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkvo = nn.Conv2d(dim, 4 * dim, 1)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.elu = nn.ELU()

    def split(self, x):
        b, c, gh, gw = x.shape
        t = self.qkvo(x)
        qkv, gate = t[:, :3 * c], t[:, 3 * c:]
        heads = qkv.reshape(b, 3, self.num_heads, self.head_dim, gh * gw).transpose(-2, -1)
        return heads[:, 0], heads[:, 1], heads[:, 2], gate, self.lepe(qkv[:, 2 * c:])

    def finish(self, y, gate, lepe):
        b, c, gh, gw = lepe.shape
        return self.proj((y.transpose(-2, -1).reshape(b, c, gh, gw) + lepe) * gate)


class GateLinearAttentionNoSilu(_QkvoAttention):
    """RALA: keys re-weighted by N softmax_j(s mean(q) . k_j), then MLLA's RoPE-numerator form."""

    def forward(self, x, sin, cos):
        q, k, v, gate, lepe = self.split(x)
        n = q.shape[2]
        q, k = self.elu(q) + 1.0, self.elu(k) + 1.0
        w = torch.softmax(self.scale * q.mean(dim=2, keepdim=True) @ k.transpose(-1, -2), -1)
        k = k * w.transpose(-1, -2) * n
        z = 1 / (q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = _turn_every_two(k, sin, cos).transpose(-2, -1) @ v / n
        return self.finish(_turn_every_two(q, sin, cos) @ kv * z, gate, lepe)


class AddLinearAttention(_QkvoAttention):
    """MALA as released: z = s q . mean k unrotated, the numerator rotated,
    (s/N) R q (R K^T V) (1 + 1/(z + 1e-6)) - z mean v."""

    def forward(self, x, sin, cos):
        q, k, v, gate, lepe = self.split(x)
        n = q.shape[2]
        q, k = self.elu(q) + 1.0, self.elu(k) + 1.0
        z = self.scale * q @ k.mean(dim=2, keepdim=True).transpose(-2, -1)
        kv = _turn_every_two(k, sin, cos).transpose(-2, -1) @ v * (self.scale / n)
        y = _turn_every_two(q, sin, cos) @ kv * (1 + 1 / (z + 1e-6)) - z * v.mean(2, keepdim=True)
        return self.finish(y, gate, lepe)


class RopeStageBlock(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn
        self.norm = nn.GroupNorm(1, attn.dim)

    def forward(self, x, sin, cos):
        return x + self.attn(self.norm(x), sin, cos)


class RopeStageModel(nn.Module):
    """One stage of RALA ('rala') or released-MALA ('mala') blocks on a 2-D map, the stage's RoPE
    computed once per forward and passed to every block; no prefix token."""

    def __init__(self, kind="mala", img_size=16, patch_size=2, in_chans=1, num_classes=5,
                 dim=32, depth=2, num_heads=2):
        super().__init__()
        cls = AddLinearAttention if kind == "mala" else GateLinearAttentionNoSilu
        self.num_prefix_tokens = 0
        self.patch_embed = TimmPatchEmbed(img_size, patch_size, in_chans, dim)
        self.RoPE = StageRoPE(dim, num_heads)
        self.blocks = nn.ModuleList([RopeStageBlock(cls(dim, num_heads)) for _ in range(depth)])
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed.proj(x)
        sin, cos = self.RoPE(*x.shape[-2:])
        for blk in self.blocks:
            x = blk(x, sin, cos)
        return self.head(x.mean(dim=(2, 3)))


# ----------------------------------------------------------------------------- CSwin
def _stripes(t, gh, gw, h_sp, w_sp):
    """[B, N, C] on a gh x gw grid -> [B * stripes, h_sp * w_sp, C], stripes row by row."""
    b, _, c = t.shape
    t = t.transpose(1, 2).reshape(b, c, gh // h_sp, h_sp, gw // w_sp, w_sp)
    return t.permute(0, 2, 4, 3, 5, 1).reshape(-1, h_sp * w_sp, c)


def _unstripe(t, b, gh, gw, h_sp, w_sp):
    c = t.shape[-1]
    t = t.reshape(b, gh // h_sp, gw // w_sp, h_sp, w_sp, c).permute(0, 5, 1, 3, 2, 4)
    return t.reshape(b, c, gh * gw).transpose(1, 2)


class InLineStripeAttention(nn.Module):
    """InLine's CSwin attention (InLineAttention of models/inline_cswin.py): one branch of a CSwin
    block, called with the block's stacked q, k, v (its channels) and the mean of the block's
    input, attending within vertical (idx 0: H_sp = the height, W_sp = split_size) or horizontal
    (idx 1) stripes, or the whole map (idx -1); per stripe InLine's W V, plus the local residual
    (3x3 kernels made by `residual` from the input mean, per image, over the stripe's grid) plus
    LePE (`get_v`, a 3x3 depthwise convolution of the stripe's v). The released InLine-CSwin runs
    these branches on the whole map (its split size is the stage's resolution); with stripes
    each stripe of an image takes the image's kernels."""

    def __init__(self, dim, resolution, idx, split_size, num_heads):
        super().__init__()
        self.dim, self.resolution, self.idx, self.num_heads = dim, resolution, idx, num_heads
        self.split_size = split_size
        self.H_sp, self.W_sp = ((resolution, resolution) if idx == -1 else
                                (resolution, split_size) if idx == 0 else (split_size, resolution))
        self.scale = (dim // num_heads) ** -0.5
        self.get_v = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.residual = nn.Sequential(nn.Conv1d(dim, dim, 1, groups=num_heads), nn.GELU(),
                                      nn.Conv1d(dim, 9 * dim, 1, groups=num_heads))
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, qkv, x_mean):
        q, k, v = qkv[0], qkv[1], qkv[2]
        b, _, c = q.shape
        r, hs, ws = self.resolution, self.H_sp, self.W_sp
        vs = _stripes(v, r, r, hs, ws)
        grid = vs.transpose(1, 2).reshape(-1, c, hs, ws)
        lepe = self.get_v(grid).flatten(2).transpose(1, 2)
        q, k, v = (_split_heads(t, self.num_heads) for t in
                   (_stripes(q, r, r, hs, ws), _stripes(k, r, r, hs, ws), vs))
        stripes = grid.shape[0] // b
        kernels = self.residual(x_mean[:, :, None]).reshape(b, c, 3, 3)
        kernels = kernels.repeat_interleave(stripes, dim=0).reshape(-1, 1, 3, 3)
        res = F.conv2d(grid.reshape(1, -1, hs, ws), kernels, padding=1, groups=kernels.shape[0])
        y = _join_heads(_inline_wv(q, k, v, self.scale)) + \
            res.reshape(-1, c, hs * ws).transpose(1, 2) + lepe
        return _unstripe(y, b, r, r, hs, ws)


class LePEAttention(nn.Module):
    """CSwin's softmax branch: softmax within the stripes plus LePE, a 3x3 depthwise convolution
    (`get_v`) of v's stripe grid."""

    def __init__(self, dim, resolution, idx, split_size, num_heads):
        super().__init__()
        self.dim, self.resolution, self.idx, self.num_heads = dim, resolution, idx, num_heads
        self.split_size = split_size
        self.H_sp, self.W_sp = ((resolution, resolution) if idx == -1 else
                                (resolution, split_size) if idx == 0 else (split_size, resolution))
        self.scale = (dim // num_heads) ** -0.5
        self.get_v = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, qkv, x_mean):  # x_mean: unused, as in the released class
        q, k, v = qkv[0], qkv[1], qkv[2]
        b = q.shape[0]
        r, hs, ws = self.resolution, self.H_sp, self.W_sp
        vs = _stripes(v, r, r, hs, ws)
        lepe = self.get_v(vs.transpose(1, 2).reshape(-1, self.dim, hs, ws)).flatten(2)
        q, k = (_split_heads(_stripes(t, r, r, hs, ws), self.num_heads) for t in (q, k))
        v = _split_heads(vs, self.num_heads)  # v is cut into stripes once, as LePE's input
        w = torch.softmax(self.scale * q @ k.transpose(-2, -1), dim=-1)
        y = _join_heads(w @ v) + lepe.transpose(1, 2)
        return _unstripe(y, b, r, r, hs, ws)


class CSwinBlock(nn.Module):
    """A CSwin block (CSWinBlock): `qkv`, the channels split in two branches (`attns`: vertical
    then horizontal stripes, half the heads each; one branch over the whole map when the stripe is the
    map), `proj`; attn_type 'I' (InLine's) or 'S' (CSwin's softmax with LePE)."""

    def __init__(self, dim, resolution, num_heads, split_size, attn_type):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm1 = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        cls = InLineStripeAttention if attn_type == "I" else LePEAttention
        last = split_size >= resolution
        self.branch_num = 1 if last else 2
        d, h = dim // self.branch_num, num_heads // self.branch_num
        self.attns = nn.ModuleList([cls(d, resolution, -1 if last else i, split_size, h)
                                    for i in range(self.branch_num)])

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, c).permute(2, 0, 1, 3)  # [3, B, N, C]
        mean = x.mean(dim=1)
        if self.branch_num == 1:
            y = self.attns[0](qkv, mean)
        else:
            h = c // 2
            y = torch.cat([a(qkv[..., i * h:(i + 1) * h], mean[:, i * h:(i + 1) * h])
                           for i, a in enumerate(self.attns)], -1)
        return x + self.proj(y)


class CSwinModel(nn.Module):
    """CSwin: a 4x4 patch embedding, stages `stage1`, `stage2` of CSwinBlock with a strided
    convolution (`merge1`) between them, the tokens' mean classified; attn_type per stage, e.g.
    'IS' as InLine-CSwin's 'IISS'."""

    def __init__(self, img_size=32, in_chans=1, num_classes=5, dim=16, num_heads=(2, 4),
                 split_size=(2, 4), attn_type="IS"):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_chans, dim, 4, 4)
        r = img_size // 4
        self.stage1 = nn.ModuleList([CSwinBlock(dim, r, num_heads[0], split_size[0],
                                                attn_type[0])])
        self.merge1 = nn.Conv2d(dim, 2 * dim, 3, 2, 1)
        self.stage2 = nn.ModuleList([CSwinBlock(2 * dim, r // 2, num_heads[1], split_size[1],
                                                attn_type[1])])
        self.head = nn.Linear(2 * dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        b, c, h, w = x.shape
        x = x.flatten(2).transpose(1, 2)
        for blk in self.stage1:
            x = blk(x)
        x = self.merge1(x.transpose(1, 2).reshape(b, c, h, w)).flatten(2).transpose(1, 2)
        for blk in self.stage2:
            x = blk(x)
        return self.head(x.mean(dim=1))


# ----------------------------------------------------------------------------- RAVLT / MALA stages
class VanillaSelfAttention(_QkvoAttention):
    """RAVLT's and MALA's softmax stages: RALA's convolutions, q and k rotated by the stage's RoPE,
    softmax(s q k^T) V, then MALA's and RALA's lepe and gate."""

    def __init__(self, dim, num_heads):
        super().__init__(dim, num_heads)
        del self.elu  # the softmax stages have no ELU map

    def forward(self, x, sin, cos):
        q, k, v, gate, lepe = self.split(x)
        q, k = _turn_every_two(q, sin, cos), _turn_every_two(k, sin, cos)
        w = torch.softmax(self.scale * q @ k.transpose(-1, -2), dim=-1)
        return self.finish(w @ v, gate, lepe)


class RopeStage(nn.Module):
    """One stage: its `RoPE`, `blocks` (RopeStageBlock) and a stride-2 convolution (`downsample`)
    to the next stage's map."""

    def __init__(self, attns, dim, out_dim):
        super().__init__()
        self.RoPE = StageRoPE(dim, attns[0].num_heads)
        self.blocks = nn.ModuleList([RopeStageBlock(a) for a in attns])
        self.downsample = None
        if out_dim:
            self.downsample = nn.Module()
            self.downsample.reduction = nn.Conv2d(dim, out_dim, 3, 2, 1)

    def forward(self, x):
        sin, cos = self.RoPE(*x.shape[-2:])
        for blk in self.blocks:
            x = blk(x, sin, cos)
        return x if self.downsample is None else self.downsample.reduction(x)


class RavltModel(nn.Module):
    """RAVLT ('rala') or MALA ('mala') as released: `layers[i]` stages over 2-D maps, flags per
    stage 'l' (the linear attention) or 'v' (VanillaSelfAttention), e.g. 'llvv' for linear in
    stages 1-2 and softmax in 3-4; a 4x4 patch embedding, no prefix token."""

    def __init__(self, kind="rala", flags="lv", in_chans=1, num_classes=5, dims=(16, 32),
                 num_heads=(2, 2), depth=1):
        super().__init__()
        lin = AddLinearAttention if kind == "mala" else GateLinearAttentionNoSilu
        self.patch_embed = nn.Conv2d(in_chans, dims[0], 4, 4)
        self.layers = nn.ModuleList()
        for i, f in enumerate(flags):
            cls = lin if f == "l" else VanillaSelfAttention
            self.layers.append(RopeStage([cls(dims[i], num_heads[i]) for _ in range(depth)],
                                         dims[i], dims[i + 1] if i + 1 < len(flags) else None))
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))
