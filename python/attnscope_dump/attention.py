"""The four attention families in the released code's convention ("code" in
lib/include/attnscope/variant.hpp), as explicit N x N weights over batched heads.

Shapes: q, k, v are [B, H, N, d], *without* the model's scale s; weights are [B, H, N, N] and
every row sums to 1. With c = (s / N) ** 0.5:

  softmax          W_ij = exp(s q_i.k_j) / sum_m exp(s q_i.k_m)
  linear (relu)    W_ij = phi(q_i).phi(k_j) / sum_m phi(q_i).phi(k_m)          phi = ReLU
  inline (identity) W_ij = a_ij - (1/N) sum_m a_im + 1/N,  a_ij = c^2 q_i.k_j
  mala (elu1)      W_ij = beta_i a_ij - gamma_i,  a_ij = c^2 phi(q_i).phi(k_j),  phi = ELU + 1,
                   S_i = sum_m a_im,  beta_i = 1 + 1/S_i,  gamma_i = S_i / N

Degenerate rows (linear and MALA): with S_i = phi(q_i).sum_m phi(k_m) (times c^2 for MALA), a row
with |S_i| <= 1e-12 |phi(q_i)| |sum_m phi(k_m)| (times c^2) has no usable denominator and gets
weights 0, the rule of the C++ library (kTinyDenominator in lib/src/linear_rows.hpp): e.g. a query
that ReLU kills entirely. A negative S_i (phi = identity) is a legitimate row and is kept as is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FAMILIES = ("softmax", "linear", "inline", "mala")
# The feature map each family uses in this project's models (the dump's `feature_map` attribute).
FEATURE_MAPS = {"softmax": "none", "linear": "relu", "inline": "identity", "mala": "elu1"}
# kTinyDenominator of lib/include/attnscope/attention.hpp: |S| at or below this times its magnitude
# makes a degenerate row.
_TINY = 1e-12


def feature_map(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return F.relu(x)
    if name == "identity":
        return x
    if name == "elu1":
        return F.elu(x) + 1.0
    raise ValueError(f"unknown feature map '{name}' (expected relu, identity or elu1)")


def attention_weights(family: str, q: torch.Tensor, k: torch.Tensor, scale: float,
                      fmap: str | None = None) -> torch.Tensor:
    """Explicit weights [B, H, N, N] of `family` in the code convention (see module docstring)."""
    fmap = fmap or FEATURE_MAPS[family]
    n = k.shape[-2]  # number of keys (N of the formulas)
    if family == "softmax":
        return torch.softmax(scale * (q @ k.transpose(-2, -1)), dim=-1)
    if family not in FAMILIES:
        raise ValueError(f"unknown attention family '{family}' (expected one of {FAMILIES})")
    fq, fk = feature_map(fmap, q), feature_map(fmap, k)
    c2 = 1.0 if family == "linear" else scale / n
    a = c2 * (fq @ fk.transpose(-2, -1))
    if family == "inline":
        return a - a.mean(dim=-1, keepdim=True) + 1.0 / n
    s, dead = _denominators(fq, fk, c2)
    s = torch.where(dead, torch.ones_like(s), s)  # keeps 0/0 out of the backward pass too
    w = a / s if family == "linear" else (1.0 + 1.0 / s) * a - s / n
    return torch.where(dead, torch.zeros_like(w), w)


def _denominators(fq: torch.Tensor, fk: torch.Tensor, c2: float):
    """S [B, H, n, 1] and whether each row is degenerate (see the module docstring)."""
    ksum = fk.sum(dim=-2, keepdim=True)  # [B, H, 1, d]
    s = c2 * (fq @ ksum.transpose(-2, -1))
    with torch.no_grad():  # a decision, not a value: no gradient through the norms
        magnitude = c2 * fq.norm(dim=-1, keepdim=True) * ksum.norm(dim=-1, keepdim=True)
        dead = ~(s.abs() > _TINY * magnitude)
    return s, dead


def attention_outputs(family: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scale: float, fmap: str | None = None) -> torch.Tensor:
    """O = W V, [B, H, N, dv]."""
    return attention_weights(family, q, k, scale, fmap) @ v
