"""The local term's depthwise kernel in the dump (/layers/L/local_kernel, local_bias; dump-format.md
"The local term's kernel"): for every released structure whose local term is a depthwise
convolution of v's grid, the stored kernel (per image where the module makes it from the image,
per window with Swin's windows), padding and bias, convolved in float64 with the stored v, give
the stored `local`; a kernel turned the other way round (a true convolution) does not. Where the
conv's input is not v itself (FLatten PVT with spatial reduction), no kernel is stored."""
import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from conftest import image_loader, tiny_vit
from standins_released import (AgentDeiT, CSwinModel, FLattenPVT, InLineDeiT, MllaModel,
                               RopeStageModel, SwinModel)

CASES = {
    "inline_deit": (lambda: InLineDeiT(), 28, True),
    "inline_pvt": (lambda: FLattenPVT(attn_type="IS"), 32, True),
    "flatten_pvt": (lambda: FLattenPVT(attn_type="LS"), 32, False),
    "polaformer_pvt": (lambda: FLattenPVT(attn_type="PS"), 32, False),
    "agent_deit": (lambda: AgentDeiT(), 28, False),
    "inline_flatten_swin": (lambda: SwinModel(attn_type="IL", num_heads=(2, 2)), 32, None),
    "mlla": (lambda: MllaModel(), 16, False),
    "rala": (lambda: RopeStageModel("rala"), 16, False),
    "mala": (lambda: RopeStageModel("mala"), 16, False),
    "inline_cswin": (lambda: CSwinModel(attn_type="IS"), 32, None),
    "cswin_softmax_lepe": (lambda: CSwinModel(attn_type="SS"), 32, False),
    "inline_cswin_whole_map": (lambda: CSwinModel(attn_type="II", split_size=(2, 4)), 32, True),
    "project_localres": (lambda: tiny_vit("inline", seed=7, depth=2, dim=32, heads=2,
                                          image_size=28, local_residual=True), 28, True),
}


def _dump(make, size, path):
    torch.manual_seed(7)
    model = make().eval()  # default initialisation: random, not symmetric kernels and biases
    dump_model(model, image_loader(4, size=size, batch=2), str(path), dtype="float32")


def _geometry(f, layer):
    a = {**f.attrs, **f[f"layers/{layer}"].attrs}
    return {k: int(a.get(k, 0)) for k in ("grid_height", "grid_width", "prefix_tokens", "windows",
                                          "window_height", "window_width")}


def _conv(grid, kernel, ph, pw):
    """Cross-correlation with zero padding, as Conv2d: grid [..., gh, gw], kernel [..., kh, kw]."""
    gh, gw = grid.shape[-2:]
    kh, kw = kernel.shape[-2:]
    padded = np.zeros(grid.shape[:-2] + (gh + 2 * ph, gw + 2 * pw))
    padded[..., ph:ph + gh, pw:pw + gw] = grid
    out = np.zeros(grid.shape)
    for a in range(kh):
        for b in range(kw):
            out += kernel[..., a, b, None, None] * padded[..., a:a + gh, b:b + gw]
    return out


