"""The families of the field that need per-layer model data, in float64, for the dumper's
self-check and the tests: MLLA, RALA, MALA with its released RoPE (`mala` in the `code+rope`
convention), PolaFormer and Agent attention. The same formulas as the C++ references
(lib/src/reference/families/{mlla,rala,mala_rope,polaformer,agent}.cpp), in torch, so that the
dumper can check itself before the dump is written; `attnscope recompute` then checks the same
dumps with the C++ registry's families (lib/src/families/).

Tensors are [B, H, N, d]; `params` is the layer's /layers/L/family_params as {name: array
[H, rows, cols]} (docs/dump-format.md, "Family parameters"), and `agents` [B, H, n, d] for Agent
attention. RoPE turns channel pairs (2p, 2p+1) by the stored cosines and sines [H, N, d/2].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# (family, convention) -> the parameter datasets a layer must carry
FIELD_VARIANTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("mlla", "code"): ("rope_cos", "rope_sin"),
    ("mlla", "paper"): ("rope_cos", "rope_sin"),
    ("rala", "code"): ("rope_cos", "rope_sin"),
    ("rala", "paper"): ("rope_cos", "rope_sin"),
    ("mala", "code+rope"): ("rope_cos", "rope_sin"),
    ("polaformer", "code"): ("feature_scale", "exponent"),
    ("polaformer", "paper"): ("feature_scale", "exponent"),
    ("agent", "code"): ("agent_bias", "token_bias"),
}
FIELD_FAMILIES = frozenset(f for f, _ in FIELD_VARIANTS)
EPS = 1e-6  # the released codes' z = 1 / (q . mean k + 1e-6)


def is_field_variant(family: str, convention: str) -> bool:
    return (family, convention) in FIELD_VARIANTS


def _p(params, name, like):
    t = params[name]
    return (t if torch.is_tensor(t) else torch.as_tensor(t)).to(torch.float64).to(like.device)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, N, d] with pairs (2p, 2p+1) turned: (x0 c - x1 s, x0 s + x1 c); cos, sin [H, N, d/2]."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def _elu1(x):
    return F.elu(x) + 1.0


def _rope_normalised(fq, fk, v, cos, sin, eps):
    """R fq . R fk_j / (fq . sum fk + N eps), applied to v."""
    n = fk.shape[-2]
    num = rotate(fq, cos, sin) @ rotate(fk, cos, sin).transpose(-2, -1)
    den = fq @ fk.sum(dim=-2, keepdim=True).transpose(-2, -1) + n * eps
    return (num / den) @ v


def weights_and_outputs(family: str, convention: str, q, k, v, scale: float, params: dict,
                        agents=None):
    """(W [B, H, N, N] or (W_same, W_opposite) for PolaFormer, O = W V), in float64."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    n = k.shape[-2]
    eps = 0.0 if convention == "paper" else EPS
    if family in ("mlla", "rala", "mala"):
        cos, sin = _p(params, "rope_cos", q), _p(params, "rope_sin", q)
        fq, fk = _elu1(q), _elu1(k)
        if family == "rala":
            qbar = fq.mean(dim=-2, keepdim=True)
            fk = fk * torch.softmax(scale * qbar @ fk.transpose(-2, -1), dim=-1).transpose(-2, -1) * n
        num = rotate(fq, cos, sin) @ rotate(fk, cos, sin).transpose(-2, -1)
        S = fq @ fk.sum(dim=-2, keepdim=True).transpose(-2, -1)
        if family == "mala":  # code+rope: z from the unrotated features
            z = scale * S / n
            w = scale / n * num * (1 + 1 / (z + EPS)) - z / n
        else:
            w = num / (S + n * eps)
        return w, w @ v
    if family == "polaformer":
        a, p = _p(params, "feature_scale", q), _p(params, "exponent", q)  # [H, 1, d]
        def parts(x):  # broadcast over [B, H, N, d]
            u = x / a
            return F.relu(u) ** p, F.relu(-u) ** p
        qp, qn = parts(q)
        kp, kn = parts(k)
        fk = torch.cat([kp, kn], dim=-1)
        maps = []
        for fq in (torch.cat([qp, qn], dim=-1), torch.cat([qn, qp], dim=-1)):
            num = fq @ fk.transpose(-2, -1)
            maps.append(num / (num.sum(dim=-1, keepdim=True) + n * eps))
        v1, v2 = torch.chunk(v, 2, dim=-1)
        return tuple(maps), torch.cat([maps[0] @ v1, maps[1] @ v2], dim=-1)
    if family == "agent":
        A = agents.to(torch.float64)
        b1, b2 = _p(params, "agent_bias", q), _p(params, "token_bias", q)
        gather = torch.softmax(scale * A @ k.transpose(-2, -1) + b1, dim=-1)
        read = torch.softmax(scale * q @ A.transpose(-2, -1) + b2, dim=-1)
        w = read @ gather
        return w, read @ (gather @ v)
    raise ValueError(f"no field family '{family}@{convention}' (known: "
                     f"{', '.join(f'{f}@{c}' for f, c in FIELD_VARIANTS)})")


def field_outputs(family, convention, q, k, v, scale, params, agents=None) -> torch.Tensor:
    return weights_and_outputs(family, convention, q, k, v, scale, params, agents)[1]
