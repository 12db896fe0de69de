"""The released hierarchical models (stand-ins in standins_released.py): PVT with spatial
reduction (FLatten's and PVT's softmax attention), InLine's PVT form, and Swin with InLine's or
FLatten's window attention and shifted windows, dumped with each layer's geometry and family;
`attnscope recompute`, confusion, locality and maps run on them per window and per stage; Swin's
softmax layers (relative position bias) and InLine PVT with reduction are refused by name."""
import json
import subprocess

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from attnscope_dump import dump_model
from attnscope_dump.figures import read_csv
from attnscope_dump.released_hier import swin_window_positions
from cli_check import info_and_recompute
from conftest import image_loader
from standins_released import CSwinModel, FLattenPVT, SwinModel


def _run(attnscope_bin, *args, ok=True):
    r = subprocess.run([attnscope_bin, *map(str, args), "--threads", "1"], capture_output=True,
                       text=True, timeout=300)
    if ok:
        assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
    return r


def _dump(model, path, **kw):
    torch.manual_seed(0)
    batches = image_loader(4, size=32, batch=2)
    dump_model(model.eval(), batches, str(path), dtype="float32", **kw)
    return torch.cat([b[0] for b in batches])


def _attrs(f, layer):
    g = f[f"layers/{layer}"]
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in g.attrs.items()}


def _proj_inputs(model, x, attns):
    got = []
    hooks = [a.proj.register_forward_pre_hook(lambda _m, inp: got.append(inp[0])) for a in attns]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return got


@pytest.fixture(scope="module")
def pvt(tmp_path_factory):
    """FLatten-PVT 'LS' with sr 2 in both stages: 8x8 grid, keys 4x4; 4x4 grid, keys 2x2."""
    torch.manual_seed(3)
    model = FLattenPVT(attn_type="LS", sr_ratios=(2, 2)).eval()
    path = tmp_path_factory.mktemp("pvt") / "pvt.h5"
    x = _dump(model, path)
    return model, path, x


def test_pvt_layers_have_their_families_and_reduced_keys(pvt, attnscope_bin, tmp_path):
    model, path, x = pvt
    with h5py.File(path) as f:
        assert [_attrs(f, i)["attention_family"] for i in range(3)] == \
            ["linear", "linear", "softmax"]
        assert _attrs(f, 0)["feature_map"] == "focused=3"
        assert (_attrs(f, 0)["key_grid_height"], _attrs(f, 0)["key_grid_width"]) == (4, 4)
        a2 = _attrs(f, 2)
        assert (a2["grid_height"], a2["num_heads"], a2["key_grid_height"]) == (4, 2, 2)
        assert f["layers/0/q"].shape == (4, 1, 64, 16) and f["layers/0/k"].shape == (4, 1, 16, 16)
        assert f["layers/2/q"].shape == (4, 2, 16, 16) and f["layers/2/v"].shape == (4, 2, 4, 16)
        assert "local" in f["layers/0"] and "local" not in f["layers/2"]
        # out + local is the module's own input of proj (the DWC of v stretched to 64 tokens)
        before = _proj_inputs(model, x, [b.attn for b in model.block1])
        g = f["layers/1"]
        both = torch.from_numpy(g["out"][()] + g["local"][()]).transpose(1, 2).reshape(4, 64, 16)
        assert (both - before[1]).abs().max() < 1e-5 * before[1].abs().max()
        assert np.abs(g["local"][()]).max() > 1e-2 * np.abs(g["out"][()]).max()
    # FLatten adds n * 1e-6 to each row's normaliser, which the family does not: 1e-3
    _, csv = info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=1e-3)
    assert list(csv["variant"]) == ["linear:focused=3@code"] * 2 + ["softmax@code"] * 2


def test_pvt_analyses_run_per_stage(pvt, attnscope_bin, tmp_path):
    _, path, _ = pvt
    _run(attnscope_bin, "confusion", "--dump", path, "--out", tmp_path / "c")
    meta = json.load(open(tmp_path / "c" / "confusion.json"))
    assert meta["parameters"]["variants"] == {"each_layer_own": {
        "0": "linear:focused=3@code", "1": "linear:focused=3@code", "2": "softmax@code"}}
    _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "l")
    assert len(read_csv(str(tmp_path / "l" / "locality.csv"))["layer"]) == 4
    _run(attnscope_bin, "maps", "--dump", path, "--out", tmp_path / "m", "--tokens", "4:4")
    with h5py.File(tmp_path / "m" / "maps.h5") as m:
        assert m["linear:focused=3@code/image_0/layer_0/head_0/query_36"].shape == (4, 4)
        assert m["softmax@code/image_0/layer_2/head_1/query_36"].shape == (2, 2)


