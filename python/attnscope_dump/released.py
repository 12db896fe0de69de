"""The attention modules of the papers' released code, recognised by their structure.

STRUCTURES is the recognition table: one entry per released structure, each with the rule that
recognises it (written out in `rule`, the text python/README.md lists), the family, feature map
and convention the dump records, and either a Site class that captures it or the reason it is
refused. `recognise(module)` walks the table in order and answers the first entry whose rule
holds; a family missing from the registry (attention.FAMILY_TABLE, the mirror of
`attnscope info --families`) is refused by name, so a family added to the registry later makes
its entry work with no other change.

The sites capture q, k, v as the family's formula sees them (after whatever the module does to
them before the map), `out` = W V exactly, and the module's local term (InLine's local residual,
FLatten's depthwise convolution) apart as `local`: the module adds out + local before its output
projection, whose input the site reads; `local` is computed from the module's own kernels and v,
and `out` is that input minus `local`. The dumper's self-check then compares `out` with the
family recomputed from q, k, v. Where the local term is a depthwise convolution of v's grid, the
site also records its kernel (`local_conv`, see depthwise_conv and docs/dump-format.md "The local
term's kernel").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import FAMILY_TABLE
from .field_families import FIELD_FAMILIES


@dataclass
class LayerInfo:
    num_heads: int
    head_dim: int
    scale: float
    family: str
    feature_map: str
    convention: str = "code"
    structure: str = ""  # the name of the recognised structure, for messages


def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """[B, N, H*d] -> [B, H, N, d]."""
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(1, 2)


def _merged(t: torch.Tensor) -> torch.Tensor:
    """[B, H, N, d] -> [B, N, H*d]."""
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def _is(m, name, kind=nn.Module) -> bool:
    return isinstance(getattr(m, name, None), kind)


def _kernel_generator(m) -> bool:
    """InLine's `residual`: Conv1d (C -> C), GELU, Conv1d (C -> 9 C), grouped by head."""
    r = getattr(m, "residual", None)
    if not isinstance(r, nn.Sequential) or len(r) != 3:
        return False
    first, last = r[0], r[-1]
    return isinstance(first, nn.Conv1d) and isinstance(last, nn.Conv1d) \
        and last.out_channels == 9 * first.in_channels


