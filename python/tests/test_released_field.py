"""The field's released modules (stand-ins in standins_released.py) dumped with their family,
convention and per-layer parameters; the stored parameters are the model's own, and with them
the float64 formulas of field_families.py reproduce the module's output to float precision,
while the forms without them (no rotation, MALA without RoPE, a wrong family) do not."""
import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from attnscope_dump.field_families import rotate, weights_and_outputs
from conftest import image_loader
from standins_released import AgentDeiT, FLattenPVT, MllaModel, RopeStageModel


def _proj_inputs(model, x, modules, pre=True):
    """What each module's projection receives (or, for MLLA, what the module returns)."""
    got = []
    hooks = [(m.register_forward_pre_hook(lambda _m, inp: got.append(inp[0])) if pre else
              m.register_forward_hook(lambda _m, _i, o: got.append(o))) for m in modules]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return got


def _layer(f, i):
    g = f[f"layers/{i}"]
    arrays = {n: torch.from_numpy(g[n][()]).double() for n in ("q", "k", "v", "out", "local")}
    params = {n: torch.from_numpy(g["family_params"][n][()]) for n in g["family_params"]}
    agents = torch.from_numpy(g["agents"][()]).double() if "agents" in g else None
    return g.attrs, arrays, params, agents


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _dump(model, path, size, **kw):
    batches = image_loader(4, size=size, batch=2)
    dump_model(model, batches, str(path), dtype="float32", **kw)
    return torch.cat([b[0] for b in batches])


