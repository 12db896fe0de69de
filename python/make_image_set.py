#!/usr/bin/env python3
"""Writes an image set for `attnscope replay --image-set`: the first N Fashion-MNIST test images.

    /usr/bin/python3 python/make_image_set.py --images 10000 --out data/image-sets/fmnist-test.h5

The file holds /images [n, 1, 28, 28] float32 (the models' normalised input, as
attnscope_dump.data.load_split makes it; the same values make_dumps.py stores in a dump's /images)
and /labels [n] int64, in the test set's file order. No q, k, v: 10 000 images take 31 MB instead
of a dump's many gigabytes, which is what a model's accuracy on the whole test set needs.
"""
from __future__ import annotations

import argparse
import os
import sys

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnscope_dump import data  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=10000, help="first N test images (at most 10000)")
    p.add_argument("--out", required=True, help="HDF5 file to write")
    p.add_argument("--data-root", default=data.DEFAULT_ROOT)
    args = p.parse_args(argv)
    if not 1 <= args.images <= 10000:
        print(f"make_image_set.py: --images {args.images}: expected 1 to 10000", file=sys.stderr)
        return 2
    x, y = data.load_split("test", args.data_root, limit=args.images)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    partial = args.out + ".partial"
    with h5py.File(partial, "w") as f:
        f.create_dataset("images", data=x.numpy(), chunks=(1,) + tuple(x.shape[1:]))
        f.create_dataset("labels", data=y.numpy())
        f.attrs["source"] = "Fashion-MNIST test set (Debian dataset-fashion-mnist), file order"
        f.attrs["normalisation"] = f"(pixel / 255 - {data.MEAN}) / {data.STD}"
    os.replace(partial, args.out)  # a killed run leaves no file that looks complete
    print(f"{args.out}: {x.shape[0]} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