def test_inline_pvt_hybrid(tmp_path, attnscope_bin):
    """InLine-PVT 'IS': InLine (sr 1, local residual apart) then softmax with reduction."""
    model = FLattenPVT(attn_type="IS", sr_ratios=(1, 2))
    _dump(model, tmp_path / "d.h5")
    with h5py.File(tmp_path / "d.h5") as f:
        assert [_attrs(f, i)["attention_family"] for i in range(3)] == \
            ["inline", "inline", "softmax"]
        assert "key_grid_height" not in _attrs(f, 0) and "local" in f["layers/0"]
    _, csv = info_and_recompute(attnscope_bin, tmp_path / "d.h5", tmp_path / "r", tol=1e-4)
    assert set(csv["variant"]) == {"inline:identity@code", "softmax@code"}


def test_inline_pvt_with_reduction_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"layer 0: InLinePVTAttention is InLine PVT with spatial "
                                         r"reduction: not supported: the released forward"):
        dump_model(FLattenPVT(attn_type="IS", sr_ratios=(2, 2)), image_loader(2, size=32),
                   str(tmp_path / "d.h5"), layers=[0])


@pytest.fixture(scope="module")
def swin(tmp_path_factory):
    """InLine-Swin 'II': 8x8 in 4x4 windows (shift 0, then 2), patch merging, 4x4 (one window)."""
    torch.manual_seed(4)
    model = SwinModel(attn_type="II").eval()
    path = tmp_path_factory.mktemp("swin") / "swin.h5"
    x = _dump(model, path)
    return model, path, x


def test_swin_windows_positions_and_mask(swin, attnscope_bin, tmp_path):
    model, path, x = swin
    blocks = [b for layer in model.layers for b in layer.blocks]
    with h5py.File(path) as f:
        for i, blk in enumerate(blocks):
            a = _attrs(f, i)
            assert a["attention_family"] == "inline" and a["feature_map"] == "identity"
            assert a.get("shift", 0) == blk.shift_size
        assert (_attrs(f, 0)["windows"], _attrs(f, 2)["windows"]) == (4, 1)
        assert f["layers/1/q"].shape == (4, 2, 4, 16, 8)
        assert f["layers/2/q"].shape == (4, 4, 1, 16, 8)
        # the positions: the token at (row, col) of window w is the map's cell, unrolled
        pos = f["layers/1/token_positions"][()]
        np.testing.assert_array_equal(pos, swin_window_positions(8, 8, 4, 2))
        assert tuple(pos[0, 0]) == (2, 2) and tuple(pos[3, 15]) == (1, 1)
        # InLine's module does not read the block's mask: every pair allowed
        assert f["layers/1/window_mask"][()].all() and "window_mask" not in f["layers/0"]
        # v per window is the block's rolled, cut map: compare with the module's own qkv input
        got = []
        hk = blocks[1].attn.qkv.register_forward_hook(lambda _m, _i, o: got.append(o))
        with torch.no_grad():
            model(x[:2])
        hk.remove()
        v = got[0].chunk(3, dim=-1)[2].reshape(2, 4, 16, 2, 8).permute(0, 3, 1, 2, 4)
        np.testing.assert_allclose(f["layers/1/v"][:2], v.numpy(), atol=1e-6)
        # out + local is the module's input of proj, window by window
        before = _proj_inputs(model, x, [blocks[1].attn])[0]
        both = torch.from_numpy(f["layers/1/out"][()] + f["layers/1/local"][()])
        both = both.permute(0, 2, 3, 1, 4).reshape(before.shape)
        assert (both - before).abs().max() < 1e-5 * before.abs().max()
    info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=1e-4)


