"""Captures of the released attention modules of the field's families (field_families.py): MLLA's
LinearAttention, RALA, MALA's AddLinearAttention, PolaFormer (PVT form) and Agent attention
(DeiT form). Each writes into the layer's store q, k, v as the family's formula takes them (before
its feature map), `out` = W V exactly, the module's local term apart as `local` (LePE, DWC), the
layer's family parameters as the model computed them (`params`: {name: float32 [H, rows, cols]})
and, for Agent attention, the agent tokens of each image (`agents`). Gated modules multiply
(W V + local) by a gate before their projection: `out` is the projection's input divided by the
gate, minus `local`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .released import LayerInfo, _heads, _LocalSite, depthwise_conv


def _conv_heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """[B, H*d, gh, gw] (channel = head * d + t) -> [B, H, gh*gw, d]."""
    b, c, gh, gw = t.shape
    return t.reshape(b, h, c // h, gh * gw).transpose(-2, -1)


def _per_head(t: torch.Tensor, h: int) -> torch.Tensor:
    return t.detach().to(torch.float32).cpu().expand(h, *t.shape[-2:]).clone()


class MllaSite(_LocalSite):
    """MLLA's LinearAttention (LeapLabTHU/MLLA models/mlla.py): `qk` Linear gives q, k; v is the
    module's input; ELU+1, the layer-wide RoPE buffer `rope.rotations` [gh, gw, C/2, 2] in the
    numerator only; the module returns W V + lepe(v) (no projection inside)."""

    captures_rotation = True

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)
        rot = m.rope.rotations  # [gh, gw, C/2, 2]
        pairs = rot.shape[2] // h
        flat = rot.reshape(-1, h, pairs, 2).transpose(0, 1)  # [H, N, d/2, 2]
        store_params = {"rope_cos": flat[..., 0].float().cpu().clone(),
                        "rope_sin": flat[..., 1].float().cpu().clone()}

        def on_input(_mod, inp):
            store["v"] = _heads(inp[0], h)
            store["params"] = store_params

        def on_qk(_mod, _inp, o):
            q, k = o.chunk(2, dim=-1)
            store.update(q=_heads(q, h), k=_heads(k, h))

        conv = depthwise_conv(m.lepe, h, False)
        hooks = [m.register_forward_pre_hook(on_input), m.qk.register_forward_hook(on_qk),
                 m.lepe.register_forward_hook(
                     lambda _m, _i, o: store.update(local=_conv_heads(o, h), local_conv=conv))]
        if want_out:
            hooks.append(m.register_forward_hook(
                lambda _m, _i, o: store.update(out=_heads(o, h) - store["local"])))
        return hooks


class _RetNetQkvoSite(_LocalSite):
    """The attention modules of RAVLT and MALA, called as attn(x, sin, cos) with the stage's RoPE
    [(gh gw), d] (each pair's value twice): `qkvo` gives q, k, v and the gate o; `lepe` of v is the
    local term; `proj` takes (W V + lepe) * o. A subclass says what it keeps of the RoPE
    (`_take_rope`) and how q and k are stored (`_queries_keys`)."""

    captures_rotation = True

    def _take_rope(self, store, sin, cos):
        raise NotImplementedError

    def _queries_keys(self, store, q, k):
        return q, k

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_input(_mod, inp):
            self._take_rope(store, inp[1], inp[2])

        def on_qkvo(_mod, _inp, o):
            c = o.shape[1] // 4
            q, k = self._queries_keys(store, _conv_heads(o[:, :c], h),
                                      _conv_heads(o[:, c:2 * c], h))
            store.update(q=q, k=k, v=_conv_heads(o[:, 2 * c:3 * c], h), gate=o[:, 3 * c:])

        conv = depthwise_conv(m.lepe, h, False)
        hooks = [m.register_forward_pre_hook(on_input), m.qkvo.register_forward_hook(on_qkvo),
                 m.lepe.register_forward_hook(
                     lambda _m, _i, o: store.update(local=_conv_heads(o, h), local_conv=conv))]
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(lambda _m, inp: store.update(
                out=_conv_heads(inp[0] / store.pop("gate"), h) - store["local"])))
        return hooks


class RetNetRopeSite(_RetNetQkvoSite):
    """RALA's and MALA's linear attention (qhfan/RALA classfication/RALA.py
    GateLinearAttentionNoSilu, qhfan/MALA classfication_release/model.py AddLinearAttention): q and
    k are stored as `qkvo` gives them, the RoPE as the layer's family parameters."""

    def _take_rope(self, store, sin, cos):
        h = self.info.num_heads
        store["params"] = {"rope_cos": _per_head(cos[:, 0::2], h),
                           "rope_sin": _per_head(sin[:, 0::2], h)}


def _rotate_pairs(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """The RetNet-style rotation RAVLT and MALA apply: x cos + turn(x) sin, turn taking each pair
    (x0, x1) to (-x1, x0); sin, cos [(gh gw), d] broadcast over batch and heads."""
    turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos + turned * sin


class RetNetSoftmaxSite(_RetNetQkvoSite):
    """The softmax stages of RAVLT and MALA (VanillaSelfAttention of qhfan/RALA
    classfication/RALA.py): q and k are rotated by the stage's RoPE before softmax(scale q k^T), so
    they are stored rotated (as the softmax sees them, family softmax, no parameters)."""

    def _take_rope(self, store, sin, cos):
        store["rope"] = (sin, cos)

    def _queries_keys(self, store, q, k):
        sin, cos = store.pop("rope")
        return _rotate_pairs(q, sin, cos), _rotate_pairs(k, sin, cos)


class PolaPVTSite(_LocalSite):
    """PolaFormer's PolaLinearAttention, PVT form with sr_ratio 1: `qg` gives q and the gate g,
    `kv` gives k (plus `positional_encoding`) and v; feature_scale = softplus(`scale`), exponent =
    1 + alpha sigmoid(`power`); `dwc` of v's grid (kernel shared by the heads) is the local term;
    `proj` takes (W V + dwc) * g."""

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)
        d = self.info.head_dim
        with torch.no_grad():
            params = {"feature_scale": F.softplus(m.scale).reshape(h, 1, d).float().cpu().clone(),
                      "exponent": (1 + m.alpha * torch.sigmoid(m.power)).reshape(h, 1, d)
                      .float().cpu().clone()}

        def on_qg(_mod, _inp, o):
            q, g = o.chunk(2, dim=-1)
            store.update(q=_heads(q, h), gate=g, params=params)

        def on_kv(_mod, _inp, o):
            k, v = o.chunk(2, dim=-1)
            store.update(k=_heads(k + m.positional_encoding, h), v=_heads(v, h))

        conv = depthwise_conv(m.dwc, h, True)
        hooks = [m.qg.register_forward_hook(on_qg), m.kv.register_forward_hook(on_kv)]
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(lambda _m, inp: self._finish_conv(
                store, inp[0] / store.pop("gate"), self.local(store["v"]), conv)))
        return hooks

    def local(self, v):
        b, h, n, d = v.shape
        gh, gw, prefix = self.layout
        if prefix != 0 or n != gh * gw:
            raise ValueError(f"{self.info.structure}: {n} tokens, not a {gh}x{gw} grid without "
                             f"prefix tokens (prefix_tokens={prefix} given)")
        img = v.reshape(b * h, gh, gw, d).permute(0, 3, 1, 2)
        return self.m.dwc(img).reshape(b, h, d, n).transpose(-2, -1)