def depthwise_conv(conv: nn.Module, h: int, shared_by_heads: bool) -> dict | None:
    """The kernel of a module's depthwise Conv2d as the dump records it: {"kernel": float32
    [H, d, kh, kw], "bias": [H, d] or None, "padding": (ph, pw), "per_image": False}, channel t of
    head i being the conv's channel i * d + t, or channel t of every head when the conv runs on
    each head's d channels apart (`shared_by_heads`: FLatten's and PolaFormer's dwc). None when
    the conv is not one the analyses can fold: depthwise (groups = channels), stride 1, no
    dilation, zero padding that keeps the grid's size (2 * padding + 1 = kernel size)."""
    if not isinstance(conv, nn.Conv2d):
        return None
    c = conv.in_channels
    kh, kw = conv.kernel_size
    pad = conv.padding
    if conv.groups != c or conv.out_channels != c or tuple(conv.stride) != (1, 1) \
            or tuple(conv.dilation) != (1, 1) or not isinstance(pad, tuple) \
            or conv.padding_mode != "zeros" or (2 * pad[0] + 1, 2 * pad[1] + 1) != (kh, kw):
        return None
    w = conv.weight.detach().to(torch.float32).cpu()[:, 0]  # [C, kh, kw]
    b = None if conv.bias is None else conv.bias.detach().to(torch.float32).cpu()
    if shared_by_heads:
        w = w.unsqueeze(0).expand(h, *w.shape)
        b = None if b is None else b.unsqueeze(0).expand(h, c)
    else:
        w = w.reshape(h, c // h, kh, kw)
        b = None if b is None else b.reshape(h, c // h)
    return {"kernel": w.clone(), "bias": None if b is None else b.clone(),
            "padding": (int(pad[0]), int(pad[1])), "per_image": False}


def inline_kernels(kernels: torch.Tensor, b: int, h: int, windows: int = 0) -> dict:
    """InLine's local residual as the dump records its kernels: `residual`'s output (9 weights per
    channel, per image or per window) as float32 [images, H, d, 3, 3] (with windows
    [images, H, windows, d, 3, 3]), padding 1, no bias."""
    k = kernels.detach().to(torch.float32)
    if windows:
        k = k.reshape(b, windows, h, -1, 3, 3).transpose(1, 2)
    else:
        k = k.reshape(b, h, -1, 3, 3)
    return {"kernel": k, "bias": None, "padding": (1, 1), "per_image": True}


class _LocalSite:
    """Shared by the released structures whose local term is added to W V before `proj`:
    hooks on the projections that give q, k, v, on whatever gives the local term's kernels, and
    on proj's input (W V + local)."""

    hint = "the attention module was not called"

    def __init__(self, m: nn.Module, info: LayerInfo, layout_hint=None):
        self.m, self.info = m, info
        self.layout_hint = layout_hint  # (grid_h, grid_w, prefix) where the model tells it
        self.layout = None  # the dump's, set by the dumper before install()

    def set_layout(self, layout) -> None:
        self.layout = tuple(int(x) for x in layout)

    def restore(self) -> None:
        pass

    def _refuse_weights(self, want_attn: bool) -> None:
        if want_attn:
            raise ValueError(f"{self.info.structure}: the module never forms the attention "
                             "weights (linear-time form); dump without with_attn")

    def _finish(self, store: dict, before_proj: torch.Tensor, local: torch.Tensor) -> None:
        """local: [B, H, N, d]; out = proj's input minus it."""
        store["local"] = local
        store["out"] = _heads(before_proj, self.info.num_heads) - local

    def _finish_conv(self, store, before_proj, local, conv) -> None:
        """_finish, recording the local term's depthwise kernel (depthwise_conv) when known."""
        self._finish(store, before_proj, local)
        if conv is not None:
            store["local_conv"] = conv


class InLineDeiTSite(_LocalSite):
    """InLine's DeiT attention (`InLineAttention` of models/inline_deit.py): fused `qkv`, no
    kernel function (phi = identity), W V in the inline family's code form with c2 = scale / N,
    and the local residual: per image and channel a 3x3 kernel from `residual` applied to the
    token mean, convolved (zero padding 1) with V's grid tokens; prefix tokens get none."""

    def install(self, store, want_attn, want_out):
        m, h = self.m, self.info.num_heads
        self._refuse_weights(want_attn)

        def on_qkv(_mod, _inp, o):
            q, k, v = o.chunk(3, dim=-1)
            store.update(q=_heads(q, h), k=_heads(k, h), v=_heads(v, h))

        hooks = [m.qkv.register_forward_hook(on_qkv),
                 m.residual.register_forward_hook(lambda _m, _i, o: store.update(kernels=o))]
        if want_out:
            hooks.append(m.proj.register_forward_pre_hook(
                lambda _m, inp: self._finish(store, inp[0], self.local(store))))
        return hooks

    def local(self, store) -> torch.Tensor:
        v, kernels = store["v"], store["kernels"]
        b, h, n, d = v.shape
        gh, gw, prefix = self.layout
        if n != prefix + gh * gw:
            raise ValueError(f"{self.info.structure}: {n} tokens, not {prefix} prefix + "
                             f"{gh}x{gw} grid; pass grid= and prefix_tokens=")
        c = h * d
        img = _merged(v)[:, prefix:].transpose(1, 2).reshape(1, b * c, gh, gw)
        res = F.conv2d(img, kernels.reshape(b * c, 1, 3, 3), padding=1, groups=b * c)
        store["local_conv"] = inline_kernels(kernels, b, h)
        grid_part = res.reshape(b, c, gh * gw).transpose(1, 2)
        full = torch.cat([grid_part.new_zeros(b, prefix, c), grid_part], dim=1)
        return _heads(full, h)


@dataclass(frozen=True)
class Structure:
    """One released structure: `rule` in words; `matches(module)`; the family, map and
    convention to record (map: a spec, or a function of the module giving one); `site(module,
    info, layout_hint)` builds the capture; `refusal`, when set, is why it cannot be dumped."""
    name: str
    rule: str
    matches: Callable[[nn.Module], bool]
    family: str
    feature_map: str | Callable[[nn.Module], str] = "none"
    convention: str = "code"
    site: Callable | None = None
    refusal: str | None = None
    layer_info: Callable | None = None  # module -> (heads, head_dim, scale) where not from qkv/q


def _windowed_or_reduced(m) -> bool:
    return any(hasattr(m, a) for a in ("window_size", "split_size", "H_sp")) \
        or int(getattr(m, "sr_ratio", 1)) > 1


def _inline_deit(m) -> bool:
    return _kernel_generator(m) and _is(m, "qkv") and _is(m, "proj") and hasattr(m, "num_heads") \
        and not _windowed_or_reduced(m) and getattr(m, "phi", None) is None


def _inline_swin(m) -> bool:
    return _kernel_generator(m) and _is(m, "qkv", nn.Linear) and hasattr(m, "window_size") \
        and hasattr(m, "phi") and m.phi is None


def _inline_pvt(m) -> bool:
    return _kernel_generator(m) and _is(m, "q", nn.Linear) and _is(m, "kv", nn.Linear) \
        and int(getattr(m, "sr_ratio", 1)) == 1


def _inline_pvt_reduced(m) -> bool:
    return _kernel_generator(m) and _is(m, "kv", nn.Linear) and int(getattr(m, "sr_ratio", 1)) > 1


def _flatten(m) -> bool:
    return hasattr(m, "focusing_factor") and _is(m, "dwc", nn.Conv2d) \
        and isinstance(getattr(m, "scale", None), nn.Parameter)


def _flatten_pvt(m) -> bool:
    return _flatten(m) and _is(m, "q", nn.Linear) and _is(m, "kv", nn.Linear) \
        and isinstance(getattr(m, "positional_encoding", None), nn.Parameter)


def _flatten_swin(m) -> bool:
    return _flatten(m) and _is(m, "qkv", nn.Linear) and hasattr(m, "window_size") \
        and isinstance(getattr(m, "positional_encoding", None), nn.Parameter)


def _agent(m) -> bool:
    return hasattr(m, "agent_num") and isinstance(getattr(m, "an_bias", None), nn.Parameter)


def _agent_deit(m) -> bool:
    return _agent(m) and _is(m, "qkv", nn.Linear) and _is(m, "pool") and _is(m, "dwc", nn.Conv2d) \
        and not _windowed_or_reduced(m)


def _polaformer(m) -> bool:
    return isinstance(getattr(m, "power", None), nn.Parameter) and hasattr(m, "alpha") \
        and (_is(m, "qg", nn.Linear) or _is(m, "qkvg", nn.Linear))


def _pola_pvt(m) -> bool:
    return _polaformer(m) and _is(m, "qg", nn.Linear) and _is(m, "kv", nn.Linear) \
        and isinstance(getattr(m, "positional_encoding", None), nn.Parameter) \
        and _is(m, "dwc", nn.Conv2d) and int(getattr(m, "sr_ratio", 1)) == 1


def _qkvo_elu(m) -> bool:
    qkvo = getattr(m, "qkvo", None)
    return isinstance(qkvo, nn.Conv2d) and qkvo.out_channels == 4 * qkvo.in_channels \
        and _is(m, "elu", nn.ELU)


def _rala(m) -> bool:
    return _qkvo_elu(m) and type(m).__name__ != "AddLinearAttention"


def _rala_lepe(m) -> bool:
    return _rala(m) and _is(m, "lepe", nn.Conv2d) and _is(m, "proj", nn.Conv2d)


def _mala_released(m) -> bool:
    """MALA's AddLinearAttention has RALA's attributes exactly; only its forward differs."""
    return _qkvo_elu(m) and type(m).__name__ == "AddLinearAttention" and _is(m, "lepe", nn.Conv2d)


def _retnet_softmax(m) -> bool:
    """RAVLT's and MALA's softmax stages: RALA's convolutions without the ELU map."""
    qkvo = getattr(m, "qkvo", None)
    return isinstance(qkvo, nn.Conv2d) and qkvo.out_channels == 4 * qkvo.in_channels \
        and not hasattr(m, "elu") and _is(m, "lepe", nn.Conv2d) and _is(m, "proj", nn.Conv2d) \
        and isinstance(getattr(m, "scale", None), float)


def _mlla(m) -> bool:
    qk = getattr(m, "qk", None)
    return isinstance(qk, nn.Linear) and qk.out_features == 2 * qk.in_features \
        and _is(m, "elu", nn.ELU) and _is(m, "lepe", nn.Conv2d) \
        and torch.is_tensor(getattr(getattr(m, "rope", None), "rotations", None))


def flatten_map(m: nn.Module) -> str:
    """The feature map a FLatten layer records: its focused map where the module has one head;
    with more, "identity" (see flatten_features)."""
    return f"focused={float(m.focusing_factor):g}" if int(m.num_heads) == 1 else "identity"


def _children_within(m: nn.Module, allowed: set) -> bool:
    return {n for n, _ in m.named_children()} <= allowed \
        and not any(True for _ in m.named_parameters(recurse=False))


def pvt_softmax(m) -> bool:
    """PVT's Attention: `q`, `kv` Linears, `proj`, a float `scale`, `sr_ratio`, nothing else."""
    return isinstance(getattr(m, "q", None), nn.Linear) \
        and isinstance(getattr(m, "kv", None), nn.Linear) \
        and isinstance(getattr(m, "proj", None), nn.Module) and hasattr(m, "num_heads") \
        and isinstance(getattr(m, "scale", None), float) and hasattr(m, "sr_ratio") \
        and _children_within(m, {"q", "kv", "attn_drop", "proj", "proj_drop", "sr", "norm"})


def swin_softmax(m) -> bool:
    return isinstance(getattr(m, "relative_position_bias_table", None), nn.Parameter) \
        and isinstance(getattr(m, "qkv", None), nn.Linear)


def _hier(name: str):
    """A site class of released_hier.py, built when used (that module imports this one)."""
    def build(m, info, layout_hint=None):
        from . import released_hier
        return getattr(released_hier, name)(m, info, layout_hint)
    return build


_WINDOWS = ("window attention (one call per window, the shifted-window mask between calls) or "
            "keys from a spatially reduced grid: the dump format holds one token grid per layer, "
            "the same for queries and keys")

from .released_field import (AgentDeiTSite, MllaSite, PolaPVTSite, RetNetRopeSite,  # noqa: E402
                             RetNetSoftmaxSite, agent_info, mlla_info, pola_info, qkvo_info)

STRUCTURES: tuple[Structure, ...] = (
    Structure("InLine DeiT (InLineAttention)",
              "`qkv` Linear, `proj`, `num_heads`, `residual` = Sequential(Conv1d C->C, GELU, "
              "Conv1d C->9C), no `phi` kernel, none of the window or reduction attributes below",
              _inline_deit, "inline", "identity", "code", site=InLineDeiTSite),
    Structure("InLine Swin (InLineAttention, window attention)",
              "`residual` as in InLine DeiT, a fused `qkv` Linear, `window_size`, `phi` None "
              "(kernel_func 'identity'); its block is a Swin block (layers[i].blocks[j])",
              _inline_swin, "inline", "identity", "code", site=_hier("InLineSwinSite")),
    Structure("InLine PVT (InLineAttention, sr_ratio 1)",
              "`residual` as in InLine DeiT, `q` and `kv` Linears, `sr_ratio` 1",
              _inline_pvt, "inline", "identity", "code", site=_hier("InLinePVTSite")),
    Structure("InLine PVT with spatial reduction",
              "`residual` as in InLine DeiT, a `kv` Linear, `sr_ratio` > 1",
              _inline_pvt_reduced, "inline", "identity",
              refusal="the released forward reshapes the reduced keys and values to the "
                      "queries' token count, so it cannot run with sr_ratio > 1"),
    Structure("InLine Swin with a kernel function, InLine CSwin branch alone",
              "`residual` as in InLine DeiT with a `phi` kernel function or `window_size` "
              "(Swin), `split_size` or `H_sp` (CSwin)",
              lambda m: _kernel_generator(m) and (getattr(m, "phi", None) is not None
                                                  or _windowed_or_reduced(m)),
              "inline", "identity",
              refusal="a kernel function other than identity (kernel_func), or a CSwin stripe "
                      "branch met outside a CSwin block: the dumper reads CSwin's stripes through "
                      "the block (stage1..4[i] with `qkv`, `attns` and `proj`)"),
    Structure("FLatten PVT (FocusedLinearAttention, PVT form)",
              "`focusing_factor`, `dwc` Conv2d, `scale` Parameter, `q` and `kv` Linears, "
              "`positional_encoding` Parameter (any `sr_ratio`: keys from the reduced grid)",
              _flatten_pvt, "linear", flatten_map, "code",
              site=_hier("FLattenPVTSite")),
    Structure("FLatten Swin (FocusedLinearAttention, window attention)",
              "`focusing_factor`, `dwc` Conv2d, `scale` Parameter, a fused `qkv` Linear, "
              "`window_size`, `positional_encoding` Parameter; its block is a Swin block",
              _flatten_swin, "linear", flatten_map, "code",
              site=_hier("FLattenSwinSite")),
    Structure("FLatten, CSwin form",
              "`focusing_factor`, `dwc` Conv2d and `scale` Parameter, none of the forms above",
              _flatten, "linear", flatten_map,
              refusal="FLatten's CSwin branches: the dumper's CSwin blocks take InLine's and "
                      "CSwin's softmax (LePE) branches only"),
    Structure("Swin softmax window attention (WindowAttention)",
              "a `relative_position_bias_table` Parameter and a fused `qkv` Linear",
              swin_softmax, "softmax",
              refusal="Swin adds a learned relative position bias to the logits, which the dump "
                      "format cannot hold (recompute's softmax has no additive bias); dump the "
                      "model's other layers with layers="),
    Structure("Agent attention, DeiT form (AgentAttention)",
              "`agent_num`, an `an_bias` Parameter, `qkv` Linear, `pool`, `dwc` Conv2d, none of "
              "the window or reduction attributes",
              _agent_deit, "agent", site=AgentDeiTSite, layer_info=agent_info),
    Structure("Agent attention (AgentAttention)",
              "`agent_num` and an `an_bias` Parameter",
              _agent, "agent", refusal=_WINDOWS),
    Structure("PolaFormer, PVT form (PolaLinearAttention, sr_ratio 1)",
              "a `power` Parameter, `alpha`, `qg` and `kv` Linears, `positional_encoding` "
              "Parameter, `dwc` Conv2d, `sr_ratio` 1",
              _pola_pvt, "polaformer", site=PolaPVTSite, layer_info=pola_info),
    Structure("PolaFormer (PolaLinearAttention)",
              "a `power` Parameter, `alpha`, and a `qg` (PVT form) or `qkvg` (Swin form) Linear",
              _polaformer, "polaformer", refusal=_WINDOWS),
    Structure("MALA as released (AddLinearAttention)",
              "class AddLinearAttention with `qkvo` Conv2d C->4C, an `elu` ELU module and `lepe` "
              "(RALA's attributes exactly: the class name tells them apart)",
              _mala_released, "mala", "elu1", "code+rope", site=RetNetRopeSite,
              layer_info=qkvo_info),
    Structure("RALA (RAVLT's rank-augmented linear attention)",
              "`qkvo` Conv2d C->4C, an `elu` ELU module, `lepe` and `proj` Conv2d, any class "
              "name but AddLinearAttention",
              _rala_lepe, "rala", site=RetNetRopeSite, layer_info=qkvo_info),
    Structure("RALA without LePE",
              "`qkvo` Conv2d C->4C and an `elu` ELU module",
              _rala, "rala", refusal="no `lepe` and `proj` convolutions: not the released "
              "structure whose forward the capture reads"),
    Structure("RAVLT and MALA softmax stage (VanillaSelfAttention)",
              "`qkvo` Conv2d C->4C, `lepe` and `proj` Conv2d, a float `scale`, no `elu`",
              _retnet_softmax, "softmax", site=RetNetSoftmaxSite, layer_info=qkvo_info),
    Structure("MLLA (LinearAttention of MLLA)",
              "`qk` Linear C->2C, an `elu` ELU module, `lepe` Conv2d and `rope` holding a "
              "`rotations` buffer",
              _mlla, "mlla", site=MllaSite, layer_info=mlla_info),
    Structure("PVT softmax attention (Attention of PVT)",
              "`q` and `kv` Linears, `proj`, `num_heads`, a float `scale` and `sr_ratio`, no "
              "submodules but attn_drop, proj_drop, sr and norm, no parameters of its own",
              pvt_softmax, "softmax", site=_hier("PVTSoftmaxSite")),
)


def recognise(m: nn.Module) -> Structure | None:
    """The first entry of STRUCTURES whose rule holds for `m`, or None."""
    return next((s for s in STRUCTURES if s.matches(m)), None)


def site_for(structure: Structure, m: nn.Module, layer: int, layout_hint=None):
    """The capture of one recognised module; ValueError naming the layer, the structure and why
    when it is refused (or its family is not in the registry)."""
    where = f"{f'layer {layer}' if isinstance(layer, int) else layer}: {type(m).__name__} is " \
        f"{structure.name}"
    if structure.family not in FAMILY_TABLE and structure.family not in FIELD_FAMILIES:
        raise ValueError(f"{where}, family '{structure.family}', which this build's registry "
                         f"lacks (attnscope info --families: {', '.join(FAMILY_TABLE)}); it "
                         "cannot be dumped")
    if structure.refusal is not None or structure.site is None:
        why = structure.refusal or ("the dumper has no capture for it yet (a Site in "
                                    "released.py); state a family with families= to read it "
                                    "as timm's names, checked by the self-check")
        raise ValueError(f"{where}: not supported: {why}")
    fmap = structure.feature_map(m) if callable(structure.feature_map) else structure.feature_map
    if structure.layer_info is not None:
        h, d, scale = structure.layer_info(m)
    else:
        h = int(m.num_heads)
        proj = m.qkv if _is(m, "qkv") else m.q
        d = proj.out_features // (3 if proj is getattr(m, "qkv", None) else 1) // h
        scale = float(m.scale) if isinstance(getattr(m, "scale", None), float) else d ** -0.5
    info = LayerInfo(h, d, scale, structure.family, fmap, structure.convention, structure.name)
    return structure.site(m, info, layout_hint)
