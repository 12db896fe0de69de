"""Plain float64 numpy recomputation of per-head attention outputs from dumped q, k, v, in the
code convention of lib/include/attnscope/variant.hpp. Written apart from attnscope_dump.attention
on purpose: the tests compare the two."""
import numpy as np


def _phi(name, x):
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "identity":
        return x
    if name == "elu1":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    raise ValueError(name)


def weights(family, fmap, q, k, scale):
    """q [n, d], k [N, d] float64 -> W [n, N]."""
    n_keys = k.shape[0]
    if family == "softmax":
        s = scale * q @ k.T
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    fq, fk = _phi(fmap, q), _phi(fmap, k)
    if family == "linear":
        a = fq @ fk.T
        den = a.sum(axis=1, keepdims=True)
        return np.divide(a, den, out=np.zeros_like(a), where=den > 0)
    c2 = scale / n_keys
    a = c2 * fq @ fk.T
    if family == "inline":
        return a - a.mean(axis=1, keepdims=True) + 1.0 / n_keys
    if family == "mala":
        s = a.sum(axis=1, keepdims=True)
        return (1.0 + 1.0 / s) * a - s / n_keys
    raise ValueError(family)


def outputs(f, layer, image, head):
    """Recomputed W V of one head from an open h5py dump, float64."""
    g = f[f"layers/{layer}"]
    q, k, v = (g[name][image, head].astype(np.float64) for name in ("q", "k", "v"))
    w = weights(f.attrs["attention_family"], f.attrs["feature_map"], q, k, float(f.attrs["scale"]))
    return w @ v
