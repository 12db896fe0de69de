#!/usr/bin/env python3
"""Data for InLine Fig. 1 on a real model: queries that linear attention cannot tell apart.

(a) collinear queries a*q (a = 0.5, 1, 2, 4) with phi = ReLU;
(b) queries of different directions and lengths with equal phi(q) = ReLU(A q + b) up to a
    positive factor (A, b drawn from --seed).
Keys, the base query q and the scale come from one layer/head/image of a dump. Writes
<out>/inline_fig1.csv (panel,query,factor,query_norm,variant,key,weight) and
<out>/inline_fig1.json ({"command", "parameters"}), published as an attnscope result set (the JSON
is the manifest, written last; see attnscope_dump/result_set.py).
No attnscope command builds such queries, so this script computes the weights itself with the
code-convention formulas of attnscope_dump.attention.
"""
from __future__ import annotations

import argparse
import csv
import os
import shlex
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnscope_dump.attention import attention_weights  # noqa: E402
from attnscope_dump.result_set import publish  # noqa: E402

FACTORS = (0.5, 1.0, 2.0, 4.0)


def collinear_queries(q: np.ndarray) -> np.ndarray:
    return np.stack([a * q for a in FACTORS])


def affine_kernel_queries(q: np.ndarray, A: np.ndarray, b: np.ndarray, rng) -> np.ndarray:
    """Queries q_m with ReLU(A q_m + b) = a_m ReLU(A q + b): keep the active pattern, scale it,
    and give the inactive coordinates fresh negative pre-activations."""
    z = A @ q + b
    active = z > 0
    out = []
    for a in FACTORS:
        pre = np.where(active, a * z, -rng.uniform(0.1, 2.0, size=z.shape))
        out.append(np.linalg.solve(A, pre - b))
    return np.stack(out)


def weights(variant: str, qs: np.ndarray, k: np.ndarray, scale: float, A=None, b=None):
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))[None, None]
    if variant == "linear:relu_affine":
        phi = lambda x: np.maximum(x @ A.T + b, 0.0)
        return attention_weights("linear", t(phi(qs)), t(phi(k)), scale, "identity")[0, 0].numpy()
    family, fmap = {"softmax": ("softmax", None), "linear:relu": ("linear", "relu"),
                    "inline:identity": ("inline", "identity")}[variant]
    return attention_weights(family, t(qs), t(k), scale, fmap)[0, 0].numpy()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--image", type=int, default=0)
    p.add_argument("--token", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with h5py.File(args.dump, "r") as f:
        g = f[f"layers/{args.layer}"]
        q = g["q"][args.image, args.head, args.token].astype(np.float64)
        k = g["k"][args.image, args.head].astype(np.float64)
        scale = float(f.attrs["scale"])
    d = q.shape[0]
    rng = np.random.default_rng(args.seed)
    A = rng.normal(0.0, d ** -0.5, size=(d, d))
    b = rng.normal(0.0, 1.0, size=d)
    panels = {"a": (collinear_queries(q), ("linear:relu", "softmax", "inline:identity")),
              "b": (affine_kernel_queries(q, A, b, rng),
                    ("linear:relu_affine", "softmax", "inline:identity"))}
    with publish(args.out, "inline_fig1.json") as st:
        with open(st.path("inline_fig1.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["panel", "query", "factor", "query_norm", "variant", "key", "weight"])
            for panel, (qs, variants) in panels.items():
                for variant in variants:
                    W = weights(variant, qs, k, scale, A, b)
                    for i, row in enumerate(W):
                        for j, x in enumerate(row):
                            w.writerow([panel, i, FACTORS[i], f"{np.linalg.norm(qs[i]):.6g}",
                                        variant, j, f"{x:.9g}"])
        meta = {"command": "python/inline_fig1.py " + " ".join(shlex.quote(a) for a in
                                                                (argv or sys.argv[1:])),
                "parameters": vars(args) | {"factors": FACTORS, "scale": scale}}
        st.publish(meta)


if __name__ == "__main__":
    main()
