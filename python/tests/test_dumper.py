"""Dumper round trip on the project's own models: every stored tensor equals the one the model
computes (taken here by running the blocks by hand, not through the hooks)."""
import os

import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from attnscope_dump.attention import FEATURE_MAPS, attention_weights
from conftest import MODEL_VARIANT_IDS, MODEL_VARIANTS, image_loader, tiny_vit


def reference_tensors(model, x):
    """Per layer: q, k, v, attn, out [B, H, N, d] by running each block's pieces explicitly."""
    h = model.patch_embed(x)
    h = torch.cat([model.cls_token.expand(len(x), -1, -1), h], dim=1) + model.pos_embed
    layers = []
    for blk in model.blocks:
        a = blk.attn
        b, n, c = h.shape
        qkv = a.qkv(blk.norm1(h)).reshape(b, n, 3, a.num_heads, a.head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        w = attention_weights(a.attention_family, q, k, a.scale, a.feature_map)
        layers.append(dict(q=q, k=k, v=v, attn=w, out=w @ v))
        h = blk(h)
    return layers


@pytest.mark.parametrize("family,fmap", MODEL_VARIANTS, ids=MODEL_VARIANT_IDS)
def test_round_trip_float32(tmp_path, family, fmap):
    model = tiny_vit(family, seed=1, feature_map=fmap)
    batches = image_loader(12, batch=5)
    path = tmp_path / "d.h5"
    s = dump_model(model, batches, str(path), dtype="float32", with_attn=True, with_images=True,
                   model_name="tiny")
    assert s.images == 12 and s.layers == [0, 1]
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    with torch.no_grad():
        ref = reference_tensors(model, x)
        logits = model(x)
    with h5py.File(path) as f:
        at = dict(f.attrs)
        assert at["format"] == "attnscope-dump" and at["format_version"] == 1
        assert at["attention_family"] == family and at["convention"] == "code"
        assert at["feature_map"] == (fmap or FEATURE_MAPS[family])  # canonical: what C++ parses
        assert (at["num_layers"], at["num_heads"], at["head_dim"], at["num_tokens"]) == (2, 2, 8, 17)
        assert (at["grid_height"], at["grid_width"], at["prefix_tokens"]) == (4, 4, 1)
        assert at["scale"] == pytest.approx(8 ** -0.5, rel=1e-15)
        for layer, tensors in enumerate(ref):
            for name, want in tensors.items():
                ds = f[f"layers/{layer}/{name}"]
                assert ds.dtype == np.float32 and ds.chunks[0] == 1
                err = np.abs(ds[()] - want.numpy()).max()
                assert err < 1e-5, f"{family} layer {layer} {name}: worst |dump - model| {err}"
        np.testing.assert_array_equal(f["labels"][()], y.numpy())
        np.testing.assert_allclose(f["logits"][()], logits.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(f["images"][()], x.numpy())


def test_float16_and_selected_layers(tmp_path):
    model = tiny_vit("mala", seed=2, depth=3)
    batches = image_loader(7, batch=3)
    path = tmp_path / "d.h5"
    s = dump_model(model, batches, str(path), layers=[2, 0], dtype="float16", with_out=True,
                   with_labels=False, with_logits=False)
    assert s.layers == [2, 0]
    x = torch.cat([b[0] for b in batches])
    with torch.no_grad():
        ref = reference_tensors(model, x)
    with h5py.File(path) as f:
        assert f.attrs["num_layers"] == 2 and list(f.attrs["source_layers"]) == [2, 0]
        assert "labels" not in f and "logits" not in f and "images" not in f
        assert "attn" not in f["layers/0"]
        for slot, src in enumerate([2, 0]):
            for name in ("q", "k", "v", "out"):
                got = f[f"layers/{slot}/{name}"][()]
                assert got.dtype == np.float16
                want = ref[src][name].numpy()
                err = np.abs(got.astype(np.float64) - want).max()
                bound = 2.0 ** -11 * np.abs(want).max()  # half-precision rounding
                assert err <= bound, f"mala layer {src} {name} float16: error {err} > {bound}"


def test_max_images_and_bare_tensor_loader(tmp_path):
    model = tiny_vit("softmax")
    batches = [b[0] for b in image_loader(20, batch=6)]  # tensors only, no labels
    s = dump_model(model, batches, str(tmp_path / "d.h5"), max_images=9)
    assert s.images == 9
    with h5py.File(tmp_path / "d.h5") as f:
        assert f["layers/1/q"].shape == (9, 2, 17, 8)
        assert "labels" not in f and f["logits"].shape == (9, 5)


def test_failure_leaves_no_file_and_restores_model(tmp_path):
    model = tiny_vit("linear").train()
    hooks_before = sum(len(m._forward_hooks) for m in model.modules())

    def bad_loader():
        yield image_loader(4)[0]
        raise RuntimeError("loader broke")

    path = tmp_path / "d.h5"
    with pytest.raises(RuntimeError, match="loader broke"):
        dump_model(model, bad_loader(), str(path))
    assert os.listdir(tmp_path) == [], f"left behind: {os.listdir(tmp_path)}"
    assert model.training
    assert sum(len(m._forward_hooks) for m in model.modules()) == hooks_before


def test_rejects_bad_arguments(tmp_path):
    model = tiny_vit("inline")
    with pytest.raises(ValueError, match="layer 5 out of range"):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"), layers=[5])
    with pytest.raises(ValueError, match="float16 or float32"):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"), dtype="bfloat16")
    with pytest.raises(ValueError, match="no supported attention layers"):
        dump_model(torch.nn.Linear(2, 2), image_loader(2), str(tmp_path / "d.h5"))
    with pytest.raises(ValueError, match="no images"):
        dump_model(model, [], str(tmp_path / "d.h5"))


@pytest.mark.parametrize("layers, message", [([2, 0, 2], "name a layer twice"), ([], "layers is empty")])
def test_repeated_or_empty_layers_are_refused(tmp_path, layers, message):
    # The dump reader refuses a source_layers attribute that repeats a layer; refuse it here first.
    model = tiny_vit("softmax", seed=1, depth=3)
    path = tmp_path / "d.h5"
    with pytest.raises(ValueError, match=message):
        dump_model(model, image_loader(3, batch=3), str(path), layers=layers)
    assert not path.exists()