def _local_from_kernel(f, layer, flip=False):
    """`local` of the layer from its stored v, kernel, padding and bias, in float64."""
    g = f[f"layers/{layer}"]
    geo = _geometry(f, layer)
    v = g["v"][()].astype(np.float64)
    ds = g["local_kernel"]
    k = ds[()].astype(np.float64)
    if flip:
        k = k[..., ::-1, ::-1]
    ph, pw = int(ds.attrs["padding_height"]), int(ds.attrs["padding_width"])
    bias = g["local_bias"][()].astype(np.float64) if "local_bias" in g else None
    if geo["windows"]:  # per head: CSwin's second stripe shape has its own window grid
        i, h, nw, t, d = v.shape
        attrs = {**f.attrs, **g.attrs}
        split = int(attrs.get("second_heads_from", h))
        out = np.zeros(v.shape)
        for head in range(h):
            wh, ww = (geo["window_height"], geo["window_width"]) if head < split else \
                (int(attrs["second_window_height"]), int(attrs["second_window_width"]))
            grid = v[:, head].reshape(i, nw, wh, ww, d).transpose(0, 1, 4, 2, 3)  # [I, W, d, wh, ww]
            kern = k[:, head] if k.ndim == 6 else np.broadcast_to(k[head], (i, nw) + k.shape[1:])
            o = _conv(grid, kern, ph, pw)
            if bias is not None:
                o += bias[head][None, None, :, None, None]
            out[:, head] = o.transpose(0, 1, 3, 4, 2).reshape(i, nw, t, d)
        return out
    gh, gw, prefix = geo["grid_height"], geo["grid_width"], geo["prefix_tokens"]
    i, h, n, d = v.shape
    grid = v[:, :, prefix:].reshape(i, h, gh, gw, d).transpose(0, 1, 4, 2, 3)  # [I, H, d, gh, gw]
    kern = k if k.ndim == 5 else np.broadcast_to(k[None], (i,) + k.shape)
    out = _conv(grid, kern, ph, pw)
    if bias is not None:
        out += bias[None, :, :, None, None]
    full = np.zeros_like(v)
    full[:, :, prefix:] = out.transpose(0, 1, 3, 4, 2).reshape(i, h, gh * gw, d)
    return full


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_stored_kernel_gives_the_stored_local_term(tmp_path, name):
    make, size, per_image = CASES[name]
    path = tmp_path / "d.h5"
    _dump(make, size, path)
    with h5py.File(path) as f:
        layers = [int(L) for L in f["layers"] if "local" in f[f"layers/{L}"]]
        assert layers, "the stand-in has a local term"
        for layer in layers:
            g = f[f"layers/{layer}"]
            assert "local_kernel" in g, f"layer {layer}: no kernel"
            k = g["local_kernel"]
            assert k.dtype == np.float32
            images = g["v"].shape[0]
            if per_image is not None:
                assert (k.shape[0] == images and k.ndim >= 5) == per_image, (layer, k.shape)
            local = g["local"][()].astype(np.float64)
            scale = np.abs(local).max()
            assert scale > 0
            err = np.abs(_local_from_kernel(f, layer) - local).max() / scale
            assert err < 1e-5, f"{name} layer {layer}: worst {err:.3g}"
            # negative control: the kernel turned round (a true convolution) is not the module's
            wrong = np.abs(_local_from_kernel(f, layer, flip=True) - local).max() / scale
            assert wrong > 1e-2, f"{name} layer {layer}: a flipped kernel also matches ({wrong})"


def test_no_kernel_where_the_conv_does_not_filter_v_itself(tmp_path):
    """FLatten PVT with sr_ratio 2 filters v stretched back by interpolation: `local` is stored,
    its kernel is not (no map from the layer's keys)."""
    path = tmp_path / "d.h5"
    _dump(lambda: FLattenPVT(attn_type="LS", sr_ratios=(2, 2)), 32, path)
    with h5py.File(path) as f:
        g = f["layers/0"]
        assert "local" in g and "local_kernel" not in g and "local_bias" not in g


# ----------------------------------------------------------------------------- locality --fold-local
def _run(attnscope_bin, *args):
    import subprocess
    return subprocess.run([attnscope_bin, *map(str, args), "--threads", "1"], capture_output=True,
                          text=True, timeout=300)


def _csv(path):
    from attnscope_dump.figures import read_csv
    return read_csv(str(path))


