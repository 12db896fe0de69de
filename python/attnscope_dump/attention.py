"""The attention families in the released code's convention ("code" in
lib/include/attnscope/variant.hpp), as explicit N x N weights and as outputs over batched heads.

One table, FAMILY_TABLE, holds one object per family, mirroring the C++ registry one to one; the
functions below only look a family up and ask it. Feature maps are a second table, MAP_TABLE.

Shapes: q, k, v are [B, H, n, d] and [B, H, N, d], *without* the model's scale s; weights are
[B, H, n, N] and every row sums to 1 (degenerate rows, below, are zero). i indexes queries, j and
m keys, N is the number of keys; with c2 = s / N:

  softmax    W_ij = exp(s q_i.k_j) / sum_m exp(s q_i.k_m)
  linear     W_ij = phi(q_i).phi(k_j) / S_i,  S_i = sum_m phi(q_i).phi(k_m)       (scale cancels)
  inline     W_ij = A_ij - (1/N) sum_m A_im + 1/N,  A_ij = c2 phi(q_i).phi(k_j)         (eq. 4)
  mala       W_ij = (1 + 1/S_i) A_ij - S_i / N,  A and S_i = sum_m A_im as above     (eq. 8-9)
  efficient  W_ij = rho_q(q_i).rho_k(k_j) / S_i, rho_q a softmax over the d features of q_i,
             rho_k a softmax over the N keys of each feature; S_i = 1 up to rounding (Shen et
             al., WACV 2021); no scale
  cosformer  W_ij = ReLU(q_i).ReLU(k_j) cos(pi/2 (i - j)/N) / S_i, S_i the row sum (Qin et al.,
             ICLR 2022, bidirectional); through cos(a - b) = cos a cos b + sin a sin b the
             features are [ReLU(x_t) cos(pi t/(2N)), ReLU(x_t) sin(pi t/(2N))], t the token index
  relu       W_ij = ReLU(q_i).ReLU(k_j) / (S_i + 1e-15), S_i = sum_m ReLU(q_i).ReLU(k_m): ReLU linear
             attention as EfficientViT (ICCV 2023) and SANA compute it, no scale; rows sum to
             S_i/(S_i + 1e-15), not 1, and a row with S_i = 0 is 0 (the code's 0 / eps)

Every family but softmax has the row form of lib/src/linear_rows.hpp, w_ij = a_i A_ij + b_i with
A_ij = c2 f(q_i).f(k_j) (c2 = s/N for inline and mala, 1 otherwise) and S_i = sum_j A_ij:
linear, efficient and cosformer a = 1/S, b = 0; inline a = 1, b = (1 - S)/N; mala a = 1 + 1/S,
b = -S/N. So outputs take linear time: o_i = a_i c2 f(q_i) [sum_j f(k_j) v_j^T] + b_i sum_j v_j.

Degenerate rows (families with a = 1/S or 1 + 1/S): a row with |S_i| <= 1e-12 c2 |f(q_i)|
|sum_m f(k_m)| has no usable denominator and gets weights 0, the rule of the C++ library
(kTinyDenominator): e.g. a query that ReLU kills entirely. A negative S_i (phi = identity) is a
legitimate row and is kept as is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Callable

import torch
import torch.nn.functional as F

# kTinyDenominator of lib/include/attnscope/attention.hpp: |S| at or below this times its magnitude
# makes a degenerate row.
_TINY = 1e-12


# --- feature maps -----------------------------------------------------------------------------

def _focused(x: torch.Tensor, p: float) -> torch.Tensor:
    """FLatten's focused map (Han et al., ICCV 2023): (|r| / |r^p|) r^p with r = ReLU(x), powers
    element by element, norms over the last axis; 0 where r = 0 entirely. Computed from
    t = r / max(r) as max(r) (|t| / |t^p|) t^p, the same map (the ratio does not change when r^p
    is scaled), whose powers and norms cannot overflow, nor underflow to an all-zero live row."""
    r = F.relu(x)
    top = r.amax(dim=-1, keepdim=True)
    live = top > 0
    top = torch.where(live, top, torch.ones_like(top))  # keeps 0/0 out, also of the backward pass
    t = r / top
    u = t ** p  # its largest entry is exactly 1, so |u| >= 1 on a live row (0 on a dead one)
    y = top * (t.norm(dim=-1, keepdim=True) / u.norm(dim=-1, keepdim=True).clamp_min(1.0)) * u
    return torch.where(live, y, torch.zeros_like(y))


def _positive(p: float) -> str | None:
    return None if math.isfinite(p) and p > 0 else "the power P must be a positive finite number"


def _finite(p: float) -> str | None:
    return None if math.isfinite(p) else "the slope must be a finite number"


@dataclass(frozen=True)
class MapKind:
    """One entry of MAP_TABLE: phi(x, parameter) applied over the last axis; `default` is the
    parameter when the spec gives none (None: the map takes no parameter)."""
    apply: Callable[[torch.Tensor, float | None], torch.Tensor]
    default: float | None = None
    check: Callable[[float], str | None] | None = None


MAP_TABLE: dict[str, MapKind] = {
    "identity": MapKind(lambda x, _: x),
    "relu": MapKind(lambda x, _: F.relu(x)),
    "leaky_relu": MapKind(lambda x, a: x.clamp_min(0) + a * x.clamp_max(0), 0.01, _finite),
    "elu1": MapKind(lambda x, _: F.elu(x) + 1.0),
    "exp": MapKind(lambda x, _: torch.exp(x)),
    "focused": MapKind(_focused, 3.0, _positive),
}


def _shortest(x: float) -> str:
    """The shortest text that reads back as x, written as C++'s std::to_chars writes it (fixed or
    exponent form, whichever is shorter, fixed on a tie): 3 -> "3", 0.0001 -> "1e-04"."""
    d = Decimal(repr(float(x))).normalize()
    fixed = format(d, "f")
    sign, digits, exp = d.as_tuple()
    e10 = exp + len(digits) - 1
    mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    sci = ("-" if sign else "") + mant + "e" + ("-" if e10 < 0 else "+") + f"{abs(e10):02d}"
    return fixed if len(fixed) <= len(sci) else sci


@dataclass(frozen=True)
class FeatureMap:
    """A parsed feature-map spec ("relu", "leaky_relu=0.2", "focused", "focused=2.5")."""
    kind: str
    param: float | None = None

    @property
    def name(self) -> str:
        """Canonical spec, as the C++ library names it ("focused" -> "focused=3")."""
        return self.kind if self.param is None else f"{self.kind}={_shortest(self.param)}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return MAP_TABLE[self.kind].apply(x, self.param)


def parse_feature_map(spec: str) -> FeatureMap:
    """`name` or `name=PARAMETER`; ValueError naming the known maps on anything else."""
    head, eq, text = spec.partition("=")
    entry = MAP_TABLE.get(head)
    if entry is None:
        raise ValueError(f"unknown feature map '{spec}' (expected one of "
                         f"{', '.join(MAP_TABLE)}; relu_affine is not available in Python)")
    if entry.default is None:
        if eq:
            raise ValueError(f"feature map '{spec}': this map takes no parameter")
        return FeatureMap(head)
    if not eq:
        return FeatureMap(head, entry.default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    why = entry.check(value) if entry.check else None
    if why or math.isnan(value):
        raise ValueError(f"feature map '{spec}': {why or 'the parameter is not a number'}")
    return FeatureMap(head, value)


def feature_map(name: str, x: torch.Tensor) -> torch.Tensor:
    """phi(x) for a feature-map spec, over the last axis."""
    return parse_feature_map(name)(x)


# --- families ---------------------------------------------------------------------------------

class Family:
    """What every family says about itself. `map_rule`: "none" (takes no feature map), "required"
    (a spec must name one) or "default" (`default_map` when none is named). `model_map` is the map
    the project's models use (the dump's feature_map attribute). `positional`: whether a weight
    depends on the token indices i, j (not only on q_i and k_j)."""
    name: str
    map_rule: str = "none"
    default_map: str | None = None
    model_map: str = "none"
    positional: bool = False

    @property
    def takes_map(self) -> bool:
        return self.map_rule != "none"

    def resolve_map(self, fmap: str | None) -> FeatureMap | None:
        if not self.takes_map:
            if fmap not in (None, "none"):
                raise ValueError(f"attention family '{self.name}' takes no feature map "
                                 f"(got '{fmap}')")
            return None
        return parse_feature_map(fmap or self.default_map or self.model_map)

    def weights(self, q, k, scale, phi):
        raise NotImplementedError

    def outputs(self, q, k, v, scale, phi):
        return self.weights(q, k, scale, phi) @ v


class Softmax(Family):
    name = "softmax"

    def weights(self, q, k, scale, phi):
        return torch.softmax(scale * (q @ k.transpose(-2, -1)), dim=-1)


class AffineRows(Family):
    """A family with the row form w_ij = a_i A_ij + b_i, A_ij = c2 f(q_i).f(k_j) (module
    docstring). A family states its features, c2 and (a, b) from S; `explicit` is the same row
    written from A, which linear and inline keep in the form the models always computed, so their
    forward (and the dumps of the committed models) stays bit for bit as it was."""
    guarded = True  # a = 1/S or 1 + 1/S: degenerate rows are zeroed

    def features(self, q, k, phi):
        return phi(q), phi(k)

    def product_factor(self, scale: float, n: int) -> float:
        return 1.0

    def coefficients(self, s, n: int):
        raise NotImplementedError

    def explicit(self, a, s, n: int):
        alpha, beta = self.coefficients(s, n)
        return alpha * a + beta

    def _denominators(self, fq, fk, c2):
        """S [B, H, n, 1] and whether each row is degenerate (module docstring)."""
        ksum = fk.sum(dim=-2, keepdim=True)
        s = c2 * (fq @ ksum.transpose(-2, -1))
        if not self.guarded:
            return s, torch.zeros_like(s, dtype=torch.bool)
        with torch.no_grad():  # a decision, not a value: no gradient through the norms
            magnitude = c2 * fq.norm(dim=-1, keepdim=True) * ksum.norm(dim=-1, keepdim=True)
            dead = ~(s.abs() > _TINY * magnitude)
        # keeps 0/0 out of the values and of the backward pass
        return torch.where(dead, torch.ones_like(s), s), dead

    def weights(self, q, k, scale, phi):
        n = k.shape[-2]
        fq, fk = self.features(q, k, phi)
        c2 = self.product_factor(scale, n)
        s, dead = self._denominators(fq, fk, c2)
        w = self.explicit(c2 * (fq @ fk.transpose(-2, -1)), s, n)
        return torch.where(dead, torch.zeros_like(w), w) if self.guarded else w

    def outputs(self, q, k, v, scale, phi):
        """Linear time: a_i c2 f(q_i) [f(K)^T V] + b_i sum_j v_j."""
        n = k.shape[-2]
        fq, fk = self.features(q, k, phi)
        c2 = self.product_factor(scale, n)
        s, dead = self._denominators(fq, fk, c2)
        alpha, beta = self.coefficients(s, n)
        o = alpha * (c2 * (fq @ (fk.transpose(-2, -1) @ v))) + beta * v.sum(dim=-2, keepdim=True)
        return torch.where(dead, torch.zeros_like(o), o) if self.guarded else o


class Linear(AffineRows):
    name, map_rule, model_map = "linear", "required", "relu"

    def coefficients(self, s, n):
        return 1.0 / s, 0.0

    def explicit(self, a, s, n):
        return a / s


class InLine(AffineRows):
    name, map_rule, default_map, model_map = "inline", "default", "identity", "identity"
    guarded = False  # no denominator

    def product_factor(self, scale, n):
        return scale / n

    def coefficients(self, s, n):
        return 1.0, (1.0 - s) / n

    def explicit(self, a, s, n):
        return a - a.mean(dim=-1, keepdim=True) + 1.0 / n


class Mala(AffineRows):
    name, map_rule, default_map, model_map = "mala", "default", "elu1", "elu1"

    def product_factor(self, scale, n):
        return scale / n

    def coefficients(self, s, n):
        return 1.0 + 1.0 / s, -s / n


class Efficient(Linear):
    name, map_rule, model_map = "efficient", "none", "none"

    def features(self, q, k, phi):
        return torch.softmax(q, dim=-1), torch.softmax(k, dim=-2)


class CosFormer(Linear):
    name, map_rule, model_map, positional = "cosformer", "none", "none", True

    def features(self, q, k, phi):
        n = k.shape[-2]

        def reweighted(x):
            t = torch.arange(x.shape[-2], dtype=x.dtype, device=x.device)[:, None]
            angle = (math.pi / 2) * t / n
            r = F.relu(x)
            return torch.cat([r * torch.cos(angle), r * torch.sin(angle)], dim=-1)

        return reweighted(q), reweighted(k)


class Relu(AffineRows):
    """EfficientViT / SANA's ReLU linear attention as their released code computes it (LiteMLA's
    relu_linear_att): the numerator over the denominator plus eps = 1e-15, by division, no
    guard (a row with S = 0 is 0 / eps = 0, with finite gradients)."""
    name = "relu"
    guarded = False
    eps = 1e-15

    def features(self, q, k, phi):
        return F.relu(q), F.relu(k)

    def coefficients(self, s, n):
        return 1.0 / (s + self.eps), 0.0

    def explicit(self, a, s, n):
        return a / (s + self.eps)


FAMILY_TABLE: dict[str, Family] = {
    f.name: f for f in (Softmax(), Linear(), InLine(), Mala(), Efficient(), CosFormer(), Relu())}
FAMILIES = tuple(FAMILY_TABLE)
# The feature map each family uses in this project's models (the dump's `feature_map` attribute).
FEATURE_MAPS = {name: f.model_map for name, f in FAMILY_TABLE.items()}


def family(name: str) -> Family:
    f = FAMILY_TABLE.get(name)
    if f is None:
        raise ValueError(f"unknown attention family '{name}' (expected one of {FAMILIES})")
    return f


def attention_weights(family_name: str, q: torch.Tensor, k: torch.Tensor, scale: float,
                      fmap: str | None = None) -> torch.Tensor:
    """Explicit weights [B, H, n, N] of the family in the code convention (module docstring);
    `fmap` is a feature-map spec, the family's own when None."""
    f = family(family_name)
    return f.weights(q, k, scale, f.resolve_map(fmap))


def attention_outputs(family_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scale: float, fmap: str | None = None) -> torch.Tensor:
    """O = W V, [B, H, n, dv]; in linear time for every family but softmax."""
    f = family(family_name)
    return f.outputs(q, k, v, scale, f.resolve_map(fmap))


def parse_variant_spec(spec: str) -> tuple[str, str, str]:
    """"family[:map][@convention]" as the C++ registry names variants ("inline",
    "linear:focused=3", "mala:elu1@code") -> (family, feature map or "none", convention; "code"
    when not given). ValueError naming what is known on an unknown family, map or convention."""
    text, _, convention = str(spec).partition("@")
    name, _, fmap = text.partition(":")
    f = family(name.strip())
    convention = convention.strip() or "code"
    if convention not in ("code", "paper", "code+rope"):
        raise ValueError(f"variant '{spec}': convention must be code, paper or code+rope, not "
                         f"'{convention}'")
    phi = f.resolve_map(fmap.strip() or None)
    return f.name, (phi.name if phi is not None else "none"), convention
