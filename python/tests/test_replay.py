"""attnscope replay (the C++ forward pass) against the PyTorch model it was exported from: the same
logits, for every family and map of the models (MODEL_VARIANTS), with and without InLine's local
residual, at the 7x7 and the 197-token grid."""
from __future__ import annotations

import csv
import json
import subprocess

import h5py
import numpy as np
import pytest
import torch

from attnscope_dump import dump_model
from attnscope_dump.weights_io import save_weights
from conftest import MODEL_VARIANT_IDS, MODEL_VARIANTS, image_loader, tiny_vit


def _replay(attnscope_bin, model, tmp_path, n_images=6, patch=4):
    weights, dump = tmp_path / "w.h5", tmp_path / "d.h5"
    save_weights(model, str(weights))
    with h5py.File(weights) as f:
        name = f.attrs["model_name"]  # the dump names its model as the weights do
    dump_model(model, image_loader(n_images, size=28, batch=3), str(dump), dtype="float16",
               with_images=True, model_name=name)
    r = subprocess.run([attnscope_bin, "replay", "--model", str(weights), "--dump", str(dump),
                        "--out", str(tmp_path / "r"), "--intervention", "none,local:3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    got = {}
    for row in csv.DictReader(open(tmp_path / "r" / "replay_logits.csv")):
        got.setdefault(row["intervention"], []).append([float(v) for v in row["logits"].split()])
    with h5py.File(dump) as f:
        x = torch.from_numpy(f["images"][()])
    with torch.no_grad():
        want = model(x).numpy()
    return {k: np.array(v) for k, v in got.items()}, want, json.load(open(tmp_path / "r" / "replay.json"))


@pytest.mark.parametrize("family,fmap", MODEL_VARIANTS, ids=MODEL_VARIANT_IDS)
@pytest.mark.parametrize("local_residual", [False, True], ids=["plain", "localres"])
def test_replay_logits_equal_pytorch(family, fmap, local_residual, tmp_path, attnscope_bin):
    model = tiny_vit(family, seed=3, depth=2, dim=32, heads=2, image_size=28,
                     feature_map=fmap, local_residual=local_residual)
    got, want, meta = _replay(attnscope_bin, model, tmp_path)
    err = np.abs(got["none"] - want).max() / np.abs(want).max()
    assert err <= 1e-4, f"{family}:{fmap} localres={local_residual}: logits differ by {err}"
    assert meta["results"]["rows"][0]["dump_logits_max_rel_error"] <= 1e-4
    # The mask acts: a dropped intervention would give the same logits bit for bit (replay is
    # deterministic); freshly initialised models attend weakly, so the change can be small.
    assert np.abs(got["local:3"] - got["none"]).max() > 1e-6 * np.abs(want).max()


def test_replay_197_tokens_with_local_residual(tmp_path, attnscope_bin):
    """The DeiT-T token count (patch 2: 14x14 + CLS) with the local residual."""
    model = tiny_vit("inline", seed=4, depth=2, dim=32, heads=2, image_size=28, patch=2,
                     local_residual=True)
    got, want, _ = _replay(attnscope_bin, model, tmp_path, n_images=3)
    assert np.abs(got["none"] - want).max() <= 1e-4 * np.abs(want).max()
    # Control: the residual matters, so a forward pass without it would have failed the check.
    for block in model.blocks:
        block.attn.local_residual = None
    with h5py.File(tmp_path / "d.h5") as f:
        x = torch.from_numpy(f["images"][()])
    with torch.no_grad():
        without = model(x).numpy()
    assert np.abs(without - want).max() > 1e-3 * np.abs(want).max()
