"""torchvision's VisionTransformer (the real class, built small with random weights): attention in
encoder.layers[i].self_attention, an nn.MultiheadAttention whose block calls it with
need_weights=False."""
import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnscope_dump import dump_model
from cli_check import info_and_recompute
from conftest import image_loader

vision_transformer = pytest.importorskip(
    "torchvision.models.vision_transformer",
    reason="torchvision is not installed (scripts/install-deps.sh python installs python3-torchvision)")

DIM, HEADS = 32, 2


def _model(seed=0):
    torch.manual_seed(seed)
    m = vision_transformer.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                             num_heads=HEADS, hidden_dim=DIM, mlp_dim=64,
                                             num_classes=5)
    with torch.no_grad():  # torchvision starts with a zero class token and near-zero positions
        m.class_token.normal_()
        m.encoder.pos_embedding.normal_()
    return m.eval()


def _reference(model, x):
    """q, k, v (unscaled), weights and per-head output of every layer, computed by hand from the
    MHA's in_proj on ln_1's output; the weights are checked against the MHA's own."""
    h = model._process_input(x)
    h = torch.cat([model.class_token.expand(len(x), -1, -1), h], dim=1) + model.encoder.pos_embedding
    out = []
    for layer in model.encoder.layers:
        mha = layer.self_attention
        a = layer.ln_1(h)
        b, n, _ = a.shape
        q, k, v = (t.reshape(b, n, HEADS, DIM // HEADS).transpose(1, 2)
                   for t in F.linear(a, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1))
        w = torch.softmax(q @ k.transpose(-2, -1) / (DIM // HEADS) ** 0.5, dim=-1)
        _, own = mha(a, a, a, need_weights=True, average_attn_weights=False)
        assert (own - w).abs().max() < 1e-6, "reference disagrees with nn.MultiheadAttention"
        out.append(dict(q=q, k=k, v=v, attn=w, out=w @ v))
        h = layer(h)
    return out


def test_torchvision_vit(tmp_path, attnscope_bin):
    model = _model()
    batches = image_loader(5, size=32, channels=3, batch=3)
    path = tmp_path / "tv.h5"
    hooks_before = sum(len(m._forward_hooks) for m in model.modules())
    s = dump_model(model, batches, str(path), dtype="float32", with_attn=True, with_out=True)
    assert s.images == 5 and s.layers == [0, 1]
    assert all("forward" not in layer.self_attention.__dict__ for layer in model.encoder.layers), \
        "the MultiheadAttention forward was not restored"
    assert sum(len(m._forward_hooks) for m in model.modules()) == hooks_before
    x = torch.cat([b[0] for b in batches])
    with torch.no_grad():
        ref = _reference(model, x)
        logits = model(x)
    with h5py.File(path) as f:
        at = dict(f.attrs)
        assert (at["attention_family"], at["feature_map"]) == ("softmax", "none")
        assert at["scale"] == pytest.approx(16 ** -0.5, rel=1e-15)
        assert (at["num_heads"], at["head_dim"], at["num_tokens"]) == (2, 16, 17)
        assert (at["grid_height"], at["grid_width"], at["prefix_tokens"]) == (4, 4, 1)
        for layer, tensors in enumerate(ref):
            for name, want in tensors.items():
                err = np.abs(f[f"layers/{layer}/{name}"][()] - want.numpy()).max()
                assert err < 1e-5, f"torchvision layer {layer} {name}: worst |dump - model| {err}"
        np.testing.assert_allclose(f["logits"][()], logits.numpy(), rtol=0, atol=1e-6)
    info, csv = info_and_recompute(attnscope_bin, path, tmp_path / "r")
    assert "softmax@code" in info and "1 prefix + 4x4 grid" in info, info
    assert len(csv["layer"]) == 2 * HEADS


def test_torchvision_qkv_only_keeps_fast_path(tmp_path):
    """Without weights or outputs the MHA runs as the model calls it; q, k, v still captured."""
    model = _model(1)
    batches = image_loader(2, size=32, channels=3)
    dump_model(model, batches, str(tmp_path / "d.h5"), dtype="float32", with_out=False)
    with torch.no_grad():
        ref = _reference(model, batches[0][0])
    with h5py.File(tmp_path / "d.h5") as f:
        assert "out" not in f["layers/0"] and "attn" not in f["layers/0"]
        for layer, tensors in enumerate(ref):
            for name in ("q", "k", "v"):
                err = np.abs(f[f"layers/{layer}/{name}"][()] - tensors[name].numpy()).max()
                assert err < 1e-5, f"torchvision layer {layer} {name}: worst error {err}"


def test_torchvision_rejects_cross_attention_inputs(tmp_path):
    """An MHA called with key/value other than its query is not self-attention over the tokens."""
    model = _model(2)
    blk = model.encoder.layers[0]
    original = type(blk).forward

    def cross(self, inp):
        x = self.ln_1(inp)
        y, _ = self.self_attention(query=x, key=inp, value=inp, need_weights=False)
        return original(self, inp + 0 * y)

    blk.forward = cross.__get__(blk)
    with pytest.raises(ValueError, match="self-attention"):
        dump_model(model, image_loader(2, size=32, channels=3), str(tmp_path / "d.h5"))
    assert not (tmp_path / "d.h5").exists()
