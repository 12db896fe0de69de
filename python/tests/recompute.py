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
    c2 = 1.0 if family == "linear" else scale / n_keys
    a = c2 * fq @ fk.T
    if family == "inline":
        return a - a.mean(axis=1, keepdims=True) + 1.0 / n_keys
    if family not in ("linear", "mala"):
        raise ValueError(family)
    # A row is degenerate (zero) when |S| <= 1e-12 |S|'s magnitude (lib/src/linear_rows.hpp);
    # a negative S (phi = identity) is a real row.
    ksum = fk.sum(axis=0)
    s = c2 * fq @ ksum[:, None]
    live = np.abs(s) > 1e-12 * c2 * np.linalg.norm(fq, axis=1, keepdims=True) * np.linalg.norm(ksum)
    s = np.where(live, s, 1.0)
    w = a / s if family == "linear" else (1.0 + 1.0 / s) * a - s / n_keys
    return np.where(live, w, 0.0)


def outputs(f, layer, image, head):
    """Recomputed W V of one head from an open h5py dump, float64."""
    g = f[f"layers/{layer}"]
    q, k, v = (g[name][image, head].astype(np.float64) for name in ("q", "k", "v"))
    w = weights(f.attrs["attention_family"], f.attrs["feature_map"], q, k, float(f.attrs["scale"]))
    return w @ v
