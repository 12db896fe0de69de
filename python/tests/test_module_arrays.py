"""The module attnscope on arrays: weights and outputs of the registry's variants against plain
numpy formulas in double on random shapes and dtypes (N = 1, 63, 197; d = 1, 60), torch tensors
as inputs, and bad inputs raising the exception the command line's message names."""
import numpy as np
import pytest
import torch

# Named tolerances, relative to the largest |weight| or |output| (>= 1): float64 inputs are
# computed in double; float16/float32 inputs in float with sums in double.
TOL_DOUBLE = 1e-12
TOL_FLOAT = 2e-5


def _softmax_rows(a):
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def reference_weights(q, k, spec, scale):
    """W of one head in double, the code convention's formulas (python/attnscope_dump/attention.py)."""
    q = q.astype(np.float64)
    k = k.astype(np.float64)
    n = k.shape[0]
    if spec == "softmax":
        return _softmax_rows(scale * q @ k.T)
    if spec == "linear:relu@code":
        a = np.maximum(q, 0) @ np.maximum(k, 0).T
        s = a.sum(axis=-1, keepdims=True)
        return np.where(s > 0, a / np.where(s > 0, s, 1), 0.0)  # a row ReLU kills is degenerate
    if spec == "inline:identity@code":
        a = (scale / n) * q @ k.T
        return a - a.mean(axis=-1, keepdims=True) + 1.0 / n
    if spec == "mala:elu1@code":
        def elu1(x):
            return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0)))
        a = (scale / n) * elu1(q) @ elu1(k).T
        s = a.sum(axis=-1, keepdims=True)
        return (1 + 1 / s) * a - s / n
    raise AssertionError(spec)


SPECS = ["softmax", "linear:relu@code", "inline:identity@code", "mala:elu1@code"]
SHAPES = [(1, 1), (63, 60), (197, 1), (197, 60), (7, 5)]


def _random_heads(rng, images, heads, n, d, dtype):
    return (rng.standard_normal((images, heads, n, d)) * 0.7).astype(dtype)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_weights_and_outputs_equal_numpy_formulas(attnscope_module, spec, dtype):
    at = attnscope_module
    rng = np.random.default_rng(hash((spec, dtype)) % 2**32)
    tol = TOL_DOUBLE if dtype == "float64" else TOL_FLOAT
    for n, d in SHAPES:
        images, heads = int(rng.integers(1, 3)), int(rng.integers(1, 4))
        q, k = (_random_heads(rng, images, heads, n, d, dtype) for _ in range(2))
        v = _random_heads(rng, images, heads, n, int(rng.integers(1, 9)), dtype)
        scale = float(d) ** -0.5
        w = at.weights(q, k, spec)
        o = at.outputs(q, k, v, spec)
        out_dtype = np.float64 if dtype == "float64" else np.float32
        assert w.dtype == out_dtype and w.shape == (images, heads, n, n), (spec, dtype, w.shape)
        assert o.shape == (images, heads, n, v.shape[-1]), (spec, dtype, o.shape)
        for i in range(images):
            for h in range(heads):
                ref = reference_weights(q[i, h], k[i, h], spec, scale)
                err = np.abs(w[i, h] - ref).max() / max(1.0, np.abs(ref).max())
                assert err <= tol, f"{spec} {dtype} N={n} d={d} image {i} head {h}: W error {err}"
                ref_o = ref @ v[i, h].astype(np.float64)
                err = np.abs(o[i, h] - ref_o).max() / max(1.0, np.abs(ref_o).max())
                assert err <= tol, f"{spec} {dtype} N={n} d={d} image {i} head {h}: O error {err}"
        # A single head [tokens, dim] gives the same numbers as its place in the stack.
        assert np.array_equal(at.weights(q[-1, -1], k[-1, -1], spec), w[-1, -1]), (spec, dtype, n, d)


