#!/usr/bin/env python3
"""The straightforward PyTorch CPU script a researcher would write for confusion and local mass.

Reads a dump image by image with h5py, computes softmax weights in float32 for all layers and
heads at once, counts confused pairs with torch.cdist (rows within eps, raw queries further apart
than query_eps) or sums each query's k x k window with a ones-kernel convolution. Prints one JSON
object: per-image counts (or per layer/head means) and milliseconds per image (read + compute).
"""
import argparse
import json
import statistics
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F


def load(f, image, layers):
    q = np.stack([f[f"layers/{l}/q"][image] for l in layers]).astype(np.float32)
    k = np.stack([f[f"layers/{l}/k"][image] for l in layers]).astype(np.float32)
    return torch.from_numpy(q), torch.from_numpy(k)  # [L, H, N, d]


def confusion(q, k, scale, eps, query_eps):
    L, H, N, d = q.shape
    attn = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1).reshape(L * H, N, N)
    near = torch.cdist(attn, attn) <= eps
    distinct = torch.cdist(q.reshape(L * H, N, d), q.reshape(L * H, N, d)) > query_eps
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
    return int((near & distinct & upper).sum())


def local_mass(q, k, scale, prefix, height, width, window):
    L, H, N, d = q.shape
    attn = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)
    grid = attn[:, :, prefix:, prefix:].reshape(L * H * height * width, 1, height, width)
    ones = torch.ones(1, 1, window, window)
    sums = F.conv2d(grid, ones, padding=window // 2).reshape(L, H, height * width, height * width)
    idx = torch.arange(height * width)
    return sums[:, :, idx, idx].mean(dim=-1)  # [L, H] mean over grid queries


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--task", choices=["confusion", "locality"], required=True)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--query-eps", type=float, default=1e-6)
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--images", type=int, default=0, help="first N images (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with h5py.File(a.dump, "r") as f:
        at = f.attrs
        layers = list(range(int(at["num_layers"])))
        n = f["layers/0/q"].shape[0] if a.images == 0 else a.images
        scale = float(at["scale"])
        times, read_times, counts, mass = [], [], [], None
        for i in range(n):
            t0 = time.perf_counter()
            q, k = load(f, i, layers)
            read_times.append(1e3 * (time.perf_counter() - t0))
            if a.task == "confusion":
                counts.append(confusion(q, k, scale, a.eps, a.query_eps))
            else:
                m = local_mass(q, k, scale, int(at["prefix_tokens"]), int(at["grid_height"]),
                               int(at["grid_width"]), a.window)
                mass = m if mass is None else mass + m
            times.append(1e3 * (time.perf_counter() - t0))
    out = {"images": n, "ms_per_image": {"median": statistics.median(times), "min": min(times),
                                         "max": max(times), "mean": statistics.mean(times)},
           "read_ms_per_image": {"median": statistics.median(read_times)}}
    if a.task == "confusion":
        out["counts"] = counts
    else:
        out["mean_mass"] = (mass / n).tolist()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
