"""The papers' released attention modules (stand-ins in standins_released.py): each is dumped
with its own family, map and convention per layer and its local term apart (/layers/L/local, out
exactly W V, `attnscope recompute` passing), or refused with one error naming it; unknown modules
are never taken for softmax; a user's wrong statement of the family is caught by the self-check."""
import os
import re

import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from attnscope_dump.attention import attention_outputs
from attnscope_dump.released import STRUCTURES
from cli_check import info_and_recompute
from conftest import REPO, image_loader
from standins import TimmAttention
from standins_released import (AgentDeiT, FLattenPVT, InLineDeiT, InLineWindowAttention,
                               OneBlockModel, PolaWindowAttention, RAVLT)


def _proj_inputs(attns, x, model, *args):
    got = []
    hooks = [a.proj.register_forward_pre_hook(lambda _m, inp: got.append(inp[0])) for a in attns]
    with torch.no_grad():
        model(x, *args)
    for h in hooks:
        h.remove()
    return got


def _check_layers(path, model, attns, x, families, tol=1e-5):
    """Per layer: its attributes, out = W V of its family, out + local = the module's own input
    of proj, and a local term that matters (else the test could not tell)."""
    before = _proj_inputs(attns, x, model)
    with h5py.File(path) as f:
        for layer, (fam, fmap) in enumerate(families):
            g = f[f"layers/{layer}"]
            assert (g.attrs["attention_family"], g.attrs["feature_map"], g.attrs["convention"]) \
                == (fam, fmap, "code"), dict(g.attrs)
            q, k, v, out = (torch.from_numpy(g[n][()]).double() for n in ("q", "k", "v", "out"))
            want = attention_outputs(fam, q, k, v, float(f.attrs["scale"]), fmap)
            err = ((out - want).abs().max() / out.abs().max()).item()
            assert err < tol, f"layer {layer} {fam}:{fmap}: out is not W V (worst {err:.3g})"
            merged = (out + torch.from_numpy(g["local"][()]).double()).transpose(1, 2)
            merged = merged.reshape(before[layer].shape)
            gap = (merged - before[layer].double()).abs().max().item()
            assert gap < tol * before[layer].abs().max().item(), f"layer {layer}: out + local"
            local = np.abs(g["local"][()])
            assert local.max() > 1e-2 * np.abs(g["out"][()]).max(), f"layer {layer}: no local"
    return before


def test_inline_deit_dumps_as_inline_with_its_local_residual(tmp_path, attnscope_bin):
    torch.manual_seed(0)
    model = InLineDeiT(depth=2, embed_dim=48, num_heads=3).eval()  # 14x14 + CLS = 197 tokens
    batches = image_loader(4, size=28, batch=2)
    path = tmp_path / "inline.h5"
    dump_model(model, batches, str(path), dtype="float32")  # grid and CLS read from the model
    x = torch.cat([b[0] for b in batches])
    _check_layers(path, model, [b.attn for b in model.blocks], x, [("inline", "identity")] * 2)
    with h5py.File(path) as f:
        assert (f.attrs["attention_family"], f.attrs["num_tokens"], f.attrs["prefix_tokens"]) \
            == ("inline", 197, 1)
        assert np.all(f["layers/1/local"][:, :, 0] == 0), "CLS got a local residual"
    info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=1e-4)


def test_the_issue_deit_t_shape(tmp_path, attnscope_bin):
    """DeiT-T as the released class builds it: 12 layers, 6 heads of 32, 224 px, 197 tokens."""
    torch.manual_seed(1)
    model = InLineDeiT(img_size=224, patch_size=16, in_chans=3, embed_dim=192, depth=12,
                       num_heads=6).eval()
    path = tmp_path / "deit_t.h5"
    s = dump_model(model, image_loader(2, size=224, channels=3, batch=2), str(path),
                   dtype="float16")
    assert s.attributes["attention_family"] == "inline" and s.attributes["head_dim"] == 32
    with h5py.File(path) as f:
        assert f["layers/11/local"].shape == (2, 6, 197, 32)
    info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=5e-3)