def test_scale_mask_and_degenerate_rows(attnscope_module):
    at = attnscope_module
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 4))
    w = at.weights(q[0], k[0], "softmax", scale=0.3)
    assert np.allclose(w, reference_weights(q[0], k[0], "softmax", 0.3), rtol=0, atol=TOL_DOUBLE)
    mask = np.ones((9, 9), dtype=bool)
    mask[:, 0] = False  # key 0 hidden from every query: its column is 0, rows renormalised
    wm = at.weights(q[0], k[0], "softmax", mask=mask)
    assert np.all(wm[:, 0] == 0) and np.allclose(wm.sum(axis=1), 1, atol=1e-12)
    # A query ReLU kills entirely has a degenerate row: zeros, and named.
    q1 = np.abs(q[0])
    q1[4] = -q1[4]
    w, dead = at.weights(q1, np.abs(k[0]), "linear:relu", return_degenerate=True)
    assert dead == [4] and np.all(w[4] == 0), dead


def test_torch_tensors_in_and_out(attnscope_module):
    at = attnscope_module
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 17, 8, generator=g, requires_grad=True)
    k, v = torch.randn(2, 3, 17, 8, generator=g), torch.randn(2, 3, 17, 8, generator=g)
    w = at.weights(q, k, "inline")
    assert isinstance(w, torch.Tensor) and w.dtype == torch.float32 and w.shape == (2, 3, 17, 17)
    assert torch.equal(w, torch.from_numpy(at.weights(q.detach().numpy(), k.numpy(), "inline")))
    o = at.outputs(q.double(), k.double(), v.double(), "mala")
    assert o.dtype == torch.float64
    assert at.confusion(q, k, "softmax")["pairs"].shape == (2, 3)
    with pytest.raises(TypeError, match="q: expected float16, float32 or float64 values, got int64"):
        at.weights(torch.ones(3, 2, dtype=torch.int64), k[0, 0], "softmax")


def test_bad_inputs_raise_with_messages(attnscope_module):
    at = attnscope_module
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 2, 5, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"q: expected a \[tokens, dim\] or \[images, heads, tokens, "
                                         r"dim\] array, got 3 dimensions"):
        at.weights(q[0], q[0], "softmax")
    bad = q.copy()
    bad[1, 0, 2, 1] = np.nan
    with pytest.raises(ValueError, match=r"<input>: k: expected finite values, found NaN at image 1, "
                                         r"head 0, token 2, dim 1"):
        at.confusion(q, bad, "softmax")
    bad[1, 0, 2, 1] = np.inf
    with pytest.raises(ValueError, match="found Inf at image 1, head 0, token 2, dim 1"):
        at.census(bad, q, "inline")
    with pytest.raises(TypeError, match="expected float16, float32 or float64 values, got int32"):
        at.weights(q.astype(np.int32), q, "softmax")
    with pytest.raises(TypeError, match="q: expected float16, float32 or float64 values, got <U"):
        at.weights([["not a number"]], q, "softmax")
    with pytest.raises(ValueError, match=r"k is \[2, 2, 4, 3\], expected the shape of q \[2, 2, 5, 3\]"):
        at.weights(q, q[:, :, :4], "softmax")
    with pytest.raises(ValueError, match=r"mask: expected a \[5, 5\] bool array"):
        at.weights(q, q, "softmax", mask=np.ones((4, 4), dtype=bool))
    with pytest.raises(ValueError, match="grid"):
        at.local_mass(q, q, "softmax", grid=(1, 2, 3))
    with pytest.raises(ValueError, match="unknown"):
        at.weights(q, q, "softmaxx")
    with pytest.raises(ValueError, match="this analysis needs v"):
        at.totals("rank", q, q, "softmax")