def test_swin_region_mask_is_not_the_modules(swin, attnscope_bin, tmp_path):
    """The negative control: with Swin's region mask in place of the stored all-pairs mask, the
    shifted layer is no longer the model's (the InLine module attends across the regions)."""
    _, path, _ = swin
    bad = tmp_path / "regions.h5"
    bad.write_bytes(path.read_bytes())
    with h5py.File(bad, "r+") as f:
        t = np.arange(64).reshape(8, 8)
        region = np.zeros((8, 8), int)
        for i, rs in enumerate((slice(0, 4), slice(4, 6), slice(6, 8))):
            for j, cs in enumerate((slice(0, 4), slice(4, 6), slice(6, 8))):
                region[rs, cs] = 3 * i + j
        rolled = np.roll(region, (-2, -2), (0, 1))  # regions are of the rolled map
        labels = rolled.reshape(2, 4, 2, 4).swapaxes(1, 2).reshape(4, 16)
        f["layers/1/window_mask"][...] = labels[:, :, None] == labels[:, None, :]
        assert not f["layers/1/window_mask"][()].all() and t.size == 64
    r = _run(attnscope_bin, "recompute", "--dump", bad, "--out", tmp_path / "r", "--tol", "1e-4",
             ok=False)
    assert r.returncode == 3, r.stdout + r.stderr
    csv = read_csv(str(tmp_path / "r" / "recompute.csv"))
    rel = {(int(l), int(h)): float(e) for l, h, e in
           zip(csv["layer"], csv["head"], csv["out_max_rel_error"])}
    assert rel[(1, 0)] > 1e-2 and rel[(0, 0)] < 1e-4


def test_swin_analyses_run_per_window(swin, attnscope_bin, tmp_path):
    _, path, _ = swin
    _run(attnscope_bin, "confusion", "--dump", path, "--out", tmp_path / "c")
    heads = read_csv(str(tmp_path / "c" / "confusion_per_head.csv"))
    assert len(heads["head"]) == 2 + 2 + 4 + 4
    _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "l")
    loc = json.load(open(tmp_path / "l" / "locality.json"))
    assert set(loc["results"]["uniform_baseline_per_layer"]) == {"0", "1", "2", "3"}
    _run(attnscope_bin, "maps", "--dump", path, "--out", tmp_path / "m", "--tokens", "2:2",
         "--layers", "1", "--heads", "0")
    with h5py.File(tmp_path / "m" / "maps.h5") as m:
        got = m["inline:identity@code/image_0/layer_1/head_0/query_18"][()]
        assert got.shape == (8, 8)
        # the window of cell (2, 2) is the rolled map's first: cells 2..5 x 2..5
        assert np.all(got[2:6, 2:6] != 0) and np.count_nonzero(got) == 16


def test_flatten_swin(tmp_path, attnscope_bin):
    """FLatten-Swin, one head in stage 1 (focused map), two in stage 2 (the module's focused
    features stored, map identity: FLatten's focusing normalises over every head's channels)."""
    torch.manual_seed(1)
    model = SwinModel(attn_type="LL", num_heads=(1, 2))
    _dump(model, tmp_path / "d.h5")
    with h5py.File(tmp_path / "d.h5") as f:
        assert [_attrs(f, i)["feature_map"] for i in range(4)] == \
            ["focused=3", "focused=3", "identity", "identity"]
        assert f["layers/1/window_mask"][()].all() and "local" in f["layers/3"]
    info_and_recompute(attnscope_bin, tmp_path / "d.h5", tmp_path / "r", tol=1e-3)


def test_flattens_normaliser_epsilon_is_caught_by_the_self_check(tmp_path):
    """FLatten adds n * 1e-6 to each row's normaliser; where a row's normaliser is that small
    (here at random initialisation) the module is not the family, and the self-check says so."""
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"layer 1 \(FLatten Swin .*\): the model's attention "
                                         r"output is not linear:focused=3@code"):
        _dump(SwinModel(attn_type="LL", num_heads=(1, 2)), tmp_path / "d.h5")


def test_swin_hybrid_softmax_stage_refused_linear_stages_dumped(tmp_path, attnscope_bin):
    """InLine-Swin 'IS' (as 'IIIS'): the softmax stage's relative position bias cannot be held by
    the format, so it is refused by one line; the InLine stage dumps alone with layers=."""
    model = SwinModel(attn_type="IS")
    with pytest.raises(ValueError, match=r"^layer 2: WindowAttention is Swin softmax window "
                                         r"attention \(WindowAttention\): not supported: Swin adds "
                                         r"a learned relative position bias"):
        dump_model(model, image_loader(2, size=32), str(tmp_path / "all.h5"))
    _dump(model, tmp_path / "d.h5", layers=[0, 1])
    with h5py.File(tmp_path / "d.h5") as f:
        assert f.attrs["num_layers"] == 2 and _attrs(f, 1)["attention_family"] == "inline"
    info_and_recompute(attnscope_bin, tmp_path / "d.h5", tmp_path / "r", tol=1e-4)


