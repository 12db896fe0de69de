"""Training smoke test, weights round trip, and the IDX reader."""
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnscope_dump import data, dump_model
from attnscope_dump.attention import FEATURE_MAPS
from attnscope_dump.weights_io import load_weights, model_name, save_weights
from conftest import MODEL_VARIANT_IDS, MODEL_VARIANTS, PYTHON_DIR, image_loader, tiny_vit


def _write_idx(path, arr):
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


@pytest.fixture
def fake_fmnist(tmp_path):
    """A 40-image stand-in for the four Fashion-MNIST files, in the same IDX format."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 32), ("t10k", 8)):
        _write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    return tmp_path


def test_idx_reader(fake_fmnist):
    x, y = data.load_split("train", root=str(fake_fmnist))
    assert x.shape == (32, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    raw = data.read_idx(str(fake_fmnist / "train-images-idx3-ubyte.gz"))
    np.testing.assert_allclose(x[:, 0].numpy(), (raw / 255.0 - data.MEAN) / data.STD, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        data.load_split("test", root=str(fake_fmnist / "missing"))


def test_idx_reader_rejects_truncated_file(tmp_path):
    p = tmp_path / "bad.gz"
    with gzip.open(p, "wb") as f:
        f.write(struct.pack(">HBBI", 0, 8, 1, 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="header says"):
        data.read_idx(str(p))


@pytest.mark.skipif(not os.path.exists(os.path.join(data.DEFAULT_ROOT, "t10k-labels-idx1-ubyte.gz")),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist_test_split():
    x, y = data.load_split("test", limit=100)
    assert x.shape == (100, 1, 28, 28) and set(y.tolist()) <= set(range(10))


def test_one_step_training_smoke(tmp_path, fake_fmnist):
    out = tmp_path / "models"
    cmd = [sys.executable, os.path.join(PYTHON_DIR, "train.py"), "--family", "inline",
           "--epochs", "1", "--batch-size", "32", "--embed-dim", "16", "--depth", "1",
           "--threads", "1", "--out", str(out), "--data-root", str(fake_fmnist), "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rec = json.loads((out / "vit7-inline-fmnist.json").read_text())
    assert rec["steps"] == 1 and rec["test_images"] == 8 and 0.0 <= rec["test_accuracy"] <= 1.0
    model = load_weights(str(out / "vit7-inline-fmnist.h5"))
    assert model.config.family == "inline" and model.config.depth == 1
    x, _ = data.load_split("test", root=str(fake_fmnist))
    acc = (model(x).argmax(1) == data.load_split("test", root=str(fake_fmnist))[1]).float().mean()
    assert acc.item() == pytest.approx(rec["test_accuracy"])
    # The commit of the training code (this checkout's, when it is one).
    head = subprocess.run(["git", "-C", PYTHON_DIR, "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode == 0:
        assert rec["code_commit"].split("+")[0] == head.stdout.strip()
    else:
        assert rec["code_commit"] is None


@pytest.mark.parametrize("family,fmap", MODEL_VARIANTS, ids=MODEL_VARIANT_IDS)
def test_weights_round_trip(tmp_path, family, fmap):
    model = tiny_vit(family, seed=3, image_size=28, feature_map=fmap)
    path = tmp_path / "w.h5"
    save_weights(model, str(path), extra={"test_accuracy": 0.5})
    back = load_weights(str(path))
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), back(x)), f"{family}:{fmap}: reloaded model differs"
    assert back.blocks[0].attn.feature_map == (fmap or FEATURE_MAPS[family])
    assert os.listdir(tmp_path) == ["w.h5"]


@pytest.mark.parametrize("family,fmap", MODEL_VARIANTS, ids=MODEL_VARIANT_IDS)
def test_every_family_trains_a_step_and_dumps(tmp_path, family, fmap):
    """A tiny model of each family: finite loss and gradients, a step that changes the weights,
    and a dump that names the family and map as the C++ reads them."""
    import h5py
    model = tiny_vit(family, seed=8, feature_map=fmap).train()
    x, y = image_loader(8)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.blocks[0].attn.qkv.weight.detach().clone()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads), \
        f"{family}:{fmap}: non-finite loss or gradient"
    opt.step()
    assert not torch.equal(before, model.blocks[0].attn.qkv.weight), f"{family}:{fmap}: no step"
    path = tmp_path / "d.h5"
    dump_model(model.eval(), [(x, y)], str(path), dtype="float32")
    with h5py.File(path) as f:
        assert f.attrs["attention_family"] == family
        assert f.attrs["feature_map"] == (fmap or FEATURE_MAPS[family])
        assert np.isfinite(f["layers/1/out"][()]).all()


def test_model_names_name_a_map_other_than_the_familys_own():
    from attnscope_dump.models import ViTConfig
    assert model_name(ViTConfig(family="linear")) == "vit7-linear-fmnist"
    assert model_name(ViTConfig(family="linear", feature_map="relu")) == "vit7-linear-fmnist"
    assert model_name(ViTConfig(family="linear", feature_map="focused")) == \
        "vit7-linear-focused=3-fmnist"
    with pytest.raises(ValueError, match="takes no feature map"):
        tiny_vit("softmax", feature_map="relu")


def test_load_weights_names_missing_dataset(tmp_path):
    import h5py
    path = tmp_path / "w.h5"
    save_weights(tiny_vit("softmax", image_size=28), str(path))
    with h5py.File(path, "a") as f:
        del f["head/bias"]
    with pytest.raises(ValueError, match="'/head/bias' missing"):
        load_weights(str(path))


def test_make_dumps_cli(tmp_path, fake_fmnist):
    import h5py
    weights = tmp_path / "vit7-mala-fmnist.h5"
    save_weights(tiny_vit("mala", seed=6, image_size=28), str(weights))
    out = tmp_path / "dumps"
    r = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "make_dumps.py"), "--models",
                        str(weights), "--out", str(out), "--images", "5", "--batch-size", "2",
                        "--threads", "1", "--data-root", str(fake_fmnist)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with h5py.File(out / "vit7-mala-fmnist.h5") as f:
        assert f.attrs["model_name"] == "vit7-mala-fmnist"
        assert f.attrs["attention_family"] == "mala" and f.attrs["feature_map"] == "elu1"
        assert f["layers/1/out"].shape == (5, 2, 50, 8) and f["layers/1/q"].dtype == np.float16
        assert f["images"].shape == (5, 1, 28, 28) and f["labels"].shape == (5,)


# --- the DeiT-T-shaped models (python/train.py --preset deit-t, scripts/train-deit-t.sh) ---

SCRIPT = os.path.join(os.path.dirname(PYTHON_DIR), "scripts", "train-deit-t.sh")
TINY = ["--embed-dim", "16", "--depth", "1", "--heads", "2", "--batch-size", "16",
        "--threads", "1", "--quiet"]


def _run_script(model, out, fake_fmnist, *extra, env=None):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), **(env or {}))
    return subprocess.run([SCRIPT, model, *TINY, "--data-root", str(fake_fmnist), *extra],
                          capture_output=True, text=True, timeout=300, env=env)


def test_presets():
    from train import parse_args
    deit = parse_args(["--preset", "deit-t", "--family", "mala"])
    assert (deit.patch_size, deit.embed_dim, deit.depth, deit.heads, deit.mlp_ratio) == \
        (2, 192, 6, 3, 4.0)
    assert (deit.crop_pad, deit.hflip, deit.label_smoothing, deit.weights_dtype) == \
        (2, True, 0.1, "float16")
    assert parse_args(["--preset", "deit-t", "--family", "mala", "--depth", "2",
                       "--no-hflip"]).depth == 2
    # The default preset is the one the committed 7x7 models were trained with.
    with open(os.path.join(os.path.dirname(PYTHON_DIR), "data", "models",
                           "vit7-softmax-fmnist.json")) as f:
        rec = json.load(f)
    v7 = parse_args(["--family", "softmax"])
    assert (v7.patch_size, v7.embed_dim, v7.depth, v7.heads, v7.mlp_ratio) == tuple(
        rec["config"][k] for k in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio"))
    assert (v7.batch_size, v7.lr, v7.weight_decay) == (rec["batch_size"], rec["lr"],
                                                       rec["weight_decay"])
    assert (v7.crop_pad, v7.hflip, v7.grad_clip, v7.weights_dtype) == (0, False, None, "float32")


def test_augment_crops_a_window_of_the_padded_image_and_flips():
    from train import augment
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 1, 28, 28, generator=g)
    y = augment(x, 2, True, torch.Generator().manual_seed(5))
    assert torch.equal(y, augment(x, 2, True, torch.Generator().manual_seed(5))), "not seeded"
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), value=-data.MEAN / data.STD)
    seen = set()
    for i in range(len(x)):
        hits = [(dy, dx, flip) for dy in range(5) for dx in range(5) for flip in (False, True)
                if torch.equal(y[i], (lambda w: w.flip(-1) if flip else w)(
                    padded[i, :, dy:dy + 28, dx:dx + 28]))]
        assert hits, f"image {i} is no flipped or unflipped 28x28 window of the padded image"
        seen.update(hits)
    assert len({h[2] for h in seen}) == 2 and len({h[:2] for h in seen}) > 5, seen
    assert torch.equal(augment(x, 0, False, g), x)


def test_deit_t_script_trains_a_tiny_local_residual_model(tmp_path, fake_fmnist):
    """Two steps of a tiny configuration with the deit-t recipe (patch 2: 197 tokens), then the
    dump of its float16 weights."""
    import h5py
    out = tmp_path / "models"
    r = _run_script("inline-localres", out, fake_fmnist, "--epochs", "1")
    assert r.returncode == 0, r.stderr
    rec = json.loads((out / "vit14-inline-localres-fmnist.json").read_text())
    assert rec["steps"] == 2 and rec["test_images"] == 8 and rec["preset"] == "deit-t"
    assert rec["local_residual"] and rec["config"]["local_residual"]
    assert (rec["crop_pad"], rec["hflip"], rec["amp"], rec["weights_dtype"]) == \
        (2, True, "off" if rec["device"] == "cpu" else "bf16", "float16")
    path = out / "vit14-inline-localres-fmnist.h5"
    with h5py.File(path) as f:
        assert f["blocks/0/attn/qkv/weight"].dtype == np.float16
        assert f["blocks/0/attn/local_residual/conv2/weight"].shape == (144, 8, 1)
    model = load_weights(str(path))
    x, y = data.load_split("test", root=str(fake_fmnist))
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    assert acc == pytest.approx(rec["test_accuracy"]), "accuracy is not that of the stored weights"
    dumps = tmp_path / "dumps"
    r = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "make_dumps.py"), "--models",
                        str(path), "--out", str(dumps), "--images", "3", "--threads", "1",
                        "--data-root", str(fake_fmnist)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    with h5py.File(dumps / "vit14-inline-localres-fmnist.h5") as f:
        assert f["layers/0/out"].shape == (3, 2, 197, 8)


def test_deit_t_script_same_seed_same_model(tmp_path, fake_fmnist):
    """Same recipe and seed: two runs give the same weights (on the CPU, one thread)."""
    import h5py
    for run in ("a", "b"):
        r = _run_script("softmax", tmp_path / run, fake_fmnist, "--epochs", "1")
        assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "a" / "vit14-softmax-fmnist.h5") as a, \
            h5py.File(tmp_path / "b" / "vit14-softmax-fmnist.h5") as b:
        for name in ("blocks/0/attn/qkv/weight", "head/weight", "pos_embed"):
            assert np.array_equal(a[name][()], b[name][()]), name


def test_deit_t_script_refuses_an_unknown_model(tmp_path, fake_fmnist):
    r = _run_script("cosformer", tmp_path, fake_fmnist)
    assert r.returncode == 2 and "usage" in r.stderr


def test_time_budget_stops_and_writes_nothing(tmp_path, fake_fmnist):
    out = tmp_path / "models"
    r = _run_script("linear", out, fake_fmnist, "--epochs", "1", env={"TIME_BUDGET": "1e-6"})
    assert r.returncode == 3, r.stderr
    assert "--time-budget" in r.stderr and "nothing written" in r.stderr
    assert not out.exists() or not os.listdir(out)


def test_make_dumps_names_a_missing_weights_file(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "make_dumps.py"), "--models",
                        str(tmp_path / "vit14-mala-fmnist.h5"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "vit14-mala-fmnist.h5: no such weights file" in r.stderr


def test_without_h5py_a_checkpoint_that_exports_to_the_same_weights(tmp_path, fake_fmnist):
    """Where h5py is missing (a GPU machine may lack it) train.py writes NAME.pt and the JSON;
    export_weights.py then writes the NAME.h5 that train.py writes where h5py is present."""
    import h5py
    argv = ["train.py", "--preset", "deit-t", "--family", "mala", "--epochs", "1", *TINY,
            "--data-root", str(fake_fmnist), "--out", str(tmp_path / "no-h5py")]
    code = ("import runpy, sys; sys.modules['h5py'] = None; "
            f"sys.argv = {argv!r}; runpy.run_path({os.path.join(PYTHON_DIR, 'train.py')!r}, "
            "run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "h5py is missing" in r.stderr
    assert sorted(os.listdir(tmp_path / "no-h5py")) == ["vit14-mala-fmnist.json",
                                                       "vit14-mala-fmnist.pt"]
    r = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "export_weights.py"),
                        str(tmp_path / "no-h5py" / "vit14-mala-fmnist.pt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = _run_script("mala", tmp_path / "h5py", fake_fmnist, "--epochs", "1")
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "no-h5py" / "vit14-mala-fmnist.h5") as a, \
            h5py.File(tmp_path / "h5py" / "vit14-mala-fmnist.h5") as b:
        names = {}
        for f in (a, b):
            names[f] = []
            f.visititems(lambda n, o: names[f].append(n) if isinstance(o, h5py.Dataset) else None)
        assert sorted(names[a]) == sorted(names[b]) and len(names[b]) == 20, names
        for n in names[b]:
            assert a[n].dtype == b[n].dtype == np.float16 and np.array_equal(a[n][()], b[n][()]), n
        for key in ("test_accuracy", "seed", "config_json", "local_residual", "weights_dtype"):
            assert a.attrs[key] == b.attrs[key], key


def test_export_weights_refuses_other_files(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"state_dict": {}}, path)
    r = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "export_weights.py"), str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not a checkpoint written by train.py" in r.stderr