def test_values_that_would_give_wrong_results_are_refused(attnscope_module, tmp_path):
    """What once gave numbers without an error: a grid whose height * width wraps in 32 bits,
    eps below 0 or NaN, a mask of floats (0.5 and NaN read as visible), integer weights in
    row_stats, an infinite sum_tol; heads without a measured query give NaN statistics, not 0
    and +-inf; weights that overflow when summed still give their entropy."""
    at = attnscope_module
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 3, 10, 4)).astype(np.float32)
    k = rng.standard_normal((2, 3, 10, 4)).astype(np.float32)
    for grid in [(10, 65536, 65536), (12, 2, 2147483647), (-1, 3, 3)]:
        with pytest.raises(ValueError, match=r"grid: expected prefix_tokens >= 0, height and width"):
            at.locality(q, k, "softmax", grid)
    for eps in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps: expected a finite radius >= 0"):
            at.confusion(q, k, "linear:relu", eps=eps)
        with pytest.raises(ValueError, match="query_eps: expected a finite radius >= 0"):
            at.confused_pairs(q[0, 0], k[0, 0], "linear:relu", query_eps=eps)
    for mask in (np.full((10, 10), 0.5), np.ones((10, 10), dtype=np.int64)):
        with pytest.raises(TypeError, match=r"mask: expected a \[tokens, tokens\] bool array, got"):
            at.weights(q, k, "softmax", mask=mask)
    # the negative control: bool masks, numpy's and torch's, are taken
    eye = np.eye(10, dtype=bool) | np.eye(10, k=1, dtype=bool)
    w_np = at.weights(q, k, "softmax", mask=eye)[0]
    w_torch = at.weights(torch.from_numpy(q), torch.from_numpy(k), "softmax",
                         mask=torch.from_numpy(eye))[0].numpy()
    assert np.array_equal(w_np, w_torch) and np.all(w_np[..., ~eye] == 0)
    with pytest.raises(TypeError, match="w: expected float16, float32 or float64 weights, got int64"):
        at.row_stats(np.array([1, 2]))
    with pytest.raises(ValueError, match="sum_tol: expected a finite tolerance >= 0, found inf"):
        at.census(q, k, "softmax", sum_tol=float("inf"))
    dead = np.zeros_like(q[:1, :1])  # every row killed by ReLU: nothing measured
    loc = at.locality(dead, k[:1, :1], "linear:relu", (1, 3, 3))
    assert loc["queries"][0] == 0 and all(np.isnan(loc[s][0]) for s in ("mean", "std", "min", "max"))
    assert np.isnan(at.census(dead, k[:1, :1], "linear:relu")["most_negative"][0])
    assert at.row_stats(np.array([1e308, 1e308]))["entropy"] == pytest.approx(np.log(2), rel=1e-15)
    assert at.row_stats(np.array([1.0, 1.0]))["entropy"] == pytest.approx(np.log(2), rel=1e-15)


def test_live_analyses_refuse_what_they_cannot_measure(attnscope_module, tmp_path):
    """The live analyses (attnscope.analyze's) check grid, scale, options and eps as the
    functions do, and publish nothing without a batch."""
    from attnscope import _attnscope as core
    ok = dict(variants=["softmax"], layers=[0], heads=1, grid=[1, 3, 3], scale=0.5,
              options={}, convention="paper")

    def live(analysis, **changed):
        args = {**ok, **changed}
        return core.live(analysis, str(tmp_path / analysis), args["variants"], args["layers"],
                         args["heads"], args["grid"], args["scale"], args["options"],
                         args["convention"])

    with pytest.raises(ValueError, match="grid: expected prefix_tokens >= 0"):
        live("locality", grid=[1, -3, -3])
    for scale in (float("nan"), 0.0):
        with pytest.raises(ValueError, match="scale: expected a finite non-zero number"):
            live("locality", scale=scale)
    with pytest.raises(ValueError, match="locality: unknown option 'nosuch'"):
        live("locality", options={"nosuch": 1})
    with pytest.raises(TypeError, match="window: expected an integer, got 'x'"):
        live("locality", options={"window": "x"})
    with pytest.raises(ValueError, match="eps: expected a finite radius >= 0, found nan"):
        live("confusion", options={"eps": float("nan")})
    with pytest.raises(ValueError, match="no images: no batch was added"):
        live("locality").publish("{}")
    assert not (tmp_path / "locality").exists() or not any((tmp_path / "locality").iterdir())


