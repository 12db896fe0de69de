#!/usr/bin/env python3
"""The PyTorch CPU scripts a researcher would write for the five per-head diagnostics of attnscope.

Reads a dump image by image with h5py (only the tensors the task needs), computes softmax weights in
float32 for all layers and heads at once, then one of:
  distance  the ViT papers' mean attention distance (CLS rows and columns dropped, no
            renormalisation, weights times the pixel distance matrix, summed over keys, mean over
            queries);
  entropy   the entropy of every row (-sum w log w, 0 log 0 = 0 by torch.special.xlogy), mean over
            queries;
  sinks     the attention each key receives (column means), the largest per head, whether one key
            takes more than 0.5 of every row, and the high-norm tokens of V (norm over the heads
            above 4 x the layer's median);
  rank      singular values of W, K and [K, 1] in float64 (torch.linalg.svdvals, batched): numerical
            rank (numpy's matrix_rank tolerance), effective rank, sigma_min / sigma_1 of K and [K, 1];
            W formed in float64 here (q and k widened first): a rank with float64's tolerance needs
            float64 weights, and float32 ones lift a singular value that is zero to 1e-11-1e-8 on
            some BLAS kernels and not on others (two equal keys give two float32 columns equal
            or not, as the GEMM kernel's blocking falls);
  rollout   Abnar & Zuidema's rollout as vit-explain writes it: heads averaged, identity added, rows
            normalised, result = a @ result over the layers; the CLS row.
Prints one JSON object: per layer and head (per token for rollout) the mean over images, and
milliseconds per image (read + compute) as median, min and max.
"""
import argparse
import json
import statistics
import time

import h5py
import numpy as np
import torch


def load(f, image, layers, names):
    return [torch.from_numpy(np.stack([f[f"layers/{l}/{n}"][image] for l in layers]).astype(np.float32))
            for n in names]  # each [L, H, N, d]


def distance_matrix(height, width, patch):
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float()
    return patch * torch.cdist(pos, pos)  # [G, G] pixels


def mean_distance(attn, dist, prefix):
    grid = attn[:, :, prefix:, prefix:]  # [L, H, G, G], not renormalised
    return (grid * dist).sum(-1).mean(-1)  # [L, H]


def entropy(attn):
    return -torch.special.xlogy(attn, attn).sum(-1).mean(-1)  # [L, H]


def sinks(attn, v):
    received = attn.mean(-2)  # [L, H, N]
    sink = (attn.min(-2).values > 0.5).any(-1)  # [L, H]
    norms = v.pow(2).sum(-1).sum(1).sqrt()  # [L, N]: ||v_t|| over the heads concatenated
    high = (norms > 4 * norms.median(-1, keepdim=True).values).sum(-1)  # [L]
    return torch.stack([received.max(-1).values, sink.double()], -1), high


def rank(q, k, scale):
    def spectrum(m):
        s = torch.linalg.svdvals(m)  # [..., min(rows, cols)], descending
        tol = s[..., :1] * max(m.shape[-2:]) * torch.finfo(torch.float64).eps
        p = s / s.sum(-1, keepdim=True)
        erank = torch.exp(-torch.special.xlogy(p, p).sum(-1))
        return (s > tol).sum(-1).double(), erank, s[..., -1] / s[..., 0]
    kd = k.double()
    r, er, _ = spectrum(torch.softmax((q.double() @ kd.transpose(-1, -2)) * scale, dim=-1))
    _, _, k_ratio = spectrum(kd)
    _, _, k1_ratio = spectrum(torch.cat([kd, torch.ones(*kd.shape[:-1], 1, dtype=kd.dtype)], -1))
    return torch.stack([r, er, k_ratio, k1_ratio], -1)  # [L, H, 4]


def rollout(attn):
    n = attn.shape[-1]
    result = torch.eye(n)
    for a in attn.mean(1):  # layers in order, heads averaged
        a = a + torch.eye(n)
        a = a / a.sum(-1, keepdim=True)
        result = a @ result
    return result[0]  # [N]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--task", choices=["distance", "entropy", "sinks", "rank", "rollout"], required=True)
    ap.add_argument("--patch-size", type=float, default=16.0)
    ap.add_argument("--images", type=int, default=0, help="first N images (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    names = ["q", "k", "v"] if a.task == "sinks" else ["q", "k"]
    with h5py.File(a.dump, "r") as f:
        at = f.attrs
        layers = list(range(int(at["num_layers"])))
        n = f["layers/0/q"].shape[0] if a.images == 0 else a.images
        scale, prefix = float(at["scale"]), int(at["prefix_tokens"])
        dist = distance_matrix(int(at["grid_height"]), int(at["grid_width"]), a.patch_size)
        total, extra, times = None, None, []
        for image in range(n):
            t0 = time.perf_counter()
            tensors = load(f, image, layers, names)
            q, k = tensors[0], tensors[1]
            if a.task != "rank":
                attn = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)
            if a.task == "distance":
                value = mean_distance(attn, dist, prefix)
            elif a.task == "entropy":
                value = entropy(attn)
            elif a.task == "sinks":
                value, high = sinks(attn, tensors[2])
                extra = high if extra is None else extra + high
            elif a.task == "rank":
                value = rank(q, k, scale)
            else:
                value = rollout(attn)
            total = value.double() if total is None else total + value.double()
            times.append((time.perf_counter() - t0) * 1e3)
    out = {"task": a.task, "images": n, "per_head": (total / n).tolist(),
           "ms_per_image": {"median": statistics.median(times), "min": min(times), "max": max(times),
                            "mean": statistics.mean(times)}}
    if extra is not None:
        out["high_norm_tokens"] = extra.tolist()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
