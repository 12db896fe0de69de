"""attnscope on arrays: the C++ library's attention variants and analyses on numpy arrays and torch
CPU tensors, with the numbers the command line gives on a dump (docs/python.md).

Heads follow the dump's layout: one head is a ``[tokens, dim]`` array, a stack of heads is
``[images, heads, tokens, dim]`` (one layer of a dump). float16, float32 and float64 are accepted.
``weights`` and ``outputs`` compute in float for float16/float32 and in double for float64, and
read a C-contiguous array of that type in place; the analyses take the dump's precision (float32;
float64 values are rounded to it). The GIL is released while the library's threads work.

Errors are the command line's messages: ``ValueError`` for bad values, shapes, names and
computations without a finite answer, ``TypeError`` for a dtype or object that is not an array.
"""
from __future__ import annotations

import numpy as np

from . import _attnscope as _core
from .live import analyze

__version__ = _core.__version__
__all__ = ["analyze", "weights", "outputs", "variant_name", "families", "confusion", "confused_pairs",
           "local_mass", "locality", "census", "attention_map", "entropy", "distance", "rank",
           "totals", "row_stats", "sweep", "sinks", "token_norms", "rollout", "mask", "verify"]

_FLOAT_DTYPES = ("float16", "float32", "float64")


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _array(x, name: str):
    """numpy view of x (a torch CPU tensor is shared, not copied)."""
    if x is None:
        return None
    if _is_torch(x):
        if x.device.type != "cpu":
            raise TypeError(f"{name}: expected a CPU tensor, got one on {x.device} (use .cpu())")
        dtype = str(x.dtype).replace("torch.", "")
        if name == "mask" and dtype == "bool":
            return x.detach().numpy()
        if dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name}: expected float16, float32 or float64 values, got {dtype}")
        return x.detach().numpy()
    return np.asarray(x)


def _like_inputs(result, *inputs):
    """Results as torch tensors where any input was one (numpy arrays otherwise)."""
    if not any(_is_torch(x) for x in inputs):
        return result
    import torch
    if isinstance(result, np.ndarray):
        return torch.from_numpy(result)
    if isinstance(result, dict):
        return {k: _like_inputs(v, *inputs) for k, v in result.items()}
    if isinstance(result, tuple):
        return tuple(_like_inputs(v, *inputs) for v in result)
    return result


def variant_name(spec: str, convention: str = "paper") -> str:
    """The canonical name of a variant spec (``"mala"`` -> ``"mala:elu1@paper"``)."""
    return _core.variant_name(spec, convention)


def families() -> list[str]:
    """The attention families of the registry (``attnscope info --families``)."""
    return _core.families()


def weights(q, k, variant: str, scale=None, mask=None, *, convention: str = "paper",
            return_degenerate: bool = False, out=None):
    """Explicit attention weights ``[..., tokens, tokens]`` of any registry variant.

    ``scale`` is the model's s (default ``dim ** -0.5``); ``mask`` a ``[tokens, tokens]`` bool
    array (True: the key stays visible), shared by every head. Degenerate rows are zeros; with
    ``return_degenerate`` their indices come too (a list per head). ``out``: a C-contiguous
    array of the computing dtype (float32, or float64 for float64 inputs) and the result's shape
    to write into (and return) instead of a new one, numpy's convention."""
    w, dead = _core.weights(_array(q, "q"), _array(k, "k"), variant, scale, _array(mask, "mask"),
                            convention, _array(out, "out"))
    w = _like_inputs(w, q, k)
    return (w, dead) if return_degenerate else w


def outputs(q, k, v, variant: str, scale=None, mask=None, *, convention: str = "paper",
            return_degenerate: bool = False):
    """Attention outputs ``W V`` ``[..., tokens, dim_v]``, in linear time where the family has a
    kernel form and no mask is given."""
    o, dead = _core.outputs(_array(q, "q"), _array(k, "k"), _array(v, "v"), variant, scale,
                            _array(mask, "mask"), convention)
    o = _like_inputs(o, q, k, v)
    return (o, dead) if return_degenerate else o


def confusion(q, k, variant: str, *, eps: float = 1e-3, query_eps: float = 1e-6, scale=None,
              reference: bool = False, convention: str = "paper") -> dict:
    """Confused pairs per head (``attnscope confusion``): ``pairs``, ``degenerate_rows``,
    ``degenerate_pairs`` and ``candidates``, each ``[images, heads]`` (numbers for one head).
    ``reference`` counts by brute force."""
    return _core.confusion(_array(q, "q"), _array(k, "k"), variant, eps, query_eps, scale,
                           reference, convention)


