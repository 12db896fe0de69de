#!/usr/bin/env python3
"""The PyTorch-on-GPU confusion count a researcher would write, for the side-by-side benchmark.

Reads a dump with h5py, moves each batch of images to the GPU, computes softmax weights in
float32 for all layers and heads at once, and counts confused pairs with torch.cdist: rows within
eps, raw queries further apart than query_eps, i < j. No margin and no exact re-check: pairs near
the threshold are decided by float32 rounding, which is what the benchmark measures against
attnscope's exact counts (--exact FILE: attnscope's confusion_per_image.csv of the same dump).

Prints one JSON object: per-image counts, milliseconds per image (read + copy + compute, median /
min / max over batches, divided by the batch size), the device, and with --exact how many images'
counts differ from the exact ones. Exits 1 with one line on stderr when the device is not there
(never waits for one).
"""
import argparse
import csv
import json
import statistics
import sys
import time

import h5py
import numpy as np
import torch


def confusion_counts(q, k, scale, eps, query_eps):
    """q, k: [B, L, H, N, d] float32 on the device -> per-image counts [B]."""
    B, L, H, N, d = q.shape
    attn = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1).reshape(B * L * H, N, N)
    near = torch.cdist(attn, attn) <= eps
    qf = q.reshape(B * L * H, N, d)
    distinct = torch.cdist(qf, qf) > query_eps
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool, device=q.device), diagonal=1)
    return (near & distinct & upper).reshape(B, L * H, N, N).sum(dim=(1, 2, 3))


def load(f, first, count, layers):
    q = np.stack([f[f"layers/{l}/q"][first:first + count] for l in layers], axis=1).astype(np.float32)
    k = np.stack([f[f"layers/{l}/k"][first:first + count] for l in layers], axis=1).astype(np.float32)
    return torch.from_numpy(q), torch.from_numpy(k)  # [B, L, H, N, d]


def exact_counts(path, variant_prefix="softmax"):
    counts = {}
    for row in csv.DictReader(open(path)):
        if row["variant"].startswith(variant_prefix):
            counts[int(row["image"])] = int(row["count"])
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--query-eps", type=float, default=1e-6)
    ap.add_argument("--images", type=int, default=0, help="first N images (0: all)")
    ap.add_argument("--batch", type=int, default=8, help="images per step")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (to test this script)")
    ap.add_argument("--exact", help="attnscope's confusion_per_image.csv to compare the counts with")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("torch_gpu_confusion.py: no CUDA device visible to PyTorch (torch.cuda.is_available() is False)",
              file=sys.stderr)
        sys.exit(1)
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with h5py.File(a.dump, "r") as f:
        at = f.attrs
        layers = list(range(int(at["num_layers"])))
        total = f["layers/0/q"].shape[0]
        n = total if a.images == 0 else min(a.images, total)
        scale = float(at["scale"])
        counts, times = [], []
        for first in range(0, n, a.batch):
            b = min(a.batch, n - first)
            sync()
            t0 = time.perf_counter()
            q, k = load(f, first, b, layers)
            c = confusion_counts(q.to(dev, non_blocking=True), k.to(dev, non_blocking=True), scale, a.eps,
                                 a.query_eps)
            counts.extend(int(x) for x in c.cpu())
            sync()
            times.append(1e3 * (time.perf_counter() - t0) / b)
    out = {"images": n, "device": name, "batch": a.batch,
           "ms_per_image": {"median": statistics.median(times), "min": min(times), "max": max(times)},
           "counts": counts}
    if a.exact:
        exact = exact_counts(a.exact)
        compared = [i for i in range(n) if i in exact]
        wrong = [i for i in compared if counts[i] != exact[i]]
        out["compared_images"] = len(compared)
        out["images_with_wrong_counts"] = len(wrong)
        out["first_wrong"] = [{"image": i, "torch": counts[i], "exact": exact[i]} for i in wrong[:10]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
