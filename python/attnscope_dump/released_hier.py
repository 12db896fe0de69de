"""Captures of the released hierarchical attention modules, each with its layer's geometry in the
per-layer format of docs/dump-format.md ("Per-layer geometry"):

* PVT's softmax `Attention` (the 'S' stages of InLine-PVT and FLatten-PVT) and FLatten's
  FocusedLinearAttention, PVT form, with spatial reduction (`sr_ratio` > 1): keys and values from
  the strided convolution's grid, `key_grid_height/width` = grid // sr_ratio;
* InLine's attention in the PVT form (`q` and `kv` Linears; `sr_ratio` 1: the released forward
  reshapes k and v to the queries' token count, so it cannot run with a reduction);
* InLine's and FLatten's window attention of Swin: the module is called once per window (the
  block rolls the map by -shift and cuts it into windows); q, k, v, out and local are stored per
  window, [images, heads, windows, T, d], with each window token's cell and the allowed pairs.
  Neither module reads the `mask` its block passes: their shifted windows attend across the
  regions of the rolled grid, and the stored `window_mask` allows every pair, which is what they
  compute.

Each site's `geometry()` gives the layer's extra attributes and arrays; the dumper writes them.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .released import (InLineDeiTSite, _heads, _LocalSite, _merged, depthwise_conv,  # noqa: F401
                       inline_kernels)


def reduced_grid(gh: int, gw: int, sr: int) -> tuple[int, int]:
    """The output grid of PVT's Conv2d(kernel = stride = sr), no padding."""
    return (gh - sr) // sr + 1, (gw - sr) // sr + 1


class _ReducedKeys:
    """Mixin: keys from the grid of the module's `sr` convolution when `sr_ratio` > 1."""

    def geometry(self):
        sr = int(getattr(self.m, "sr_ratio", 1))
        if sr <= 1:
            return {}, {}
        gh, gw, prefix = self.layout
        if prefix != 0:
            raise ValueError(f"{self.info.structure}: spatial reduction with {prefix} prefix "
                             "tokens; PVT has none")
        kh, kw = reduced_grid(gh, gw, sr)
        return {"key_grid_height": kh, "key_grid_width": kw}, {}


class PVTSoftmaxSite(_ReducedKeys, _LocalSite):
    """PVT's softmax Attention: `q` gives q; `kv`, applied to the input or to its spatial
    reduction (sr then norm), gives k and v; softmax(scale q k^T) v is proj's input."""

    hint = "the attention module was not called"

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        hooks = [m.q.register_forward_hook(lambda _m, _i, o: store.update(q=_heads(o, h))),
                 m.kv.register_forward_hook(lambda _m, _i, o: store.update(
                     k=_heads(o.chunk(2, dim=-1)[0], h), v=_heads(o.chunk(2, dim=-1)[1], h)))]
        if want_attn:
            hooks.append(m.attn_drop.register_forward_hook(
                lambda _m, inp, _o: store.update(attn=inp[0])))
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(
                lambda _m, inp: store.update(out=_heads(inp[0], h))))
        return hooks


class InLinePVTSite(InLineDeiTSite):
    """InLine's attention, PVT form (models/inline_pvt.py), sr_ratio 1: q from `q`, k and v from
    `kv`; otherwise InLine DeiT's (W V in the inline code form, the local residual from
    `residual`'s kernels over V's grid, no prefix tokens)."""

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_kv(_mod, _inp, o):
            k, v = o.chunk(2, dim=-1)
            store.update(k=_heads(k, h), v=_heads(v, h))

        hooks = [m.q.register_forward_hook(lambda _m, _i, o: store.update(q=_heads(o, h))),
                 m.kv.register_forward_hook(on_kv),
                 m.residual.register_forward_hook(lambda _m, _i, o: store.update(kernels=o))]
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(
                lambda _m, inp: self._finish(store, inp[0], self.local(store))))
        return hooks

    def geometry(self):
        return {}, {}