def test_variant_errors_are_the_command_lines(attnscope_module, attnscope_bin, tmp_path):
    """A variant the command refuses is refused by the module with the same message (less the
    flag's name, --variant, where the command names it)."""
    import subprocess
    at = attnscope_module
    dump = tmp_path / "d.h5"
    subprocess.run([attnscope_bin, "synth", "--out", str(dump), "--layers", "1", "--heads", "1",
                    "--images", "1", "--grid-height", "2", "--grid-width", "2"], check=True,
                   capture_output=True)
    q = np.zeros((5, 16), np.float32)
    for spec in ["softmaxx", "linear", "inline@code+rope", "inline:bogus"]:
        r = subprocess.run([attnscope_bin, "locality", "--dump", str(dump), "--out",
                            str(tmp_path / "o"), "--variant", spec], capture_output=True, text=True)
        assert r.returncode != 0, spec
        message = r.stderr.strip().splitlines()[-1].removeprefix("attnscope locality: ")
        message = message.removeprefix("--variant ")
        with pytest.raises(ValueError) as e:
            at.weights(q, q, spec)
        assert str(e.value) == message, (spec, str(e.value), message)


def test_confused_pairs_find_planted_duplicates(attnscope_module):
    at = attnscope_module
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((40, 8)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    q[17] = 2 * q[3]  # collinear: linear:relu's rows are equal, softmax's are not
    pairs = at.confused_pairs(q, k, "linear:relu")
    assert [3, 17] in pairs.tolist(), pairs
    assert len(pairs) == at.confusion(q, k, "linear:relu")["pairs"]
    assert at.confusion(q, k, "linear:relu", reference=True)["pairs"] == len(pairs)
    assert [3, 17] not in at.confused_pairs(q, k, "softmax").tolist()


def test_any_layout_gives_the_same_numbers(attnscope_module):
    """Non-contiguous views (converted once) and reversed strides give the contiguous copy's bits."""
    at = attnscope_module
    rng = np.random.default_rng(4)
    big = rng.standard_normal((2, 3, 20, 16)).astype(np.float32)
    q, k = big[:, :, :, ::2], big[:, ::-1, :, 1::2]
    for spec in ("softmax", "mala"):
        assert np.array_equal(at.weights(q, k, spec),
                              at.weights(np.ascontiguousarray(q), np.ascontiguousarray(k), spec))
    assert np.array_equal(at.confusion(q, k, "inline")["candidates"],
                          at.confusion(q.copy(), k.copy(), "inline")["candidates"])


def test_row_stats_and_per_query_shapes(attnscope_module):
    at = attnscope_module
    with pytest.raises(ValueError, match="w: expected finite values, found NaN at key 1"):
        at.row_stats(np.array([0.5, np.nan]))
    s = at.row_stats(np.array([0.5, 0.25, 0.25, 0.0]), topk=2)
    assert s["max_weight"] == 0.5 and s["topk_mass"] == 0.75 and s["zeros"] == 1 and s["negatives"] == 0
    assert abs(s["entropy"] - (-(0.5 * np.log(0.5) + 0.5 * np.log(0.25)))) < 1e-15
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((3, 2, 10, 4)), rng.standard_normal((3, 2, 10, 4))
    e = at.entropy(q, k, "softmax")
    assert e["entropy"].shape == (3, 2, 10) and e["degenerate_rows"].shape == (3, 2)
    assert np.all(e["entropy"] <= np.log(10) + 1e-12) and np.all(e["entropy"] > 0)
    w = at.weights(q.astype(np.float32).astype(np.float64), k.astype(np.float32).astype(np.float64),
                   "softmax")
    ref = -(w * np.log(w)).sum(axis=-1)
    # Softmax heads whose float logits are accurate take the float path (docs/cli/entropy.md):
    # within delta + (1 + 2 log N) r / (1 - r) of the exact entropy, r = expm1(delta) + 2^-22,
    # delta = |s| max|q_i| max|k_j| (d + 6) 2^-24 per head.
    qf, kf = q.astype(np.float32).astype(np.float64), k.astype(np.float32).astype(np.float64)
    delta = (np.linalg.norm(qf, axis=-1).max(-1) * np.linalg.norm(kf, axis=-1).max(-1)
             / np.sqrt(4) * (4 + 6) * 2.0 ** -24)[..., None]
    r = np.expm1(delta) + 2.0 ** -22
    assert np.all(np.abs(e["entropy"] - ref) <= delta + (1 + 2 * np.log(10)) * r / (1 - r))
    dist = at.distance(q, k, "softmax", grid=(1, 3, 3))
    assert np.all(np.isnan(dist["distance"][..., 0])) and not np.any(np.isnan(dist["distance"][..., 1:]))
    m = at.local_mass(q, k, "softmax", grid=(1, 3, 3), window=5)
    assert np.allclose(m[..., 1:], 1 - w[..., 1:, 0], atol=1e-6)  # a 5x5 window covers the 3x3 grid
    g, p = at.attention_map(q, k, "softmax", grid=(1, 3, 3), token=4)
    assert g.shape == (3, 2, 3, 3) and p.shape == (3, 2, 1)
    assert np.allclose(g.reshape(3, 2, 9), w[:, :, 4, 1:], atol=1e-6)
    r = at.rank(q, k, q, "inline")
    assert r["rank"].shape == (3, 2, 1) and np.all(r["rank"] >= 1) and np.all(r["rank"] <= 10)


def test_sweep_follows_the_magnitude_laws(attnscope_module):
    """Softmax: the ratio of two weights at query scale a is its a-th power at a = 1 (MALA eq. 6),
    and the swept rows are the weights of the scaled query; linear attention: the ratio does not
    move (eq. 7); every law the family lists passes on a random head, and is reported."""
    at = attnscope_module
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((63, 8)).astype(np.float32), rng.standard_normal((63, 8)).astype(np.float32)
    scales = [0.5, 1.0, 2.0]
    r = at.sweep(q, k, "softmax", 7, scales="0.5,1,2", keep_weights=True)
    ratios = [p["ratio"] for p in r["points"]]
    for a, ratio in zip(scales, ratios):
        assert abs(np.log(ratio) - a * np.log(ratios[1])) < 1e-9, (a, ratio, ratios[1])
    for i, a in enumerate(scales):
        w = at.weights(a * q.astype(np.float64), k.astype(np.float64), "softmax", scale=8 ** -0.5)
        assert np.allclose(r["weights"][i], w[7], rtol=0, atol=1e-12), a
        s = at.row_stats(r["weights"][i])
        assert s["max_weight"] == r["points"][i]["max_weight"], a
    assert [law["law"] for law in r["laws"]] == ["softmax_power"] and r["laws"][0]["pass"]
    lin = at.sweep(q, k, "linear:relu", 7, scales="0.5,1,2")
    assert len({p["ratio"] for p in lin["points"]}) == 1, lin["points"]
    for spec in ("inline", "mala"):
        laws = at.sweep(q, k, spec, 7, scales="0.25:8:5")["laws"]
        assert laws and all(law["pass"] and law["points"] > 0 for law in laws), (spec, laws)
    with pytest.raises(ValueError, match="token: expected a token index in \\[0, 63\\), got 63"):
        at.sweep(q, k, "softmax", 63)


def test_diagnostics_refuse_bad_inputs(attnscope_module):
    """sinks, token_norms, rollout, mask, verify and rank's out: wrong rank, NaN, wrong dtype,
    mismatched shapes and bad parameters raise the command line's message, never crash."""
    at = attnscope_module
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 2, 5, 3)).astype(np.float32)
    bad = q.copy()
    bad[0, 1, 4, 2] = np.nan
    grid = (1, 2, 2)
    # wrong rank
    for call in (lambda: at.sinks(q[0], q[0], "softmax"), lambda: at.token_norms(q[0]),
                 lambda: at.rollout([q[0]], [q[0]], "softmax"),
                 lambda: at.mask(q[0], q[0], q[0], "softmax", grid)):
        with pytest.raises(ValueError, match="expected a \\[tokens, dim\\] or \\[images, heads, "
                                             "tokens, dim\\] array, got 3 dimensions"):
            call()
    # NaN
    nan = r"expected finite values, found NaN at image 0, head 1, token 4, dim 2"
    for call in (lambda: at.sinks(q, bad, "softmax"), lambda: at.token_norms(bad),
                 lambda: at.rollout([q, bad], [q, q], "softmax"),
                 lambda: at.mask(q, q, bad, "softmax", grid)):
        with pytest.raises(ValueError, match=nan):
            call()
    # wrong dtype
    for call in (lambda: at.sinks(q.astype(np.int64), q, "softmax"),
                 lambda: at.token_norms(q.astype(np.int16)),
                 lambda: at.rollout([q], [q.astype(np.int32)], "softmax"),
                 lambda: at.mask(q, q, q.astype(np.int8), "softmax", grid)):
        with pytest.raises(TypeError, match="expected float16, float32 or float64 values"):
            call()
    # non-contiguous views are read correctly (copied once), not refused
    wide = np.repeat(q, 2, axis=3)[..., ::2]
    assert not wide.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(at.sinks(wide, wide, "inline")["received"],
                                  at.sinks(q, q, "inline")["received"])
    # mismatched shapes
    with pytest.raises(ValueError, match=r"k is \[2, 2, 4, 3\], expected the shape of q"):
        at.sinks(q, q[:, :, :4], "softmax")
    with pytest.raises(ValueError, match=r"expected the shape of q"):
        at.rollout([q, q[:1]], [q, q[:1]], "softmax")
    with pytest.raises(ValueError, match="one array per layer, of the same length, got 2 and 1"):
        at.rollout([q, q], [q], "softmax")
    with pytest.raises(TypeError, match="lists of arrays"):
        at.rollout(q, q, "softmax")
    with pytest.raises(ValueError, match=r"v is \[2, 2, 4, 3\]"):
        at.mask(q, q, q[:, :, :4], "softmax", grid)
    with pytest.raises(ValueError, match=r"out is \[2, 2, 4, 3\]"):
        at.rank(q, q, q, "softmax", out=q[:, :, :4])
    with pytest.raises(ValueError, match="entropy: takes no out"):
        at.totals("entropy", q, q, "softmax", out=q)
    # bad parameters: the command's messages
    with pytest.raises(ValueError, match="--threshold: expected a finite number, found nan"):
        at.sinks(q, q, "softmax", threshold=float("nan"))
    with pytest.raises(ValueError, match="--norm-ratio: expected a finite number > 0, found 0"):
        at.token_norms(q, ratio=0.0)
    with pytest.raises(ValueError, match="--fusion: expected mean, max or min, found 'sum'"):
        at.rollout([q], [q], "softmax", fusion="sum")
    with pytest.raises(ValueError, match="--mask 'local:4'"):
        at.mask(q, q, q, "softmax", grid, masks="local:4")
    with pytest.raises(ValueError, match="grid"):
        at.mask(q, q, q, "softmax", (1, 3, 3))
    with pytest.raises(ValueError, match="unknown"):
        at.sinks(q, q, "softmaxx")
    with pytest.raises(ValueError, match="trials must be >= 1, got 0"):
        at.verify(trials=0)