def test_a_wrong_statement_on_windows_fails_the_self_check(tmp_path):
    with pytest.raises(ValueError, match=r"layer 0 \(InLine Swin .*family as stated\): the "
                                         r"model's attention output is not softmax"):
        dump_model(SwinModel(attn_type="II").eval(), image_loader(2, size=32),
                   str(tmp_path / "d.h5"), families={0: "softmax"}, layers=[0])


def test_nothing_is_softmax_by_default(tmp_path):
    """Every layer recorded as softmax is a recognised softmax structure (PVT's Attention)."""
    for model in (SwinModel(attn_type="II"), FLattenPVT(attn_type="LL", sr_ratios=(2, 1)),
                  FLattenPVT(attn_type="IS", sr_ratios=(1, 2))):
        _dump(model, tmp_path / "d.h5")
        sites = [b.attn for name in ("block1", "block2", "layers") for blk in
                 (getattr(model, name, None) or []) for b in
                 (blk.blocks if hasattr(blk, "blocks") else [blk])]
        with h5py.File(tmp_path / "d.h5") as f:
            for i, attn in enumerate(sites):
                fam = _attrs(f, i)["attention_family"]
                assert (fam == "softmax") == (type(attn).__name__ == "PVTAttention"), (i, fam)


def test_census_and_spikiness_apply_their_variants_to_every_layer_of_a_hybrid(tmp_path,
                                                                              attnscope_bin):
    """Their default is a list of variants, not the dump's own: on a hybrid (InLine then softmax
    layers) each listed variant covers every layer, as docs/cli/census.md says."""
    from standins_released import InLineDeiT
    torch.manual_seed(0)
    path = tmp_path / "h.h5"
    dump_model(InLineDeiT(depth=2, softmax_from=1).eval(), image_loader(2, size=28), str(path),
               dtype="float32")
    _run(attnscope_bin, "census", "--dump", path, "--out", tmp_path / "c")
    csv = read_csv(str(tmp_path / "c" / "census.csv"))
    rows = sorted(zip(csv["variant"], map(int, csv["layer"]), map(int, csv["head"])))
    assert rows == [(v, l, h) for v in ("inline:identity@code", "mala:elu1@code")
                    for l in (0, 1) for h in range(3)]
    assert all(int(w) == 197 * 197 * 2 for w in csv["weights"]), csv
    _run(attnscope_bin, "spikiness", "--dump", path, "--out", tmp_path / "s")
    samples = read_csv(str(tmp_path / "s" / "spikiness_samples.csv"))
    for v in ("softmax@code", "inline:identity@code"):
        assert {int(l) for var, l in zip(samples["variant"], samples["layer"]) if var == v} \
            == {0, 1}, v


