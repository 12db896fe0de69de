"""The module attnscope and the command line give the same numbers on the same dump: each layer's
[images, heads, tokens, dim] arrays read with h5py through the module, against the rows of that
layer in the command's CSV files. Counts are compared exactly, and so are the floating-point
columns as the CSV prints them (17 significant digits for the census, 10 for the others)."""
import csv
import subprocess

import h5py
import pytest

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
