"""The families of attention.FAMILIES in the code convention, against independent formulas:
tests/recompute.py (plain numpy, written apart) for every family and feature map on awkward sizes,
and the papers' equations where a family has one to check."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import recompute
from attnscope_dump.attention import (FAMILIES, FEATURE_MAPS, MAP_TABLE, attention_outputs,
                                      attention_weights, family, feature_map, parse_feature_map)

# Every family with every feature map it takes (each map of MAP_TABLE, with and without its
# parameter), "none" for a family that takes none.
_SPECS = [s for name, m in MAP_TABLE.items()
          for s in ([name] if m.default is None else [name, f"{name}=1.5"])]
VARIANTS = [(f, m) for f in FAMILIES for m in (_SPECS if family(f).takes_map else ["none"])]
VARIANT_IDS = [f"{f}:{m}" for f, m in VARIANTS]
# (queries, keys, head dim): N = 1, 63, 197 and d = 1, 60 as the library's tests use, and fewer
# queries than keys (as inline_fig1.py uses).
SIZES = [(1, 1, 1), (2, 2, 7), (63, 63, 60), (197, 197, 1), (3, 17, 5)]


def _qk(seed, n=13, d=7):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, n, d, generator=g, dtype=torch.float64),
            torch.randn(1, 2, n, d, generator=g, dtype=torch.float64))


def _paper_linear_family(family, phi_q, phi_k):
    """Paper equations (InLine eq. 4, MALA eq. 8-9) for one head, plain loops, float64."""
    n = phi_k.shape[0]
    w = np.zeros((phi_q.shape[0], n))
    for i in range(phi_q.shape[0]):
        a = np.array([phi_q[i] @ phi_k[j] for j in range(n)])
        if family == "inline":
            w[i] = a - a.sum() / n + 1.0 / n
        else:
            s = phi_q[i] @ phi_k.sum(axis=0)
            w[i] = (1 + 1 / s) * a - s / n
    return w


def _qkv(seed, n, n_keys, d, dead_query=False):
    """[1, 2, n, d], [1, 2, N, d], [1, 2, N, d] float64 from a seed; with dead_query, query 0 of
    head 0 is all negative (ReLU and the focused map zero it)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, n_keys, d, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, n_keys, d, generator=g, dtype=torch.float64)
    if dead_query:
        q[0, 0, 0] = -q[0, 0, 0].abs() - 0.5
    return q, k, v