def test_diagnostics_on_planted_inputs(attnscope_module):
    """Negative controls for the new functions: a key every query attends to is a sink and one
    no query favours is not; a token with a large value is high-norm and the others are not; a
    rollout's class-token row sums to 1; a mask that removes nothing changes nothing."""
    at = attnscope_module
    n, d = 9, 4
    k = np.zeros((n, d), np.float32)
    k[3, 0] = 10.0
    q = np.zeros((n, d), np.float32)
    q[:, 0] = 2.0
    r = at.sinks(q, k, "softmax", threshold=0.5, scale=1.0)
    assert r["sink_keys"] == [3] and r["valid_rows"] == n
    assert r["received"][3] > 0.99 and r["received"][[0, 1, 2, 4]].max() < 0.01
    r = at.sinks(q, np.zeros_like(k), "softmax", threshold=0.5, scale=1.0)
    assert r["sink_keys"] == []  # uniform rows: no sink
    v = np.ones((1, 2, n, d), np.float32)
    v[0, 1, 6] = 50.0
    norms = at.token_norms(v, ratio=4.0)
    assert norms["high"][0].tolist() == [t == 6 for t in range(n)]
    rng = np.random.default_rng(3)
    qs = [rng.standard_normal((2, 3, n, d)).astype(np.float32) for _ in range(3)]
    ks = [rng.standard_normal((2, 3, n, d)).astype(np.float32) for _ in range(3)]
    cls = at.rollout(qs, ks, "softmax")["cls"]
    np.testing.assert_allclose(cls.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # the fast path's softmax weights come from float exponentials (rollout.hpp: each within a
    # relative 5e-4, measured below 2e-6); the reference is ExactRows' in double
    ref = at.rollout(qs, ks, "softmax", reference=True)["cls"]
    np.testing.assert_allclose(cls, ref, rtol=1e-5, atol=0)
    np.testing.assert_array_equal(at.rollout(qs, ks, "inline")["cls"].shape, (2, n))
    vs = rng.standard_normal((2, 3, n, d)).astype(np.float32)
    m = at.mask(qs[0], ks[0], vs, "inline", (0, 3, 3), masks="random:0,local:3")
    # the masked outputs are computed by the mask path (rounding apart from the plain path's)
    assert np.all(m["random:0"]["change"] < 1e-12)
    assert np.all(m["local:3"]["change"] > 1e-3)


def test_weights_into_a_given_array(attnscope_module):
    """out=: the weights are written into the array given (and it is returned), the same values
    as a new array's; a wrong dtype, layout, shape or a read-only array is refused."""
    at = attnscope_module
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    k = rng.standard_normal((2, 3, 7, 5)).astype(np.float32)
    out = np.full((2, 3, 7, 7), np.nan, np.float32)
    w = at.weights(q, k, "inline", out=out)
    assert w is out or np.shares_memory(w, out)
    np.testing.assert_array_equal(out, at.weights(q, k, "inline"))
    with pytest.raises(TypeError, match="out: expected a C-contiguous float32 array"):
        at.weights(q, k, "softmax", out=out.astype(np.float64))
    with pytest.raises(TypeError, match="out: expected a C-contiguous float32 array"):
        at.weights(q, k, "softmax", out=np.zeros((2, 3, 7, 14), np.float32)[..., ::2])
    with pytest.raises(ValueError, match=r"out: expected shape \[2, 3, 7, 7\]"):
        at.weights(q, k, "softmax", out=np.zeros((2, 3, 7, 6), np.float32))
    ro = np.zeros((2, 3, 7, 7), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        at.weights(q, k, "softmax", out=ro)


def test_local_mass_reads_any_float32_buffer_bit_for_bit(attnscope_module):
    """local_mass reads float32 heads in place (no copy into the library's matrix): heads at an
    address that is not 16-byte aligned, a slice of a larger stack, and the float64 copy of the
    same values (converted once) give the same masses bit for bit, every family alike."""
    at = attnscope_module
    rng = np.random.default_rng(11)
    big_q = rng.standard_normal((3, 3, 50, 16)).astype(np.float32)
    big_k = rng.standard_normal((3, 3, 50, 16)).astype(np.float32)
    q, k = np.ascontiguousarray(big_q[1:]), np.ascontiguousarray(big_k[1:])

    def misaligned(a):
        raw = np.zeros(a.nbytes + 16, np.uint8)
        start = 4 if raw.ctypes.data % 16 == 0 else 16 - raw.ctypes.data % 16 + 4
        out = raw[start:start + a.nbytes].view(np.float32).reshape(a.shape)
        out[...] = a
        return out

    qm, km = misaligned(q), misaligned(k)
    assert qm.ctypes.data % 16 != 0 and km.ctypes.data % 16 != 0 and qm.flags.c_contiguous
    for spec in ["softmax", "inline", "linear:relu", "mala"]:
        m = at.local_mass(q, k, spec, grid=(1, 7, 7), return_degenerate=True)
        assert m[0].shape == (2, 3, 50) and not np.all(np.isnan(m[0])), spec
        for qq, kk in [(qm, km), (big_q[1:], big_k[1:]),
                       (q.astype(np.float64), k.astype(np.float64))]:
            other = at.local_mass(qq, kk, spec, grid=(1, 7, 7), return_degenerate=True)
            assert np.array_equal(other[0], m[0], equal_nan=True), spec
            assert np.array_equal(other[1], m[1]), spec
    # control: other values give other masses
    assert not np.array_equal(at.local_mass(q, k[::-1].copy(), "inline", grid=(1, 7, 7))[0],
                              at.local_mass(q, k, "inline", grid=(1, 7, 7))[0], equal_nan=True)
