"""Where the dumper reads q, k, v, the attention weights and the per-head output in a model.

Each supported structure has one `Site` class that installs forward hooks on one attention layer
and leaves the captured tensors, shaped [B, H, N, d] (weights [B, H, N, N]), in a dict:

* timm-style ViT/DeiT (and the project's own models, which keep timm's names):
  `model.blocks[i].attn` with a fused `qkv` Linear, `num_heads`, `scale`, optional
  `q_norm`/`k_norm` (q and k are read *after* them, as the attention sees them), `attn_drop`
  (its input is the weights, seen only with `fused_attn = False`) and `proj` (its input, or that
  of `norm` where timm has one, is the per-head output). The project's models with InLine's local
  residual add it to W V before `proj`, in a `local_residual` module: there the per-head output
  is read at that module's first input, so it stays W V.
* Hugging Face ViT: `encoder.layer[i].attention.attention` (a ViTSelfAttention) with separate
  `query`, `key`, `value` Linears of output [B, N, H*d]; the module's first output is the per-head
  output. transformers 5 (seen in 5.17) drops the encoder module and folds it into
  `layers[i].attention` with `q_proj`, `k_proj`, `v_proj` and its own `o_proj`: the per-head
  output is then o_proj's input. The weights exist only on the eager attention path: where they are wanted, the config's
  `_attn_implementation` is set to "eager" for the run (and restored), the model is called with
  `output_attentions=True`, and they are read from the module's second output (current releases,
  where eager_attention_forward is a function with functional dropout) or from the input of its
  `dropout` module (older releases, which call that module on the weights).
* torchvision ViT: `encoder.layers[i].self_attention`, an nn.MultiheadAttention called with
  query = key = value. q, k, v are its in_proj applied to that input; where weights or outputs
  are wanted its forward is wrapped for the run to ask for per-head weights, and the per-head
  output is those weights times v, checked against the module's own (projected) output.

The papers' released attention modules (InLine, FLatten, ...) are recognised, captured or
refused by the table of released.py; any other module with timm's names but more than timm's
Attention holds is refused (its family is unknown) unless the user states it (`families=`).

q and k are captured before any scale is applied; the scale is recorded separately.
"""
from __future__ import annotations

import inspect
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .attention import parse_variant_spec
from .released import LayerInfo, _heads, recognise, site_for
from .released_hier import cswin_blocks, cswin_site, swin_blocks


