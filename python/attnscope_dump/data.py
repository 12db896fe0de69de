"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (gzipped IDX files), as tensors.

The package installs the four original files under /usr/share/datasets/fashion-mnist/. Nothing is
downloaded: a missing file raises FileNotFoundError naming the path and the package to install.
"""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import torch

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# Training-set statistics of the pixel values scaled to [0, 1].
MEAN, STD = 0.2860, 0.3530

_FILES = {
    ("train", "images"): "train-images-idx3-ubyte.gz",
    ("train", "labels"): "train-labels-idx1-ubyte.gz",
    ("test", "images"): "t10k-images-idx3-ubyte.gz",
    ("test", "labels"): "t10k-labels-idx1-ubyte.gz",
}


def read_idx(path: str) -> np.ndarray:
    """Reads one gzipped IDX file (unsigned-byte data) into an array of its stated shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, found {data.size} bytes of data")
    return data.reshape(shape)


def load_split(split: str, root: str = DEFAULT_ROOT, limit: int | None = None):
    """Returns (images float32 [n, 1, 28, 28] normalised, labels int64 [n]) of 'train' or 'test'."""
    paths = {kind: os.path.join(root, _FILES[(split, kind)]) for kind in ("images", "labels")}
    for p in paths.values():
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p} not found (Debian package dataset-fashion-mnist)")
    images = read_idx(paths["images"])
    labels = read_idx(paths["labels"])
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def loader(split: str, batch_size: int, shuffle: bool = False, seed: int = 0,
           limit: int | None = None, root: str = DEFAULT_ROOT):
    """A DataLoader over (image, label) pairs; shuffling is seeded for reproducibility."""
    x, y = load_split(split, root, limit)
    ds = torch.utils.data.TensorDataset(x, y)
    gen = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=gen)