def _taps_in_window(f, layer, head, window):
    """Per image and grid query of a layer without windows, the head's mean kernel's taps whose
    input cell is on the grid and in the query's window, summed; their mean over the queries."""
    geo = _geometry(f, layer)
    gh, gw = geo["grid_height"], geo["grid_width"]
    ds = f[f"layers/{layer}/local_kernel"]
    k = ds[()].astype(np.float64)
    ph, pw = int(ds.attrs["padding_height"]), int(ds.attrs["padding_width"])
    kernels = k[:, head] if k.ndim == 5 else np.broadcast_to(k[head], (f[f"layers/{layer}/v"].shape[0],) + k.shape[1:])
    sums = []
    for kern in kernels.mean(axis=1):  # the head's mean over its channels, per image
        for r in range(gh):
            for c in range(gw):
                s = 0.0
                for a in range(kern.shape[0]):
                    for b in range(kern.shape[1]):
                        sr, sc = r + a - ph, c + b - pw
                        if 0 <= sr < gh and 0 <= sc < gw and abs(sr - r) <= window // 2 \
                                and abs(sc - c) <= window // 2:
                            s += kern[a, b]
                sums.append(s)
    return float(np.mean(sums))


@pytest.mark.parametrize("name,window", [("inline_deit", 3), ("agent_deit", 1),
                                         ("flatten_pvt", 3), ("mlla", 3)])
def test_fold_local_adds_the_kernels_taps_in_the_window(tmp_path, attnscope_bin, name, window):
    """locality_folded.csv's mean = locality.csv's mean + the mean of the head's mean kernel's
    taps in each query's window (numpy from the stored kernel); --reference gives the same."""
    make, size, _ = CASES[name]
    path = tmp_path / "d.h5"
    _dump(make, size, path)
    with h5py.File(path) as f:
        layers = [int(L) for L in f["layers"] if "local_kernel" in f[f"layers/{L}"]
                  and not _geometry(f, int(L))["windows"]]
    sel = ",".join(map(str, layers))
    fast = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "fast",
                "--fold-local", "--window", window, "--layers", sel)
    assert fast.returncode == 0, fast.stdout + fast.stderr
    ref = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "ref",
               "--fold-local", "--window", window, "--layers", sel, "--reference")
    assert ref.returncode == 0, ref.stdout + ref.stderr
    plain, folded = _csv(tmp_path / "fast/locality.csv"), _csv(tmp_path / "fast/locality_folded.csv")
    folded_ref = _csv(tmp_path / "ref/locality_folded.csv")
    assert len(folded["layer"]) == len(plain["layer"]) > 0
    moved = 0.0
    with h5py.File(path) as f:
        for row in range(len(plain["layer"])):
            layer, head = int(folded["layer"][row]), int(folded["head"][row])
            assert (int(plain["layer"][row]), int(plain["head"][row])) == (layer, head)
            assert folded["queries"][row] == plain["queries"][row]
            assert folded_ref["queries"][row] == folded["queries"][row]
            want = float(plain["mean"][row]) + _taps_in_window(f, layer, head, window)
            got = float(folded["mean"][row])
            assert abs(got - want) < 1e-6 * max(1.0, abs(want)), (name, layer, head, got, want)
            assert abs(float(folded_ref["mean"][row]) - got) < 1e-6 * max(1.0, abs(got))
            moved = max(moved, abs(got - float(plain["mean"][row])))
    assert moved > 1e-3, "the kernel moved no mass: the fold did nothing"


def test_fold_local_refuses_layers_without_a_kernel_in_one_line(tmp_path, attnscope_bin):
    path = tmp_path / "d.h5"
    _dump(lambda: FLattenPVT(attn_type="LS", sr_ratios=(2, 2)), 32, path)
    r = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "o", "--fold-local")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "model layer 0" in lines[0] and "local_kernel" in lines[0] \
        and "layers with one: none" in lines[0], r.stderr
    assert not (tmp_path / "o" / "locality.json").exists()
    # an InLine-then-softmax hybrid: the softmax layer has no kernel, the error names the other
    path = tmp_path / "h.h5"
    _dump(lambda: InLineDeiT(depth=2, softmax_from=1), 28, path)
    r = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "h", "--fold-local")
    assert r.returncode != 0 and "model layer 1" in r.stderr and "--layers 0" in r.stderr, r.stderr
    ok = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "h", "--fold-local",
              "--layers", 0)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("fault,expected", [
    (lambda ds: ds.attrs.__setitem__("padding_height", 0), "padding"),
    (lambda ds: ds.attrs.__delitem__("padding_width"), "padding_width"),
])
def test_fold_local_names_a_damaged_kernel(tmp_path, attnscope_bin, fault, expected):
    path = tmp_path / "d.h5"
    _dump(CASES["inline_deit"][0], 28, path)
    with h5py.File(path, "r+") as f:
        fault(f["layers/0/local_kernel"])
    r = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "o", "--fold-local")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "/layers/0/local_kernel" in lines[0] and expected in lines[0], r.stderr
    assert not (tmp_path / "o" / "locality.csv").exists(), "refused before the run, not after"


