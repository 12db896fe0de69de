"""InLine's local residual (eq. 6) in the project's models: the filter is the released code's
depthwise convolution, its kernels come from the token mean through grouped 1x1 convolutions, CLS
gets none; the dumper's /layers/L/out stays W V, so `attnscope recompute` passes on a dump of a
local-residual model; float16 weights round trip; and five DeiT-T-shaped models fit in 30 MB."""
import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnscope_dump import dump_model
from attnscope_dump.attention import attention_weights
from attnscope_dump.models import DEIT_T, LocalResidual, ViTConfig, build_model
from attnscope_dump.weights_io import load_weights, model_name, round_to_float16, save_weights
from cli_check import info_and_recompute
from conftest import image_loader, tiny_vit

F16_WORST = 5e-3  # as test_recompute.py: float16 dumps, relative to the head's largest |out|


def _released_filter(v, kernels, grid):
    """The released code's form: V's grid tokens as one image of B*C channels, filtered by
    F.conv2d with one group per channel, zero padding 1."""
    b, h, _, d = v.shape
    c = h * d
    img = v[:, :, 1:, :].transpose(1, 2).reshape(b, grid, grid, c).permute(0, 3, 1, 2)
    out = F.conv2d(img.reshape(1, b * c, grid, grid), kernels.reshape(b * c, 1, 3, 3),
                   padding=1, groups=b * c)
    return out.reshape(b, c, grid * grid).transpose(1, 2)


@pytest.mark.parametrize("grid,heads,d", [(1, 1, 1), (3, 2, 5), (14, 3, 64)])
def test_filter_is_the_depthwise_convolution(grid, heads, d):
    g = torch.Generator().manual_seed(grid * 100 + d)
    lr = LocalResidual(heads * d, heads, grid).double()
    v = torch.randn(2, heads, 1 + grid * grid, d, generator=g, dtype=torch.float64)
    kernels = torch.randn(2, heads * d, 3, 3, generator=g, dtype=torch.float64)
    mine, ref = lr.filtered(v, kernels), _released_filter(v, kernels, grid)
    err = (mine - ref).abs().max().item()
    assert err < 1e-12, f"grid {grid} heads {heads} d {d} seed {grid * 100 + d}: worst {err}"


