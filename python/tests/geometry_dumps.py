"""Dumps of hierarchical geometry written straight from h5py (docs/dump-format.md, "Per-layer
geometry"), with the model's own `out` and `attn` computed here in float64 from the formulas,
apart from the C++ code they test:

- a PVT-shaped dump: stage 1 on an odd 9x9 grid whose keys come from a spatial reduction of
  sr = 2 (a 4x4 key grid: PVT's strided convolution floors), stage 2 on a 5x5 grid without
  reduction, other heads and head dim per stage, and families per stage (linear then softmax);
- a Swin-shaped dump: stage 1 on a 14x14 grid in 7x7 windows, one block unshifted and one shifted
  by 3 with the shifted-window mask, stage 2 on a 7x7 grid (one window) with more heads.
"""
from __future__ import annotations

import h5py
import numpy as np
import torch

from attnscope_dump.attention import attention_outputs


def _root(f, name, family, fmap, heads, dim, grid, layers, prefix=0):
    f.attrs.update(format="attnscope-dump", format_version=1, model_name=name,
                   attention_family=family, convention="code", feature_map=fmap,
                   scale=dim ** -0.5, num_layers=layers, num_heads=heads, head_dim=dim,
                   num_tokens=prefix + grid[0] * grid[1], grid_height=grid[0],
                   grid_width=grid[1], prefix_tokens=prefix)


def _weights(family, q, k, scale, fmap, mask=None):
    """Explicit weights in float64; mask: bool [.., nq, nk] of allowed pairs (Swin's -100)."""
    if family == "softmax":
        logits = scale * q @ k.transpose(-2, -1)
        if mask is not None:
            logits = logits + torch.where(mask, 0.0, -100.0).to(logits)
        return logits.softmax(-1)
    eye = torch.eye(k.shape[-2], dtype=k.dtype).expand(*k.shape[:-2], -1, -1)
    w = attention_outputs(family, q, k, eye, scale, fmap)
    assert mask is None, "the test dumps mask softmax layers only"
    return w


def _layer(f, l, family, fmap, q, k, v, scale, mask=None, attrs=None, with_attn=True):
    g = f.require_group(f"layers/{l}")
    g.attrs.update(attention_family=family, feature_map=fmap, convention="code", scale=scale,
                   **(attrs or {}))
    w = _weights(family, q, k, scale, fmap, mask)
    for name, t in (("q", q), ("k", k), ("v", v), ("out", w @ v)):
        g[name] = t.numpy().astype(np.float32)
    if with_attn:
        g["attn"] = w.numpy().astype(np.float32)
    return g


def pvt_dump(path, images=2, seed=0, families=(("linear", "relu"), ("softmax", "none"))):
    """Stage 1: 9x9 grid, 1 head x 8, keys 4x4 (sr 2); stage 2: 5x5 grid, 2 heads x 6."""
    gen = torch.Generator().manual_seed(seed)
    with h5py.File(path, "w") as f:
        _root(f, "pvt_standin", families[0][0], families[0][1], 1, 8, (9, 9), 2)
        stages = [((9, 9), (4, 4), 1, 8), ((5, 5), (5, 5), 2, 6)]
        for l, ((gh, gw), (kh, kw), h, d) in enumerate(stages):
            q = torch.randn(images, h, gh * gw, d, generator=gen, dtype=torch.float64)
            k = torch.randn(images, h, kh * kw, d, generator=gen, dtype=torch.float64)
            v = torch.randn(images, h, kh * kw, d, generator=gen, dtype=torch.float64)
            fam, fmap = families[l]
            attrs = dict(num_heads=h, head_dim=d, grid_height=gh, grid_width=gw, prefix_tokens=0)
            if (kh, kw) != (gh, gw):
                attrs.update(key_grid_height=kh, key_grid_width=kw)
            _layer(f, l, fam, fmap, q, k, v, d ** -0.5, attrs=attrs, with_attn=fam == "softmax")
    return path


def swin_windows(height, width, window, shift):
    """(positions [windows, T, 2], mask [windows, T, T] or None) of Swin's windows: the grid
    rolled by -shift, cut into window x window windows in row order; a token's position is its
    cell before the roll; the mask allows the pairs of one region of the shifted grid."""
    rows = (np.arange(height)[:, None] + shift) % height
    cols = (np.arange(width)[None, :] + shift) % width
    cell = np.stack(np.broadcast_arrays(rows, cols), -1)  # rolled grid -> original cell
    region = np.zeros((height, width), np.int64)
    if shift > 0:
        cuts = lambda n: (slice(0, n - window), slice(n - window, n - shift), slice(n - shift, n))
        for i, hs in enumerate(cuts(height)):
            for j, ws in enumerate(cuts(width)):
                region[hs, ws] = 3 * i + j
    def windows(a):
        a = a.reshape(height // window, window, width // window, window, *a.shape[2:])
        return a.swapaxes(1, 2).reshape(-1, window * window, *a.shape[4:])
    pos = windows(cell)
    if shift == 0:
        return pos, None
    reg = windows(region)
    return pos, reg[:, :, None] == reg[:, None, :]


def swin_dump(path, images=2, seed=0, drop_mask=False):
    """Stage 1: 14x14 in 7x7 windows, shift 0 then 3, 2 heads x 8; stage 2: 7x7, 4 heads x 8.
    Q, K, V per window are the window's tokens of one feature map per image, as Swin forms them.
    drop_mask: the shifted layer written without its mask and shift (a negative control)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [((14, 14), 7, 0, 2), ((14, 14), 7, 3, 2), ((7, 7), 7, 0, 4)]
    with h5py.File(path, "w") as f:
        _root(f, "swin_standin", "softmax", "none", 2, 8, (14, 14), len(blocks))
        for l, ((gh, gw), win, shift, h) in enumerate(blocks):
            pos, mask = swin_windows(gh, gw, win, shift)
            nw, t = pos.shape[:2]
            fmaps = [torch.randn(images, h, gh, gw, 8, generator=gen, dtype=torch.float64)
                     for _ in range(3)]
            r, c = torch.from_numpy(pos[..., 0]), torch.from_numpy(pos[..., 1])
            q, k, v = (m[:, :, r, c] for m in fmaps)  # [images, heads, windows, T, d]
            m = None if mask is None else torch.from_numpy(mask)
            attrs = dict(num_heads=h, head_dim=8, grid_height=gh, grid_width=gw,
                         prefix_tokens=0, windows=nw, window_height=win, window_width=win)
            if shift and not drop_mask:
                attrs["shift"] = shift
            g = _layer(f, l, "softmax", "none", q, k, v, 8 ** -0.5, mask=m, attrs=attrs)
            g["token_positions"] = pos.astype(np.int64)
            if m is not None and not drop_mask:
                g["window_mask"] = mask
    return path
