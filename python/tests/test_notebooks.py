"""Notebook smoke tests: `attnscope` analyses a tiny synthetic dump of each family, and the figure
notebooks execute headless on those results and write their PNGs. The notebooks draw the models
ATTNSCOPE_MODELS names (scripts/figures.sh exports it): here the four families, or these and an
"inline-localres" model (one more InLine dump), as the 197-token set has."""
import json
import os
import subprocess
import sys

from attnscope_dump.figures import FAMILIES
from conftest import PYTHON_DIR, REPO

SYNTH_MAPS = {"softmax": "none", "linear": "relu", "inline": "identity", "mala": "elu1"}


def _run(cmd, models=FAMILIES):
    env = {**os.environ, "ATTNSCOPE_MODELS": " ".join(models)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}: {r.stderr}"
    return r


def test_locality_notebook_on_tiny_dumps(tmp_path, attnscope_bin):
    results = tmp_path / "results"
    for fam in FAMILIES:
        dump = tmp_path / f"{fam}.h5"
        _run([attnscope_bin, "synth", "--out", str(dump), "--layers", "2", "--heads", "2",
              "--grid-height", "4", "--grid-width", "4", "--prefix", "1", "--head-dim", "8",
              "--images", "3", "--family", fam, "--convention", "code",
              "--feature-map", SYNTH_MAPS[fam]])
        _run([attnscope_bin, "locality", "--dump", str(dump), "--out",
              str(results / f"locality-{fam}"), "--window", "3"])
        meta = json.loads((results / f"locality-{fam}" / "locality.json").read_text())
        assert "command" in meta, f"locality.json of {fam} has no 'command'"
    figures = tmp_path / "figures"
    _run([sys.executable, os.path.join(PYTHON_DIR, "run_notebooks.py"), "--results", str(results),
          "--figures", str(figures), os.path.join(REPO, "notebooks", "inline_fig3_locality.ipynb")])
    png = figures / "inline_fig3_locality.png"
    assert png.exists() and png.stat().st_size > 10_000, f"{png} missing or nearly empty"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_confusion_sensitivity_notebook_on_tiny_dumps(tmp_path, attnscope_bin):
    """Every family on every tiny model's Q and K at three radii: the notebook finds the sweep,
    checks that its commands differ only in model and radius, and writes its PNG."""
    results = tmp_path / "results"
    variants = ",".join(f"{fam}:{SYNTH_MAPS[fam]}@code" if SYNTH_MAPS[fam] != "none"
                        else f"{fam}@code" for fam in FAMILIES)
    for fam in FAMILIES:
        dump = tmp_path / f"vit7-{fam}-fmnist.h5"
        _run([attnscope_bin, "synth", "--out", str(dump), "--layers", "2", "--heads", "2",
              "--grid-height", "4", "--grid-width", "4", "--prefix", "1", "--head-dim", "8",
              "--images", "3", "--family", fam, "--convention", "code",
              "--feature-map", SYNTH_MAPS[fam]])
        for eps in ("1e-3", "1e-2", "0.3"):
            _run([attnscope_bin, "confusion", "--dump", str(dump), "--out",
                  str(results / f"confusion-eps-{fam}-{eps}"), "--variant", variants,
                  "--eps", eps])
    figures = tmp_path / "figures"
    r = _run([sys.executable, os.path.join(PYTHON_DIR, "run_notebooks.py"), "--results",
              str(results), "--figures", str(figures),
              os.path.join(REPO, "notebooks", "confusion_sensitivity.ipynb")])
    png = figures / "confusion_sensitivity.png"
    assert png.exists() and png.stat().st_size > 10_000, f"{png} missing or nearly empty: {r.stdout}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_confusion_per_layer_notebook_on_tiny_dumps(tmp_path, attnscope_bin):
    """InLine Fig. 2 with its per-layer panel and the filtered counts: five tiny models (the four
    families and a second InLine one, named as the 197-token set names them), each under its own
    family and linear attention, once over every token and once with a token mask."""
    import h5py
    import numpy as np
    results = tmp_path / "results"
    models = ("softmax", "linear", "inline", "inline-localres", "mala")
    for i, m in enumerate(models):
        fam = m.split("-")[0]
        dump = tmp_path / f"{m}.h5"
        _run([attnscope_bin, "synth", "--out", str(dump), "--layers", "2", "--heads", "2",
              "--grid-height", "4", "--grid-width", "4", "--prefix", "1", "--head-dim", "8",
              "--images", "3", "--family", fam, "--convention", "code", "--seed", str(i),
              "--feature-map", SYNTH_MAPS[fam], "--plant-duplicates", "1"])
        with h5py.File(dump, "a") as f:  # the first four grid tokens of every image left out
            mask = np.zeros((3, 17), dtype=np.uint8)
            mask[:, 1:5] = 1
            f.create_dataset("token_masks/corner", data=mask)
        own = "linear:relu@code" if fam == "linear" else (
            f"{fam}:{SYNTH_MAPS[fam]}@code" if SYNTH_MAPS[fam] != "none" else f"{fam}@code")
        variants = own if fam == "linear" else f"{own},linear:relu@code"
        for suffix, extra in (("", []), ("-no-constant", ["--exclude-tokens", "mask:token_masks/corner"])):
            _run([attnscope_bin, "confusion", "--dump", str(dump), "--out",
                  str(results / f"confusion-{m}{suffix}"), "--variant", variants, *extra])
    figures = tmp_path / "figures"
    r = _run([sys.executable, os.path.join(PYTHON_DIR, "run_notebooks.py"), "--results",
              str(results), "--figures", str(figures),
              os.path.join(REPO, "notebooks", "inline_fig2_confusion.ipynb")], models=models)
    png = figures / "inline_fig2_confusion.png"
    assert png.exists() and png.stat().st_size > 10_000, f"{png} missing or nearly empty: {r.stdout}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_vit_diagnostics_notebook_on_tiny_dumps(tmp_path, attnscope_bin):
    """distance, entropy, rank and rollout on a tiny dump of each family: the notebook draws both
    of its PNGs from their result files."""
    results = tmp_path / "results"
    for fam in FAMILIES:
        dump = tmp_path / f"{fam}.h5"
        _run([attnscope_bin, "synth", "--out", str(dump), "--layers", "2", "--heads", "2",
              "--grid-height", "4", "--grid-width", "4", "--prefix", "1", "--head-dim", "8",
              "--images", "3", "--family", fam, "--convention", "code",
              "--feature-map", SYNTH_MAPS[fam]])
        for command in ("distance", "entropy", "rank", "rollout"):
            _run([attnscope_bin, command, "--dump", str(dump), "--out",
                  str(results / f"{command}-{fam}")])
    figures = tmp_path / "figures"
    _run([sys.executable, os.path.join(PYTHON_DIR, "run_notebooks.py"), "--results", str(results),
          "--figures", str(figures), os.path.join(REPO, "notebooks", "vit_diagnostics.ipynb")])
    for name in ("vit_diagnostics", "vit_rollout"):
        png = figures / f"{name}.png"
        assert png.exists() and png.stat().st_size > 10_000, f"{png} missing or nearly empty"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_live_analysis_notebook_on_a_committed_model(tmp_path, attnscope_bin):
    """The notebook runs a committed model live (attnscope.analyze, the module built beside
    $ATTNSCOPE) over 32 Fashion-MNIST test images and draws its figure from the result sets."""
    import pytest
    from attnscope_dump import data
    from attnscope_dump.result_set import verify
    build_python = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(attnscope_bin))),
                                "python")
    if not os.path.isdir(os.path.join(build_python, "attnscope")):
        pytest.skip(f"the Python module was not built ({build_python}/attnscope is missing)")
    if not os.path.isdir(data.DEFAULT_ROOT):
        pytest.skip(f"Fashion-MNIST is not installed ({data.DEFAULT_ROOT})")
    results, figures = tmp_path / "results", tmp_path / "figures"
    env = {**os.environ, "ATTNSCOPE_PYTHON": build_python, "ATTNSCOPE_LIVE_IMAGES": "32",
           "ATTNSCOPE_LIVE_MODEL": "vit7-softmax-fmnist"}
    r = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "run_notebooks.py"), "--results",
                        str(results), "--figures", str(figures),
                        os.path.join(REPO, "notebooks", "live_analysis.ipynb")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    png = figures / "live_analysis.png"
    assert png.exists() and png.stat().st_size > 10_000, f"{png} missing or nearly empty"
    live = results / "live-vit7-softmax-fmnist"
    meta = verify(str(live / "locality" / "locality.json"))
    assert meta["parameters"]["images"] == 32
    rows = (live / "locality" / "locality.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 4 * 2  # four variants x the model's 4 layers x 2 heads
