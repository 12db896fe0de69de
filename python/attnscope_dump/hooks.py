"""Where the dumper reads q, k, v, the attention weights and the per-head output in a model.

Each supported structure has one `Site` class that installs forward hooks on one attention layer
and leaves the captured tensors, shaped [B, H, N, d] (weights [B, H, N, N]), in a dict:

* timm-style ViT/DeiT (and the project's own models, which keep timm's names):
  `model.blocks[i].attn` with a fused `qkv` Linear, `num_heads`, `scale`, optional
  `q_norm`/`k_norm` (q and k are read *after* them, as the attention sees them), `attn_drop`
  (its input is the weights, seen only with `fused_attn = False`) and `proj` (its input, or that
  of `norm` where timm has one, is the per-head output).
* Hugging Face ViT: `encoder.layer[i].attention.attention` (a ViTSelfAttention) with separate
  `query`, `key`, `value` Linears of output [B, N, H*d]; the module's first output is the per-head
  output; its `dropout` module, when called, sees the weights (eager attention only).

q and k are captured before any scale is applied; the scale is recorded separately.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class LayerInfo:
    num_heads: int
    head_dim: int
    scale: float
    family: str
    feature_map: str


def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """[B, N, H*d] -> [B, H, N, d]."""
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(1, 2)


class TimmSite:
    """One timm-style attention module (`blocks[i].attn`)."""

    def __init__(self, attn: nn.Module):
        self.m = attn
        h = int(attn.num_heads)
        d = int(getattr(attn, "head_dim", attn.qkv.out_features // 3 // h))
        self.info = LayerInfo(h, d, float(attn.scale),
                              getattr(attn, "attention_family", "softmax"),
                              getattr(attn, "feature_map", "none"))
        self._saved_fused = None

    def install(self, store: dict, want_attn: bool, want_out: bool) -> list:
        m, h, d = self.m, self.info.num_heads, self.info.head_dim
        has_qn = isinstance(getattr(m, "q_norm", None), nn.Module)
        has_kn = isinstance(getattr(m, "k_norm", None), nn.Module)

        def on_qkv(_mod, _inp, out):
            b, n, _ = out.shape
            q, k, v = out.reshape(b, n, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
            store["v"] = v
            if not has_qn:
                store["q"] = q
            if not has_kn:
                store["k"] = k

        hooks = [m.qkv.register_forward_hook(on_qkv)]
        if has_qn:
            hooks.append(m.q_norm.register_forward_hook(lambda _m, _i, o: store.update(q=o)))
        if has_kn:
            hooks.append(m.k_norm.register_forward_hook(lambda _m, _i, o: store.update(k=o)))
        if want_attn:
            if not isinstance(getattr(m, "attn_drop", None), nn.Module):
                raise ValueError("attention weights asked for, but the module has no attn_drop")
            hooks.append(m.attn_drop.register_forward_hook(
                lambda _m, inp, _o: store.update(attn=inp[0])))
        if want_out:
            # timm >= 0.9 may normalise the merged heads (`norm`) before `proj`.
            tail = m.norm if isinstance(getattr(m, "norm", None), nn.Module) else m.proj
            hooks.append(tail.register_forward_pre_hook(
                lambda _m, inp: store.update(out=_heads(inp[0], h))))
        if hasattr(m, "fused_attn"):
            self._saved_fused = m.fused_attn
            m.fused_attn = False  # the fused kernel never forms the weights
        return hooks

    def restore(self) -> None:
        if self._saved_fused is not None:
            self.m.fused_attn = self._saved_fused
            self._saved_fused = None


class HFViTSite:
    """One Hugging Face ViTSelfAttention (`encoder.layer[i].attention.attention`)."""

    def __init__(self, sa: nn.Module):
        self.m = sa
        h = int(sa.num_attention_heads)
        d = int(sa.attention_head_size)
        scale = float(getattr(sa, "scaling", d ** -0.5))
        self.info = LayerInfo(h, d, scale, "softmax", "none")

    def install(self, store: dict, want_attn: bool, want_out: bool) -> list:
        m, h = self.m, self.info.num_heads
        hooks = [getattr(m, name).register_forward_hook(
            lambda _m, _i, o, name=name: store.update({name[0]: _heads(o, h)}))
            for name in ("query", "key", "value")]
        if want_attn:
            if not isinstance(getattr(m, "dropout", None), nn.Module):
                raise ValueError("attention weights asked for, but the module has no dropout")
            hooks.append(m.dropout.register_forward_hook(
                lambda _m, inp, _o: store.update(attn=inp[0])))
        if want_out:
            hooks.append(m.register_forward_hook(
                lambda _m, _i, o: store.update(out=_heads(o[0] if isinstance(o, tuple) else o,
                                                          h))))
        return hooks

    def restore(self) -> None:
        pass


def find_sites(model: nn.Module):
    """Returns (style, [site per layer]) for a supported model; ValueError otherwise."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None and len(blocks) and hasattr(blocks[0], "attn") \
            and hasattr(blocks[0].attn, "qkv"):
        return "timm", [TimmSite(b.attn) for b in blocks]
    root = getattr(model, "vit", model)  # ViTForImageClassification wraps a ViTModel
    enc = getattr(root, "encoder", None)
    layers = getattr(enc, "layer", None)
    if layers is not None and len(layers) and hasattr(layers[0], "attention") \
            and hasattr(layers[0].attention, "attention"):
        return "hf_vit", [HFViTSite(layer.attention.attention) for layer in layers]
    raise ValueError(f"{type(model).__name__}: no supported attention layers found (expected "
                     "blocks[i].attn.qkv (timm style) or encoder.layer[i].attention.attention "
                     "(Hugging Face ViT))")


def token_layout(model: nn.Module, style: str):
    """(grid_height, grid_width, prefix_tokens) read from the model, or None where unknown."""
    if style == "timm":
        pe = getattr(model, "patch_embed", None)
        grid = getattr(pe, "grid_size", None) or getattr(model, "grid_size", None)
        prefix = getattr(model, "num_prefix_tokens", None)
        if grid is not None and prefix is not None:
            return int(grid[0]), int(grid[1]), int(prefix)
        return None
    cfg = getattr(getattr(model, "vit", model), "config", None)
    if cfg is not None and hasattr(cfg, "image_size") and hasattr(cfg, "patch_size"):
        g = int(cfg.image_size) // int(cfg.patch_size)
        return g, g, 1
    return None