@pytest.mark.parametrize("spec", ["softmax", "linear:relu"])
def test_a_wrong_statement_is_caught_by_the_self_check(tmp_path, spec):
    model = InLineDeiT(depth=1).eval()
    with pytest.raises(ValueError, match=r"layer 0 \(InLine DeiT \(InLineAttention\), family as "
                                         r"stated\): the model's attention output is not "
                                         + re.escape(spec)):
        dump_model(model, image_loader(2, size=28), str(tmp_path / "d.h5"), families={0: spec})
    assert not os.path.exists(tmp_path / "d.h5")


def test_a_right_statement_keeps_the_recognised_capture(tmp_path):
    model = InLineDeiT(depth=2).eval()
    path = tmp_path / "d.h5"
    dump_model(model, image_loader(2, size=28), str(path), families={1: "inline:identity@code"})
    with h5py.File(path) as f:
        assert "local" in f["layers/1"] and f["layers/1"].attrs["attention_family"] == "inline"


def test_a_wrong_statement_for_a_recognised_module_is_caught_by_the_self_check(tmp_path):
    """Stating softmax for Agent attention keeps its capture (q, k, v, its DWC apart), and the
    self-check then finds that its output is not softmax of them."""
    model = AgentDeiT(agent_layer=1, depth=2).eval()
    with pytest.raises(ValueError, match=r"layer 0 \(Agent attention, DeiT form \(AgentAttention\), "
                                         r"family as stated\): the model's attention output is "
                                         r"not softmax"):
        dump_model(model, image_loader(2, size=28), str(tmp_path / "d.h5"),
                   families={0: "softmax"})


def test_an_unknown_module_with_timm_names_is_refused_not_softmax(tmp_path):
    attn = TimmAttention(16, 2)
    attn.gate = torch.nn.Linear(16, 16)  # something softmax attention does not have
    model = OneBlockModel(attn)
    with pytest.raises(ValueError, match=r"layer 0: TimmAttention has timm's names but also gate: "
                                         r"it is none of the structures .* families="):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"), grid=(4, 4), prefix_tokens=1)


def test_hybrid_records_each_layers_family(tmp_path, attnscope_bin):
    torch.manual_seed(2)
    model = InLineDeiT(depth=4, softmax_from=2).eval()  # layers 0-1 InLine, 2-3 softmax
    batches = image_loader(3, size=28, batch=3)
    path = tmp_path / "hybrid.h5"
    dump_model(model, batches, str(path), dtype="float32")
    with h5py.File(path) as f:
        fams = [f[f"layers/{i}"].attrs["attention_family"] for i in range(4)]
        assert fams == ["inline", "inline", "softmax", "softmax"]
        assert "local" in f["layers/1"] and "local" not in f["layers/2"]
        assert f.attrs["attention_family"] == "inline"  # the root: the first layer's
    out, csv = info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=1e-4)
    assert list(csv["variant"]) == ["inline:identity@code"] * 6 + ["softmax@code"] * 6, csv


def test_flatten_pvt_stage_dumps_as_linear_focused(tmp_path, attnscope_bin):
    torch.manual_seed(3)
    model = FLattenPVT().eval()  # stage 1: 2 FLatten layers on 8x8; stage 2: PVT softmax
    batches = image_loader(4, size=32, batch=2)
    path = tmp_path / "flatten.h5"
    dump_model(model, batches, str(path), dtype="float32", layers=[0, 1])
    x = torch.cat([b[0] for b in batches])
    _check_layers(path, model, [b.attn for b in model.block1], x, [("linear", "focused=3")] * 2,
                  tol=1e-4)
    with h5py.File(path) as f:
        assert (f.attrs["num_tokens"], f.attrs["grid_height"], f.attrs["prefix_tokens"]) == \
            (64, 8, 0)
    info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=1e-4)


