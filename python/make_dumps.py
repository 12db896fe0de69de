#!/usr/bin/env python3
"""Writes an attnscope dump (docs/dump-format.md) of each trained model over the first test
images of Fashion-MNIST.

    /usr/bin/python3 python/make_dumps.py --models data/models/*.h5 --out data/dumps --images 256

The models' own per-head output W V is stored as /layers/L/out; a model with InLine's local
residual adds it after that (docs/dump-format.md).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnscope_dump import data, dump_model  # noqa: E402
from attnscope_dump.weights_io import load_weights  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", required=True, help="weight files (HDF5)")
    p.add_argument("--out", default="data/dumps")
    p.add_argument("--images", type=int, default=256, help="first N test images")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--no-out", action="store_true", help="leave out /layers/L/out")
    p.add_argument("--attn", action="store_true", help="also store /layers/L/attn")
    p.add_argument("--layers", default=None,
                   help="comma-separated source layers to keep, e.g. 0 (default: all)")
    p.add_argument("--compression", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-root", default=data.DEFAULT_ROOT)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    for path in args.models:
        if not os.path.isfile(path):
            print(f"make_dumps.py: {path}: no such weights file", file=sys.stderr)
            return 1
    os.makedirs(args.out, exist_ok=True)
    test = data.loader("test", args.batch_size, limit=args.images, root=args.data_root)
    for path in args.models:
        model = load_weights(path)
        name = os.path.splitext(os.path.basename(path))[0]
        target = os.path.join(args.out, name + ".h5")
        layers = None if args.layers is None else [int(x) for x in args.layers.split(",")]
        s = dump_model(model, test, target, layers=layers, dtype=args.dtype, with_out=not args.no_out,
                       with_attn=args.attn, with_images=True, model_name=name,
                       compression=args.compression)
        size = os.path.getsize(target) / 1e6
        print(f"{target}: {s.images} images, {len(s.layers)} layers, "
              f"{s.attributes['attention_family']}, {size:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
