"""attnscope.analyze: a model analysed live, batch by batch, publishes the result set the command
writes for a dump of the same images (the CSV files byte for byte, a manifest that verifies), and
its peak memory does not grow with the number of images."""
import os
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR, image_loader, tiny_vit
from attnscope_dump import dump_model
from attnscope_dump.result_set import verify


@pytest.mark.parametrize("family,layers", [("softmax", None), ("inline", [1, 0])])
def test_analyze_equals_the_cli_on_a_dump_of_the_same_images(attnscope_module, attnscope_bin,
                                                              tmp_path, family, layers):
    model = tiny_vit(family, depth=2, heads=2)
    loader = image_loader(12, batch=5)  # batches of 5, 5 and 2 images
    variants = ["softmax", "inline", "mala", "linear:relu"]
    dump = tmp_path / "d.h5"
    dump_model(model, loader, str(dump), layers=layers, dtype="float16", with_out=False)
    manifests = attnscope_module.analyze(model, loader, ["locality", "census", "confusion"],
                                         layers=layers,
                                         out=str(tmp_path / "live"), variants=variants,
                                         dtype="float16")
    confusion = ["confusion_per_head.csv", "confusion_per_layer.csv", "confusion_histogram.csv",
                 "confusion_per_image.csv", "confusion_per_image_layer.csv"]
    for name, csvs in (("locality", ["locality.csv"]), ("census", ["census.csv"]),
                       ("confusion", confusion)):
        cli = tmp_path / "cli" / name
        r = subprocess.run([attnscope_bin, name, "--dump", str(dump), "--out", str(cli),
                            "--variant", ",".join(variants), "--threads", "2"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        live = tmp_path / "live" / name
        assert manifests[name] == str(live / f"{name}.json")
        verify(manifests[name])  # every file listed with its size and SHA-256
        assert sorted(os.listdir(live)) == sorted(os.listdir(cli)), (name, os.listdir(live))
        for csv in csvs:
            want, got = (cli / csv).read_text(), (live / csv).read_text()
            assert got == want, f"{family} layers={layers} {csv}:\nlive:\n{got}\ncommand:\n{want}"
        if name != "confusion":  # header + variant x layer x head
            assert len(want.splitlines()) == 1 + len(variants) * 2 * 2


@pytest.mark.parametrize("family,layers", [("mala", None), ("softmax", [1])])
def test_analyze_diagnostics_equal_the_cli(attnscope_module, attnscope_bin, tmp_path, family,
                                          layers):
    """entropy, distance and rank live: the CSV files byte for byte against the command's on a dump
    of the same images (rank with the model's out, so its collapse residual is compared too)."""
    model = tiny_vit(family, depth=2, heads=2)
    loader = image_loader(7, batch=3)  # batches of 3, 3 and 1 images
    variants = ["softmax", "inline", "mala"]
    dump = tmp_path / "d.h5"
    dump_model(model, loader, str(dump), layers=layers, dtype="float16", with_out=True)
    names = ["entropy", "distance", "rank"]
    manifests = attnscope_module.analyze(model, loader, names, layers=layers,
                                         out=str(tmp_path / "live"), variants=variants,
                                         dtype="float16", bins=16)
    for name in names:
        cli = tmp_path / "cli" / name
        flags = [] if name == "rank" else ["--bins", "16"]
        r = subprocess.run([attnscope_bin, name, "--dump", str(dump), "--out", str(cli),
                            "--variant", ",".join(variants), "--threads", "2", *flags],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        live = tmp_path / "live" / name
        verify(manifests[name])
        assert sorted(os.listdir(live)) == sorted(os.listdir(cli)), (name, os.listdir(live))
        for csv in (f"{name}.csv", f"{name}_histogram.csv"):
            want, got = (cli / csv).read_text(), (live / csv).read_text()
            assert got == want, f"{family} layers={layers} {csv}:\nlive:\n{got}\ncommand:\n{want}"
        rows = (cli / f"{name}.csv").read_text().splitlines()
        assert len(rows) == 1 + len(variants) * len(layers or [0, 1]) * 2
        if name == "rank":  # the residual was measured, not left out
            assert all(not r.split(",")[-5] == "nan" for r in rows[1:]), rows[1]


def test_analyze_refuses_bad_arguments(attnscope_module, tmp_path):
    model = tiny_vit("softmax")
    with pytest.raises(ValueError, match="analyses: expected some of locality, census, confusion, "
                                         "entropy, distance, rank, got 'bogus'"):
        attnscope_module.analyze(model, image_loader(2), ["bogus"], out=str(tmp_path))
    with pytest.raises(ValueError, match="layer 5 out of range"):
        attnscope_module.analyze(model, image_loader(2), ["census"], layers=[5], out=str(tmp_path))
    with pytest.raises(ValueError, match="the loader yielded no images"):
        attnscope_module.analyze(model, [], ["census"], out=str(tmp_path))
    with pytest.raises(ValueError, match="patch_size: expected a positive size in pixels"):
        attnscope_module.analyze(model, image_loader(2), ["distance"], patch_size=0.0,
                                 out=str(tmp_path))
    with pytest.raises(ValueError, match="bins: expected 1 to 1000000 bins, found 0"):
        attnscope_module.analyze(model, image_loader(2), ["entropy"], bins=0, out=str(tmp_path))
    for bad in (-3, 0, 1.5):  # -3 once analysed one image (the batch sliced as x[:-3])
        with pytest.raises(ValueError, match="max_images: expected a positive number of images"):
            attnscope_module.analyze(model, image_loader(2), ["census"], max_images=bad,
                                     out=str(tmp_path))
    with pytest.raises(ValueError, match="eps: expected a finite radius >= 0, found nan"):
        attnscope_module.analyze(model, image_loader(2), ["confusion"], eps=float("nan"),
                                 out=str(tmp_path))
    with pytest.raises(ValueError, match="out: expected a results folder"):
        attnscope_module.analyze(model, image_loader(2), ["census"], out="")
    assert not list(tmp_path.iterdir()), "a refused call wrote something"
    assert not model.training  # tiny_vit is in eval mode, and analyze restored it


CHILD = r"""
import importlib.util, resource, sys, torch
sys.path.insert(0, sys.argv[1])
package = sys.argv[2] + "/attnscope"
spec = importlib.util.spec_from_file_location("attnscope", package + "/__init__.py",
                                              submodule_search_locations=[package])
attnscope = importlib.util.module_from_spec(spec); sys.modules["attnscope"] = attnscope
spec.loader.exec_module(attnscope)
from attnscope_dump.models import ViTConfig, build_model
torch.set_num_threads(1)
n = int(sys.argv[3])
model = build_model(ViTConfig(family="softmax", embed_dim=32, depth=2, num_heads=2), seed=0)
def batches():
    g = torch.Generator().manual_seed(0)
    for _ in range(n // 64):
        yield torch.randn(64, 1, 28, 28, generator=g), torch.zeros(64, dtype=torch.long)
attnscope.analyze(model, batches(), ["locality", "census", "confusion"], out=sys.argv[4],
                  dtype="float32")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


def test_analyze_memory_does_not_grow_with_images(attnscope_module, tmp_path):
    build_python = os.path.dirname(os.path.dirname(attnscope_module.__file__))

    def peak_kib(n):
        r = subprocess.run([sys.executable, "-c", CHILD, PYTHON_DIR, build_python, str(n),
                            str(tmp_path / f"r{n}")], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip().splitlines()[-1])

    small, big = peak_kib(64), peak_kib(2048)
    # q and k of 2048 images (2 layers x 2 heads x 50 tokens x 16 dims, float32) are 52 MB:
    # holding them would show.
    growth_mib = (big - small) / 1024
    assert growth_mib < 12, f"peak RSS grew {growth_mib:.1f} MiB from 64 to 2048 images"