def test_info_checks_the_kernels_as_fold_local_reads_them(tmp_path, attnscope_bin):
    """info validates the first image's kernel of each layer (its shape, padding, values), and
    with --check-values every image's; a NaN in image 2's kernel is seen only then, by both."""
    import subprocess

    def run(*args):  # info takes no --threads
        if args[0] != "info":
            return _run(attnscope_bin, *args)
        return subprocess.run([attnscope_bin, *map(str, args)], capture_output=True, text=True,
                              timeout=300)

    path = tmp_path / "d.h5"
    _dump(CASES["inline_deit"][0], 28, path)
    assert run("info", "--check-values", path).returncode == 0
    with h5py.File(path, "r+") as f:
        k = f["layers/0/local_kernel"]
        assert k.ndim == 5 and k.shape[0] == 4  # per image
        k[2, 0, 0, 0, 0] = np.nan
    assert run("info", path).returncode == 0
    for args in (("info", "--check-values", path),
                 ("locality", "--dump", path, "--out", tmp_path / "o", "--fold-local")):
        r = run(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert "/layers/0/local_kernel: expected finite values" in lines[0], r.stderr
    with h5py.File(path, "r+") as f:
        f["layers/0/local_kernel"].attrs["padding_height"] = 0
    r = run("info", path)
    assert r.returncode == 1 and "/layers/0/local_kernel" in r.stderr and "padding" in r.stderr, r.stderr
    assert r.stdout == "", "nothing printed for an invalid dump"


def test_fold_local_reads_each_files_kernels_and_merges_shards(tmp_path, attnscope_bin):
    """Per-image kernels of a dump written as two files, and a run split into --shard 0/2 and 1/2
    then merged, give locality_folded.csv byte for byte as one file and one run."""
    for i in range(2):
        torch.manual_seed(7)
        dump_model(InLineDeiT().eval(), image_loader(4, size=28, batch=2),
                   str(tmp_path / f"part{i}.h5"), dtype="float32", shard=i, num_shards=2)
    _dump(CASES["inline_deit"][0], 28, tmp_path / "one.h5")
    plain = _run(attnscope_bin, "locality", "--dump", tmp_path / "one.h5", "--out",
                 tmp_path / "plain", "--fold-local")
    files = _run(attnscope_bin, "locality", "--dump", tmp_path / "part0.h5", tmp_path / "part1.h5",
                 "--out", tmp_path / "files", "--fold-local")
    assert plain.returncode == 0 and files.returncode == 0, plain.stderr + files.stderr
    for s in range(2):
        r = _run(attnscope_bin, "locality", "--dump", tmp_path / "one.h5", "--out",
                 tmp_path / f"s{s}", "--fold-local", "--shard", f"{s}/2")
        assert r.returncode == 0, r.stderr
    import subprocess
    m = subprocess.run([attnscope_bin, "merge", tmp_path / "s0", tmp_path / "s1", "--out",
                        tmp_path / "merged"], capture_output=True, text=True, timeout=300)
    assert m.returncode == 0, m.stderr
    want = (tmp_path / "plain" / "locality_folded.csv").read_bytes()
    assert (tmp_path / "files" / "locality_folded.csv").read_bytes() == want
    assert (tmp_path / "merged" / "locality_folded.csv").read_bytes() == want