CASES = {
    "mlla": (lambda: MllaModel(), 16, {}, ("mlla", "code", "none")),
    "rala": (lambda: RopeStageModel("rala"), 16, {}, ("rala", "code", "none")),
    "mala": (lambda: RopeStageModel("mala"), 16, {}, ("mala", "code+rope", "elu1")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rope_family_dumps_with_the_models_rotation(tmp_path, name):
    torch.manual_seed(5)
    make, size, kw, (family, convention, fmap) = CASES[name]
    model = make().eval()
    x = _dump(model, tmp_path / "d.h5", size, **kw)
    attns = [b.attn for b in model.blocks]
    mlla = name == "mlla"
    before = _proj_inputs(model, x, attns if mlla else [a.proj for a in attns], pre=not mlla)
    with h5py.File(tmp_path / "d.h5") as f:
        assert (f.attrs["attention_family"], f.attrs["prefix_tokens"]) == (family, 0)
        for i, attn in enumerate(attns):
            attrs, t, params, _ = _layer(f, i)
            assert (attrs["attention_family"], attrs["convention"], attrs["feature_map"]) == \
                (family, convention, fmap)
            h, n, d = t["q"].shape[1:]
            for p in ("rope_cos", "rope_sin"):
                assert f[f"layers/{i}/family_params/{p}"].dtype == np.float32
                assert params[p].shape == (h, n, d // 2), (p, params[p].shape)
            # the stored rotation is the module's own, bit for bit
            if mlla:
                rot = attn.rope.rotations.reshape(n, h, d // 2, 2).transpose(0, 1)
                assert torch.equal(params["rope_cos"], rot[..., 0])
            else:
                sin, cos = model.RoPE(*model.patch_embed.grid_size)
                assert torch.equal(params["rope_cos"][0], cos[:, 0::2])
                assert torch.equal(params["rope_sin"][1], sin[:, 1::2])
            conv = attrs["convention"]
            scale = float(f.attrs["scale"])
            _, mine = weights_and_outputs(family, conv, t["q"], t["k"], t["v"], scale, params)
            err = _rel(t["out"], mine)
            assert err < 1e-5, f"{name} layer {i}: out vs the stored rotation: {err:.3g}"
            # out + local is what the module hands on (before its gate, for RALA and MALA)
            got = before[i].double()
            if mlla:
                merged = (t["out"] + t["local"]).transpose(1, 2).reshape(got.shape)
            else:
                b, c, gh, gw = got.shape
                merged = (t["out"] + t["local"]).transpose(-2, -1).reshape(b, c, gh, gw) * \
                    _gate(attn, model, x, i)
            assert _rel(merged, got) < 1e-5, f"{name} layer {i}: out + local"
            assert t["local"].abs().max() > 1e-2 * t["out"].abs().max(), "no local term"
            # Negative controls: without the rotation (cos 1, sin 0) the output is another one.
            flat = {"rope_cos": torch.ones_like(params["rope_cos"]),
                    "rope_sin": torch.zeros_like(params["rope_sin"])}
            _, plain = weights_and_outputs(family, conv, t["q"], t["k"], t["v"], scale, flat)
            assert _rel(t["out"], plain) > 1e-2, f"{name}: the rotation made no difference"


def _gate(attn, model, x, i):
    got = []
    h = attn.qkvo.register_forward_hook(lambda _m, _i, o: got.append(o[:, 3 * o.shape[1] // 4:]))
    with torch.no_grad():
        model(x)
    h.remove()
    return got[0].double()


def test_released_mala_rows_do_not_sum_to_one_and_mala_code_is_refused_by_the_self_check(
        tmp_path):
    torch.manual_seed(6)
    model = RopeStageModel("mala").eval()
    _dump(model, tmp_path / "d.h5", 16)
    with h5py.File(tmp_path / "d.h5") as f:
        _, t, params, _ = _layer(f, 0)
        w, _ = weights_and_outputs("mala", "code+rope", t["q"], t["k"], t["v"],
                                   float(f.attrs["scale"]), params)
    sums = w.sum(dim=-1)
    assert (sums - 1).abs().max() > 1e-2, "the released form's rows summed to 1"
    # MALA without RoPE (mala@code) is not what the released module computes.
    with pytest.raises(ValueError, match=r"attention output is not mala:elu1@code"):
        dump_model(model, image_loader(2, size=16), str(tmp_path / "x.h5"),
                   families={0: "mala:elu1@code", 1: "mala:elu1@code"})


def test_polaformer_dumps_its_scale_and_exponent(tmp_path):
    torch.manual_seed(7)
    model = FLattenPVT(attn_type="PS", img_size=32, num_heads=(2, 2)).eval()
    x = _dump(model, tmp_path / "d.h5", 32, layers=[0, 1])
    attns = [b.attn for b in model.block1]
    with h5py.File(tmp_path / "d.h5") as f:
        for i, attn in enumerate(attns):
            attrs, t, params, _ = _layer(f, i)
            assert (attrs["attention_family"], attrs["convention"]) == ("polaformer", "code")
            h, d = t["q"].shape[1], t["q"].shape[3]
            assert params["feature_scale"].shape == (h, 1, d)
            want = 1 + attn.alpha * torch.sigmoid(attn.power.detach())
            assert torch.equal(params["exponent"], want.reshape(h, 1, d))
            (same, opposite), mine = weights_and_outputs("polaformer", "code", t["q"], t["k"],
                                                         t["v"], 1.0, params)
            assert _rel(t["out"], mine) < 1e-5
            # each map: rows of non-negative weights summing to S / (S + N 1e-6) <= 1
            for m in (same, opposite):
                assert m.min() >= 0 and m.sum(-1).max() <= 1 + 1e-12
                assert (m.sum(-1) - 1).abs().max() < 1e-3
            paper = weights_and_outputs("polaformer", "paper", t["q"], t["k"], t["v"], 1.0,
                                        params)[0]
            assert (paper[0].sum(-1) - 1).abs().max() < 1e-12
            # negative control: one map for both halves is not the module
            merged = same @ t["v"]
            assert _rel(t["out"], merged) > 1e-2


def test_agent_dumps_its_agents_and_biases(tmp_path):
    torch.manual_seed(8)
    model = AgentDeiT(agent_layer=2, depth=2).eval()
    _dump(model, tmp_path / "d.h5", 28)
    with h5py.File(tmp_path / "d.h5") as f:
        attrs, t, params, agents = _layer(f, 0)
        assert (attrs["attention_family"], attrs["convention"]) == ("agent", "code")
        b, h, n, d = t["q"].shape
        a = model.blocks[0].attn.agent_num
        assert agents.shape == (b, h, a, d)
        assert params["agent_bias"].shape == (h, a, n) and params["token_bias"].shape == (h, n, a)
        # the agents are q's grid pooled 2x2 (14x14 -> 2x2 bins of 7x7)
        grid = t["q"][:, :, 1:].reshape(b, h, 14, 14, d)
        pooled = grid.reshape(b, h, 2, 7, 2, 7, d).mean(dim=(3, 5)).reshape(b, h, 4, d)
        assert _rel(agents, pooled) < 1e-6
        w, mine = weights_and_outputs("agent", "code", t["q"], t["k"], t["v"],
                                      float(f.attrs["scale"]), params, agents)
        assert _rel(t["out"], mine) < 1e-5
        assert torch.linalg.matrix_rank(w[0, 0]).item() <= a
        assert (w.sum(-1) - 1).abs().max() < 1e-12
        # negative control: without the position biases the output is another one
        zero = {k: torch.zeros_like(v) for k, v in params.items()}
        _, plain = weights_and_outputs("agent", "code", t["q"], t["k"], t["v"],
                                       float(f.attrs["scale"]), zero, agents)
        assert _rel(t["out"], plain) > 1e-3


def test_mlla_rotation_is_per_head_slices_of_the_channel_wide_one(tmp_path):
    """Head 1 of MLLA turns its first pairs by column angles (channel pairs past C/4), head 0 by
    row angles: the stored rotation differs per head, and rotating with head 0's for every head
    does not reproduce the module."""
    torch.manual_seed(9)
    model = MllaModel().eval()
    _dump(model, tmp_path / "d.h5", 16)
    with h5py.File(tmp_path / "d.h5") as f:
        _, t, params, _ = _layer(f, 0)
    assert not torch.equal(params["rope_cos"][0], params["rope_cos"][1])
    same = {k: v[:1].expand_as(v) for k, v in params.items()}
    _, wrong = weights_and_outputs("mlla", "code", t["q"], t["k"], t["v"], 1.0, same)
    assert _rel(t["out"], wrong) > 1e-3
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    c, s = torch.rand(2, 3, 2, dtype=torch.float64), torch.rand(2, 3, 2, dtype=torch.float64)
    z = torch.view_as_real(torch.view_as_complex(x.reshape(1, 2, 3, 2, 2).contiguous())
                          * torch.complex(c, s)).flatten(-2)
    assert torch.allclose(rotate(x, c, s), z)


FIELD_MODELS = {
    "mlla": (lambda: MllaModel(), 16, {}, ["mlla@code"]),
    "rala": (lambda: RopeStageModel("rala"), 16, {}, ["rala@code"]),
    "mala": (lambda: RopeStageModel("mala"), 16, {}, ["mala_rope:elu1@code"]),
    "polaformer": (lambda: FLattenPVT(attn_type="PS", img_size=32, num_heads=(2, 2)), 32, {"layers": [0, 1]},
                   ["polaformer:same@code", "polaformer:opposite@code"]),
    "agent": (lambda: AgentDeiT(agent_layer=2, depth=2), 28, {}, ["agent@code"]),
}


@pytest.mark.parametrize("name", sorted(FIELD_MODELS))
def test_attnscope_recomputes_the_dumped_field_families(tmp_path, attnscope_bin, name):
    """The registry's families read the dumper's family parameters: `attnscope recompute`
    reproduces each module's stored output (PolaFormer: both maps, each on its half of the value
    channels), and an analysis runs on the dump; the same dump without its parameters is refused
    naming the missing dataset."""
    import subprocess
    torch.manual_seed(5)
    make, size, kw, variants = FIELD_MODELS[name]
    _dump(make().eval(), tmp_path / "d.h5", size, **kw)
    for i, variant in enumerate(variants):
        args = [attnscope_bin, "recompute", "--dump", str(tmp_path / "d.h5"), "--out", str(tmp_path / f"r{i}")]
        if i > 0:
            args += ["--variant", variant]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0 and "PASS" in r.stdout, (variant, r.stdout, r.stderr)
        with open(tmp_path / f"r{i}" / "recompute.csv") as f:
            rows = [line for line in f.read().splitlines()[1:] if line]
        assert any(row.startswith(variant + ",") for row in rows), (variant, rows)
    r = subprocess.run([attnscope_bin, "locality", "--dump", str(tmp_path / "d.h5"), "--out", str(tmp_path / "loc")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "d.h5", "r+") as f:
        for g in f["layers"].values():
            for n in ("family_params", "agents"):
                if n in g:
                    del g[n]
    r = subprocess.run([attnscope_bin, "locality", "--dump", str(tmp_path / "d.h5"), "--out", str(tmp_path / "bare")],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert ("agents" if name == "agent" else "feature_scale" if name == "polaformer" else "rope_cos") in r.stderr


@pytest.mark.parametrize("kind,family", [("rala", "rala"), ("mala", "mala")])
def test_ravlt_and_mala_hybrid_linear_then_softmax_stages(tmp_path, attnscope_bin, kind, family):
    """RAVLT and MALA as released: a linear stage, then a softmax stage (their 'llvv'), each
    stage's blocks at layers[i].blocks[j].attn with the stage's RoPE. Each layer records its
    family and its stage's grid (8x8, then 4x4 after the stride-2 downsample); the softmax stage's
    q and k are stored rotated, so softmax of them is the module's W V, and out + local, gated, is
    what proj receives; attnscope recomputes the whole hybrid, each stage under its own family,
    and the softmax stage dumped alone."""
    import subprocess
    from cli_check import info_and_recompute
    from standins_released import RavltModel
    torch.manual_seed(11)
    model = RavltModel(kind, flags="lv").eval()
    x = _dump(model, tmp_path / "d.h5", 32, grid=(8, 8), prefix_tokens=0)
    attns = [s.blocks[0].attn for s in model.layers]
    before = _proj_inputs(model, x, [a.proj for a in attns])
    gates = []
    hooks = [a.qkvo.register_forward_hook(
        lambda _m, _i, o: gates.append(o[:, 3 * o.shape[1] // 4:])) for a in attns]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    with h5py.File(tmp_path / "d.h5") as f:
        a0, a1 = dict(f["layers/0"].attrs), dict(f["layers/1"].attrs)
        assert a0["attention_family"] == family and a1["attention_family"] == "softmax"
        assert (f.attrs["grid_height"], a1["grid_height"], a1["grid_width"]) == (8, 4, 4)
        assert f["layers/1/q"].shape == (4, 2, 16, 16)
        t = {n: torch.from_numpy(f[f"layers/1/{n}"][()]).double() for n in
             ("q", "k", "v", "out", "local")}
        scale = float(a1["scale"])
        w = torch.softmax(scale * t["q"] @ t["k"].transpose(-1, -2), dim=-1)
        assert _rel(t["out"], w @ t["v"]) < 1e-5
        b, c, gh, gw = before[1].shape
        merged = (t["out"] + t["local"]).transpose(-2, -1).reshape(b, c, gh, gw) * \
            gates[1].double()
        assert _rel(merged, before[1].double()) < 1e-5
        assert t["local"].abs().max() > 1e-2 * t["out"].abs().max()
        # negative control: q and k before the rotation do not give the module's output
        qkvo = []
        hk = attns[1].qkvo.register_forward_hook(lambda _m, _i, o: qkvo.append(o))
        with torch.no_grad():
            model(x)
        hk.remove()
        raw = qkvo[0].double()[:, :16].reshape(4, 2, 8, 16).transpose(-2, -1)
        rawk = qkvo[0].double()[:, 16:32].reshape(4, 2, 8, 16).transpose(-2, -1)
        w_raw = torch.softmax(scale * raw @ rawk.transpose(-1, -2), dim=-1)
        assert _rel(t["out"], w_raw @ t["v"]) > 1e-3
    # the whole hybrid: the linear stage under its registry family (RALA; released MALA as
    # mala_rope) with the stage's RoPE tables, the softmax stage under softmax
    info_and_recompute(attnscope_bin, tmp_path / "d.h5", tmp_path / "rr", tol=1e-5)
    _dump(model, tmp_path / "s.h5", 32, grid=(8, 8), prefix_tokens=0, layers=[1])
    with h5py.File(tmp_path / "s.h5") as f:
        assert (f.attrs["grid_height"], f.attrs["num_tokens"]) == (4, 16)
    info_and_recompute(attnscope_bin, tmp_path / "s.h5", tmp_path / "r", tol=1e-5)
