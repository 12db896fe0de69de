"""The dumper on the real timm and Hugging Face classes, where those libraries can be imported
(Debian packages neither, so these skip here and say why). Each model is built with random
weights (no download), a few images are dumped, and `attnscope info` and `attnscope recompute`
must accept the dump: the outputs recomputed from the dumped q, k, v with the dump's own
attributes equal the model's own."""
import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from cli_check import info_and_recompute
from conftest import image_loader

TOL = 1e-4  # float32 dumps: recompute's default tolerance


def _dump_and_check(model, tmp_path, attnscope_bin, size, prefix, grid, **kw):
    model = model.eval()
    batches = image_loader(3, size=size, channels=3, batch=2)
    path = tmp_path / "d.h5"
    s = dump_model(model, batches, str(path), dtype="float32", with_attn=True, **kw)
    assert s.images == 3
    with h5py.File(path) as f:
        at = dict(f.attrs)
        assert (at["prefix_tokens"], at["grid_height"], at["grid_width"]) == (prefix, grid, grid)
        assert at["num_tokens"] == prefix + grid * grid
        assert (at["attention_family"], at["feature_map"]) == ("softmax", "none")
    info, csv = info_and_recompute(attnscope_bin, path, tmp_path / "r", TOL)
    assert f"{prefix} prefix + {grid}x{grid} grid" in info, info
    attn_err = np.asarray(csv["attn_max_abs_error"], dtype=float)
    assert attn_err.size and attn_err.max() < TOL, f"weights: worst error {attn_err.max()}"
    return path, batches


# ----------------------------------------------------------------------------- timm
def _timm():
    return pytest.importorskip("timm", reason="timm is not installed (Debian does not package it)")


def test_timm_deit_tiny(tmp_path, attnscope_bin):
    timm = _timm()
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=10)
    fused = [b.attn.fused_attn for b in model.blocks]
    path, _ = _dump_and_check(model, tmp_path, attnscope_bin, 224, 1, 14, layers=[0, 5, 11])
    assert [b.attn.fused_attn for b in model.blocks] == fused, "fused_attn not restored"
    with h5py.File(path) as f:
        assert list(f.attrs["source_layers"]) == [0, 5, 11]
        assert (f.attrs["num_heads"], f.attrs["head_dim"]) == (3, 64)


def test_timm_deit_tiny_distilled(tmp_path, attnscope_bin):
    """Two prefix tokens: class and distillation."""
    timm = _timm()
    torch.manual_seed(1)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, num_classes=10)
    assert model.num_prefix_tokens == 2
    _dump_and_check(model, tmp_path, attnscope_bin, 224, 2, 14, layers=[0, 11])


@pytest.mark.parametrize("class_token,prefix", [(True, 5), (False, 4)])
def test_timm_register_tokens(tmp_path, attnscope_bin, class_token, prefix):
    """Four register tokens (with and without a class token, as vit_*_reg4_gap_* models)."""
    _timm()
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(2)
    model = VisionTransformer(img_size=32, patch_size=8, num_classes=5, embed_dim=32, depth=2,
                              num_heads=2, reg_tokens=4, class_token=class_token,
                              no_embed_class=not class_token,
                              global_pool="token" if class_token else "avg")
    assert model.num_prefix_tokens == prefix
    _dump_and_check(model, tmp_path, attnscope_bin, 32, prefix, 4)


def test_timm_qk_norm(tmp_path, attnscope_bin):
    """q and k normalised per head before the attention: dumped after q_norm / k_norm."""
    _timm()
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(3)
    model = VisionTransformer(img_size=32, patch_size=8, num_classes=5, embed_dim=32, depth=2,
                              num_heads=2, qk_norm=True)
    assert isinstance(model.blocks[0].attn.q_norm, torch.nn.LayerNorm)
    _dump_and_check(model, tmp_path, attnscope_bin, 32, 1, 4)


def test_timm_rope_model_is_refused(tmp_path):
    """EVA with rotary position embeddings (the structure of timm's vit_*_rope_* models)."""
    _timm()
    from timm.models.eva import Eva
    torch.manual_seed(4)
    model = Eva(img_size=32, patch_size=8, num_classes=5, embed_dim=32, depth=1, num_heads=2,
                use_rot_pos_emb=True).eval()
    with pytest.raises(ValueError, match="RoPE"):
        dump_model(model, image_loader(2, size=32, channels=3), str(tmp_path / "d.h5"))
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- Hugging Face
@pytest.mark.parametrize("head", [True, False])
def test_hf_vit(tmp_path, attnscope_bin, head):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (Debian does not package it)")
    torch.manual_seed(5)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 num_labels=5)
    cls = transformers.ViTForImageClassification if head else transformers.ViTModel
    model = cls(cfg).eval()
    impl = getattr(model.config, "_attn_implementation", None)
    path, batches = _dump_and_check(model, tmp_path, attnscope_bin, 32, 1, 4)
    assert getattr(model.config, "_attn_implementation", None) == impl, "implementation not restored"
    x = torch.cat([b[0] for b in batches])
    with torch.no_grad():  # the library's own weights, reported through its outputs
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("eager")
        else:
            model.config._attn_implementation = "eager"
        out = model(pixel_values=x, output_attentions=True)
    with h5py.File(path) as f:
        assert len(out.attentions) == 2
        for layer, w in enumerate(out.attentions):
            err = np.abs(f[f"layers/{layer}/attn"][()] - w.numpy()).max()
            assert err < 1e-6, f"HF layer {layer}: dump vs outputs.attentions {err}"
        if head:
            np.testing.assert_allclose(f["logits"][()], out.logits.numpy(), rtol=0, atol=1e-5)
