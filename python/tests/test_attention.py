"""The four families in the code convention, against independent formulas."""
import numpy as np
import pytest
import torch

import recompute
from attnscope_dump.attention import FAMILIES, attention_outputs, attention_weights


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


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n,d", [(1, 1), (2, 7), (50, 16)])
def test_rows_sum_to_one(family, n, d):
    q, k = _qk(n * 31 + d, n, d)
    w = attention_weights(family, q, k, d ** -0.5)
    sums = w.sum(-1)
    if family == "linear":  # a query that ReLU kills entirely has a zero row (degenerate)
        dead = (q.clamp_min(0) @ k.clamp_min(0).sum(-2, keepdim=True).transpose(-2, -1)) == 0
        dead = dead.squeeze(-1)
        assert torch.all(sums[dead] == 0), f"linear N={n} d={d}: degenerate rows not zero"
        sums = sums[~dead]
    err = (sums - 1).abs().max().item() if sums.numel() else 0.0
    assert err < 1e-12, f"{family} N={n} d={d}: worst |row sum - 1| = {err}"


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


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_are_weights_times_values(family):
    q, k = _qk(11, 8, 4)
    v = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    err = (attention_outputs(family, q, k, v, 0.5) - attention_weights(family, q, k, 0.5) @ v)
    assert err.abs().max() < 1e-12, f"{family}: outputs differ from W V"


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
