"""The module attnscope and the command line give the same numbers on the same dump: each layer's
[images, heads, tokens, dim] arrays read with h5py through the module, against the rows of that
layer in the command's CSV files. Counts are compared exactly, and so are the floating-point
columns as the CSV prints them (17 significant digits for the census, 10 for the others)."""
import csv
import math
import subprocess

import h5py
import numpy as np
import pytest

from attnscope_dump import dump_model
from conftest import image_loader, tiny_vit

VARIANTS = ["softmax", "linear:relu", "inline", "mala"]


@pytest.fixture(scope="module", params=["f32", "f16"])
def synth_dump(request, attnscope_bin, tmp_path_factory):
    """A small synthetic dump with planted confusions (duplicates, collinear queries)."""
    d = tmp_path_factory.mktemp(f"synth-{request.param}")
    dump = d / "d.h5"
    subprocess.run([attnscope_bin, "synth", "--out", str(dump), "--layers", "2", "--heads", "2",
                    "--images", "5", "--grid-height", "5", "--grid-width", "5", "--head-dim", "8",
                    "--dtype", request.param, "--plant-duplicates", "1", "--plant-collinear", "2",
                    "--seed", "3"], check=True, capture_output=True, timeout=120)
    return dump


def run_cli(attnscope_bin, command, dump, out, *flags):
    r = subprocess.run([attnscope_bin, command, "--dump", str(dump), "--out", str(out),
                        "--variant", ",".join(VARIANTS), "--threads", "2", *flags],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"attnscope {command}: {r.stdout}{r.stderr}"
    return out


def layers(dump):
    """(layer, q, k, attributes) of every layer, q and k as stored (float16 or float32)."""
    with h5py.File(dump, "r") as f:
        attrs = dict(f.attrs)
        for name in sorted(f["layers"], key=int):
            yield int(name), f["layers"][name]["q"][()], f["layers"][name]["k"][()], attrs


def read_rows(path):
    """The CSV's rows as printed (text, not parsed numbers)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def rows_of(rows, variant, layer):
    """The rows of one variant and layer, by head."""
    return {int(r["head"]): r for r in rows if r["variant"] == variant and int(r["layer"]) == layer}


def text(x, digits):
    """A double as the command prints it with std::setprecision(digits)."""
    return f"{x:.{digits}g}"


def test_confusion_counts_equal_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    out = run_cli(attnscope_bin, "confusion", synth_dump, tmp_path / "c")
    csv_rows = read_rows(str(out / "confusion_per_head.csv"))
    compared = 0
    total_pairs = 0
    for layer, q, k, attrs in layers(synth_dump):
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.confusion(q, k, spec, scale=float(attrs["scale"]))
            for head, row in rows_of(csv_rows, name, layer).items():
                got = (int(r["pairs"][:, head].sum()), int(r["degenerate_rows"][:, head].sum()),
                       int(r["degenerate_pairs"][:, head].sum()))
                want = (int(row["count"]), int(row["degenerate_rows"]), int(row["degenerate_pairs"]))
                assert got == want, f"{synth_dump.name} {name} layer {layer} head {head}: {got} != {want}"
                compared += 1
                total_pairs += got[0]
    assert compared == 2 * 2 * len(VARIANTS)
    assert total_pairs > 0  # the planted pairs were found: the comparison is not of zeros only


def test_locality_equals_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    out = run_cli(attnscope_bin, "locality", synth_dump, tmp_path / "l")
    csv_rows = read_rows(str(out / "locality.csv"))
    compared = 0
    for layer, q, k, attrs in layers(synth_dump):
        grid = (int(attrs["prefix_tokens"]), int(attrs["grid_height"]), int(attrs["grid_width"]))
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.locality(q, k, spec, grid, scale=float(attrs["scale"]))
            for head, row in rows_of(csv_rows, name, layer).items():
                for column in ("mean", "std", "min", "max"):
                    got = text(r[column][head], 10)
                    assert got == row[column], f"{name} layer {layer} head {head} {column}: {got} != {row[column]}"
                assert int(r["queries"][head]) == int(row["queries"])
                assert text(r["uniform_baseline"], 10) == row["uniform_baseline"]
                compared += 1
    assert compared == 2 * 2 * len(VARIANTS)


def test_census_equals_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    out = run_cli(attnscope_bin, "census", synth_dump, tmp_path / "n")
    csv_rows = read_rows(str(out / "census.csv"))
    compared = 0
    for layer, q, k, attrs in layers(synth_dump):
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.census(q, k, spec, scale=float(attrs["scale"]))
            for head, row in rows_of(csv_rows, name, layer).items():
                for column in ("weights", "negative", "zero", "rows_not_summing_to_one"):
                    assert int(r[column][head]) == int(row[column]), (name, layer, head, column)
                for column in ("most_negative", "max_row_sum_error"):
                    got = text(r[column][head], 17)
                    assert got == row[column], f"{name} layer {layer} head {head} {column}: {got} != {row[column]}"
                compared += 1
    assert compared == 2 * 2 * len(VARIANTS)


def test_entropy_totals_equal_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    out = run_cli(attnscope_bin, "entropy", synth_dump, tmp_path / "e")
    csv_rows = read_rows(str(out / "entropy.csv"))
    compared = 0
    for layer, q, k, attrs in layers(synth_dump):
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.totals("entropy", q, k, spec, scale=float(attrs["scale"]))
            assert r["images"] == q.shape[0]
            for head, row in rows_of(csv_rows, name, layer).items():
                h = r["heads"][head]
                e = h["entropy"]
                assert text(h["entropy_images"]["mean"], 10) == row["mean_entropy"], (name, layer, head)
                assert text(h["entropy_images"]["std"], 10) == row["image_std"], (name, layer, head)
                assert text(e["std"], 10) == row["query_std"], (name, layer, head)
                if e["count"]:
                    assert text(e["min"], 10) == row["min"] and text(e["max"], 10) == row["max"]
                assert e["count"] == int(row["queries"])
                assert h["degenerate_rows"] == int(row["degenerate_rows"])
                assert h["negative_weight_rows"] == int(row["negative_weight_rows"])
                assert text(h["negative_mass"]["mean"], 10) == row["mean_negative_mass"]
                compared += 1
    assert compared == 2 * 2 * len(VARIANTS)


def layers_qkv(dump):
    """(layer, q, k, v, attributes) of every layer, as stored."""
    with h5py.File(dump, "r") as f:
        attrs = dict(f.attrs)
        for name in sorted(f["layers"], key=int):
            g = f["layers"][name]
            yield int(name), g["q"][()], g["k"][()], g["v"][()], attrs


def grid_of(attrs):
    return (int(attrs["prefix_tokens"]), int(attrs["grid_height"]), int(attrs["grid_width"]))


def test_distance_totals_equal_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    out = run_cli(attnscope_bin, "distance", synth_dump, tmp_path / "d")
    csv_rows = read_rows(str(out / "distance.csv"))
    hist = read_rows(str(out / "distance_histogram.csv"))
    compared = 0
    for layer, q, k, attrs in layers(synth_dump):
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.totals("distance", q, k, spec, scale=float(attrs["scale"]), grid=grid_of(attrs))
            for head, row in rows_of(csv_rows, name, layer).items():
                h = r["heads"][head]
                d = h["distance"]
                assert text(h["distance_images"]["mean"], 10) == row["mean_distance"], (name, layer, head)
                assert text(h["distance_images"]["std"], 10) == row["image_std"]
                assert text(d["std"], 10) == row["query_std"]
                assert text(d["min"], 10) == row["min"] and text(d["max"], 10) == row["max"]
                assert d["count"] == int(row["queries"])
                assert text(h["grid_mass"]["mean"], 10) == row["mean_grid_mass"]
                for c in ("degenerate_rows", "negative_weight_rows", "rows_without_grid_mass"):
                    assert h[c] == int(row[c]), (name, layer, head, c)
                want = [int(x["queries"]) for x in hist
                        if x["variant"] == name and int(x["layer"]) == layer and int(x["head"]) == head]
                assert h["histogram"] == want, (name, layer, head)
                compared += 1
    assert compared == 2 * 2 * len(VARIANTS)


def test_rank_totals_equal_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    out = run_cli(attnscope_bin, "rank", synth_dump, tmp_path / "r")
    csv_rows = read_rows(str(out / "rank.csv"))
    compared = 0
    for layer, q, k, v, attrs in layers_qkv(synth_dump):
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.totals("rank", q, k, spec, v=v, scale=float(attrs["scale"]))
            for head, row in rows_of(csv_rows, name, layer).items():
                h = r["heads"][head]
                assert h["rank"]["count"] == int(row["images"])
                for quantity, columns in (("rank", ("mean", "min", "max")), ("erank", ("mean",)),
                                          ("kv_rank", ("mean", "min", "max")),
                                          ("kv_erank", ("mean",)),
                                          ("k_ratio", ("mean", "min", "max")),
                                          ("k1_ratio", ("mean", "min", "max")),
                                          ("fk_ratio", ("mean", "min", "max")),
                                          ("fk1_ratio", ("mean", "min", "max"))):
                    for c in columns:
                        s = h[quantity]
                        got = "nan" if s["count"] == 0 else text(s[c], 10)
                        assert got == row[f"{c}_{quantity}"], (name, layer, head, quantity, c)
                assert row["mean_out_residual"] == "nan"  # synth dumps have no out
                for c in ("k_full_rank", "k1_full_rank", "fk_full_rank", "fk1_full_rank"):
                    assert h[c] == int(row[f"{c}_images"]), (name, layer, head, c)
                assert h["degenerate_rows"] == int(row["degenerate_rows"])
                compared += 1
    assert compared == 2 * 2 * len(VARIANTS)


def test_sinks_equal_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    """Per key, the mean received weight and the images in which it was a sink; per head, the
    images with a sink and the degenerate rows; per layer and token, the norm ratio of the values
    over the heads. The module's per-image results are folded here as the command folds them."""
    at = attnscope_module
    threshold = 0.2  # low enough that some heads of the planted dump have a sink
    out = run_cli(attnscope_bin, "sinks", synth_dump, tmp_path / "s", "--threshold", str(threshold))
    keys = read_rows(str(out / "sinks_keys.csv"))
    heads = read_rows(str(out / "sinks.csv"))
    norms = read_rows(str(out / "sinks_norms.csv"))
    compared = sinks_found = 0
    for layer, q, k, v, attrs in layers_qkv(synth_dump):
        images, nh, tokens = q.shape[0], q.shape[1], q.shape[2]
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.sinks(q, k, spec, threshold=threshold, scale=float(attrs["scale"]))
            assert r["received"].shape == (images, nh, tokens)
            for head in range(nh):
                total = [0.0] * tokens
                sink_images = [0] * tokens
                valid = with_sink = 0
                for i in range(images):
                    if r["valid_rows"][i, head] == 0:
                        continue
                    valid += 1
                    for j in range(tokens):
                        total[j] += float(r["received"][i, head, j])
                    with_sink += bool(r["sink_keys"][i][head])
                    for j in r["sink_keys"][i][head]:
                        sink_images[j] += 1
                n = valid if valid else 1
                want = {int(x["token"]): x for x in keys if x["variant"] == name
                        and int(x["layer"]) == layer and int(x["head"]) == head}
                assert len(want) == tokens
                for j in range(tokens):
                    assert text(total[j] / n, 10) == want[j]["mean_received"], (name, layer, head, j)
                    assert sink_images[j] == int(want[j]["sink_images"])
                row = rows_of(heads, name, layer)[head]
                assert (valid, with_sink) == (int(row["images"]), int(row["sink_images"]))
                assert int(r["degenerate_rows"][:, head].sum()) == int(row["degenerate_rows"])
                sinks_found += with_sink
                compared += 1
        n = at.token_norms(v)
        assert n["ratio"].shape == (images, tokens)
        want = {int(x["token"]): x for x in norms if int(x["layer"]) == layer}
        for j in range(tokens):
            s = 0.0
            for i in range(images):
                s += float(n["ratio"][i, j])
            assert text(s / images, 10) == want[j]["mean_norm_ratio"], (layer, j)
            assert int(n["high"][:, j].sum()) == int(want[j]["high_norm_images"])
    assert compared == 2 * 2 * len(VARIANTS)
    assert sinks_found > 0  # not a comparison of empty sets


def test_rollout_equals_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    for fusion in ("mean", "min"):
        out = run_cli(attnscope_bin, "rollout", synth_dump, tmp_path / f"r-{fusion}",
                      "--fusion", fusion)
        rows = read_rows(str(out / "rollout.csv"))
        data = list(layers(synth_dump))
        qs, ks = [d[1] for d in data], [d[2] for d in data]
        scale = float(data[0][3]["scale"])
        compared = 0
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.rollout(qs, ks, spec, fusion=fusion, scale=scale)
            for x in rows:
                if x["variant"] != name:
                    continue
                got = text(float(r["cls"][int(x["image"]), int(x["token"])]), 10)
                assert got == x["value"], (fusion, name, x["image"], x["token"])
                compared += 1
        assert compared == len(VARIANTS) * qs[0].shape[0] * qs[0].shape[2]


def test_mask_equals_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    at = attnscope_module
    masks = "local:3,random:4"
    out = run_cli(attnscope_bin, "mask", synth_dump, tmp_path / "m", "--mask", masks, "--seed", "5")
    rows = read_rows(str(out / "mask_per_head.csv"))
    compared = 0
    for layer, q, k, v, attrs in layers_qkv(synth_dump):
        for spec in VARIANTS:
            name = at.variant_name(spec)
            r = at.mask(q, k, v, spec, grid_of(attrs), masks=masks, seed=5, layer=layer,
                        scale=float(attrs["scale"]))
            for m in ("local:3", "random:4"):
                got = r[m]
                for x in rows:
                    if x["variant"] != name or x["mask"] != m or int(x["layer"]) != layer:
                        continue
                    h = int(x["head"])
                    assert int(got["values"][h]) == int(x["values"])
                    if int(x["values"]):
                        for c in ("change_mean", "change_std", "change_min", "change_max"):
                            assert text(got[c][h], 17) == x[c], (name, m, layer, h, c)
                    if int(got["removed_mass_queries"][h]):
                        for c in ("removed_mass_mean", "removed_mass_std"):
                            assert text(got[c][h], 17) == x[c], (name, m, layer, h, c)
                    for c in ("empty_rows", "degenerate_rows"):
                        assert int(got[c][h]) == int(x[c]), (name, m, layer, h, c)
                    assert int(got["unmeasured_heads"][h]) == int(x["unmeasured"])
                    compared += 1
    assert compared == 2 * 2 * len(VARIANTS) * 2


def test_verify_equals_the_cli(attnscope_module, attnscope_bin, tmp_path):
    import json
    r = subprocess.run([attnscope_bin, "verify", "--json", "--no-timing", "--trials", "5",
                        "--seed", "7", "--out", str(tmp_path / "v")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 3), r.stderr
    want = json.loads(r.stdout)["rows"]
    got = attnscope_module.verify(seed=7, trials=5)
    assert [g["check"] for g in got] == [w["check"] for w in want]
    for g, w in zip(got, want):
        for c in ("what", "trials", "unusable_trials", "threshold", "sense", "result"):
            assert g[c] == w[c], (g["check"], c)
        if w["margin"] is None:  # JSON has no NaN or infinity
            assert not math.isfinite(g["margin"]), g["check"]
        else:
            assert g["margin"] == w["margin"], g["check"]
        assert g["pass"] == (w["result"] == "PASS")
    assert len(got) > 20


def test_attention_map_equals_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    """Every map `attnscope maps` writes into maps.h5 (double, exactly) equals attention_map's for
    that image, layer, head and query token, bit for bit."""
    at = attnscope_module
    tokens = [0, 7, 13]
    out = run_cli(attnscope_bin, "maps", synth_dump, tmp_path / "m", "--tokens",
                  ",".join(map(str, tokens)), "--images", "0-4")
    compared = 0
    with h5py.File(out / "maps.h5", "r") as f:
        for layer, q, k, attrs in layers(synth_dump):
            for spec in VARIANTS:
                name = at.variant_name(spec)
                for token in tokens:
                    grid_w, prefix_w = at.attention_map(q, k, spec, grid_of(attrs), token,
                                                        scale=float(attrs["scale"]))
                    for image in range(q.shape[0]):
                        for head in range(q.shape[1]):
                            path = f"{name}/image_{image}/layer_{layer}/head_{head}/query_{token}"
                            if path not in f:  # the command writes no map of a degenerate row
                                assert not grid_w[image, head].any(), path
                                continue
                            d = f[path]
                            assert np.array_equal(d[()], grid_w[image, head]), path
                            assert np.array_equal(np.asarray(d.attrs["prefix_weights"]),
                                                  prefix_w[image, head]), path
                            compared += 1
    assert compared > 0.9 * 2 * len(VARIANTS) * len(tokens) * 5 * 2


def test_sweep_equals_the_cli(attnscope_module, attnscope_bin, synth_dump, tmp_path):
    """Each query `attnscope spikiness` samples, swept by sweep() on its head: the reference keys
    and every point (ratio and the row's spikiness) as spikiness.csv prints them."""
    at = attnscope_module
    out = run_cli(attnscope_bin, "spikiness", synth_dump, tmp_path / "s", "--samples", "6",
                  "--scales", "0.5:4:7", "--keys", "top,median", "--topk", "3", "--seed", "2")
    samples = read_rows(str(out / "spikiness_samples.csv"))
    points = read_rows(str(out / "spikiness.csv"))
    data = {layer: (q, k, attrs) for layer, q, k, attrs in layers(synth_dump)}
    compared = 0
    for s in samples:
        q, k, attrs = data[int(s["layer"])]
        image, head, token = int(s["image"]), int(s["head"]), int(s["token"])
        spec = next(v for v in VARIANTS if at.variant_name(v) == s["variant"])
        r = at.sweep(q[image, head], k[image, head], spec, token, scales="0.5:4:7",
                     keys="top,median", topk=3, scale=float(attrs["scale"]))
        assert (r["key_high"], r["key_low"]) == (int(s["key_high"]), int(s["key_low"])), s
        want = [p for p in points if p["variant"] == s["variant"] and p["sample"] == s["sample"]]
        assert len(want) == len(r["points"]) == 7
        for p, w in zip(r["points"], want):
            for c in ("scale", "ratio", "max_weight", "entropy", "effective_keys", "topk_mass"):
                assert text(p[c], 10) == w[c], (s, c, p[c], w[c])
            assert (p["negatives"], p["zeros"]) == (int(w["negatives"]), int(w["zeros"]))
            compared += 1
    assert compared == len(VARIANTS) * 6 * 7


@pytest.mark.parametrize("family", ["softmax", "inline", "mala"])
def test_outputs_and_weights_equal_recompute(attnscope_module, attnscope_bin, tmp_path, family):
    """outputs() and weights() in double on a dump's q, k, v give, against the model's own `out`
    and `attn` that the dumper captured, exactly the errors `attnscope recompute` reports per head
    (recompute.csv's out_max_abs_error and attn_max_abs_error, as it prints them): the module and
    the command compute the same outputs and weights."""
    at = attnscope_module
    dump = tmp_path / "d.h5"
    model = tiny_vit(family, seed=5, depth=2, dim=32, heads=2, image_size=28)
    dump_model(model, image_loader(3, size=28), str(dump), dtype="float32", with_attn=True)
    r = subprocess.run([attnscope_bin, "recompute", "--dump", str(dump), "--out",
                        str(tmp_path / "r"), "--threads", "2"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"attnscope recompute: {r.stdout}{r.stderr}"
    rows = read_rows(tmp_path / "r" / "recompute.csv")
    assert len(rows) == 4
    with h5py.File(dump, "r") as f:
        scale = float(f.attrs["scale"])
        for row in rows:
            layer, head = int(row["layer"]), int(row["head"])
            spec, convention = row["variant"].split("@")
            g = f["layers"][str(layer)]
            q, k, v, out, attn = (g[n][()].astype(np.float64) for n in ("q", "k", "v", "out", "attn"))
            o = at.outputs(q, k, v, spec, scale=scale, convention=convention)
            w = at.weights(q, k, spec, scale=scale, convention=convention)
            out_err = np.abs(o[:, head] - out[:, head]).max()
            attn_err = np.abs(w[:, head] - attn[:, head]).max()
            assert out_err > 0 and attn_err > 0  # float32 tensors: the comparison is not vacuous
            assert text(out_err, 9) == row["out_max_abs_error"], (row, out_err)
            assert text(attn_err, 9) == row["attn_max_abs_error"], (row, attn_err)
