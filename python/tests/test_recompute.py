"""The attention output recomputed from a dump's q, k, v equals the model's own output (the
dump's /layers/L/out, captured by the dumper), for every family.

Tolerances: float32 dumps of the tiny models, 1e-5 of the head's largest |out|. float16 dumps
(the committed data/dumps): q, k, v, out each carry a relative rounding of 2^-11, which the
attention amplifies by up to s|q||k| in the exponent (softmax) or by 1/denominator (linear),
so the bound is 5e-3 of the head's largest |out| at the worst element, and 5e-4 on average
(measured on the committed dumps: at most 8.3e-4 and 2.1e-4, data/README.md)."""
import glob
import os
import subprocess

import h5py
import numpy as np
import pytest

from attnscope_dump import dump_model
from attnscope_dump.attention import FAMILIES
from attnscope_dump.figures import read_csv
from conftest import REPO, image_loader, tiny_vit
from recompute import outputs

F16_WORST, F16_MEAN = 5e-3, 5e-4  # relative to the head's largest |out|
DATA_DUMPS = sorted(glob.glob(os.path.join(REPO, "data", "dumps", "*.h5")))


def _worst(f, images):
    """(worst relative error, mean relative error, where) over layers, images and heads."""
    worst, where, errs = 0.0, None, []
    for layer in range(int(f.attrs["num_layers"])):
        out = f[f"layers/{layer}/out"]
        for image in images:
            for head in range(int(f.attrs["num_heads"])):
                want = out[image, head].astype(np.float64)
                diff = np.abs(outputs(f, layer, image, head) - want) / np.abs(want).max()
                errs.append(diff.mean())
                if diff.max() > worst:
                    worst, where = diff.max(), (layer, image, head, np.unravel_index(
                        diff.argmax(), diff.shape))
    return worst, float(np.mean(errs)), where


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_float32(tmp_path, family):
    model = tiny_vit(family, seed=4, depth=2, dim=32, heads=2, image_size=28)
    path = tmp_path / "d.h5"
    dump_model(model, image_loader(6, size=28), str(path), dtype="float32")
    with h5py.File(path) as f:
        worst, _, where = _worst(f, range(6))
    assert worst < 1e-5, f"{family} float32 N=50 d=16: worst relative error {worst:.3g} at {where}"


@pytest.mark.skipif(not DATA_DUMPS, reason="no dumps in data/dumps (make data writes them)")
@pytest.mark.parametrize("path", DATA_DUMPS, ids=[os.path.basename(p) for p in DATA_DUMPS])
def test_committed_dumps_float16(path):
    with h5py.File(path) as f:
        n = f["layers/0/q"].shape[0]
        worst, mean, where = _worst(f, range(0, n, max(1, n // 16)))
        family = f.attrs["attention_family"]
    assert worst < F16_WORST, f"{family} ({os.path.basename(path)}): worst {worst:.3g} at {where}"
    assert mean < F16_MEAN, f"{family} ({os.path.basename(path)}): mean relative error {mean:.3g}"


# --- through the C++ library: `attnscope maps` recomputes each query's weights over the grid keys
# from the dumped q, k; the prefix (CLS) key's weight is 1 minus their sum (every family's rows sum
# to 1), and W V with the dumped v must give the model's own output.

def _maps_weights(attnscope_bin, dump, out_dir, images, n_tokens):
    tokens = ",".join(str(t) for t in range(n_tokens))
    r = subprocess.run([attnscope_bin, "maps", "--dump", str(dump), "--out", str(out_dir),
                        "--images", ",".join(map(str, images)), "--tokens", tokens,
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"attnscope maps on {dump}: {r.stderr}"
    c = read_csv(os.path.join(str(out_dir), "maps.csv"))
    return c


def _compare_cpp(attnscope_bin, dump, tmp_path, images):
    """(worst, mean relative error, rows skipped as degenerate) of C++ W times v against out."""
    with h5py.File(dump) as f:
        n, gw, prefix = (int(f.attrs[a]) for a in ("num_tokens", "grid_width", "prefix_tokens"))
        assert prefix == 1, "this check rebuilds one prefix weight from the row sum"
        c = _maps_weights(attnscope_bin, dump, tmp_path / "maps", images, n)
        keys = ["image", "layer", "head", "query"]
        rows = np.stack([c[k] for k in keys], axis=1).astype(int)
        key_idx = prefix + (c["row"] * gw + c["col"]).astype(int)
        W = {}
        for r, k, w in zip(map(tuple, rows), key_idx, c["weight"]):
            W.setdefault(r, np.zeros(n))[k] = w
        worst, errs, skipped = 0.0, [], 0
        for (image, layer, head, query), w in W.items():
            if not np.any(w[prefix:]):
                skipped += 1  # a zeroed (degenerate) row: its prefix weight is unknown here
                continue
            w[0] = 1.0 - w[prefix:].sum()
            v = f[f"layers/{layer}/v"][image, head].astype(np.float64)
            out = f[f"layers/{layer}/out"][image, head].astype(np.float64)
            diff = np.abs(w @ v - out[query]).max() / np.abs(out).max()
            errs.append(diff)
            worst = max(worst, diff)
    return worst, float(np.mean(errs)), skipped, len(W)


@pytest.mark.parametrize("family", FAMILIES)
def test_cpp_weights_give_model_output_float32(tmp_path, family, attnscope_bin):
    model = tiny_vit(family, seed=5, depth=2, dim=32, heads=2, image_size=28)
    dump = tmp_path / "d.h5"
    dump_model(model, image_loader(2, size=28), str(dump), dtype="float32")
    worst, mean, skipped, rows = _compare_cpp(attnscope_bin, dump, tmp_path, [0, 1])
    assert rows == 2 * 2 * 2 * 50 and skipped <= rows // 20, f"{family}: {skipped}/{rows} skipped"
    assert worst < 1e-5, f"{family} float32 N=50 d=16: worst relative error {worst:.3g}"


@pytest.mark.skipif(not DATA_DUMPS, reason="no dumps in data/dumps (make data writes them)")
@pytest.mark.parametrize("path", DATA_DUMPS, ids=[os.path.basename(p) for p in DATA_DUMPS])
def test_cpp_weights_give_model_output_committed(tmp_path, path, attnscope_bin):
    worst, mean, skipped, rows = _compare_cpp(attnscope_bin, path, tmp_path, [0, 1])
    name = os.path.basename(path)
    assert skipped <= rows // 20, f"{name}: {skipped}/{rows} rows skipped as degenerate"
    assert worst < F16_WORST and mean < F16_MEAN, f"{name}: worst {worst:.3g}, mean {mean:.3g}"
