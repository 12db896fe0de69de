"""The timm and Hugging Face paths, on stand-in modules with the libraries' structure and names
(tests/standins.py, tests/standins_hf_current.py; neither library is installable here)."""
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from conftest import image_loader
import standins_hf_current as hf_current
import standins_hf_v5 as hf_v5
from standins import TimmVisionTransformer, ViTForImageClassification, ViTModel, hf_config


def _timm_reference(model, x):
    """q, k (after q_norm/k_norm, unscaled), v, weights, per-head output of every block."""
    h = model.patch_embed(x)
    h = torch.cat([model.cls_token.expand(len(x), -1, -1), h], dim=1) + model.pos_embed
    out = []
    for blk in model.blocks:
        a = blk.attn
        b, n, c = h.shape
        qkv = a.qkv(blk.norm1(h)).reshape(b, n, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = a.q_norm(qkv[0]), a.k_norm(qkv[1]), qkv[2]
        w = torch.softmax(a.scale * q @ k.transpose(-2, -1), dim=-1)
        out.append(dict(q=q, k=k, v=v, attn=w, out=w @ v))
        h = blk(h)
    return out


def _check(path, ref, label):
    with h5py.File(path) as f:
        for layer, tensors in enumerate(ref):
            for name, want in tensors.items():
                err = np.abs(f[f"layers/{layer}/{name}"][()] - want.numpy()).max()
                assert err < 1e-5, f"{label} layer {layer} {name}: worst |dump - model| {err}"


@pytest.mark.parametrize("qk_norm,scale_norm", [(False, False), (True, True)])
def test_timm_vit(tmp_path, qk_norm, scale_norm):
    torch.manual_seed(0)
    model = TimmVisionTransformer(qk_norm=qk_norm, scale_norm=scale_norm).eval()
    assert all(b.attn.fused_attn for b in model.blocks)
    batches = image_loader(6, batch=4)
    path = tmp_path / "timm.h5"
    dump_model(model, batches, str(path), dtype="float32", with_attn=True, model_name="timm")
    assert all(b.attn.fused_attn for b in model.blocks), "fused_attn not restored"
    x = torch.cat([b[0] for b in batches])
    with torch.no_grad():
        _check(path, _timm_reference(model, x), f"timm qk_norm={qk_norm}")
    with h5py.File(path) as f:
        assert f.attrs["attention_family"] == "softmax" and f.attrs["feature_map"] == "none"
        assert f.attrs["scale"] == pytest.approx(8 ** -0.5)
        assert (f.attrs["grid_height"], f.attrs["prefix_tokens"], f.attrs["num_tokens"]) == (4, 1, 17)


def test_timm_without_qk_norm_attributes(tmp_path):
    """Older timm Attention has no q_norm/k_norm: q and k come straight from qkv."""
    torch.manual_seed(1)
    model = TimmVisionTransformer(depth=1).eval()
    for b in model.blocks:
        del b.attn.q_norm, b.attn.k_norm
        b.attn.q_norm = b.attn.k_norm = (lambda t: t)  # plain functions, not modules
    batches = image_loader(3)
    path = tmp_path / "old.h5"
    dump_model(model, batches, str(path), dtype="float32")
    with torch.no_grad():
        _check(path, [{n: t for n, t in r.items() if n in ("q", "k", "v", "out")}
                      for r in _timm_reference(model, batches[0][0])], "timm (no q_norm)")


def _hf_reference(vit, x):
    h = vit.embeddings(x)
    out = []
    for layer in vit.encoder.layer:
        sa = layer.attention.attention
        hb = layer.layernorm_before(h)
        q, k, v = (sa.transpose_for_scores(m(hb)) for m in (sa.query, sa.key, sa.value))
        w = torch.softmax(q @ k.transpose(-2, -1) / sa.attention_head_size ** 0.5, dim=-1)
        out.append(dict(q=q, k=k, v=v, attn=w, out=w @ v))
        h = layer(h)
    return out


@pytest.mark.parametrize("cls", [ViTModel, ViTForImageClassification])
def test_hf_vit(tmp_path, cls):
    torch.manual_seed(2)
    model = cls(hf_config()).eval()
    batches = [{"pixel_values": b[0], "labels": b[1]} for b in image_loader(5, batch=2)]
    path = tmp_path / "hf.h5"
    dump_model(model, batches, str(path), dtype="float32", with_attn=True, convention="paper")
    vit = getattr(model, "vit", model)
    x = torch.cat([b["pixel_values"] for b in batches])
    with torch.no_grad():
        _check(path, _hf_reference(vit, x), cls.__name__)
    with h5py.File(path) as f:
        assert f.attrs["num_tokens"] == 17 and f.attrs["num_heads"] == 2
        assert f["labels"].shape == (5,)
        assert ("logits" in f) == (cls is ViTForImageClassification)


# --- the current Hugging Face structure (standins_hf_current.py): SDPA by default, eager attention
# as a function with functional dropout, ViTSelfAttention returning (context, weights).

def _hf_current_reference(vit, x):
    h = vit.embeddings(x)
    out = []
    for layer in vit.encoder.layer:
        sa = layer.attention.attention
        hb = layer.layernorm_before(h)
        q, k, v = (m(hb).view(len(x), -1, sa.num_attention_heads, sa.attention_head_size)
                   .transpose(1, 2) for m in (sa.query, sa.key, sa.value))
        w = torch.softmax(q @ k.transpose(-2, -1) * sa.scaling, dim=-1)
        out.append(dict(q=q, k=k, v=v, attn=w, out=w @ v))
        h = layer(h)
    return out


@pytest.mark.parametrize("cls", [hf_current.ViTModel, hf_current.ViTForImageClassification])
def test_hf_vit_current_weights(tmp_path, cls):
    torch.manual_seed(3)
    model = cls(hf_current.hf_config()).eval()
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model.vit if hasattr(model, "vit") else model, "dropout")
    batches = [{"pixel_values": b[0], "labels": b[1]} for b in image_loader(5, batch=2)]
    path = tmp_path / "hf.h5"
    dump_model(model, batches, str(path), dtype="float32", with_attn=True)
    assert model.config._attn_implementation == "sdpa", "attention implementation not restored"
    vit = getattr(model, "vit", model)
    x = torch.cat([b["pixel_values"] for b in batches])
    with torch.no_grad():
        _check(path, _hf_current_reference(vit, x), f"current {cls.__name__}")
        model.config._attn_implementation = "eager"  # the library's own weights, via its outputs
        own = model(x, output_attentions=True).attentions
        model.config._attn_implementation = "sdpa"
    with h5py.File(path) as f:
        for layer, w in enumerate(own):
            err = np.abs(f[f"layers/{layer}/attn"][()] - w.numpy()).max()
            assert err < 1e-6, f"current {cls.__name__} layer {layer}: dump vs outputs.attentions {err}"
        assert ("logits" in f) == (cls is hf_current.ViTForImageClassification)