def confused_pairs(q, k, variant: str, *, eps: float = 1e-3, query_eps: float = 1e-6, scale=None,
                   convention: str = "paper") -> np.ndarray:
    """The confused pairs (i, j), i < j, of one head ``[tokens, dim]`` as a ``[pairs, 2]`` array,
    found by brute force (O(N^3): for heads of a few hundred tokens)."""
    return _core.confused_pairs(_array(q, "q"), _array(k, "k"), variant, eps, query_eps, scale,
                                convention)


def local_mass(q, k, variant: str, grid, *, window: int = 3, scale=None,
               convention: str = "paper", return_degenerate: bool = False):
    """Each query's attention in its ``window`` x ``window`` grid window ``[..., tokens]`` (NaN
    for prefix tokens and degenerate rows). ``grid`` is ``(prefix_tokens, height, width)``."""
    mass, dead = _core.local_mass(_array(q, "q"), _array(k, "k"), variant, list(grid), window,
                                  scale, convention)
    return (mass, dead) if return_degenerate else mass


def locality(q, k, variant: str, grid, *, window: int = 3, scale=None,
             convention: str = "paper") -> dict:
    """Local mass per head over the images, as ``attnscope locality`` totals a layer: ``queries``,
    ``mean``, ``std``, ``min``, ``max``, ``degenerate_rows`` (each ``[heads]``), ``images``,
    ``uniform_baseline``."""
    return _core.locality(_array(q, "q"), _array(k, "k"), variant, list(grid), window, scale,
                          convention)


def census(q, k, variant: str, *, sum_tol: float = 1e-6, scale=None,
           convention: str = "paper") -> dict:
    """The weight census per head over the images (``attnscope census``): counts of negative and
    zero weights, the smallest weight, rows not summing to 1, each ``[heads]``."""
    return _core.census(_array(q, "q"), _array(k, "k"), variant, sum_tol, scale, convention)


def attention_map(q, k, variant: str, grid, token: int, *, scale=None, convention: str = "paper"):
    """Query ``token``'s row laid out on the grid: ``(grid_weights [..., height, width],
    prefix_weights [..., prefix_tokens])``, computed in double (``attnscope maps``)."""
    return _core.attention_map(_array(q, "q"), _array(k, "k"), variant, list(grid), token, scale,
                               convention)


def entropy(q, k, variant: str, *, log_eps: float = 0.0, scale=None, reference: bool = False,
            convention: str = "paper") -> dict:
    """Per query: ``entropy`` and ``negative_mass`` ``[..., tokens]``; per head the counters
    ``degenerate_rows`` and ``negative_weight_rows`` (``attnscope entropy``)."""
    return _core.per_query("entropy", _array(q, "q"), _array(k, "k"), None, variant, scale,
                           {"log_eps": log_eps}, reference, convention)


def distance(q, k, variant: str, grid, *, patch_size: float = 1.0, renormalise: bool = False,
             scale=None, reference: bool = False, convention: str = "paper") -> dict:
    """Per query: the mean attention ``distance`` in pixels and the ``grid_mass`` ``[..., tokens]``;
    per head the counters (``attnscope distance``)."""
    return _core.per_query("distance", _array(q, "q"), _array(k, "k"), None, variant, scale,
                           {"grid": list(grid), "patch_size": patch_size,
                            "renormalise": renormalise}, reference, convention)


def rank(q, k, v, variant: str, *, rank_tol: float = 0.0, out=None, scale=None,
         reference: bool = False, convention: str = "paper") -> dict:
    """Per head: rank and effective rank of W, of the kernel form's K^T V, condition ratios of K
    and the features, and with ``out`` (the model's own attention output, shaped like ``v``) its
    rank-collapse residual (NaN without it) (``attnscope rank``); each ``[..., 1]``."""
    return _core.per_query("rank", _array(q, "q"), _array(k, "k"), _array(v, "v"), variant, scale,
                           {"rank_tol": rank_tol}, reference, convention, _array(out, "out"))


def totals(analysis: str, q, k, variant: str, v=None, *, out=None, scale=None,
           reference: bool = False, convention: str = "paper", **options) -> dict:
    """The per-head totals over the images of ``entropy``, ``distance`` or ``rank``, as the
    command totals one layer of a dump: per quantity the statistics of every (image, query) value
    and of the images' means, the histogram of the first quantity and the counters. ``options``:
    entropy ``log_eps``, ``bins``; distance ``grid``, ``patch_size``, ``renormalise``, ``bins``;
    rank ``rank_tol`` (and ``out``, the model's attention output, for the collapse residual)."""
    if "grid" in options:
        options["grid"] = list(options["grid"])
    return _core.totals(analysis, _array(q, "q"), _array(k, "k"), _array(v, "v"), variant, scale,
                        options, reference, convention, _array(out, "out"))