def test_kernels_come_from_the_token_mean_through_grouped_convolutions():
    """Kernel of channel c = outputs 9c .. 9c+8 of conv2(GELU(conv1(mean over all tokens))),
    each convolution seeing only its head's channels; written out with explicit loops."""
    torch.manual_seed(3)
    c, heads = 6, 2
    lr = LocalResidual(c, heads, grid=2).double()
    x = torch.randn(2, 5, c, dtype=torch.float64)
    got = lr.kernels(x)
    w1, b1 = lr.conv1.weight[:, :, 0], lr.conv1.bias
    w2, b2 = lr.conv2.weight[:, :, 0], lr.conv2.bias
    per = c // heads
    for img in range(2):
        m = x[img].mean(dim=0)  # CLS included
        hidden = torch.stack([b1[o] + w1[o] @ m[(o // per) * per:(o // per + 1) * per]
                              for o in range(c)])
        hidden = F.gelu(hidden)
        out = torch.stack([b2[o] + w2[o] @ hidden[(o // (9 * per)) * per:(o // (9 * per) + 1) * per]
                           for o in range(9 * c)])
        for ch in range(c):
            want = out[9 * ch:9 * ch + 9].reshape(3, 3)
            assert torch.allclose(got[img, ch], want, atol=1e-12), f"image {img} channel {ch}"


def _fixed_kernel(lr, r, s):
    """Makes every channel's kernel 1 at (r, s) and 0 elsewhere, whatever the input."""
    with torch.no_grad():
        lr.conv2.weight.zero_()
        lr.conv2.bias.zero_()
        lr.conv2.bias.view(-1, 9)[:, 3 * r + s] = 1.0


def test_known_answers_and_cls_gets_none():
    torch.manual_seed(4)
    grid, heads, d = 4, 2, 3
    lr = LocalResidual(heads * d, heads, grid).double()
    n = 1 + grid * grid
    out = torch.randn(2, n, heads * d, dtype=torch.float64)
    v = torch.randn(2, heads, n, d, dtype=torch.float64)
    x = torch.randn(2, n, heads * d, dtype=torch.float64)
    v_tokens = v.transpose(1, 2).reshape(2, n, heads * d)
    _fixed_kernel(lr, 1, 1)  # the centre: the residual is V itself
    y = lr(out, v, x)
    assert torch.equal(y[:, 0], out[:, 0]), "CLS got a residual"
    assert torch.allclose(y[:, 1:], out[:, 1:] + v_tokens[:, 1:], atol=1e-14)
    _fixed_kernel(lr, 0, 1)  # the tap above: token (row, col) gets V of (row - 1, col), row 0 zero
    res = (lr(out, v, x) - out)[:, 1:].reshape(2, grid, grid, heads * d)
    want = v_tokens[:, 1:].reshape(2, grid, grid, heads * d)
    assert torch.equal(res[:, 0], torch.zeros_like(res[:, 0])), "zero padding"
    assert torch.allclose(res[:, 1:], want[:, :-1], atol=1e-14), "shift by one row"


def _proj_inputs(model, x):
    """The input of every block's output projection: W V plus the local residual."""
    got = []
    hooks = [b.attn.proj.register_forward_pre_hook(lambda _m, inp: got.append(inp[0]))
             for b in model.blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return got


def test_dump_out_is_w_v_and_attnscope_recompute_passes(tmp_path, attnscope_bin):
    model = tiny_vit("inline", seed=7, depth=2, dim=32, heads=2, image_size=28,
                     local_residual=True)
    batches = image_loader(4, size=28, batch=3)
    path = tmp_path / "d.h5"
    dump_model(model, batches, str(path), dtype="float32", with_attn=True)
    x = torch.cat([b[0] for b in batches])
    before_proj = _proj_inputs(model, x)
    with h5py.File(path) as f:
        assert f.attrs["attention_family"] == "inline" and f.attrs["num_tokens"] == 50
        for layer in range(2):
            q, k, v, out = (torch.from_numpy(f[f"layers/{layer}/{n}"][()])
                            for n in ("q", "k", "v", "out"))
            w = attention_weights("inline", q, k, model.blocks[layer].attn.scale)
            err = (out - w @ v).abs().max().item()
            assert err < 1e-5, f"layer {layer}: dumped out is not W V (worst {err})"
            # Negative control: the projection's input is W V plus a residual that matters.
            merged = out.transpose(1, 2).reshape(out.shape[0], 50, 32)
            gap = (before_proj[layer] - merged).abs()
            assert gap[:, 0].max() < 1e-5, f"layer {layer}: CLS got a residual"
            assert gap[:, 1:].max() > 1e-2 * merged.abs().max(), \
                f"layer {layer}: the local residual changes nothing; the test cannot tell"
            local = torch.from_numpy(f[f"layers/{layer}/local"][()])
            whole = (out + local).transpose(1, 2).reshape(out.shape[0], 50, 32)
            err = (whole - before_proj[layer]).abs().max().item()
            assert err < 1e-5, f"layer {layer}: out + local is not the projection's input ({err})"
    info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=1e-5)


def test_cpp_recompute_197_tokens_float16(tmp_path, attnscope_bin):
    """The DeiT-T token count (patch 2 on 28x28: 14x14 + CLS) in float16, as make dumps writes."""
    model = tiny_vit("inline", seed=8, depth=2, dim=32, heads=2, image_size=28, patch=2,
                     local_residual=True)
    path = tmp_path / "d.h5"
    dump_model(model, image_loader(3, size=28), str(path), dtype="float16")
    out, _ = info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=F16_WORST)
    assert "197 = 1 prefix + 14x14 grid" in out, out


def test_float16_weights_round_trip(tmp_path):
    model = tiny_vit("inline", seed=9, dim=12, heads=3, image_size=28, local_residual=True)
    path = tmp_path / "w.h5"
    save_weights(model, str(path), dtype="float16")
    back = load_weights(str(path))
    assert back.config.local_residual and back.blocks[1].attn.local_residual is not None
    with h5py.File(path) as f:
        assert f.attrs["local_residual"] == 1 and f.attrs["weights_dtype"] == "float16"
        assert f.attrs["model_name"] == "vit7-inline-localres-fmnist"
        assert f["blocks/1/attn/local_residual/conv1/weight"].shape == (12, 4, 1)
        assert f["blocks/1/attn/local_residual/conv2/weight"].shape == (108, 4, 1)
        assert f["blocks/1/attn/local_residual/conv2/bias"].dtype == np.float16
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(round_to_float16(model)(x), back(x)), "float16 file != rounded model"


def test_a_missing_residual_dataset_is_named(tmp_path):
    path = tmp_path / "w.h5"
    save_weights(tiny_vit("inline", image_size=28, local_residual=True), str(path), dtype="float16")
    with h5py.File(path, "a") as f:
        del f["blocks/0/attn/local_residual/conv2/weight"]
    with pytest.raises(ValueError, match="'/blocks/0/attn/local_residual/conv2/weight' missing"):
        load_weights(str(path))


def _deit_t_parameters(local_residual):
    """Parameter count of the DeiT-T-shaped model, from the architecture written out."""
    dim, depth, heads, mlp = 192, 6, 3, 768
    tokens, patch, classes = 197, 2, 10
    block = (2 * 2 * dim  # two LayerNorms
             + 3 * dim * dim + 3 * dim + dim * dim + dim  # qkv, proj
             + dim * mlp + mlp + mlp * dim + dim)  # MLP
    if local_residual:
        block += dim * (dim // heads) + dim + 9 * dim * (dim // heads) + 9 * dim
    return (dim * patch * patch + dim + dim + tokens * dim + depth * block + 2 * dim
            + classes * dim + classes)


def test_five_deit_t_models_fit_in_30_mb(tmp_path):
    """The five float16 weight files, bounded for trained weights: the raw float16 bytes (gzip
    cannot shrink trained weights much and may grow them by 0.1 %) plus each file's own overhead
    as measured here."""
    bound = 0
    for fam, local in (("softmax", False), ("linear", False), ("inline", False),
                       ("inline", True), ("mala", False)):
        model = build_model(ViTConfig(family=fam, local_residual=local, **DEIT_T), seed=0)
        count = sum(p.numel() for p in model.parameters())
        assert model.config.num_tokens == 197
        assert count == _deit_t_parameters(local), f"{fam} local_residual={local}: {count}"
        path = tmp_path / (model_name(model.config) + ".h5")
        save_weights(model, str(path), dtype="float16")
        with h5py.File(path) as f:
            stored = []
            f.visititems(lambda _n, o: stored.append(o.id.get_storage_size())
                         if isinstance(o, h5py.Dataset) else None)
        overhead = os.path.getsize(path) - sum(stored)
        bound += 2 * count * 1.001 + overhead
    assert sorted(os.listdir(tmp_path)) == [
        "vit14-inline-fmnist.h5", "vit14-inline-localres-fmnist.h5", "vit14-linear-fmnist.h5",
        "vit14-mala-fmnist.h5", "vit14-softmax-fmnist.h5"]
    assert bound < 30e6, f"five DeiT-T-shaped models may take {bound / 1e6:.2f} MB"


def test_attention_core_stays_float32_under_autocast():
    """Training on CUDA runs under bfloat16 autocast; the attention weights, W V and the local
    residual stay float32 (the CPU's bfloat16 autocast stands in for it here)."""
    model = tiny_vit("inline", seed=10, dim=32, heads=2, image_size=28, patch=2,
                     local_residual=True)
    seen = {}
    a = model.blocks[1].attn
    a.attn_drop.register_forward_hook(lambda _m, inp, _o: seen.update(w=inp[0].dtype))
    a.proj.register_forward_pre_hook(lambda _m, inp: seen.update(o=inp[0].dtype))
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        want = model(x)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            got = model(x)
    assert got.dtype == torch.bfloat16, "autocast did not apply to the rest of the model"
    assert seen == {"w": torch.float32, "o": torch.float32}, seen
    err = (got.float() - want).abs().max().item()
    assert err < 0.1 * want.abs().max().item(), f"bfloat16 forward differs by {err}"