def test_hf_vit_current_without_weights_keeps_sdpa(tmp_path, monkeypatch):
    """q, k, v and out need no weights: the model keeps its SDPA path."""
    torch.manual_seed(4)
    model = hf_current.ViTForImageClassification(hf_current.hf_config()).eval()
    calls = []
    sdpa = hf_current.ATTENTION_FUNCTIONS["sdpa"]
    monkeypatch.setitem(hf_current.ATTENTION_FUNCTIONS, "sdpa",
                        lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    batches = image_loader(3)
    dump_model(model, batches, str(tmp_path / "d.h5"), dtype="float32", with_out=True)
    assert len(calls) == 2, f"SDPA called {len(calls)} times, expected once per layer"
    with torch.no_grad():
        ref = _hf_current_reference(model.vit, batches[0][0])
    _check(tmp_path / "d.h5", [{n: t for n, t in r.items() if n != "attn"} for r in ref],
           "current HF (sdpa)")


def test_hf_vit_config_that_refuses_eager(tmp_path):
    """A config whose attention implementation cannot be switched: a plain error that says what
    to do, and nothing written."""
    class FixedConfig(SimpleNamespace):
        @property
        def _attn_implementation(self):
            return "sdpa"

    torch.manual_seed(5)
    cfg = FixedConfig(**vars(hf_current.hf_config()))
    model = hf_current.ViTModel(cfg).eval()
    with pytest.raises(ValueError, match='attn_implementation="eager"'):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"), with_attn=True)
    assert not (tmp_path / "d.h5").exists()


def test_hf_vit_without_weights_names_the_fix(tmp_path, monkeypatch):
    """An attention that returns no weights even on the eager path (here: eager replaced by a
    kernel): the error says what was missing and how to load the model instead."""
    torch.manual_seed(6)
    model = hf_current.ViTModel(hf_current.hf_config()).eval()
    monkeypatch.setattr(hf_current, "eager_attention_forward", hf_current.sdpa_attention_forward)
    with pytest.raises(ValueError, match=r"no 'attn' was captured .*attn_implementation=\"eager\""):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"), with_attn=True)
    assert not (tmp_path / "d.h5").exists()
    assert model.config._attn_implementation == "sdpa"


# --- the transformers 5 structure (standins_hf_v5.py): model.layers, one attention module with
# q_proj, k_proj, v_proj and its own o_proj.

def test_hf_vit_v5_structure(tmp_path):
    torch.manual_seed(6)
    model = hf_v5.ViTModel(hf_v5.hf_config()).eval()
    batches = image_loader(4, batch=2)
    path = tmp_path / "v5.h5"
    dump_model(model, batches, str(path), dtype="float32", with_attn=True, with_out=True)
    assert model.config._attn_implementation == "sdpa", "attention implementation not restored"
    x = torch.cat([b[0] for b in batches])
    ref, h = [], model.embeddings(x)
    with torch.no_grad():
        for layer in model.layers:
            a = layer.attention
            hb = layer.layernorm_before(h)
            q, k, v = (m(hb).view(len(x), -1, a.num_heads, a.head_dim).transpose(1, 2)
                       for m in (a.q_proj, a.k_proj, a.v_proj))
            w = torch.softmax(q @ k.transpose(-2, -1) * a.scaling, dim=-1)
            ref.append(dict(q=q, k=k, v=v, attn=w, out=w @ v))  # out: o_proj's input, per head
            h = layer(h)
        _check(path, ref, "transformers 5 ViTModel")
        model.config._attn_implementation = "eager"
        own = model(x, output_attentions=True).attentions
        model.config._attn_implementation = "sdpa"
    with h5py.File(path) as f:
        assert f.attrs["num_heads"] == model.config.num_attention_heads
        for layer, w in enumerate(own):
            err = np.abs(f[f"layers/{layer}/attn"][()] - w.numpy()).max()
            assert err < 1e-6, f"transformers 5 layer {layer}: dump vs outputs.attentions {err}"
