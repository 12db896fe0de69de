"""Plain float64 numpy recomputation of per-head attention weights and outputs from dumped q, k, v,
in the code convention of lib/include/attnscope/variant.hpp. Written apart from
attnscope_dump.attention on purpose, straight from each family's formula (no shared row form, no
feature trick for cosFormer): the tests compare the two."""
import numpy as np

TINY = 1e-12  # kTinyDenominator: |S| not above TINY * |S|'s magnitude is a degenerate (zero) row


def _focused(x, p):
    """(|r| / |r^p|) r^p with r = ReLU(x) row by row; a row that ReLU zeroes stays zero."""
    y = np.zeros_like(x)
    for t, row in enumerate(np.maximum(x, 0.0)):
        if row.any():
            powered = row ** p
            y[t] = np.linalg.norm(row) / np.linalg.norm(powered) * powered
    return y


def phi(spec, x):
    """A feature-map spec ("relu", "leaky_relu=0.2", "focused", "focused=2") applied row-wise."""
    name, _, param = spec.partition("=")
    if name == "identity":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "leaky_relu":
        return np.where(x > 0, x, float(param or 0.01) * x)
    if name == "elu1":
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    if name == "exp":
        return np.exp(x)
    if name == "focused":
        return _focused(x, float(param or 3.0))
    raise ValueError(f"feature map {spec!r}")


def _normalised(a, s, magnitude):
    """Row i of a divided by s[i]; a row whose |s[i]| is not above TINY * magnitude[i] is zero
    (degenerate)."""
    w = np.zeros_like(a)
    for i in range(a.shape[0]):
        if abs(s[i]) > TINY * magnitude[i]:
            w[i] = a[i] / s[i]
    return w


def _by_sum_of_features(fq, fk):
    """f(q_i).f(k_j) / S_i with S_i = f(q_i).sum_j f(k_j), as the library forms S."""
    ksum = fk.sum(axis=0)
    return _normalised(fq @ fk.T, fq @ ksum, np.linalg.norm(fq, axis=1) * np.linalg.norm(ksum))


def softmax(q, k, scale, fmap):
    s = scale * q @ k.T
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def linear(q, k, scale, fmap):
    return _by_sum_of_features(phi(fmap, q), phi(fmap, k))


def inline(q, k, scale, fmap):
    """InLine eq. 4 with phi scaled by (s/N)^1/2."""
    n = k.shape[0]
    a = (scale / n) * phi(fmap, q) @ phi(fmap, k).T
    return a - a.sum(axis=1, keepdims=True) / n + 1.0 / n


def mala(q, k, scale, fmap):
    """MALA eq. 8-9 with phi scaled by (s/N)^1/2: beta a_ij - gamma, S = sum_j a_ij."""
    n = k.shape[0]
    fq, fk = phi(fmap, q), phi(fmap, k)
    c2 = scale / n
    w = np.zeros((q.shape[0], n))
    for i in range(q.shape[0]):
        a = c2 * fk @ fq[i]
        s = c2 * fq[i] @ fk.sum(axis=0)
        if abs(s) > TINY * c2 * np.linalg.norm(fq[i]) * np.linalg.norm(fk.sum(axis=0)):
            w[i] = (1.0 + 1.0 / s) * a - s / n
    return w


def efficient(q, k, scale, fmap):
    """rho_q(Q) rho_k(K)^T normalised per row: softmax over each query's features, over the
    tokens for each key feature; the scale is not used."""
    eq = np.exp(q - q.max(axis=1, keepdims=True))
    rq = eq / eq.sum(axis=1, keepdims=True)
    ek = np.exp(k - k.max(axis=0, keepdims=True))
    rk = ek / ek.sum(axis=0, keepdims=True)
    return _by_sum_of_features(rq, rk)


def cosformer(q, k, scale, fmap):
    """ReLU(q_i).ReLU(k_j) cos(pi/2 (i - j)/N), normalised over j, i and j token indices. Every
    term is >= 0, so the row sum is S_i. The degenerate rule's magnitude is that of the width-2d
    features [r cos, r sin] the library uses: |ReLU(q_i)| |sum_j ReLU(k_j) e^(i pi j/(2N))|."""
    n = k.shape[0]
    rq, rk = np.maximum(q, 0.0), np.maximum(k, 0.0)
    a = np.zeros((q.shape[0], n))
    for i in range(q.shape[0]):
        for j in range(n):
            a[i, j] = (rq[i] @ rk[j]) * np.cos(np.pi / 2 * (i - j) / n)
    turned = rk.T @ np.exp(0.5j * np.pi * np.arange(n) / n)  # per feature, a complex number
    return _normalised(a, a.sum(axis=1), np.linalg.norm(rq, axis=1) * np.linalg.norm(turned))


def relu(q, k, scale, fmap):
    """EfficientViT / SANA code: ReLU(q_i).ReLU(k_j) / (sum_m ReLU(q_i).ReLU(k_m) + 1e-15), no
    scale; a row with a zero sum stays zero."""
    a = np.maximum(q, 0.0) @ np.maximum(k, 0.0).T
    return a / (a.sum(axis=1, keepdims=True) + 1e-15)


WEIGHTS = {"softmax": softmax, "linear": linear, "inline": inline, "mala": mala,
           "efficient": efficient, "cosformer": cosformer, "relu": relu}
# The map a spec without one uses (the project's models' and the library's defaults).
DEFAULT_MAP = {"linear": "relu", "inline": "identity", "mala": "elu1"}


def weights(family, fmap, q, k, scale):
    """q [n, d], k [N, d] float64 -> W [n, N]; fmap a spec or "none"."""
    if fmap in (None, "none"):
        fmap = DEFAULT_MAP.get(family, "none")
    return WEIGHTS[family](q, k, scale, fmap)


def outputs(f, layer, image, head):
    """Recomputed W V of one head from an open h5py dump, float64."""
    g = f[f"layers/{layer}"]
    q, k, v = (g[name][image, head].astype(np.float64) for name in ("q", "k", "v"))
    w = weights(f.attrs["attention_family"], f.attrs["feature_map"], q, k, float(f.attrs["scale"]))
    return w @ v