class AgentDeiTSite(_LocalSite):
    """Agent attention in the DeiT form (LeapLabTHU/Agent-Attention models/agent_deit.py): fused
    `qkv`; agents = q's grid average-pooled by `pool`; the position biases formed from the
    module's tables as it forms them (an_bias/na_bias resized bilinearly to the grid, plus the row
    and column terms, and ac_bias/ca_bias for the CLS token); `dwc` of v's grid is the local term
    (CLS gets none)."""

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_qkv(_mod, _inp, o):
            q, k, v = o.chunk(3, dim=-1)
            b, n, c = q.shape
            gh, gw, prefix = self.layout
            grid = q[:, prefix:].reshape(b, gh, gw, c).permute(0, 3, 1, 2)
            agents = m.pool(grid).reshape(b, c, -1).permute(0, 2, 1)
            store.update(q=_heads(q, h), k=_heads(k, h), v=_heads(v, h),
                         agents=_heads(agents, h), params=self.biases())

        conv = depthwise_conv(m.dwc, h, False)
        hooks = [m.qkv.register_forward_hook(on_qkv)]
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(
                lambda _m, inp: self._finish_conv(store, inp[0], self.local(store["v"]), conv)))
        return hooks

    def biases(self) -> dict:
        m, h, a, win = self.m, self.info.num_heads, self.m.agent_num, self.m.window
        with torch.no_grad():
            b1 = F.interpolate(m.an_bias, size=(win, win), mode="bilinear").reshape(1, h, a, -1)
            b1 = b1 + (m.ah_bias + m.aw_bias).reshape(1, h, a, -1)
            b1 = torch.cat([m.ac_bias, b1], dim=-1)
            b2 = F.interpolate(m.na_bias, size=(win, win), mode="bilinear").reshape(1, h, a, -1)
            b2 = b2.permute(0, 1, 3, 2) + (m.ha_bias + m.wa_bias).reshape(1, h, -1, a)
            b2 = torch.cat([m.ca_bias, b2], dim=-2)
        return {"agent_bias": b1[0].float().cpu().clone(), "token_bias": b2[0].float().cpu().clone()}

    def local(self, v):
        b, h, n, d = v.shape
        gh, gw, prefix = self.layout
        c = h * d
        grid = v[:, :, prefix:].transpose(1, 2).reshape(b, gh, gw, c).permute(0, 3, 1, 2)
        res = self.m.dwc(grid).permute(0, 2, 3, 1).reshape(b, gh * gw, c)
        return _heads(torch.cat([res.new_zeros(b, prefix, c), res], dim=1), h)


def mlla_info(m: nn.Module):
    h = int(m.num_heads)
    d = m.qk.out_features // 2 // h
    return h, d, d ** -0.5  # no scale in its formula; the dump's scale attribute is nominal


def qkvo_info(m: nn.Module):
    h = int(m.num_heads)
    return h, m.qkvo.out_channels // 4 // h, float(m.scale)


def pola_info(m: nn.Module):
    h = int(m.num_heads)
    d = m.qg.out_features // 2 // h
    return h, d, d ** -0.5  # no scale in its formula (its `scale` is the learned feature scale)


def agent_info(m: nn.Module):
    h = int(m.num_heads)
    return h, m.qkv.out_features // 3 // h, float(m.scale)


def make_site(site_cls, info_fn):
    def build(m, info: LayerInfo, layout_hint=None):
        info.num_heads, info.head_dim, info.scale = info_fn(m)
        return site_cls(m, info, layout_hint)
    return build