def flatten_features(m: nn.Module, t: torch.Tensor) -> torch.Tensor:
    """q or k [B, N, C] as the family takes them. FLatten prepares them as ReLU + 1e-6 divided
    by softplus(`scale`), then focuses r -> r^p |r| / |r^p| with norms over all C channels, every
    head's together. With one head that is the family's focused map (per head), applied by the
    reader to the prepared values stored; with more heads it is not (the per-head norms differ),
    so the module's focused features themselves are stored, the map recorded as identity."""
    r = (F.relu(t) + 1e-6) / F.softplus(m.scale)
    if int(m.num_heads) == 1:
        return r
    p = float(m.focusing_factor)
    powered = r ** p
    return powered / powered.norm(dim=-1, keepdim=True) * r.norm(dim=-1, keepdim=True)


def _dwc_local(o: torch.Tensor, tokens: int, h: int) -> torch.Tensor:
    """FLatten's `dwc` output [B*H, d, gh, gw] as the module adds it: reshaped to [B, C, N]
    (channel = head * d + t), i.e. [B, H, N, d]."""
    bh, d = o.shape[:2]
    return _heads(o.reshape(bh // h, h * d, tokens).transpose(1, 2), h)


class FLattenPVTSite(_ReducedKeys, _LocalSite):
    """FLatten's FocusedLinearAttention, PVT form (models/flatten_pvt.py), any sr_ratio: `q` and
    `kv` Linears (kv of the spatially reduced map when sr_ratio > 1), `positional_encoding` added
    to k, ReLU + 1e-6, divided by softplus(`scale`), the focused map, linear attention; the local
    term is `dwc`'s output as the module adds it (with sr_ratio > 1 the module first stretches v
    back to the query tokens by linear interpolation over the token order: that is its DWC's
    input)."""

    def _prepared(self, t: torch.Tensor) -> torch.Tensor:
        return flatten_features(self.m, t)

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_q(_mod, _inp, o):
            store.update(q=_heads(self._prepared(o), h), tokens=o.shape[1])

        def on_kv(_mod, _inp, o):
            k, v = o.chunk(2, dim=-1)
            store.update(k=_heads(self._prepared(k + m.positional_encoding), h), v=_heads(v, h))

        # with sr_ratio > 1 the dwc filters v stretched back by interpolation, not v itself: its
        # kernel is then no map from the layer's keys, and is not recorded
        conv = depthwise_conv(m.dwc, h, True) if int(getattr(m, "sr_ratio", 1)) <= 1 else None
        hooks = [m.q.register_forward_hook(on_q), m.kv.register_forward_hook(on_kv),
                 m.dwc.register_forward_hook(lambda _m, _i, o: store.update(
                     dwc=_dwc_local(o, store["tokens"], h)))]
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(
                lambda _m, inp: self._finish_conv(store, inp[0], store["dwc"], conv)))
        return hooks


# ----------------------------------------------------------------------------- Swin windows
def swin_window_positions(gh: int, gw: int, window: int, shift: int) -> np.ndarray:
    """[windows, T, 2]: the (row, col) of the unshifted grid of each window token, windows in
    Swin's order (the map rolled by -shift, cut row by row into window x window windows)."""
    rows = (np.arange(gh)[:, None] + shift) % gh
    cols = (np.arange(gw)[None, :] + shift) % gw
    cell = np.stack(np.broadcast_arrays(rows, cols), -1)
    cell = cell.reshape(gh // window, window, gw // window, window, 2).swapaxes(1, 2)
    return cell.reshape(-1, window * window, 2).astype(np.int64)


class _WindowSite(_LocalSite):
    """A module called once per window by a Swin block (`layers[i].blocks[j]`): its input is
    [images * windows, T, C], images first; `set_windowing` gives the block's window size and
    shift. Captured [images * windows, H, T, d] tensors are stored [images, H, windows, T, d]."""

    window = shift = None

    def set_windowing(self, window: int, shift: int) -> None:
        self.window, self.shift = int(window), int(shift)

    def geometry(self):
        gh, gw, prefix = self.layout
        if self.window is None:
            raise ValueError(f"{self.info.structure}: window attention outside a Swin block "
                             "(layers[i].blocks[j] with window_size, shift_size and "
                             "input_resolution): its windows are unknown")
        ws = self.window
        if prefix != 0 or gh % ws or gw % ws:
            raise ValueError(f"{self.info.structure}: a {gh}x{gw} grid with {prefix} prefix "
                             f"tokens is not cut into {ws}x{ws} windows")
        nw = (gh // ws) * (gw // ws)
        attrs = {"windows": nw, "window_height": ws, "window_width": ws}
        arrays = {"token_positions": swin_window_positions(gh, gw, ws, self.shift)}
        if self.shift > 0:  # the module ignores its block's mask: every pair within a window
            attrs["shift"] = self.shift
            arrays["window_mask"] = np.ones((nw, ws * ws, ws * ws), dtype=bool)
        return attrs, arrays

    def _windows(self, t: torch.Tensor) -> torch.Tensor:
        """[B*W, H, T, d] -> [B, H, W, T, d]."""
        gh, gw, _ = self.layout
        nw = (gh // self.window) * (gw // self.window)
        bw, h, n, d = t.shape
        return t.reshape(bw // nw, nw, h, n, d).transpose(1, 2)

    def _finish_windows(self, store, before_proj, local, conv=None):
        h = self.info.num_heads
        if conv is not None:
            store["local_conv"] = conv
        out = _heads(before_proj, h) - local
        store.update(out=self._windows(out), local=self._windows(local),
                     q=self._windows(store.pop("q_flat")), k=self._windows(store.pop("k_flat")),
                     v=self._windows(store.pop("v_flat")))


class InLineSwinSite(_WindowSite):
    """InLine's window attention (models/inline_swin.py, kernel_func 'identity': `phi` None):
    fused `qkv`; per window, W V in the inline code form with c2 = scale / T and the local
    residual: kernels made from the window's token mean by `residual`, a 3x3 filter of V's
    window grid with zero padding at the window's border."""

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_qkv(_mod, _inp, o):
            q, k, v = o.chunk(3, dim=-1)
            store.update(q_flat=_heads(q, h), k_flat=_heads(k, h), v_flat=_heads(v, h))

        hooks = [m.qkv.register_forward_hook(on_qkv),
                 m.residual.register_forward_hook(lambda _m, _i, o: store.update(kernels=o))]
        # without want_out the windows are still stored: the proj hook does it
        hooks.append(m.proj.register_forward_pre_hook(
            lambda _m, inp: self._finish_windows(store, inp[0], self.local(store))))
        return hooks

    def local(self, store) -> torch.Tensor:
        v, kernels, ws = store["v_flat"], store["kernels"], self.window
        bw, h, n, d = v.shape
        c = h * d
        img = _merged(v).transpose(1, 2).reshape(1, bw * c, ws, ws)
        res = F.conv2d(img, kernels.reshape(bw * c, 1, 3, 3), padding=1, groups=bw * c)
        nw = (self.layout[0] // ws) * (self.layout[1] // ws)
        store["local_conv"] = inline_kernels(kernels, bw // nw, h, nw)
        return _heads(res.reshape(bw, c, n).transpose(1, 2), h)


class FLattenSwinSite(_WindowSite):
    """FLatten's FocusedLinearAttention, Swin form (models/flatten_swin.py): fused `qkv`, the
    window's `positional_encoding` added to k, ReLU + 1e-6, divided by softplus(`scale`), the
    focused map, linear attention per window; the local term is `dwc` of V's window grid."""

    def _prepared(self, t: torch.Tensor) -> torch.Tensor:
        return flatten_features(self.m, t)

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_qkv(_mod, _inp, o):
            q, k, v = o.chunk(3, dim=-1)
            store.update(q_flat=_heads(self._prepared(q), h),
                         k_flat=_heads(self._prepared(k + m.positional_encoding), h),
                         v_flat=_heads(v, h), tokens=o.shape[1])

        conv = depthwise_conv(m.dwc, h, True)
        hooks = [m.qkv.register_forward_hook(on_qkv),
                 m.dwc.register_forward_hook(lambda _m, _i, o: store.update(
                     dwc=_dwc_local(o, store["tokens"], h))),
                 m.proj.register_forward_pre_hook(
                     lambda _m, inp: self._finish_windows(store, inp[0], store["dwc"], conv))]
        return hooks


# ----------------------------------------------------------------------------- recognition
def swin_blocks(model: nn.Module):
    """Swin's `layers[i].blocks[j]` (blocks with `attn`, `window_size`, `shift_size` and
    `input_resolution`), in order; None when the model is not so built."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        return None
    blocks = [b for layer in layers for b in (getattr(layer, "blocks", None) or [])]
    need = ("attn", "window_size", "shift_size", "input_resolution")
    if not blocks or not all(all(hasattr(b, a) for a in need) for b in blocks):
        return None
    return blocks


# ----------------------------------------------------------------------------- CSwin stripes
def stripe_positions(gh: int, gw: int, h_sp: int, w_sp: int) -> np.ndarray:
    """[stripes, h_sp * w_sp, 2]: each stripe token's (row, col), stripes row by row over the
    (gh / h_sp) x (gw / w_sp) stripes, tokens row by row within a stripe (CSwin's img2windows)."""
    rows = np.arange(gh)[:, None].repeat(gw, 1)
    cols = np.arange(gw)[None, :].repeat(gh, 0)
    cell = np.stack([rows, cols], -1).reshape(gh // h_sp, h_sp, gw // w_sp, w_sp, 2)
    return cell.swapaxes(1, 2).reshape(-1, h_sp * w_sp, 2).astype(np.int64)


def _to_stripes(t: torch.Tensor, gh: int, gw: int, h_sp: int, w_sp: int) -> torch.Tensor:
    """[B, N, C] on the gh x gw grid -> [B * stripes, h_sp * w_sp, C], as stripe_positions."""
    b, _, c = t.shape
    t = t.reshape(b, gh // h_sp, h_sp, gw // w_sp, w_sp, c)
    return t.permute(0, 1, 3, 2, 4, 5).reshape(-1, h_sp * w_sp, c)


def cswin_branch_kind(a: nn.Module) -> str | None:
    """'inline' for InLine's CSwin branch (`residual` making 3x3 kernels, no kernel function),
    'softmax' for CSwin's LePEAttention (`get_v` depthwise Conv2d); None otherwise."""
    from .released import _kernel_generator
    if not all(hasattr(a, n) for n in ("H_sp", "W_sp", "num_heads", "resolution")):
        return None
    if _kernel_generator(a) and getattr(a, "phi", None) is None:
        return "inline"
    if isinstance(getattr(a, "get_v", None), nn.Conv2d) and not hasattr(a, "residual"):
        return "softmax"
    return None


def cswin_blocks(model: nn.Module):
    """CSwin's blocks (`stage1..4`, each a ModuleList of blocks with `qkv`, `proj` and `attns`, a
    ModuleList of stripe branches), in order; None when the model is not so built."""
    blocks = []
    for i in range(1, 5):
        stage = getattr(model, f"stage{i}", None)
        if stage is None:
            break
        blocks += list(stage)
    if not blocks:
        return None
    ok = all(isinstance(getattr(b, "attns", None), nn.ModuleList) and len(b.attns) in (1, 2)
             and isinstance(getattr(b, "qkv", None), nn.Linear) and hasattr(b, "proj")
             and all(hasattr(a, "H_sp") for a in b.attns) for b in blocks)
    return blocks if ok else None


class CSwinStripeSite(_LocalSite):
    """A CSwin block (`qkv`, branches `attns`, `proj`) as one layer of two stripe shapes: each
    branch's heads attend within its stripes of H_sp x W_sp (the released code: the first
    branch's vertical, the height x split_size, the second's horizontal), each stripe one window;
    with one branch (split_size = the resolution, as in InLine-CSwin's InLine stages) one stripe,
    the whole map. Per branch: q, k, v are the branch's input (the block's stacked qkv, its
    channels) cut into stripes; InLine's branch computes W V in the inline code form per stripe
    plus its local residual (3x3 kernels made by `residual`, per image from the block input's
    mean, or per stripe) plus LePE (`get_v` of the stripe's v); CSwin's softmax branch
    softmax(scale q k^T) V plus LePE. proj's input, cut into each branch's stripes, minus the local
    term is `out`."""

    def __init__(self, m, info, layout_hint=None):
        super().__init__(m, info, layout_hint)
        self.kind = cswin_branch_kind(m.attns[0])

    def shapes(self):
        gh, gw, _ = self.layout
        return [(int(a.H_sp), int(a.W_sp)) for a in self.m.attns]

    def geometry(self):
        gh, gw, prefix = self.layout
        shapes = self.shapes()
        if prefix != 0 or any(gh % hs or gw % ws for hs, ws in shapes):
            raise ValueError(f"{self.info.structure}: a {gh}x{gw} grid with {prefix} prefix "
                             f"tokens is not cut into stripes of {shapes}")
        (hs, ws) = shapes[0]
        attrs = {"windows": (gh // hs) * (gw // ws), "window_height": hs, "window_width": ws}
        arrays = {"token_positions": stripe_positions(gh, gw, hs, ws)}
        if len(shapes) == 2:
            h2, w2 = shapes[1]
            if (gh // h2) * (gw // w2) != attrs["windows"] or h2 * w2 != hs * ws:
                raise ValueError(f"{self.info.structure}: its two stripe shapes {shapes} on the "
                                 f"{gh}x{gw} grid differ in stripes or tokens per stripe, which "
                                 "one layer of the dump cannot hold")
            attrs.update(second_heads_from=int(self.m.attns[0].num_heads),
                         second_window_height=h2, second_window_width=w2)
            arrays["second_token_positions"] = stripe_positions(gh, gw, h2, w2)
        return attrs, arrays

    def install(self, store, want_attn, want_out):
        m = self.m
        if want_attn:
            raise ValueError(f"{self.info.structure}: the dumper does not capture its weights; "
                             "dump without with_attn")
        hooks = []
        for i, a in enumerate(m.attns):
            hooks.append(a.register_forward_pre_hook(
                lambda _m, inp, i=i: self._on_branch(store, i, inp[0])))
            if self.kind == "inline":
                hooks.append(a.residual.register_forward_hook(
                    lambda _m, _i, o, i=i: store.update({f"kernels{i}": o})))
            if isinstance(getattr(a, "get_v", None), nn.Conv2d):
                hooks.append(a.get_v.register_forward_hook(
                    lambda _m, _i, o, i=i: store.update({f"lepe{i}": o})))
        hooks.append(m.proj.register_forward_pre_hook(lambda _m, inp: self._finish_stripes(
            store, inp[0])))
        return hooks

    def _stripes(self, t, i):
        gh, gw, _ = self.layout
        hs, ws = self.shapes()[i]
        return _to_stripes(t, gh, gw, hs, ws)

    def _on_branch(self, store, i, qkv):
        h = int(self.m.attns[i].num_heads)
        store.setdefault("branches", {})[i] = [_heads(self._stripes(t, i), h) for t in qkv]

    def _local(self, store, i, v):
        """The branch's local term per stripe, [B*S, h, T, d]: InLine's residual (its kernels per
        image, or per stripe) and/or LePE (`get_v`); and the per-stripe kernels of the residual
        ([B*S, h, d, 3, 3], None without one)."""
        a = self.m.attns[i]
        h = int(a.num_heads)
        bs, _, t, d = v.shape
        hs, ws = self.shapes()[i]
        c = h * d
        local = torch.zeros_like(v)
        kern = None
        if self.kind == "inline":
            kernels = store[f"kernels{i}"]  # [B or B*S, 9C, 1]
            kernels = kernels.repeat_interleave(bs // kernels.shape[0], dim=0)
            img = _merged(v).transpose(1, 2).reshape(1, bs * c, hs, ws)
            res = F.conv2d(img, kernels.reshape(bs * c, 1, 3, 3), padding=1, groups=bs * c)
            local = local + _heads(res.reshape(bs, c, t).transpose(1, 2), h)
            kern = kernels.detach().to(torch.float32).reshape(bs, h, d, 3, 3)
        if f"lepe{i}" in store:
            lepe = store[f"lepe{i}"]  # [B*S, C, hs, ws]
            local = local + _heads(lepe.reshape(bs, c, t).transpose(1, 2), h)
        return local, kern

    def _finish_stripes(self, store, before_proj):
        gh, gw, _ = self.layout
        cb = before_proj.shape[-1] // len(self.m.attns)
        parts = {n: [] for n in ("q", "k", "v", "out", "local")}
        kernels, convs = [], []
        for i, a in enumerate(self.m.attns):
            h = int(a.num_heads)
            q, k, v = store["branches"][i]  # [B*S, h, T, d]
            y = _heads(self._stripes(before_proj[..., i * cb:(i + 1) * cb], i), h)
            local, kern = self._local(store, i, v)
            for n, t in (("q", q), ("k", k), ("v", v), ("out", y - local), ("local", local)):
                parts[n].append(t)
            kernels.append(kern)
            convs.append(depthwise_conv(a.get_v, h, False) if hasattr(a, "get_v") else
                         {"kernel": None, "bias": None, "padding": (1, 1)})
        b = before_proj.shape[0]

        def windows(ts):  # [B*S, h_i, T, d] per branch -> [B, H, S, T, d]
            t = torch.cat(ts, dim=1)
            bs, hh, n, d = t.shape
            return t.reshape(b, bs // b, hh, n, d).transpose(1, 2)

        store.pop("branches")
        store.update({n: windows(ts) for n, ts in parts.items()})
        if any(c is None or (c["kernel"] is not None and tuple(c["kernel"].shape[-2:]) != (3, 3)
                             and self.kind == "inline") for c in convs):
            return  # a LePE the analyses cannot fold (or add to the 3x3 residual): no kernel
        static = [c["kernel"] for c in convs]  # LePE's, [h_i, d, 3, 3], or None
        bias = None if any(c["bias"] is None for c in convs) else torch.cat([c["bias"] for c in convs])
        if self.kind == "inline":  # the residual's per-image kernels, plus LePE's where present
            parts = [kern if st is None else kern + st[None].to(kern.device)
                     for kern, st in zip(kernels, static)]
            k = torch.cat(parts, dim=1)  # [B*S, H, d, 3, 3]
            store["local_conv"] = {"kernel": k.reshape(b, -1, *k.shape[1:]).transpose(1, 2),
                                   "bias": bias, "padding": (1, 1), "per_image": True}
        else:
            store["local_conv"] = {"kernel": torch.cat(static), "bias": bias,
                                   "padding": convs[0]["padding"], "per_image": False}


def cswin_site(block: nn.Module, layer: int, families):
    """The site of one CSwin block: InLine's stripes (family inline, map identity, code) or
    CSwin's softmax with LePE; refused by name when its branches are neither."""
    from .released import LayerInfo
    kinds = {cswin_branch_kind(a) for a in block.attns}
    if len(kinds) != 1 or None in kinds:
        raise ValueError(f"layer {layer}: a CSwin block whose stripe branches are "
                         f"{[type(a).__name__ for a in block.attns]}: neither InLine's CSwin "
                         "attention nor CSwin's LePEAttention")
    if families is not None:
        raise ValueError("families= is not taken for CSwin's stripe blocks: their family comes "
                         "from their branches (InLine's or CSwin's softmax)")
    kind = kinds.pop()
    a0 = block.attns[0]
    h = sum(int(a.num_heads) for a in block.attns)
    d = int(a0.dim) // int(a0.num_heads)
    name = "InLine CSwin (stripes)" if kind == "inline" else "CSwin softmax (LePEAttention, stripes)"
    info = LayerInfo(h, d, float(a0.scale), kind, "identity" if kind == "inline" else "none",
                     "code", name)
    r = int(a0.resolution)
    return CSwinStripeSite(block, info, (r, r, 0))