def row_stats(w, topk: int = 5) -> dict:
    """Spikiness of one attention row (``attnscope spikiness``): ``max_weight``, ``entropy``,
    ``effective_keys``, ``topk_mass``, ``negatives``, ``zeros``."""
    return _core.row_stats(_array(w, "w"), topk)


def sweep(q, k, variant: str, token: int, *, scales: str = "0.25:8:33", keys: str = "top,median",
          topk: int = 5, space: str = "auto", scale=None, keep_weights: bool = False,
          convention: str = "paper") -> dict:
    """One query's spikiness under a sweep of its magnitude (``attnscope spikiness``): query
    ``token`` of one head ``[tokens, dim]`` scaled by each of ``scales`` ("LO:HI:COUNT" log-spaced,
    or "0.5,1,2") in the query or feature ``space`` ("auto": query for softmax, feature for the
    kernel families). Returns ``key_high``, ``key_low`` (the reference keys at scale 1, ``keys``
    "HIGH,LOW" each top, median, bottom or an index), ``points`` (per scale: ``ratio`` of their
    weights and the row's spikiness) and ``laws`` (each law of the family checked, as the command's
    laws table); with ``keep_weights`` also ``weights``, the row at each scale."""
    return _core.sweep(_array(q, "q"), _array(k, "k"), variant, token, scales, keys, topk, space,
                       scale, keep_weights, convention)


def sinks(q, k, variant: str, *, threshold: float = 0.5, scale=None, reference: bool = False,
          convention: str = "paper") -> dict:
    """Attention sinks per head (``attnscope sinks``): ``received`` ``[..., tokens]``, each key's
    mean weight over the head's valid rows; ``sink_keys``, the keys above ``threshold`` in every
    valid row (a list per head, ``[images][heads]`` for a stack); ``valid_rows`` and
    ``degenerate_rows`` per head."""
    return _core.sinks(_array(q, "q"), _array(k, "k"), variant, threshold, scale, reference,
                       convention)


def token_norms(x, *, ratio: float = 4.0) -> dict:
    """High-norm tokens of one layer (``attnscope sinks --norms``): ``x`` the layer's values or
    attention outputs ``[images, heads, tokens, dim]`` (or one head ``[tokens, dim]``). Each
    token's norm over the heads against the image's median: ``ratio`` ``[images, tokens]``,
    ``high`` (ratio above ``ratio``), ``median`` ``[images]``."""
    return _core.token_norms(_array(x, "x"), ratio)


def rollout(q, k, variant: str, *, fusion: str = "mean", scale=None, reference: bool = False,
            convention: str = "paper") -> dict:
    """Attention rollout (``attnscope rollout``): ``q`` and ``k`` are lists with one array per
    layer, in the model's order, each ``[images, heads, tokens, dim]`` (or ``[tokens, dim]``).
    Returns ``cls`` ``[images, tokens]``, row 0 (the class token) of the product of the layers'
    head-fused (``fusion`` mean, max or min), residual-added, row-normalised weights, and per image
    ``fixed_rows`` (rows replaced by the identity's) and ``degenerate_rows``."""
    if not isinstance(q, (list, tuple)) or not isinstance(k, (list, tuple)):
        raise TypeError("rollout: q and k are lists of arrays, one per layer")
    return _core.rollout([_array(x, "q") for x in q], [_array(x, "k") for x in k], variant,
                         fusion, scale, reference, convention)


def mask(q, k, v, variant: str, grid, *, masks: str = "local:3,local:5,local:7,random:9,"
         "random:25,random:49", seed: int = 0, layer: int = 0, scale=None,
         convention: str = "paper") -> dict:
    """Layer-local masking (``attnscope mask``): per mask (``"local:K"`` windows, ``"random:N"``
    keys drawn from ``seed`` per image, ``layer`` and head as the command draws them for that
    dump layer), ``change`` ``[images, heads]`` = |O' - O| / |O| (NaN where no row was left to
    compare), and per head over the images ``values``, ``change_mean``, ``change_std``,
    ``change_min``, ``change_max``, ``removed_mass_queries``, ``removed_mass_mean``,
    ``removed_mass_std``, ``empty_rows``, ``degenerate_rows``, ``unmeasured_heads``. ``grid``
    is ``(prefix_tokens, height, width)``."""
    return _core.mask(_array(q, "q"), _array(k, "k"), _array(v, "v"), variant, masks, list(grid),
                      seed, layer, scale, convention)


def verify(*, seed: int = 0, trials: int = 200) -> list[dict]:
    """The papers' propositions and identities checked by numbers (``attnscope verify
    --no-timing``): one dict per row with ``check``, ``what``, ``trials``, ``unusable_trials``,
    ``margin``, ``threshold``, ``sense``, ``result`` and ``pass``."""
    return _core.verify(seed, trials)