@pytest.mark.parametrize("family_name,fmap", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("n,n_keys,d", SIZES)
def test_matches_independent_recompute(family_name, fmap, n, n_keys, d):
    seed = 1000 * n + 10 * n_keys + d
    q, k, _ = _qkv(seed, n, n_keys, d, dead_query=True)
    s = d ** -0.5
    got = attention_weights(family_name, q, k, s, fmap)
    assert got.shape == (1, 2, n, n_keys)
    for head in range(2):
        want = recompute.weights(family_name, fmap, q[0, head].numpy(), k[0, head].numpy(), s)
        err = np.abs(got[0, head].numpy() - want).max() / max(1.0, np.abs(want).max())
        assert err < 1e-12, (f"{family_name}:{fmap} n={n} N={n_keys} d={d} seed={seed} "
                             f"head {head}: worst relative |attention.py - recompute.py| {err:.3g}")


@pytest.mark.parametrize("family_name,fmap", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("n,n_keys,d", SIZES)
def test_rows_sum_to_one_or_are_degenerate(family_name, fmap, n, n_keys, d):
    """Every row sums to 1, except a degenerate row (recompute.py's zero row), which is zero."""
    seed = 7 * n + n_keys + d
    q, k, _ = _qkv(seed, n, n_keys, d, dead_query=True)
    w = attention_weights(family_name, q, k, d ** -0.5, fmap)
    for head in range(2):
        ref = recompute.weights(family_name, fmap, q[0, head].numpy(), k[0, head].numpy(),
                                d ** -0.5)
        dead = torch.from_numpy(np.all(ref == 0, axis=1))
        where = f"{family_name}:{fmap} n={n} N={n_keys} d={d} seed={seed} head {head}"
        assert torch.all(w[0, head][dead] == 0), f"{where}: degenerate rows not zero"
        sums = w[0, head][~dead].sum(-1)
        err = (sums - 1).abs().max().item() if sums.numel() else 0.0
        assert err < 1e-12, f"{where}: worst |row sum - 1| = {err:.3g}"


def test_dead_query_makes_a_degenerate_row_somewhere():
    """The degenerate branch of the test above is exercised: ReLU-based maps and cosFormer zero
    the dead query's row (a negative control for 'all rows sum to 1')."""
    q, k, _ = _qkv(3, 5, 5, 4, dead_query=True)
    zero = [f"{f}:{m}" for f, m in VARIANTS
            if torch.all(attention_weights(f, q, k, 0.5, m)[0, 0, 0] == 0)]
    assert "linear:relu" in zero and "cosformer:none" in zero and "linear:focused" in zero, zero
    assert "softmax:none" not in zero and "inline:relu" not in zero, zero


@pytest.mark.parametrize("family,phi", [("inline", lambda x: x),
                                        ("mala", lambda x: np.where(x > 0, x + 1, np.exp(x)))])
def test_code_convention_is_paper_form_with_scaled_phi(family, phi):
    n, d = 13, 7
    q, k = _qk(3, n, d)
    s = 0.37
    c = (s / n) ** 0.5
    got = attention_weights(family, q, k, s)[0, 1].numpy()
    want = _paper_linear_family(family, c * phi(q[0, 1].numpy()), c * phi(k[0, 1].numpy()))
    err = np.abs(got - want).max()
    assert err < 1e-12, f"{family} N={n} d={d} s={s}: worst |code - paper(c phi)| = {err}"


def test_mala_code_matches_released_form():
    """(s/N) phi(q).phi(k_j) (1 + 1/z) - z/N with z = s phi(q).mean phi(k)."""
    n, d, s = 9, 5, 0.5
    q, k = _qk(5, n, d)
    fq = torch.nn.functional.elu(q[0, 0]) + 1
    fk = torch.nn.functional.elu(k[0, 0]) + 1
    z = s * fq @ fk.mean(0)
    want = (s / n) * (fq @ fk.T) * (1 + 1 / z)[:, None] - (z / n)[:, None]
    err = (attention_weights("mala", q, k, s)[0, 0] - want).abs().max().item()
    assert err < 1e-12, f"mala N={n} d={d}: worst error {err}"


def test_softmax_and_linear_definitions():
    n, d, s = 11, 4, 0.5
    q, k = _qk(7, n, d)
    e = torch.exp(s * q @ k.transpose(-2, -1))
    err = (attention_weights("softmax", q, k, s) - e / e.sum(-1, keepdim=True)).abs().max()
    assert err < 1e-12, f"softmax N={n} d={d}: worst error {err}"
    a = q.clamp_min(0) @ k.clamp_min(0).transpose(-2, -1)
    want = torch.nan_to_num(a / a.sum(-1, keepdim=True))  # 0/0 rows are degenerate: zero
    err = (attention_weights("linear", q, k, s) - want).abs().max()
    assert err < 1e-12, f"linear:relu N={n} d={d}: worst error {err}"


def test_linear_row_with_dead_query_is_zero():
    q, k = _qk(9, 6, 3)
    q[0, 0, 2] = -1.0  # ReLU kills the whole query
    w = attention_weights("linear", q, k, 1.0)
    assert torch.all(w[0, 0, 2] == 0), f"linear:relu dead query row: {w[0, 0, 2]}"
    assert torch.isfinite(w).all()


@pytest.mark.parametrize("family_name,fmap", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("n,n_keys,d", SIZES)
def test_outputs_are_weights_times_values(family_name, fmap, n, n_keys, d):
    """attention_outputs (linear time for every family but softmax) equals W V."""
    seed = 3 * n + n_keys + 11 * d
    q, k, v = _qkv(seed, n, n_keys, d, dead_query=True)
    w = attention_weights(family_name, q, k, 0.5, fmap)
    o = attention_outputs(family_name, q, k, v, 0.5, fmap)
    want = w @ v
    err = ((o - want).abs().max() / want.abs().max().clamp_min(1.0)).item()
    assert err < 1e-12, (f"{family_name}:{fmap} n={n} N={n_keys} d={d} seed={seed}: worst "
                         f"relative |outputs - W V| {err:.3g}")


@pytest.mark.parametrize("family_name,fmap", VARIANTS, ids=VARIANT_IDS)
def test_gradients_are_finite(family_name, fmap):
    """The models train through every family: no NaN from a degenerate row or a dead query."""
    q, k, v = _qkv(23, 9, 9, 4, dead_query=True)
    q.requires_grad_(True)
    k.requires_grad_(True)
    (attention_weights(family_name, q, k, 0.5, fmap) @ v).square().sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all(), \
        f"{family_name}:{fmap}: non-finite gradient"


@pytest.mark.parametrize("family_name", FAMILIES)
def test_token_permutation(family_name):
    """Permuting the tokens (queries and keys alike) permutes the weights, W -> P W P^T, exactly
    for a family that is not positional; a positional one's weights change beyond that (the
    negative control: the same check must fail there)."""
    q, k, _ = _qkv(31, 12, 12, 5)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(2))
    w = attention_weights(family_name, q, k, 0.4)
    wp = attention_weights(family_name, q[:, :, perm], k[:, :, perm], 0.4)
    diff = (wp - w[:, :, perm][:, :, :, perm]).abs().max().item()
    if family(family_name).positional:
        assert diff > 1e-3, f"{family_name}: positional, yet permuting tokens only permutes W"
    else:
        assert diff < 1e-12, f"{family_name}: permuting tokens changes W by {diff:.3g}"


def test_cosformer_depends_on_position_and_linear_does_not():
    """Equal positive queries and keys: ReLU(q).ReLU(k) is the same for every pair, so linear
    attention is uniform and cosFormer's row i is cos(pi/2 (i - j)/N) normalised over j."""
    n, d = 9, 3
    x = torch.rand(1, 1, 1, d, dtype=torch.float64).add(0.1).expand(1, 1, n, d).contiguous()
    lin = attention_weights("linear", x, x, 1.0, "relu")
    assert (lin - 1.0 / n).abs().max() < 1e-15, f"linear: not uniform: {lin}"
    i = torch.arange(n, dtype=torch.float64)
    c = torch.cos(math.pi / 2 * (i[:, None] - i[None, :]) / n)
    want = c / c.sum(-1, keepdim=True)
    err = (attention_weights("cosformer", x, x, 1.0)[0, 0] - want).abs().max().item()
    assert err < 1e-15, f"cosformer N={n}: worst |W - cos(pi/2 (i-j)/N) / row sum| {err:.3g}"
    assert not torch.allclose(want, torch.full_like(want, 1.0 / n)), "control: cos weights flat"


@pytest.mark.parametrize("family_name", ["linear", "efficient", "cosformer"])
def test_scale_is_not_used(family_name):
    """Linear and cosFormer: a scale on the features cancels; Efficient Attention has none."""
    q, k, _ = _qkv(41, 10, 10, 6)
    a = attention_weights(family_name, q, k, 0.1)
    b = attention_weights(family_name, q, k, 3.0)
    assert torch.equal(a, b), f"{family_name}: weights depend on the scale"


def test_efficient_is_softmax_features_product():
    """W = rho_q(Q) rho_k(K)^T: the row denominator is 1 up to rounding, and the rank is d."""
    n, d = 20, 4
    q, k, _ = _qkv(43, n, n, d)
    want = torch.softmax(q, -1) @ torch.softmax(k, -2).transpose(-2, -1)
    w = attention_weights("efficient", q, k, 0.5)
    err = (w - want).abs().max().item()
    assert err < 1e-15, f"efficient N={n} d={d}: worst |W - rho_q rho_k^T| {err:.3g}"
    assert torch.linalg.matrix_rank(w[0, 0]).item() == d, "efficient: rank of W is not d"


@pytest.mark.parametrize("family", ["inline", "mala"])
def test_n_is_the_number_of_keys(family):
    """Fewer queries than keys (as in inline_fig1.py): N in (s/N) and 1/N counts keys."""
    q, _ = _qk(13, 3, 5)
    _, k = _qk(14, 17, 5)
    s = 0.4
    phi = (lambda x: x) if family == "inline" else (lambda x: np.where(x > 0, x + 1, np.exp(x)))
    c = (s / 17) ** 0.5
    want = _paper_linear_family(family, c * phi(q[0, 0].numpy()), c * phi(k[0, 0].numpy()))
    err = np.abs(attention_weights(family, q, k, s)[0, 0].numpy() - want).max()
    assert err < 1e-12, f"{family} 3 queries x 17 keys: worst error {err}"


def _plain_linear_family(family, phi_q, phi_k, c2=1.0):
    """Row by row in float64: a_ij = c2 phi(q_i).phi(k_j), S_i = sum_j a_ij; a row whose
    |S_i| is not above 1e-12 |c2 phi(q_i)| |sum_j phi(k_j)| is degenerate and zero (the C++
    library's rule, lib/src/linear_rows.hpp); otherwise linear gives a_ij / S_i and MALA
    (1 + 1/S_i) a_ij - S_i / N, whatever the sign of S_i (S_i taken as c2 phi(q_i).sum_j phi(k_j),
    as the library does)."""
    n = phi_k.shape[0]
    ksum = phi_k.sum(axis=0)
    w = np.zeros((phi_q.shape[0], n))
    for i in range(phi_q.shape[0]):
        a = np.array([c2 * phi_q[i] @ phi_k[j] for j in range(n)])
        s = c2 * phi_q[i] @ ksum
        if not abs(s) > 1e-12 * c2 * np.linalg.norm(phi_q[i]) * np.linalg.norm(ksum):
            continue
        w[i] = a / s if family == "linear" else (1 + 1 / s) * a - s / n
    return w


@pytest.mark.parametrize("family", ["linear", "mala"])
def test_identity_map_with_negative_denominators(family):
    """phi = identity changes sign: rows with a negative denominator are legitimate rows (they
    still sum to 1), not degenerate ones; only a denominator that is zero relative to its
    magnitude makes a zero row."""
    n, d, s = 12, 5, 0.5
    q, k = _qk(21, n, d)
    q[0, 0, 3] = 0.0                      # zero query: S = 0, degenerate
    half = torch.randint(-3, 4, (n // 2, d), generator=torch.Generator().manual_seed(5))
    k[0, 1] = torch.cat([half, -half]).double()  # keys summing exactly to 0: head 1 degenerate
    fq, fk = q[0, 0].numpy(), k[0, 0].numpy()
    den = fq @ fk.sum(0)
    assert (den < 0).sum() >= 3 and (den > 0).sum() >= 3, f"seed gives no mixed signs: {den}"
    got = attention_weights(family, q, k, s, "identity")
    c2 = 1.0 if family == "linear" else s / n
    for head in range(2):
        want = _plain_linear_family(family, q[0, head].numpy(), k[0, head].numpy(), c2)
        err = np.abs(got[0, head].numpy() - want).max()
        assert err < 1e-12, f"{family}:identity N={n} d={d} head {head}: worst error {err}"
        helper = recompute.weights(family, "identity", q[0, head].numpy(), k[0, head].numpy(), s)
        err = np.abs(helper - want).max()
        assert err < 1e-12, f"tests/recompute.py {family}:identity head {head}: worst error {err}"
    assert torch.all(got[0, 0, 3] == 0) and torch.all(got[0, 1] == 0), "degenerate rows not zero"
    live = got[0, 0].sum(-1)[torch.arange(n) != 3]
    assert (live - 1).abs().max() < 1e-12, f"{family}:identity row sums {live}"


def test_identity_map_gradients_are_finite():
    """The zero-row guard must not put NaN into the backward pass (the models train through it)."""
    q, k = _qk(22, 6, 3)
    q[0, 0, 1] = 0.0
    q.requires_grad_(True)
    attention_weights("linear", q, k, 1.0, "identity").sum().backward()
    assert torch.isfinite(q.grad).all(), f"non-finite gradient: {q.grad}"


# --- the focused map (FLatten, Han et al., ICCV 2023) and the map table ------------------------

def _rows(seed, n=40, d=9):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("p", [0.5, 1.0, 3.0, 7.5])
def test_focused_map_formula(p):
    """(|r| / |r^P|) r^P with r = ReLU(x), row by row, against the formula written out."""
    x = _rows(1)
    r = x.clamp_min(0)
    want = r.norm(dim=-1, keepdim=True) / (r ** p).norm(dim=-1, keepdim=True) * r ** p
    err = (feature_map(f"focused={p}", x) - want).abs().max().item()
    assert err < 1e-14, f"focused={p}: worst error {err:.3g}"
    if p == 1.0:
        err = (feature_map("focused=1", x) - r).abs().max().item()
        assert err < 1e-15, f"focused=1 differs from ReLU by {err:.3g}"


def test_focused_map_zero_rule():
    """A row that ReLU zeroes entirely is zero (no 0/0); a row with one positive entry is not."""
    x = _rows(2, n=4, d=5)
    x[0] = -x[0].abs()        # all negative
    x[1] = 0.0                # all zero
    x[2] = -x[2].abs()
    x[2, 3] = 1e-300          # one tiny positive entry: a live row, not a degenerate one
    y = feature_map("focused", x)
    assert torch.all(y[:2] == 0) and torch.isfinite(y).all(), f"zero rule: {y[:2]}"
    assert y[2, 3] == 1e-300 and torch.count_nonzero(y[2]) == 1, f"single-entry row: {y[2]}"


@pytest.mark.parametrize("p", [0.5, 3.0, 40.0])
def test_focused_map_is_positively_homogeneous(p):
    """phi(a x) = a phi(x) for a > 0 (so the code convention's factor c commutes with it), and
    |phi(x)| = |ReLU(x)|; a negative a is not the same map (the control)."""
    x = _rows(3)
    for a in (1e-3, 0.37, 5.0, 1e6):
        err = (feature_map(f"focused={p}", a * x) - a * feature_map(f"focused={p}", x)).abs().max()
        assert err <= 1e-13 * a, f"focused={p}: phi({a} x) != {a} phi(x), worst {err:.3g}"
    y = feature_map(f"focused={p}", x)
    err = (y.norm(dim=-1) - x.clamp_min(0).norm(dim=-1)).abs().max().item()
    assert err < 1e-13, f"focused={p}: |phi(x)| differs from |ReLU(x)| by {err:.3g}"
    assert not torch.allclose(feature_map(f"focused={p}", -x), -y), "control: odd map"


def test_focused_map_survives_large_powers():
    """r^P over- or underflows for a large P; the map's value does not: it is r's norm on a
    direction sharpened toward r's largest entry."""
    x = torch.tensor([[300.0, 200.0, -1.0], [1e-200, 2e-200, 0.0]], dtype=torch.float64)
    y = feature_map("focused=200", x)
    norms = (math.hypot(300.0, 200.0), math.hypot(1.0, 2.0) * 1e-200)  # |ReLU(x)|, no underflow
    for row, (big, n) in enumerate(zip((0, 1), norms)):
        assert abs(y[row, big].item() - n) <= 1e-15 * n, f"row {row}: {y[row]} (norm {n})"
        assert 0 < y[row, 1 - big].item() < 1e-30 * n and y[row, 2] == 0, f"row {row}: {y[row]}"


@pytest.mark.parametrize("spec,name", [
    ("focused", "focused=3"), ("focused=3", "focused=3"), ("focused=2.5", "focused=2.5"),
    ("focused=100", "focused=100"), ("focused=1e-4", "focused=1e-04"),
    ("focused=0.001", "focused=0.001"), ("focused=1e15", "focused=1e+15"),
    ("leaky_relu", "leaky_relu=0.01"), ("relu", "relu"), ("elu1", "elu1"), ("exp", "exp"),
    ("identity", "identity")])
def test_map_names_are_the_libraries_canonical_ones(spec, name):
    """As the C++ names them (shortest round-trip number, std::to_chars style); a name parses
    back to itself."""
    assert parse_feature_map(spec).name == name
    assert parse_feature_map(name).name == name


@pytest.mark.parametrize("spec", ["focused=0", "focused=-1", "focused=nan", "focused=inf",
                                  "focused=abc", "focused=", "leaky_relu=inf", "relu=2",
                                  "relu_affine", "softplus", ""])
def test_bad_map_specs_are_refused(spec):
    with pytest.raises(ValueError, match="feature map"):
        parse_feature_map(spec)


def test_families_and_maps_are_refused_by_name():
    q, k, _ = _qkv(5, 3, 3, 2)
    with pytest.raises(ValueError, match="unknown attention family 'softmaxx'"):
        attention_weights("softmaxx", q, k, 1.0)
    for name in FAMILIES:
        if not family(name).takes_map:
            with pytest.raises(ValueError, match="takes no feature map"):
                attention_weights(name, q, k, 1.0, "relu")
            assert FEATURE_MAPS[name] == "none"
        else:
            assert attention_weights(name, q, k, 1.0, "focused").shape == (1, 2, 3, 3)


def test_relu_family_is_the_released_efficientvit_form():
    """relu: ReLU(q).ReLU(k) / (S + 1e-15), EfficientViT / SANA's code. Where S is large it equals
    linear:relu; a query that ReLU zeroes gives a zero row; where S is comparable to 1e-15 the row
    sums to S / (S + 1e-15), not 1 (never renormalised), which linear:relu would call degenerate."""
    q, k, _ = _qkv(41, 9, 9, 4, dead_query=True)
    w = attention_weights("relu", q, k, 0.5)
    lin = attention_weights("linear", q, k, 0.5, "relu")
    assert (w - lin).abs().max().item() < 1e-13, "relu: differs from linear:relu at S ~ 1"
    assert (w[0, 0, 0] == 0).all(), "relu: a query ReLU zeroes must give a zero row"
    tiny = 1e-8  # S_i ~ tiny^2 = 1e-16, comparable to eps
    ws = attention_weights("relu", q * tiny, k * tiny, 0.5)
    sums = ws.sum(-1)[0, 1]
    s = (F.relu(q * tiny) @ F.relu(k * tiny).transpose(-2, -1)).sum(-1)[0, 1]
    want = s / (s + 1e-15)
    assert (sums - want).abs().max().item() < 1e-12, f"relu: row sums {sums} != S/(S+eps) {want}"
    assert sums.max().item() < 0.9, f"control: rows at S ~ 1e-16 must sum well below 1, got {sums}"
