#!/usr/bin/env python3
"""The PyTorch CPU script a researcher would write for mean attention distance and attention entropy.

Reads a dump image by image with h5py, computes softmax weights in float32 for all layers and heads
at once, then either the ViT papers' mean attention distance (CLS rows and columns dropped, no
renormalisation, weights times the pixel distance matrix, summed over keys, averaged over queries)
or the entropy of every row (-sum w log w, 0 log 0 = 0 by torch.special.xlogy). Prints one JSON
object: per layer and head the mean over queries, then images, and milliseconds per image (read +
compute) as median, min and max.
"""
import argparse
import json
import statistics
import time

import h5py
import numpy as np
import torch


def load(f, image, layers):
    q = np.stack([f[f"layers/{l}/q"][image] for l in layers]).astype(np.float32)
    k = np.stack([f[f"layers/{l}/k"][image] for l in layers]).astype(np.float32)
    return torch.from_numpy(q), torch.from_numpy(k)  # [L, H, N, d]


def distance_matrix(height, width, patch):
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float()
    return patch * torch.cdist(pos, pos)  # [G, G] pixels


def mean_distance(attn, dist, prefix):
    grid = attn[:, :, prefix:, prefix:]  # [L, H, G, G], not renormalised
    return (grid * dist).sum(-1).mean(-1)  # [L, H]


def entropy(attn):
    return -torch.special.xlogy(attn, attn).sum(-1).mean(-1)  # [L, H]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--task", choices=["distance", "entropy"], required=True)
    ap.add_argument("--patch-size", type=float, default=16.0)
    ap.add_argument("--images", type=int, default=0, help="first N images (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with h5py.File(a.dump, "r") as f:
        at = f.attrs
        layers = list(range(int(at["num_layers"])))
        n = f["layers/0/q"].shape[0] if a.images == 0 else a.images
        scale, prefix = float(at["scale"]), int(at["prefix_tokens"])
        dist = distance_matrix(int(at["grid_height"]), int(at["grid_width"]), a.patch_size)
        total, times = None, []
        for image in range(n):
            t0 = time.perf_counter()
            q, k = load(f, image, layers)
            attn = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)
            value = mean_distance(attn, dist, prefix) if a.task == "distance" else entropy(attn)
            total = value.double() if total is None else total + value.double()
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"task": a.task, "images": n, "per_head": (total / n).tolist(),
                      "ms_per_image": {"median": statistics.median(times), "min": min(times),
                                       "max": max(times)}}))


if __name__ == "__main__":
    main()