def test_pvt_stages_of_other_heads_dump_with_their_geometry(tmp_path):
    """PVT's softmax stage and stages of other heads dump with their own geometry
    (test_released_hier.py goes further)."""
    s = dump_model(FLattenPVT(), image_loader(2, size=32), str(tmp_path / "a.h5"), layers=[2])
    assert s.attributes["attention_family"] == "softmax" and s.attributes["num_heads"] == 2
    dump_model(FLattenPVT(attn_type="LL"), image_loader(2, size=32), str(tmp_path / "b.h5"))
    with h5py.File(tmp_path / "b.h5") as f:
        assert f["layers/2"].attrs["num_heads"] == 2 and f["layers/2/q"].shape == (2, 2, 16, 16)


def test_agent_deit_dumps_its_agent_layers_as_agent_and_its_softmax_layers(tmp_path):
    model = AgentDeiT(agent_layer=2, depth=4).eval()
    dump_model(model, image_loader(2, size=28), str(tmp_path / "a.h5"))
    with h5py.File(tmp_path / "a.h5") as f:
        assert [f[f"layers/{i}"].attrs["attention_family"] for i in range(4)] == \
            ["agent", "agent", "softmax", "softmax"]
        assert "agents" in f["layers/0"] and "agents" not in f["layers/2"]
    s = dump_model(model, image_loader(2, size=28), str(tmp_path / "b.h5"), layers=[2, 3])
    assert s.attributes["attention_family"] == "softmax"


@pytest.mark.parametrize("model,match", [
    (OneBlockModel(InLineWindowAttention(16)), r"InLine Swin \(InLineAttention, window "
                                               r"attention\): window attention outside a Swin "
                                               r"block"),
    (OneBlockModel(PolaWindowAttention(16)), r"layer 0: PolaWindowAttention is PolaFormer "
                                             r"\(PolaLinearAttention\): not supported: window"),
    (RAVLT(), r"module layers.0.blocks.0.attn: RALA is RALA without LePE: not supported: no "
              r"`lepe`"),
])
def test_other_released_families_are_refused_by_name(tmp_path, model, match):
    with pytest.raises(ValueError, match=match):
        dump_model(model, image_loader(2), str(tmp_path / "d.h5"), grid=(4, 4), prefix_tokens=0)


def test_the_readme_lists_every_structure_with_its_rule():
    with open(os.path.join(REPO, "python", "README.md")) as f:
        text = f.read()
    for s in STRUCTURES:
        assert s.name in text and s.rule in text, f"python/README.md lacks {s.name}: {s.rule}"


