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
