"""Models that rotate q and k (RoPE, timm's EVA and vit_*_rope_* shape, tests/standins.py): the
dumper reads q and k before the rotation, so it refuses them unless told otherwise."""
import warnings

import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from conftest import image_loader
from recompute import outputs
from standins import TimmEva


def _worst_out_error(path):
    with h5py.File(path) as f:
        worst = 0.0
        for layer in range(int(f.attrs["num_layers"])):
            for image in range(f["layers/0/q"].shape[0]):
                for head in range(int(f.attrs["num_heads"])):
                    want = f[f"layers/{layer}/out"][image, head].astype(np.float64)
                    err = np.abs(outputs(f, layer, image, head) - want).max() / np.abs(want).max()
                    worst = max(worst, err)
    return worst


def test_rope_model_is_refused(tmp_path):
    torch.manual_seed(0)
    model = TimmEva(rope=True).eval()
    with pytest.raises(ValueError, match=r"rotates q and k \(RoPE: rope\).*allow_rotary=True"):
        dump_model(model, image_loader(3), str(tmp_path / "d.h5"))
    assert list(tmp_path.iterdir()) == []
    assert all(b.attn.fused_attn for b in model.blocks)


def test_rope_model_with_override_warns_and_is_really_wrong(tmp_path):
    """allow_rotary=True writes the unrotated q and k, with a warning; the refusal is justified:
    the outputs recomputed from them do not give the model's own."""
    torch.manual_seed(0)
    model = TimmEva(rope=True).eval()
    path = tmp_path / "d.h5"
    with pytest.warns(UserWarning, match="RoPE"):
        dump_model(model, image_loader(3), str(path), dtype="float32", allow_rotary=True)
    assert _worst_out_error(path) > 1e-2


def test_same_model_without_rope_dumps_silently(tmp_path):
    """EVA without rotary embeddings (model.rope is None, attention still takes rope=): no
    rotation, no warning, and the dump reproduces the model's outputs."""
    torch.manual_seed(0)
    model = TimmEva(rope=False).eval()
    path = tmp_path / "d.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dump_model(model, image_loader(3), str(path), dtype="float32")
    assert _worst_out_error(path) < 1e-5


def test_rotary_tensor_held_by_the_attention(tmp_path):
    """A rotary table stored on the attention module itself is found too."""
    torch.manual_seed(0)
    model = TimmEva(rope=False).eval()
    model.blocks[1].attn.rope_freqs = torch.ones(4)
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.rope_freqs"):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"))


def test_differential_attention_is_refused(tmp_path):
    torch.manual_seed(0)
    model = TimmEva(rope=False).eval()
    model.blocks[0].attn.lambda_q1 = torch.nn.Parameter(torch.zeros(8))
    with pytest.raises(ValueError, match="differential attention"):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"))