def test_the_released_inline_deit_class(tmp_path, attnscope_bin):
    """The released class itself, where timm and a checkout of its repository are present (the
    project copies no code of it: the stand-in tests above carry the proof elsewhere)."""
    pytest.importorskip("timm", reason="timm is not installed (Debian does not package it); the "
                                       "released InLine DeiT class needs it")
    if not os.environ.get("ATTNSCOPE_INLINE_REPO"):
        pytest.skip("set ATTNSCOPE_INLINE_REPO to a checkout of the InLine repository: the "
                    "released models/inline_deit.py is not part of this project")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "inline_deit", os.path.join(os.environ["ATTNSCOPE_INLINE_REPO"], "models",
                                    "inline_deit.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.VisionTransformer(embed_dim=192, depth=12, num_heads=6, num_classes=10).eval()
    path = tmp_path / "real.h5"
    dump_model(model, image_loader(2, size=224, channels=3, batch=2), str(path))
    with h5py.File(path) as f:
        assert f.attrs["attention_family"] == "inline" and "local" in f["layers/0"]
    info_and_recompute(attnscope_bin, path, tmp_path / "r", tol=5e-3)


def _run(attnscope_bin, *args):
    import subprocess
    return subprocess.run([attnscope_bin, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_locality_reports_the_local_terms_share(tmp_path, attnscope_bin):
    from attnscope_dump.figures import read_csv
    torch.manual_seed(4)
    path = tmp_path / "inline.h5"
    dump_model(InLineDeiT(depth=2).eval(), image_loader(3, size=28, batch=3), str(path),
               dtype="float32")
    r = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "loc", "--threads", 1)
    assert r.returncode == 0, r.stdout + r.stderr
    csv = read_csv(str(tmp_path / "loc" / "local_share.csv"))
    with h5py.File(path) as f:
        for row in range(len(csv["layer"])):
            layer, head = int(csv["layer"][row]), int(csv["head"][row])
            local = f[f"layers/{layer}/local"][:, head, 1:].astype(np.float64)
            out = f[f"layers/{layer}/out"][:, head, 1:].astype(np.float64)
            a = np.linalg.norm(local.reshape(3, -1), axis=1)
            b = np.linalg.norm(out.reshape(3, -1), axis=1)
            want = np.mean(a / (a + b))
            assert abs(float(csv["mean"][row]) - want) < 1e-9, (layer, head)
            assert 0 < want < 1
    info = _run(attnscope_bin, "info", path)
    assert "local: all layers" in info.stdout, info.stdout


def test_a_hybrid_dump_says_its_layers_and_locality_takes_each_layers_own(tmp_path, attnscope_bin):
    path = tmp_path / "hybrid.h5"
    dump_model(InLineDeiT(depth=2, softmax_from=1).eval(), image_loader(2, size=28), str(path))
    info = _run(attnscope_bin, "info", path)
    assert info.returncode == 0 and "per layer   0: inline:identity@code, 1: softmax@code" \
        in info.stdout, info.stdout
    from attnscope_dump.figures import read_csv
    own = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "loc")
    assert own.returncode == 0, own.stderr  # each layer's own, named per row
    assert list(read_csv(str(tmp_path / "loc" / "locality.csv"))["variant"]) \
        == ["inline:identity@code"] * 3 + ["softmax@code"] * 3
    ok = _run(attnscope_bin, "locality", "--dump", path, "--out", tmp_path / "l2", "--variant",
              "softmax")
    assert ok.returncode == 0, ok.stderr
    for layer, variant in ((0, "inline:identity@code"), (1, "softmax@code")):  # the layer's own
        out = tmp_path / f"l{layer}"
        one = _run(attnscope_bin, "locality", "--dump", path, "--out", out, "--layers", layer)
        assert one.returncode == 0, one.stderr
        assert set(read_csv(str(out / "locality.csv"))["variant"]) == {variant}


# Per command: its per-(layer, head) CSV and the columns compared (deterministic, family-dependent).
HYBRID_ROWS = {
    "distance": ("distance.csv", ("mean_distance", "negative_weight_rows")),
    "entropy": ("entropy.csv", ("mean_entropy", "negative_weight_rows")),
    "rank": ("rank.csv", ("mean_rank", "mean_erank")),
    "sinks": ("sinks.csv", ("top_key", "top_key_received", "mean_max_received")),
    "mask": ("mask_per_head.csv", ("change_mean", "removed_mass_mean")),
}


@pytest.fixture(scope="module")
def hybrid_dump(tmp_path_factory):
    """InLine blocks then softmax blocks (the released DeiT's InLine layer and timm's softmax)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hybrid") / "hybrid.h5"
    dump_model(InLineDeiT(depth=2, softmax_from=1).eval(), image_loader(2, size=28), str(path),
               dtype="float32", with_images=True)
    return path


def _rows(out, csv, cols, layer=None):
    from attnscope_dump.figures import read_csv
    t = read_csv(str(out / csv))
    keys = [k for k in ("mask", "layer", "head") if k in t]
    return {tuple(t[k][i] for k in keys): (t["variant"][i],) + tuple(t[c][i] for c in cols)
            for i in range(len(t["layer"])) if layer is None or int(t["layer"][i]) == layer}


@pytest.mark.parametrize("command", sorted(HYBRID_ROWS))
def test_every_per_head_analysis_takes_each_layers_own_family_on_a_hybrid(
        hybrid_dump, tmp_path, attnscope_bin, command):
    """Without --variant each layer is measured with its own family: its rows name it and equal,
    to the digit, a run of that layer alone under that family; the other family gives other rows
    (the negative control); the JSON records each layer's."""
    import json
    csv, cols = HYBRID_ROWS[command]
    r = _run(attnscope_bin, command, "--dump", hybrid_dump, "--out", tmp_path / "own",
             "--threads", 1)
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.load(open(tmp_path / "own" / f"{command}.json"))
    assert meta["parameters"]["variants"] == {
        "each_layer_own": {"0": "inline:identity@code", "1": "softmax@code"}}
    own = _rows(tmp_path / "own", csv, cols)
    assert {v[0] for k, v in own.items()} == {"inline:identity@code", "softmax@code"}
    for layer, mine, other in ((0, "inline:identity@code", "softmax@code"),
                               (1, "softmax@code", "inline:identity@code")):
        part = {k: v for k, v in own.items() if int(k[-2]) == layer}
        assert part and all(v[0] == mine for v in part.values()), (layer, part)
        for variant, same in ((mine, True), (other, False)):
            out = tmp_path / f"l{layer}-{variant[:6]}"
            one = _run(attnscope_bin, command, "--dump", hybrid_dump, "--out", out, "--layers",
                       layer, "--variant", variant, "--threads", 1)
            assert one.returncode == 0, one.stdout + one.stderr
            alone = _rows(out, csv, cols, layer)
            assert (alone == part) == same, (command, layer, variant, alone, part)


def test_rollout_runs_each_layers_own_family_through_a_hybrid(hybrid_dump, tmp_path,
                                                             attnscope_bin):
    import json
    from attnscope_dump.figures import read_csv
    means = {}
    for name, extra in (("own", ()), ("inline", ("--variant", "inline:identity@code")),
                        ("softmax", ("--variant", "softmax"))):
        r = _run(attnscope_bin, "rollout", "--dump", hybrid_dump, "--out", tmp_path / name,
                 "--threads", 1, *extra)
        assert r.returncode == 0, r.stdout + r.stderr
        means[name] = read_csv(str(tmp_path / name / "rollout_mean.csv"))["mean"]
    meta = json.load(open(tmp_path / "own" / "rollout.json"))
    assert meta["parameters"]["variants"] == {
        "each_layer_own": {"0": "inline:identity@code", "1": "softmax@code"}}
    assert meta["results"]["variants"][0]["variant"] == "each_layer_own"
    # the mixed rollout is neither family's alone
    assert not np.array_equal(means["own"], means["inline"])
    assert not np.array_equal(means["own"], means["softmax"])


def test_analyses_that_do_not_take_a_layers_geometry_say_why(tmp_path, attnscope_bin):
    """InLine-PVT 'IS': stage 1 (InLine, the root's shape) is read by every analysis with
    --layers; stage 2 (softmax over keys from a reduced grid) is refused by the analyses that
    do not take it, with their reason and the layers they can read; distance, entropy, rank,
    census and mask measure it (test_geometry.py checks their values)."""
    path = tmp_path / "ipvt.h5"
    torch.manual_seed(0)
    dump_model(FLattenPVT(attn_type="IS", sr_ratios=(1, 2)).eval(), image_loader(2, size=32),
               str(path), dtype="float32")
    for command in ("distance", "entropy", "rank"):
        r = _run(attnscope_bin, command, "--dump", path, "--out", tmp_path / f"{command}-all",
                 "--threads", 1)
        assert r.returncode == 0, (command, r.stdout, r.stderr)
        rows = _rows(tmp_path / f"{command}-all", *HYBRID_ROWS[command])
        assert (2, 0) in {(int(k[-2]), int(k[-1])) for k in rows}, (command, rows)
    r = _run(attnscope_bin, "census", "--dump", path, "--out", tmp_path / "census-all",
             "--threads", 1)
    assert r.returncode == 0, (r.stdout, r.stderr)
    rows = _rows(tmp_path / "census-all", "census.csv", ("weights",))
    assert (2, 0) in {(int(k[-2]), int(k[-1])) for k in rows}, rows
    r = _run(attnscope_bin, "mask", "--dump", path, "--out", tmp_path / "mask-all",
             "--threads", 1)
    assert r.returncode == 0, (r.stdout, r.stderr)
    rows = _rows(tmp_path / "mask-all", *HYBRID_ROWS["mask"])
    assert 2 in {int(k[-2]) for k in rows}, rows
    reasons = {"sinks": "the measure is not defined there", "spikiness": "not measured yet"}
    for command, why in reasons.items():
        r = _run(attnscope_bin, command, "--dump", path, "--out", tmp_path / command,
                 "--threads", 1)
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        line = r.stderr.strip().splitlines()[-1]
        assert "/layers/2 (model layer 2)" in line and why in line and \
            "layers of the root's shape: --layers 0,1" in line and \
            "keys 2x2 (spatial reduction)" in line, (command, line)
        ok = _run(attnscope_bin, command, "--dump", path, "--out", tmp_path / f"{command}-01",
                  "--layers", "0,1", "--threads", 1)
        assert ok.returncode == 0, (command, ok.stdout, ok.stderr)
        if command in HYBRID_ROWS:  # one head each: no rows of the second head stage 2 has
            csv, cols = HYBRID_ROWS[command]
            rows = _rows(tmp_path / f"{command}-01", csv, cols)
            assert {(int(k[-2]), int(k[-1])) for k in rows} == {(0, 0), (1, 0)}, (command, rows)
    info = _run(attnscope_bin, "info", "--check-values", path)  # reads every layer's shape
    assert info.returncode == 0 and "values      all finite" in info.stdout, info.stderr


def test_a_layer_attribute_naming_no_family_is_an_error(tmp_path, attnscope_bin):
    path = tmp_path / "d.h5"
    dump_model(InLineDeiT(depth=2).eval(), image_loader(2, size=28), str(path))
    with h5py.File(path, "a") as f:
        f["layers/1"].attrs["attention_family"] = "nosuchfamily"
    r = _run(attnscope_bin, "info", path)
    assert r.returncode != 0 and "/layers/1 attribute 'attention_family'" in r.stderr \
        and "'nosuchfamily:identity@code'" in r.stderr, r.stderr


def test_weights_are_refused_for_the_linear_time_modules(tmp_path):
    with pytest.raises(ValueError, match=r"InLine DeiT \(InLineAttention\): the module never forms "
                                         r"the attention weights"):
        dump_model(InLineDeiT(depth=1).eval(), image_loader(2, size=28), str(tmp_path / "d.h5"),
                   with_attn=True)


def test_the_refusals_registry_is_the_builds(attnscope_bin):
    """The dumper refuses a recognised family that attention.FAMILY_TABLE lacks; that table and
    the families of field_families.py (those with per-layer data; the released MALA, `mala` in
    `code+rope`, is the registry's `mala_rope`) must list exactly the families of `attnscope info
    --families`, so the refusal is the build's."""
    from attnscope_dump.attention import FAMILY_TABLE
    from attnscope_dump.field_families import FIELD_FAMILIES
    r = _run(attnscope_bin, "info", "--families")
    assert r.returncode == 0, r.stderr
    built = [line.strip() for line in r.stdout.splitlines() if line and not line[0].isspace()]
    python = set(FAMILY_TABLE) | {"mala_rope" if f == "mala" else f for f in FIELD_FAMILIES}
    assert sorted(built) == sorted(python), (built, sorted(python))