class TimmSite:
    """One timm-style attention module (`blocks[i].attn`)."""

    hint = "the model took a path the hooks do not see, e.g. fused attention"
    layout_hint = None

    def __init__(self, attn: nn.Module, family: str, feature_map: str, convention: str = "code",
                 structure: str = "timm-style attention"):
        self.m = attn
        h = int(attn.num_heads)
        d = int(getattr(attn, "head_dim", attn.qkv.out_features // 3 // h))
        self.info = LayerInfo(h, d, float(attn.scale), family, feature_map, convention, structure)
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
            # timm >= 0.9 may normalise the merged heads (`norm`) before `proj`; a local residual
            # (the project's InLine models) is added to W V before either: its input is W V, its
            # output minus its input the local term.
            local = getattr(m, "local_residual", None)
            tail = next(t for t in (local, getattr(m, "norm", None), m.proj)
                        if isinstance(t, nn.Module))
            hooks.append(tail.register_forward_pre_hook(
                lambda _m, inp: store.update(out=_heads(inp[0], h))))
            if isinstance(local, nn.Module):
                def on_local(mod, inp, o):
                    store["local"] = _heads(o - inp[0], h)
                    if callable(getattr(mod, "kernels", None)):  # LocalResidual: its kernels
                        k = mod.kernels(inp[2])  # [B, C, 3, 3] from the attention input
                        store["local_conv"] = {"kernel": k.reshape(k.shape[0], h, -1, 3, 3),
                                               "bias": None, "padding": (1, 1), "per_image": True}
                hooks.append(local.register_forward_hook(on_local))
        if hasattr(m, "fused_attn"):
            self._saved_fused = m.fused_attn
            m.fused_attn = False  # the fused kernel never forms the weights
        return hooks

    def restore(self) -> None:
        if self._saved_fused is not None:
            self.m.fused_attn = self._saved_fused
            self._saved_fused = None


class HFViTSite:
    """One Hugging Face ViT self-attention: `encoder.layer[i].attention.attention` (transformers 4:
    query, key, value; its output is the per-head context) or `encoder.layers[i].attention`
    (transformers 5: `layers[i].attention` with q_proj, k_proj, v_proj, and an o_proj applied
    inside, whose input is the per-head context)."""

    layout_hint = None
    hint = ("Hugging Face attention returned no weights: load the model with "
            "attn_implementation=\"eager\"")

    def __init__(self, sa: nn.Module, config=None):
        self.m = sa
        self.proj = _hf_projection_names(sa)
        # An output projection inside the module: "out" is its input, not the module's output.
        o_proj = getattr(sa, "o_proj", None)
        self.o_proj = o_proj if isinstance(o_proj, nn.Module) else None
        cfg = config if config is not None else getattr(sa, "config", None)
        # Attribute names differ between transformers releases; the config always has the heads.
        h = int(getattr(sa, "num_attention_heads", None) or getattr(sa, "num_heads", None)
                or cfg.num_attention_heads)
        d = int(getattr(sa, "attention_head_size", None) or getattr(sa, "head_dim", None)
                or getattr(sa, self.proj[0]).out_features // h)
        scale = float(getattr(sa, "scaling", d ** -0.5))
        self.info = LayerInfo(h, d, scale, "softmax", "none", "code", "Hugging Face ViT attention")
        self._configs = [c for c in (config, getattr(sa, "config", None)) if c is not None]
        self._saved_impl = []

    def install(self, store: dict, want_attn: bool, want_out: bool) -> list:
        m, h = self.m, self.info.num_heads
        hooks = [getattr(m, name).register_forward_hook(
            lambda _m, _i, o, key=key: store.update({key: _heads(o, h)}))
            for name, key in zip(self.proj, ("q", "k", "v"))]
        if want_attn:
            self._force_eager()
            if isinstance(getattr(m, "dropout", None), nn.Module):  # releases that call it
                hooks.append(m.dropout.register_forward_hook(
                    lambda _m, inp, _o: store.update(attn=inp[0])))
        if want_out and self.o_proj is not None:
            hooks.append(self.o_proj.register_forward_hook(
                lambda _m, inp, _o: store.update(out=_heads(inp[0], h))))

        def on_output(_m, _i, o):
            if want_out and self.o_proj is None:
                store["out"] = _heads(o[0] if isinstance(o, tuple) else o, h)
            if want_attn and isinstance(o, tuple) and len(o) > 1 and torch.is_tensor(o[1]):
                store["attn"] = o[1]

        if want_out or want_attn:
            hooks.append(m.register_forward_hook(on_output))
        return hooks

    def _force_eager(self) -> None:
        """SDPA and flash kernels never form the weights: use eager attention for this run."""
        for cfg in self._configs:
            impl = getattr(cfg, "_attn_implementation", None)
            if impl is None or impl == "eager":
                continue
            try:
                cfg._attn_implementation = "eager"
            except (AttributeError, TypeError, ValueError) as e:
                raise ValueError(f"attention weights asked for, but the model uses {impl!r} "
                                 f"attention and its config refused 'eager' ({e}); load the "
                                 "model with attn_implementation=\"eager\"") from e
            self._saved_impl.append((cfg, impl))

    def restore(self) -> None:
        for cfg, impl in reversed(self._saved_impl):
            cfg._attn_implementation = impl
        self._saved_impl = []


class TorchvisionSite:
    """One nn.MultiheadAttention of torchvision's ViT (`encoder.layers[i].self_attention`)."""

    hint = "the MultiheadAttention was not called"
    layout_hint = None

    def __init__(self, mha: nn.MultiheadAttention):
        if mha.bias_k is not None or mha.bias_v is not None or mha.add_zero_attn:
            raise ValueError("nn.MultiheadAttention with add_bias_kv or add_zero_attn attends to "
                             "extra key tokens; not supported")
        self.m = mha
        h, d = int(mha.num_heads), int(mha.head_dim)
        self.info = LayerInfo(h, d, d ** -0.5, "softmax", "none", "code",  # F.multi_head_attention_forward
                              "torchvision MultiheadAttention")
        self._own_forward = None  # a forward the instance already had, put back by restore()

    def _qkv(self, x: torch.Tensor):
        m = self.m
        b = m.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
        if m._qkv_same_embed_dim:
            wq, wk, wv = m.in_proj_weight.chunk(3)
        else:
            wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
        h = self.info.num_heads
        return tuple(_heads(F.linear(x, w, bias), h) for w, bias in ((wq, bq), (wk, bk), (wv, bv)))

    def install(self, store: dict, want_attn: bool, want_out: bool) -> list:
        m = self.m
        self._own_forward = m.__dict__.get("forward")
        original = m.forward
        names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
                 "average_attn_weights")

        def forward(*args, **kwargs):
            call = dict(zip(names, args), **kwargs)
            x = call["query"]
            if call.get("key") is not x or call.get("value") is not x:
                raise ValueError("nn.MultiheadAttention called with key/value other than its "
                                 "query: only self-attention over the tokens is supported")
            if call.get("attn_mask") is not None or call.get("key_padding_mask") is not None \
                    or call.get("is_causal"):
                raise ValueError("nn.MultiheadAttention called with a mask: not supported")
            tokens = x if m.batch_first else x.transpose(0, 1)
            q, k, v = self._qkv(tokens)
            store.update(q=q, k=k, v=v)
            if not (want_attn or want_out):
                return original(*args, **kwargs)
            wanted = call.get("need_weights", True)
            averaged = call.get("average_attn_weights", True)
            call.update(need_weights=True, average_attn_weights=False)
            y, w = original(**call)
            per_head = w.to(v.dtype) @ v
            _check_projection(m, per_head, y if m.batch_first else y.transpose(0, 1))
            if want_attn:
                store["attn"] = w
            if want_out:
                store["out"] = per_head
            if not wanted:
                return y, None
            return y, (w.mean(dim=1) if averaged else w)

        m.forward = forward  # an instance attribute: nn.Module.__call__ looks it up first
        return []

    def restore(self) -> None:
        self.m.__dict__.pop("forward", None)
        if self._own_forward is not None:
            self.m.forward = self._own_forward
            self._own_forward = None


def _check_projection(m: nn.MultiheadAttention, per_head: torch.Tensor, y: torch.Tensor) -> None:
    """out_proj of the merged per-head outputs must give the module's own output."""
    b, h, n, d = per_head.shape
    merged = per_head.transpose(1, 2).reshape(b, n, h * d)
    mine = F.linear(merged, m.out_proj.weight, m.out_proj.bias)
    err = (mine - y).abs().max().item()
    rel = 1e-4 if y.dtype in (torch.float32, torch.float64) else 1e-2  # half precision: 2^-11
    bound = rel * max(1.0, y.abs().max().item())
    if not err <= bound:
        raise ValueError(f"nn.MultiheadAttention: out_proj(weights @ v) differs from the module's "
                         f"output by {err:.3g}: the module computes something other than "
                         "softmax self-attention")


_HF_PROJECTIONS = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"))


def _hf_projection_names(m: nn.Module):
    """The names of a Hugging Face attention module's q, k, v projections, or None."""
    for names in _HF_PROJECTIONS:
        if all(isinstance(getattr(m, n, None), nn.Module) for n in names):
            return names
    return None


def _hf_self_attention(layer: nn.Module):
    """A Hugging Face ViT layer's self-attention, the module holding the q, k, v projections:
    `layer.attention.attention` (query, key, value) in transformers 4, `layer.attention` itself
    (q_proj, k_proj, v_proj and its own o_proj) in transformers 5; None when it has neither."""
    att = getattr(layer, "attention", None)
    for cand in (getattr(att, "attention", None), att):
        if isinstance(cand, nn.Module) and _hf_projection_names(cand) is not None:
            return cand
    return None


# The children of timm's Attention (and of the project's models, which keep its names): a module
# with others computes something more than softmax attention and is not taken as timm's.
_TIMM_CHILDREN = {"qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"}


def _plain_timm(attn: nn.Module) -> bool:
    return {n for n, _ in attn.named_children()} <= _TIMM_CHILDREN \
        and not any(True for _ in attn.named_parameters(recurse=False))


def _stated(families, layer: int):
    """The user's statement for one layer: families is None, a spec for every layer, or a dict
    {layer: spec}; a spec is "family[:map][@convention]" (attention.parse_variant_spec)."""
    if families is None:
        return None
    spec = families.get(layer) if isinstance(families, dict) else families
    return None if spec is None else parse_variant_spec(spec)


def _attention_site(attn: nn.Module, layer: int, families, layout_hint=None):
    """The site of one attention module of a block: what the user stated, else a recognised
    released structure, else the project's own or timm's plain softmax attention; anything else
    is refused by name."""
    if hasattr(attn, "lambda_q1") or hasattr(attn, "lambda_init"):
        raise ValueError(f"layer {layer}: {type(attn).__name__} is differential attention "
                         "(two softmax maps subtracted), not one of the attention families")
    stated = _stated(families, layer)
    own = getattr(attn, "attention_family", None)  # the project's models say their family
    structure = recognise(attn)
    if structure is not None:
        try:
            site = site_for(structure, attn, layer, layout_hint)
        except ValueError:
            if stated is None:
                raise
        else:  # its capture (local term apart), with the user's family where stated
            site.layout_hint = layout_hint
            if stated is not None:
                site.info.family, site.info.feature_map, site.info.convention = stated
                site.info.structure += ", family as stated"
            return site
    if not hasattr(attn, "qkv"):
        raise ValueError(f"layer {layer}: {type(attn).__name__} has no fused `qkv` projection; "
                         "the dumper cannot read its q, k, v" + (
                             f" (it is {structure.name}, stated as {stated[0]})"
                             if structure is not None else ""))
    if stated is not None:
        return TimmSite(attn, *stated, structure=f"{type(attn).__name__} (family as stated)")
    if own is not None:
        return TimmSite(attn, own, getattr(attn, "feature_map", "none"),
                        structure="the project's attention")
    if _plain_timm(attn):
        return TimmSite(attn, "softmax", "none", structure="timm Attention")
    extra = sorted({n for n, _ in attn.named_children()} - _TIMM_CHILDREN
                   | {n for n, _ in attn.named_parameters(recurse=False)})
    raise ValueError(f"layer {layer}: {type(attn).__name__} has timm's names but also "
                     f"{', '.join(extra)}: it is none of the structures the dumper recognises "
                     "(python/README.md), so its family is unknown; state it with "
                     "families={" + str(layer) + ": 'FAMILY[:MAP][@CONVENTION]'} (the self-check "
                     "then compares the model's output with that family)")


class RefusedSite:
    """A layer the dumper cannot capture: dump_model raises `reason` when the layer is kept, so
    that the other layers of a hybrid model can still be dumped with layers=."""
    info = None
    layout_hint = None

    def __init__(self, m: nn.Module, reason: str):
        self.m, self.reason = m, reason

    def install(self, store, want_attn, want_out):
        raise ValueError(self.reason)

    def restore(self) -> None:
        pass


def _site_or_refusal(attn, layer, families, layout_hint=None):
    try:
        return _attention_site(attn, layer, families, layout_hint)
    except ValueError as e:
        return RefusedSite(attn, str(e))


def _window_site(block: nn.Module, layer: int, families):
    """The site of a Swin block's attention, told the block's window size and shift; a module
    without a window capture is refused by name."""
    h, w = (int(x) for x in block.input_resolution)
    site = _site_or_refusal(block.attn, layer, families, (h, w, 0))
    if isinstance(site, RefusedSite):
        return site
    if not hasattr(site, "set_windowing"):
        return RefusedSite(block.attn, f"layer {layer}: {type(block.attn).__name__} in a Swin "
                           f"block ({site.info.structure}): the dumper has no per-window capture "
                           "for it")
    site.set_windowing(block.window_size, block.shift_size)
    return site


def _stages(model: nn.Module):
    """PVT-style models: `block1`, `block2`, ... ModuleLists of blocks with `attn`, each stage's
    grid in `patch_embed1`, ... (H, W); [(blocks, layout or None)] or None."""
    stages, i = [], 1
    while isinstance(getattr(model, f"block{i}", None), nn.ModuleList):
        pe = getattr(model, f"patch_embed{i}", None)
        hw = (getattr(pe, "H", None), getattr(pe, "W", None))
        stages.append((getattr(model, f"block{i}"), None if None in hw else (*hw, 0)))
        i += 1
    return stages or None


def _conv_out(size: int, conv: nn.Conv2d, axis: int) -> int:
    k, st, p = (int(conv.kernel_size[axis]), int(conv.stride[axis]), int(conv.padding[axis]))
    return (size + 2 * p - k) // st + 1


def rope_stages(model: nn.Module):
    """RAVLT's and MALA's stages: `layers[i]` with `blocks` (their `attn`) and the stage's `RoPE`,
    each stage's map the one before run through its `downsample` convolution; [(block, hint)] in
    order, hint None for the first stage (the dump's root grid) and else a function of the root
    layout giving the stage's; None when the model is not so built."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers) or not all(
            isinstance(getattr(s, "blocks", None), nn.ModuleList) and hasattr(s, "RoPE")
            and all(hasattr(b, "attn") for b in s.blocks) for s in layers):
        return None
    out, convs = [], []
    for stage in layers:
        def hint(root, convs=tuple(convs)):
            gh, gw, _ = root
            for c in convs:
                gh, gw = _conv_out(gh, c, 0), _conv_out(gw, c, 1)
            return gh, gw, 0
        out += [(b, hint if convs else None) for b in stage.blocks]
        down = getattr(stage, "downsample", None)
        conv = next((m for m in down.modules() if isinstance(m, nn.Conv2d)), None) \
            if down is not None else None
        if conv is None and stage is not layers[-1]:
            raise ValueError(f"{type(model).__name__}: stage layers[{len(convs)}] has no "
                             "`downsample` convolution, so the next stage's grid is unknown")
        convs.append(conv)
    return out


def find_sites(model: nn.Module, families=None):
    """Returns (style, [site per layer]) for a supported model; ValueError otherwise.
    families: the user's statement of each layer's family (see _stated)."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None and len(blocks) and all(hasattr(b, "attn") for b in blocks):
        return "timm", [_site_or_refusal(b.attn, i, families) for i, b in enumerate(blocks)]
    swin = swin_blocks(model)
    if swin is not None:
        return "swin", [_window_site(b, i, families) for i, b in enumerate(swin)]
    cswin = cswin_blocks(model)
    if cswin is not None:
        return "cswin", [cswin_site(b, i, families) for i, b in enumerate(cswin)]
    staged = rope_stages(model)
    if staged is not None:
        return "rope_stages", [_site_or_refusal(b.attn, i, families, hint)
                               for i, (b, hint) in enumerate(staged)]
    stages = _stages(model)
    if stages is not None and all(hasattr(b, "attn") for blk, _ in stages for b in blk):
        sites = []
        for blk, layout in stages:
            sites += [_site_or_refusal(b.attn, len(sites) + j, families, layout)
                      for j, b in enumerate(blk)]
        return "stages", sites
    if families is not None:
        raise ValueError("families= is for models whose blocks have an `attn` module "
                         "(blocks[i].attn, block1..N[i].attn or Swin's layers[i].blocks[j].attn); "
                         "Hugging Face and torchvision "
                         "ViTs are softmax")
    root = getattr(model, "vit", model)  # ViTForImageClassification wraps a ViTModel
    enc = getattr(root, "encoder", None)
    # transformers 4: root.encoder.layer; transformers 5: root.layers, no encoder module.
    for holder, name in ((enc, "layer"), (enc, "layers"), (root, "layers")):
        layers = getattr(holder, name, None) if holder is not None else None
        if isinstance(layers, nn.ModuleList) and len(layers) and _hf_self_attention(layers[0]) is not None:
            cfg = getattr(root, "config", None)
            return "hf_vit", [HFViTSite(_hf_self_attention(layer), cfg) for layer in layers]
    layers = getattr(enc, "layers", None)
    if layers is not None and len(layers) \
            and isinstance(getattr(layers[0], "self_attention", None), nn.MultiheadAttention):
        return "torchvision", [TorchvisionSite(layer.self_attention) for layer in layers]
    for name, m in model.named_modules():
        structure = recognise(m)
        if structure is not None:  # a released attention where the dumper does not look
            site_for(structure, m, f"module {name}", None)  # refuses it by name where it must
            raise ValueError(f"{type(model).__name__}.{name} is {structure.name}, but the model "
                             "holds its attention modules where the dumper does not look "
                             "(blocks[i].attn, block1..N[i].attn or Swin's "
                             "layers[i].blocks[j].attn)")
    raise ValueError(f"{type(model).__name__}: no supported attention layers found (expected "
                     "blocks[i].attn (timm style and the released InLine, FLatten, Agent "
                     "models), block1..N[i].attn (PVT style), encoder.layer[i].attention.attention "
                     "or layers[i].attention with q_proj, k_proj, v_proj (Hugging Face ViT) "
                     "or encoder.layers[i].self_attention (torchvision ViT))")


def call_kwargs(model: nn.Module, style: str, want_attn: bool) -> dict:
    """Keyword arguments for model(x): Hugging Face models return weights only when asked."""
    if style != "hf_vit" or not want_attn:
        return {}
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    if "output_attentions" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return {"output_attentions": True}
    return {}


_ROTARY = ("rope", "rotary", "rot_pos")


def _rotary_name(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1].lower()
    return any(r in leaf for r in _ROTARY)


def rotary_sources(model: nn.Module, sites) -> list:
    """Where the model rotates q and k (RoPE): its rotary submodules, parameters or buffers (timm's
    EVA and vit_*_rope_* models keep one at `model.rope` and pass its output to every attention
    as `rope=`), and rotary tensors or functions held by the attention modules themselves.
    Empty when there is none; a `rope` argument that no such source can feed is no rotation."""
    found = [n for n, mod in model.named_modules() if n and _rotary_name(n) and mod is not None]
    found += [n for n, _ in model.named_parameters() if _rotary_name(n)]
    found += [n for n, _ in model.named_buffers() if _rotary_name(n)]
    names = {id(mod): n for n, mod in model.named_modules()}
    for site in sites:
        for attr, value in vars(site.m).items():
            if _rotary_name(attr) and (torch.is_tensor(value) or callable(value)):
                found.append(f"{names.get(id(site.m), type(site.m).__name__)}.{attr}")
    return sorted(set(found))


def check_rotary(model: nn.Module, sites, allow: bool) -> None:
    """Refuses (ValueError) a model that rotates q and k, unless `allow`, which warns instead."""
    where = rotary_sources(model, sites)
    if not where:
        return
    msg = (f"{type(model).__name__} rotates q and k (RoPE: {', '.join(where[:3])}"
           f"{', ...' if len(where) > 3 else ''}); the dumper reads q and k before the rotation, "
           "so their dot products are not the ones the model's attention used")
    if not allow:
        raise ValueError(msg + "; pass allow_rotary=True to dump the unrotated q and k anyway")
    warnings.warn(msg + " (allow_rotary=True: dumping them anyway; recompute, confusion and every "
                  "analysis of q and k will not match the model)", stacklevel=3)


def token_layout(model: nn.Module, style: str):
    """(grid_height, grid_width, prefix_tokens) read from the model, or None where unknown."""
    if style == "timm":
        pe = getattr(model, "patch_embed", None)
        grid = getattr(pe, "grid_size", None) or getattr(model, "grid_size", None)
        prefix = getattr(model, "num_prefix_tokens", None)
        if prefix is None and isinstance(getattr(model, "cls_token", None), nn.Parameter):
            # older timm and the papers' DeiT classes: a CLS token and maybe a distillation one
            prefix = 1 + isinstance(getattr(model, "dist_token", None), nn.Parameter)
        if grid is not None and prefix is not None:
            return int(grid[0]), int(grid[1]), int(prefix)
        return None
    if style == "torchvision":
        size, patch = getattr(model, "image_size", None), getattr(model, "patch_size", None)
        if size is None or patch is None:
            return None
        prefix = 1 if getattr(model, "class_token", None) is not None else 0
        return int(size) // int(patch), int(size) // int(patch), prefix
    cfg = getattr(getattr(model, "vit", model), "config", None)
    if cfg is not None and hasattr(cfg, "image_size") and hasattr(cfg, "patch_size"):
        g = int(cfg.image_size) // int(cfg.patch_size)
        return g, g, 1
    return None
