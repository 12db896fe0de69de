#!/usr/bin/env python3
"""Turns checkpoints that python/train.py wrote where h5py was missing (NAME.pt) into the weights
files it writes otherwise (NAME.h5 beside them, docs/model-weights.md), value for value.

    /usr/bin/python3 python/export_weights.py data/models/vit14-*.pt
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnscope_dump.weights_io import export_checkpoint  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+", help="NAME.pt files written by train.py")
    args = p.parse_args(argv)
    for path in args.checkpoints:
        if not os.path.isfile(path):
            print(f"export_weights.py: {path}: no such checkpoint", file=sys.stderr)
            return 1
        try:
            out = export_checkpoint(path, os.path.splitext(path)[0] + ".h5")
        except ValueError as e:
            print(f"export_weights.py: {e}", file=sys.stderr)
            return 1
        print(f"{path} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