def _block_qkv(model, x):
    """Each CSwin block's q (the first third of `qkv`'s output), [B, N, C], in block order."""
    got = []
    blocks = [b for st in (model.stage1, model.stage2) for b in st]
    hooks = [b.qkv.register_forward_hook(lambda _m, _i, o: got.append(o.chunk(3, dim=-1)[0]))
             for b in blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return got


@pytest.mark.parametrize("attn_type,family", [("IS", "inline"), ("SS", "softmax")])
def test_cswin_stripes_dump_with_each_heads_stripe_shape(tmp_path, attnscope_bin, attn_type,
                                                         family):
    """InLine-CSwin 'IS' (as 'IISS') and CSwin's softmax 'SS': a block's first branch's heads
    attend within vertical stripes, the second's within horizontal ones; the layer stores both
    shapes (second_heads_from, second_token_positions); each head's stored q at (stripe, token)
    is the block's q at the cell its own shape's positions name (not the other shape's);
    recompute passes stripe by stripe."""
    torch.manual_seed(2)
    model = CSwinModel(attn_type=attn_type).eval()
    x = _dump(model, tmp_path / "d.h5")
    qs = _block_qkv(model, x)
    with h5py.File(tmp_path / "d.h5") as f:
        a0, a1 = _attrs(f, 0), _attrs(f, 1)
        assert a0["attention_family"] == family and a1["attention_family"] == "softmax"
        assert (a0["windows"], a0["window_height"], a0["window_width"]) == (4, 8, 2)
        assert (a0["second_heads_from"], a0["second_window_height"],
                a0["second_window_width"]) == (1, 2, 8)
        assert "second_heads_from" not in a1 and (a1["windows"], a1["window_height"]) == (1, 4)
        first = f["layers/0/token_positions"][()]
        second = f["layers/0/second_token_positions"][()]
        assert sorted(map(tuple, first.reshape(-1, 2))) == sorted(map(tuple, second.reshape(-1, 2)))
        q = f["layers/0/q"][()]  # [images, heads, stripes, T, d]
        full = qs[0].numpy()  # [images, 64, C]: head h's channels h*d..(h+1)*d
        d = q.shape[-1]
        for head, pos, other in ((0, first, second), (1, second, first)):
            cells = pos[..., 0] * 8 + pos[..., 1]
            want = full[:, cells, head * d:(head + 1) * d]
            assert np.abs(q[:, head] - want).max() < 1e-6, head
            wrong = full[:, other[..., 0] * 8 + other[..., 1], head * d:(head + 1) * d]
            assert np.abs(q[:, head] - wrong).max() > 1e-2, "the two shapes cannot be told apart"
    out, _ = info_and_recompute(attnscope_bin, tmp_path / "d.h5", tmp_path / "r", tol=1e-4)
    assert "heads 1.. in 4 windows of 2x8" in out, out


def test_cswin_maps_and_locality_take_each_heads_stripes(tmp_path, attnscope_bin):
    """maps lays each head's row on its own stripe: head 0's nonzero cells lie in the query's
    vertical stripe (2 columns), head 1's in its horizontal one (2 rows), 16 cells each;
    confusion and locality (with the local term folded in) run per stripe."""
    torch.manual_seed(2)
    _dump(CSwinModel(attn_type="IS").eval(), tmp_path / "d.h5")
    _run(attnscope_bin, "maps", "--dump", tmp_path / "d.h5", "--out", tmp_path / "m",
         "--layers", 0, "--tokens", 19, "--images", 0)
    rows = read_csv(str(tmp_path / "m" / "maps.csv"))
    for head, same in ((0, "col"), (1, "row")):
        cells = [(int(r), int(c)) for h, r, c, w in zip(rows["head"], rows["row"], rows["col"],
                                                         rows["weight"])
                 if int(h) == head and float(w) != 0.0]
        qr, qc = 19 // 8, 19 % 8
        key = 0 if same == "row" else 1
        assert len(cells) == 16, (head, len(cells))
        assert all(c[key] // 2 == (qr if key == 0 else qc) // 2 for c in cells), (head, cells)
    for cmd in ("confusion", "locality"):
        extra = ("--fold-local",) if cmd == "locality" else ()
        _run(attnscope_bin, cmd, "--dump", tmp_path / "d.h5", "--out", tmp_path / cmd, *extra)
    loc = json.loads((tmp_path / "locality" / "locality.json").read_text())
    assert "heads 1.." in json.dumps(loc["parameters"]["layer_geometry"])
    assert (tmp_path / "locality" / "locality_folded.csv").exists()


def test_cswin_branches_of_unknown_kinds_are_refused_never_softmax(tmp_path):
    """A CSwin block whose branches are neither InLine's nor CSwin's LePE attention is refused by
    name; families= is refused for stripe blocks (their family is their branches')."""
    torch.manual_seed(2)
    model = CSwinModel(attn_type="IS").eval()
    with pytest.raises(ValueError, match="families= is not taken for CSwin's stripe blocks"):
        dump_model(model, image_loader(2, size=32), str(tmp_path / "f.h5"), families="softmax")
    for a in model.stage1[0].attns:
        a.residual = nn.Identity()  # a `residual` that makes no kernels: no known branch
    with pytest.raises(ValueError, match=r"layer 0: a CSwin block whose stripe branches are "
                                         r"\['InLineStripeAttention', 'InLineStripeAttention'\]"):
        dump_model(model, image_loader(2, size=32), str(tmp_path / "d.h5"))
    assert not (tmp_path / "d.h5").exists() and not (tmp_path / "f.h5").exists()


@pytest.mark.parametrize("edit,expected", [
    (lambda g: g.attrs.__setitem__("second_heads_from", 2), "second_heads_from"),
    (lambda g: g.attrs.__setitem__("second_window_width", 3), "second_window_height"),
    (lambda g: g.__delitem__("second_token_positions"), "second_token_positions"),
])
def test_a_damaged_second_stripe_shape_is_named_in_one_line(tmp_path, attnscope_bin, edit,
                                                            expected):
    torch.manual_seed(2)
    _dump(CSwinModel(attn_type="IS").eval(), tmp_path / "d.h5")
    with h5py.File(tmp_path / "d.h5", "r+") as f:
        edit(f["layers/0"])
    r = _run(attnscope_bin, "recompute", "--dump", tmp_path / "d.h5", "--out", tmp_path / "r",
             ok=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "/layers/0" in lines[0] and expected in lines[0], r.stderr
