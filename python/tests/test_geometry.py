"""Per-layer geometry (docs/dump-format.md, "Per-layer geometry"): PVT's keys from a spatially
reduced grid on an odd grid, Swin's windows with a shift and its mask, stages of their own heads
and dims, and per-layer families, read by recompute, confusion, locality, maps, entropy, distance,
rank, census and mask (their values checked here against the model's own weights); the other analyses refuse such
layers by name. The dumps come from geometry_dumps.py (h5py and the
formulas, apart from the C++)."""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

from attnscope_dump.figures import read_csv
from geometry_dumps import pvt_dump, swin_dump


def _run(attnscope_bin, *args, ok=True):
    r = subprocess.run([attnscope_bin, *map(str, args), "--threads", "1"] if args[0] != "info"
                       else [attnscope_bin, *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
    return r


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("geometry")
    return {"pvt": pvt_dump(str(d / "pvt.h5")), "swin": swin_dump(str(d / "swin.h5")),
            "unmasked": swin_dump(str(d / "unmasked.h5"), drop_mask=True)}


def test_info_lists_each_layers_geometry(attnscope_bin, dumps):
    out = _run(attnscope_bin, "info", dumps["pvt"]).stdout
    assert "schema      valid" in out
    assert "0: 1 heads x 8, grid 9x9, keys 4x4 (spatial reduction)" in out
    assert "1: 2 heads x 6, grid 5x5" in out
    out = _run(attnscope_bin, "info", dumps["swin"]).stdout
    assert "1: 2 heads x 8, 4 windows of 7x7 on 14x14, shift 3" in out
    assert "2: 4 heads x 8, 1 windows of 7x7 on 7x7" in out


@pytest.mark.parametrize("name", ["pvt", "swin"])
def test_recompute_passes_per_window_and_stage(attnscope_bin, dumps, name, tmp_path):
    r = _run(attnscope_bin, "recompute", "--dump", dumps[name], "--out", tmp_path, "--tol", "1e-5")
    csv = read_csv(str(tmp_path / "recompute.csv"))
    heads = {"pvt": [(0, 0), (1, 0), (1, 1)],
             "swin": [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)]}[name]
    assert list(zip(map(int, csv["layer"]), map(int, csv["head"]))) == heads
    assert max(map(float, csv["out_max_rel_error"])) < 1e-5
    if name == "pvt":  # a hybrid: each layer's own family
        assert list(csv["variant"]) == ["linear:relu@code", "softmax@code", "softmax@code"]
        assert "each layer's own" in r.stdout


def test_shifted_windows_without_their_mask_fail_recompute(attnscope_bin, dumps, tmp_path):
    """The negative control: the shifted layer read as unmasked windows is not the model's."""
    r = _run(attnscope_bin, "recompute", "--dump", dumps["unmasked"], "--out", tmp_path, ok=False)
    assert r.returncode == 3, r.stdout + r.stderr
    csv = read_csv(str(tmp_path / "recompute.csv"))
    rel = dict(zip(zip(map(int, csv["layer"]), map(int, csv["head"])),
                   map(float, csv["out_max_rel_error"])))
    assert rel[(1, 0)] > 1e-2 and rel[(0, 0)] < 1e-5 and rel[(2, 0)] < 1e-5


def _edited(src, dst, edit):
    with open(src, "rb") as a, open(dst, "wb") as b:
        b.write(a.read())
    with h5py.File(dst, "r+") as f:
        edit(f)
    return dst


@pytest.mark.parametrize("edit, says", [
    (lambda f: f["layers/1"].__delitem__("window_mask"), "/layers/1/window_mask"),
    (lambda f: f["layers/1/token_positions"].__setitem__((0, 0, 0), 14), "token_positions"),
    (lambda f: f["layers/0"].attrs.__setitem__("window_height", 6), "/layers/0/token_positions"),
    (lambda f: f["layers/2"].attrs.__setitem__("key_grid_height", 3), "key_grid"),
    # Windows must cut the grid into pieces: a cell twice, or windows that leave cells out.
    (lambda f: f["layers/0/token_positions"].__setitem__((0, 1), f["layers/0/token_positions"][0, 0]),
     "/layers/0/token_positions: expected each cell of the grid once, found cell (0, 0) at window 0, "
     "token 0 and at window 0, token 1"),
    (lambda f: f["layers/2"].attrs.__setitem__("grid_height", 8),
     "/layers/2/token_positions: expected windows that cover the 8x7 grid once (windows x window "
     "tokens = 56), found 1 windows of 49 tokens"),
])
def test_bad_geometry_is_one_line_naming_the_place(attnscope_bin, dumps, tmp_path, edit, says):
    bad = _edited(dumps["swin"], str(tmp_path / "bad.h5"), edit)
    r = _run(attnscope_bin, "recompute", "--dump", bad, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and bad in lines[0] and says in lines[0], r.stderr
    assert "HDF5-DIAG" not in r.stderr


def _window_mass(f, layer, head, window=3):
    """Mean 3x3 local mass of the model's own weights, from the positions."""
    g = f[f"layers/{layer}"]
    attn, pos = g["attn"][()].astype(np.float64), g["token_positions"][()]
    near = (np.abs(pos[:, :, None, :] - pos[:, None, :, :]) <= window // 2).all(-1)
    return (attn[:, head] * near[None]).sum(-1).mean()


def test_locality_and_confusion_run_per_window(attnscope_bin, dumps, tmp_path):
    _run(attnscope_bin, "locality", "--dump", dumps["swin"], "--out", tmp_path / "loc")
    csv = read_csv(str(tmp_path / "loc" / "locality.csv"))
    with h5py.File(dumps["swin"]) as f:
        for layer, head, mean in zip(map(int, csv["layer"]), map(int, csv["head"]),
                                     map(float, csv["mean"])):
            assert mean == pytest.approx(_window_mass(f, layer, head), abs=1e-6), (layer, head)
    base = json.load(open(tmp_path / "loc" / "locality.json"))["results"]
    assert set(base["uniform_baseline_per_layer"]) == {"0", "1", "2"}
    assert base["uniform_baseline_per_layer"]["2"] == pytest.approx(
        np.mean([min(r + 1, 6) - max(r - 1, 0) + 1 for r in range(7)]) ** 2 / 49)

    _run(attnscope_bin, "confusion", "--dump", dumps["swin"], "--out", tmp_path / "conf",
         "--eps", "0.05")
    heads = read_csv(str(tmp_path / "conf" / "confusion_per_head.csv"))
    assert len(heads["head"]) == 8  # each layer's own heads, not the most of any layer
    # Pairs within windows, from the model's own weights (the eps keeps clear of rounding).
    with h5py.File(dumps["swin"]) as f:
        for layer, head, count in zip(map(int, heads["layer"]), map(int, heads["head"]),
                                      map(int, heads["count"])):
            a = f[f"layers/{layer}/attn"][:, head].astype(np.float64)
            d = np.sqrt(((a[..., :, None, :] - a[..., None, :, :]) ** 2).sum(-1))
            iu = np.triu_indices(49, 1)
            assert count == int((d[..., iu[0], iu[1]] <= 0.05).sum()), (layer, head)
    meta = json.load(open(tmp_path / "conf" / "confusion.json"))
    assert "windows of 7x7" in meta["parameters"]["layer_geometry"]["1"]


def test_maps_lay_a_window_out_on_the_grid(attnscope_bin, dumps, tmp_path):
    _run(attnscope_bin, "maps", "--dump", dumps["swin"], "--out", tmp_path, "--tokens", "7:7",
         "--layers", "1", "--heads", "0")
    with h5py.File(tmp_path / "maps.h5") as m, h5py.File(dumps["swin"]) as f:
        got = m["softmax@code/image_0/layer_1/head_0/query_105"][()]
        pos = f["layers/1/token_positions"][()]
        w, t = np.argwhere((pos == (7, 7)).all(-1))[0]
        want = np.zeros((14, 14))
        want[pos[w, :, 0], pos[w, :, 1]] = f["layers/1/attn"][0, 0, w, t]
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_hybrid_stages_use_each_layers_own_family(attnscope_bin, dumps, tmp_path):
    _run(attnscope_bin, "confusion", "--dump", dumps["pvt"], "--out", tmp_path / "c")
    per_layer = read_csv(str(tmp_path / "c" / "confusion_per_layer.csv"))
    assert list(per_layer["variant"]) == ["linear:relu@code", "softmax@code"]
    meta = json.load(open(tmp_path / "c" / "confusion.json"))
    assert meta["parameters"]["variants"] == {"each_layer_own": {"0": "linear:relu@code",
                                                             "1": "softmax@code"}}
    _run(attnscope_bin, "locality", "--dump", dumps["pvt"], "--out", tmp_path / "l")
    loc = read_csv(str(tmp_path / "l" / "locality.csv"))
    assert list(loc["variant"]) == ["linear:relu@code", "softmax@code", "softmax@code"]
    _run(attnscope_bin, "maps", "--dump", dumps["pvt"], "--out", tmp_path / "m", "--tokens", "4:4")
    with h5py.File(tmp_path / "m" / "maps.h5") as m:
        assert m["linear:relu@code/image_0/layer_0/head_0/query_40"].shape == (4, 4)
        assert m["softmax@code/image_0/layer_1/head_1/query_40"].shape == (5, 5)

    # not at hand; stage 2 (softmax) is compared with its attn: cell 4:4 of 9x9 -> 2:2 of 5x5.
    with h5py.File(tmp_path / "m" / "maps.h5") as m, h5py.File(dumps["pvt"]) as f:
        np.testing.assert_allclose(m["softmax@code/image_0/layer_1/head_1/query_40"][()],
                                   f["layers/1/attn"][0, 1, 12].reshape(5, 5), atol=1e-6)


def test_other_analyses_refuse_other_geometry_by_name(attnscope_bin, dumps, tmp_path):
    r = _run(attnscope_bin, "spikiness", "--dump", dumps["pvt"], "--out", tmp_path,
             "--variant", "softmax", ok=False)
    assert r.returncode == 1
    line = r.stderr.strip()
    assert "\n" not in line and dumps["pvt"] in line and "/layers/0 (model layer 0)" in line
    assert "keys 4x4 (spatial reduction)" in line
    masked = _edited(dumps["swin"], str(tmp_path / "masked.h5"), lambda f: f.create_dataset(
        "token_masks/bg", data=np.zeros((2, 196), bool)))
    r = _run(attnscope_bin, "confusion", "--dump", masked, "--out", tmp_path / "x",
             "--exclude-tokens", "mask:/token_masks/bg", ok=False)
    assert r.returncode != 0 and "model layer 0" in r.stderr and "--exclude-tokens" in r.stderr


def _model_weights(f, layer):
    """The model's own weights of a layer, [images, heads, (windows,) nq, nk] in float64: its
    `attn` where the dump holds it, else from q and k by the formulas (geometry_dumps)."""
    from geometry_dumps import _weights
    g = f[f"layers/{layer}"]
    if "attn" in g:
        return g["attn"][()].astype(np.float64)
    q, k = (torch.from_numpy(g[n][()].astype(np.float64)) for n in ("q", "k"))
    return _weights(g.attrs["attention_family"], q, k, float(g.attrs["scale"]),
                    g.attrs["feature_map"]).numpy()


def _allowed(f, layer, shape):
    g = f[f"layers/{layer}"]
    if "window_mask" in g:
        return np.broadcast_to(g["window_mask"][()].astype(bool), shape)
    return np.ones(shape, bool)


def _per_head(csv, column):
    return {(int(l), int(h)): float(x) for l, h, x in zip(csv["layer"], csv["head"], csv[column])}


@pytest.mark.parametrize("name", ["pvt", "swin"])
def test_entropy_runs_per_window_and_over_reduced_keys(attnscope_bin, dumps, name, tmp_path):
    """Each row's entropy over the keys it sees, and its share of log of their number (a shifted
    window's row: the keys its mask allows), against the model's own weights."""
    _run(attnscope_bin, "entropy", "--dump", dumps[name], "--out", tmp_path)
    csv = read_csv(str(tmp_path / "entropy.csv"))
    mean, share = _per_head(csv, "mean_entropy"), _per_head(csv, "mean_normalised")
    with h5py.File(dumps[name]) as f:
        for layer in range(int(f.attrs["num_layers"])):
            w = _model_weights(f, layer)
            seen = _allowed(f, layer, w.shape).sum(-1)
            h = -(np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0)).sum(-1)
            for head in range(w.shape[1]):
                rows_h = h[:, head].reshape(h.shape[0], -1)
                rows_s = (h[:, head] / np.log(seen[:, head])).reshape(h.shape[0], -1)
                assert mean[(layer, head)] == pytest.approx(rows_h.mean(-1).mean(), abs=1e-5)
                assert share[(layer, head)] == pytest.approx(rows_s.mean(-1).mean(), abs=1e-5)
    meta = json.load(open(tmp_path / "entropy.json"))
    want = "keys 4x4 (spatial reduction)" if name == "pvt" else "4 windows of 7x7 on 14x14, shift 3"
    assert want in meta["parameters"]["layer_geometry"]["0" if name == "pvt" else "1"]
    if name == "swin":  # the masked rows see fewer keys: log 49 alone would give other shares
        with h5py.File(dumps[name]) as f:
            w = _model_weights(f, 1)
            h = -(np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0)).sum(-1)
            wrong = (h[:, 0] / np.log(49)).reshape(2, -1).mean(-1).mean()
        assert abs(share[(1, 0)] - wrong) > 1e-3


def _positions(f, layer):
    """Each query's and key's centre in the stage's cells: [(windows,) n, 2]."""
    g = f[f"layers/{layer}"]
    if "token_positions" in g:
        p = g["token_positions"][()].astype(np.float64)
        return p, p
    gh, gw = int(g.attrs["grid_height"]), int(g.attrs["grid_width"])
    kh = int(g.attrs.get("key_grid_height", gh))
    kw = int(g.attrs.get("key_grid_width", gw))
    qp = np.stack(np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij"), -1).reshape(-1, 2)
    kc = np.stack(np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij"), -1).reshape(-1, 2)
    # a reduced key at the centre of the block of query cells it pools
    kp = (kc + 0.5) * np.array([gh / kh, gw / kw]) - 0.5
    return qp.astype(np.float64), kp


@pytest.mark.parametrize("name", ["pvt", "swin"])
def test_distance_runs_in_each_stages_pixels(attnscope_bin, dumps, name, tmp_path):
    """Swin: pixels between the cells of a window in the stage's grid; PVT: a reduced key at the
    centre of the block it pools; a stage's patch is the dump's scaled to its grid."""
    _run(attnscope_bin, "distance", "--dump", dumps[name], "--out", tmp_path, "--patch-size", 4)
    mean = _per_head(read_csv(str(tmp_path / "distance.csv")), "mean_distance")
    meta = json.load(open(tmp_path / "distance.json"))
    with h5py.File(dumps[name]) as f:
        root = int(f.attrs["grid_height"])
        for layer in range(int(f.attrs["num_layers"])):
            patch = 4.0 * root / int(f[f"layers/{layer}"].attrs["grid_height"])
            assert meta["parameters"]["stage_patch_size"][str(layer)]["height"] == patch
            qp, kp = _positions(f, layer)
            dist = np.sqrt(((qp[..., :, None, :] - kp[..., None, :, :]) ** 2).sum(-1)) * patch
            w = _model_weights(f, layer)
            d = (w * dist).sum(-1)
            uniform = (dist * _allowed(f, layer, dist.shape)).sum(-1) / \
                _allowed(f, layer, dist.shape).sum(-1)
            assert meta["results"]["uniform_baseline_per_layer"][str(layer)] == pytest.approx(
                uniform.mean(), rel=1e-12)
            for head in range(w.shape[1]):
                assert mean[(layer, head)] == pytest.approx(
                    d[:, head].reshape(d.shape[0], -1).mean(-1).mean(), abs=1e-5), (layer, head)
    if name == "pvt":  # the block's corner instead of its centre: other distances
        with h5py.File(dumps[name]) as f:
            qp, _ = _positions(f, 0)
            corner = np.stack(np.meshgrid(np.arange(4), np.arange(4), indexing="ij"),
                              -1).reshape(-1, 2) * 9 / 4
            dist = np.sqrt(((qp[:, None] - corner[None]) ** 2).sum(-1)) * 4
            wrong = (_model_weights(f, 0)[:, 0] * dist).sum(-1).mean()
        assert abs(mean[(0, 0)] - wrong) > 0.1


@pytest.mark.parametrize("name", ["pvt", "swin"])
def test_rank_runs_per_window_and_over_reduced_keys(attnscope_bin, dumps, name, tmp_path):
    """One matrix per window (7x7 windows: 49 x 49, full rank for softmax; the full-rank counts
    count windows), N x M under reduction (81 x 16 of ReLU features of dimension 8: rank 8)."""
    _run(attnscope_bin, "rank", "--dump", dumps[name], "--out", tmp_path)
    csv = read_csv(str(tmp_path / "rank.csv"))
    rank, images = _per_head(csv, "mean_rank"), _per_head(csv, "images")
    k_full = _per_head(csv, "k_full_rank_images")
    erank = _per_head(csv, "mean_erank")
    with h5py.File(dumps[name]) as f:
        for layer in range(int(f.attrs["num_layers"])):
            w = _model_weights(f, layer)
            units = 1 if w.ndim == 4 else w.shape[2]
            for head in range(w.shape[1]):
                m = w[:, head].reshape(-1, *w.shape[-2:])
                s = np.linalg.svd(m, compute_uv=False)
                p = s / s.sum(-1, keepdims=True)
                want = np.exp(-(p * np.log(np.where(p > 0, p, 1))).sum(-1)).mean()
                assert erank[(layer, head)] == pytest.approx(want, rel=1e-4), (layer, head)
                low = name == "pvt" and layer == 0  # ReLU features of dimension 8
                assert rank[(layer, head)] == (8 if low else min(m.shape[-2:])), (layer, head)
                assert images[(layer, head)] == 2 and k_full[(layer, head)] == 2 * units
    meta = json.load(open(tmp_path / "rank.json"))
    assert "units" in meta["parameters"] and "layer_geometry" in meta["parameters"]


@pytest.mark.parametrize("name", ["pvt", "swin"])
def test_census_counts_each_windows_allowed_pairs(attnscope_bin, dumps, name, tmp_path):
    """The InLine census per window and over reduced keys: only the pairs a window's mask allows
    are weights (a forbidden pair is no zero weight); the negative weights of unmasked units
    against InLine's weights from the formulas (python/attnscope_dump/attention.py)."""
    from attnscope_dump.attention import attention_outputs
    _run(attnscope_bin, "census", "--dump", dumps[name], "--out", tmp_path, "--variant",
         "inline:identity@code")
    csv = read_csv(str(tmp_path / "census.csv"))
    weights, negative, zero = (_per_head(csv, c) for c in ("weights", "negative", "zero"))
    with h5py.File(dumps[name]) as f:
        assert set(weights) == {(l, h) for l in range(int(f.attrs["num_layers"]))
                                for h in range(int(f[f"layers/{l}"].attrs["num_heads"]))}
        for layer in range(int(f.attrs["num_layers"])):
            g = f[f"layers/{layer}"]
            q, k = (torch.from_numpy(g[n][()].astype(np.float64)) for n in ("q", "k"))
            eye = torch.eye(k.shape[-2], dtype=torch.float64).expand(*k.shape[:-2], -1, -1)
            w = attention_outputs("inline", q, k, eye, float(g.attrs["scale"]), "identity").numpy()
            allowed = _allowed(f, layer, w.shape)
            for head in range(w.shape[1]):
                assert weights[(layer, head)] == allowed[:, head].sum(), (layer, head)
                assert zero[(layer, head)] == 0
                if "window_mask" not in g:
                    assert negative[(layer, head)] == (w[:, head] < 0).sum(), (layer, head)
    if name == "swin":  # the shifted layer: fewer weights than its windows' pairs
        assert weights[(1, 0)] < weights[(0, 0)] == 2 * 4 * 49 * 49
    meta = json.load(open(tmp_path / "census.json"))
    assert "layer_geometry" in meta["parameters"] and "units" in meta["parameters"]


def _softmax(logits, allowed):
    x = np.where(allowed, logits, -np.inf)
    x = np.exp(x - x.max(-1, keepdims=True))
    return x / x.sum(-1, keepdims=True)


def test_mask_removes_local_keys_per_window(attnscope_bin, dumps, tmp_path):
    """local:3 on Swin's windows: the keys of the query's 3x3 cells of its window removed on top
    of the shifted windows' mask; the change over every window's rows, from the formulas."""
    _run(attnscope_bin, "mask", "--dump", dumps["swin"], "--out", tmp_path, "--mask", "local:3")
    csv = read_csv(str(tmp_path / "mask_per_head.csv"))
    change = _per_head(csv, "change_mean")
    empty = _per_head(csv, "empty_rows")
    with h5py.File(dumps["swin"]) as f:
        for layer in range(3):
            g = f[f"layers/{layer}"]
            q, k, v = (g[n][()].astype(np.float64) for n in ("q", "k", "v"))
            pos = g["token_positions"][()]
            base = g["window_mask"][()].astype(bool) if "window_mask" in g else \
                np.ones(pos.shape[:1] + (pos.shape[1],) * 2, bool)
            near = (np.abs(pos[:, :, None, :] - pos[:, None, :, :]) <= 1).all(-1)
            logits = float(g.attrs["scale"]) * q @ np.swapaxes(k, -1, -2)
            o = _softmax(logits, base) @ v
            kept = base & ~near
            rows = kept.any(-1)  # a row left with no key is left out of both norms
            om = _softmax(logits, np.where(rows[..., None], kept, True)) @ v
            for head in range(q.shape[1]):
                d2 = (((om - o) ** 2).sum(-1) * rows)[:, head].reshape(2, -1).sum(-1)
                b2 = ((o ** 2).sum(-1) * rows)[:, head].reshape(2, -1).sum(-1)
                assert change[(layer, head)] == pytest.approx(np.sqrt(d2 / b2).mean(), rel=1e-5)
                assert empty[(layer, head)] == 2 * (~rows).sum(), (layer, head)
    assert empty[(1, 0)] > 0 and empty[(0, 0)] == 0  # 3x3 regions of the shifted windows
    meta = json.load(open(tmp_path / "mask.json"))
    assert "units" in meta["parameters"] and "layer_geometry" in meta["parameters"]


def test_mask_maps_queries_onto_reduced_keys(attnscope_bin, dumps, tmp_path):
    """local:1 with reduced keys removes, for each query, the one key whose cell its own cell
    maps onto (row * 4 // 9); the removed mass is that key's weight."""
    _run(attnscope_bin, "mask", "--dump", dumps["pvt"], "--out", tmp_path, "--mask", "local:1",
         "--layers", "0")
    csv = read_csv(str(tmp_path / "mask_per_head.csv"))
    with h5py.File(dumps["pvt"]) as f:
        w = _model_weights(f, 0)[:, 0]  # [images, 81, 16]
    cell = (np.arange(9) * 4 // 9)
    key = (cell[:, None] * 4 + cell[None, :]).reshape(-1)
    removed = np.take_along_axis(w, np.broadcast_to(key[None, :, None], (2, 81, 1)), -1)
    assert float(csv["removed_mass_mean"][0]) == pytest.approx(removed.mean(), rel=1e-6)
