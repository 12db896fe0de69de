"""Data-parallel dumping: dump_model(..., shard=i, num_shards=n) writes the i-th contiguous block of
the images, the blocks together are the whole dump, and attnscope reads the shards as one."""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest

from attnscope_dump import dump_model
from conftest import image_loader, tiny_vit

N_IMAGES, N_SHARDS = 11, 3


def _dump_shards(tmp_path, model, batches, **kw):
    paths = []
    for i in range(N_SHARDS):
        p = tmp_path / f"s{i}.h5"
        s = dump_model(model, batches, str(p), dtype="float32", with_images=True,
                       shard=i, num_shards=N_SHARDS, **kw)
        assert s.images == len(range(i * N_IMAGES // N_SHARDS, (i + 1) * N_IMAGES // N_SHARDS))
        paths.append(p)
    return paths


def test_shards_are_contiguous_blocks_of_the_whole_dump(tmp_path):
    model = tiny_vit("softmax", seed=3)
    batches = image_loader(N_IMAGES, batch=4)  # blocks [0,3) [3,7) [7,11) cut across batches
    whole = tmp_path / "whole.h5"
    dump_model(model, batches, str(whole), dtype="float32", with_images=True)
    paths = _dump_shards(tmp_path, model, batches)
    with h5py.File(whole) as w:
        names = []
        w.visit(lambda n: names.append(n) if isinstance(w[n], h5py.Dataset) else None)
        files = [h5py.File(p) for p in paths]
        try:
            firsts = [f.attrs["shard_first_image"] for f in files]
            assert firsts == [0, 3, 7]
            for i, f in enumerate(files):
                assert (f.attrs["shard_index"], f.attrs["num_shards"]) == (i, N_SHARDS)
                assert f.attrs["total_images"] == N_IMAGES
                for key in ("num_layers", "num_heads", "head_dim", "scale", "attention_family"):
                    assert f.attrs[key] == w.attrs[key]
            for name in names:
                joined = np.concatenate([f[name][()] for f in files])
                # The model runs on other batch compositions: equal up to float32 rounding.
                np.testing.assert_allclose(joined, w[name][()], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{name}: shards joined differ from the whole")
            # The inputs and labels are copied, not computed: exactly equal.
            np.testing.assert_array_equal(np.concatenate([f["images"][()] for f in files]),
                                          w["images"][()])
            np.testing.assert_array_equal(np.concatenate([f["labels"][()] for f in files]),
                                          w["labels"][()])
        finally:
            for f in files:
                f.close()


def test_max_images_is_split_and_dataset_length_is_used(tmp_path):
    model = tiny_vit("softmax", seed=3)
    batches = image_loader(20, batch=6)
    s = dump_model(model, batches, str(tmp_path / "a.h5"), shard=1, num_shards=2, max_images=9)
    assert s.images == 5  # images [4, 9) of the first nine
    with h5py.File(tmp_path / "a.h5") as f:
        assert f.attrs["shard_first_image"] == 4 and f.attrs["total_images"] == 9

    class Loader(list):
        dataset = list(range(20))  # a sized dataset: its length is the number of images

    s = dump_model(model, Loader(batches), str(tmp_path / "b.h5"), shard=3, num_shards=4)
    assert s.images == 5


@pytest.mark.parametrize("kw, message", [
    (dict(shard=3, num_shards=3), "0 <= shard < num_shards"),
    (dict(shard=-1, num_shards=3), "0 <= shard < num_shards"),
    (dict(shard=0), "give both"),
    (dict(shard=0, num_shards=12), "holds no image"),
])
def test_bad_shards_are_refused(tmp_path, kw, message):
    model = tiny_vit("softmax", seed=3)
    with pytest.raises(ValueError, match=message):
        dump_model(model, image_loader(N_IMAGES, batch=4), str(tmp_path / "d.h5"), **kw)
    assert os.listdir(tmp_path) == []


def test_unsized_loader_needs_max_images(tmp_path):
    model = tiny_vit("softmax", seed=3)
    batches = iter(image_loader(N_IMAGES, batch=4))
    with pytest.raises(ValueError, match="max_images"):
        dump_model(model, batches, str(tmp_path / "d.h5"), shard=0, num_shards=2)


def test_attnscope_reads_the_shards_as_one_dump(tmp_path, attnscope_bin):
    model = tiny_vit("softmax", seed=3)
    batches = image_loader(N_IMAGES, batch=4)
    paths = _dump_shards(tmp_path, model, batches)
    out = tmp_path / "loc"
    r = subprocess.run([attnscope_bin, "locality", "--dump", *map(str, paths), "--out", str(out),
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.loads((out / "locality.json").read_text())
    assert meta["inputs"]["dump"] == [str(p) for p in paths]
    assert meta["results"]["images"] == N_IMAGES
    # Given out of order, the sequence would not be the dump's: refused, naming both files.
    r = subprocess.run([attnscope_bin, "locality", "--dump", str(paths[1]), str(paths[0]),
                        "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert str(paths[0]) in r.stderr and str(paths[1]) in r.stderr and "shard" in r.stderr, r.stderr
