#!/usr/bin/env python3
"""Trains one of the project's DeiT-style ViTs on Fashion-MNIST and writes its weights (HDF5,
docs/model-weights.md) and a JSON record with its test accuracy.

    /usr/bin/python3 python/train.py --family inline --epochs 8 --out data/models

Deterministic for a given seed, thread count and BLAS (see data/README.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnscope_dump import data  # noqa: E402
from attnscope_dump.attention import FAMILIES  # noqa: E402
from attnscope_dump.models import ViTConfig, build_model  # noqa: E402
from attnscope_dump.weights_io import model_name, save_weights  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=FAMILIES, required=True)
    p.add_argument("--feature-map", default=None,
                   help="feature-map spec, e.g. focused=3 (default: the family's own)")
    p.add_argument("--out", default="data/models", help="output folder")
    p.add_argument("--epochs", type=float, default=8.0, help="may be fractional")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--embed-dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--train-limit", type=int, default=None, help="use the first N training images")
    p.add_argument("--test-limit", type=int, default=None, help="evaluate on the first N test images")
    p.add_argument("--data-root", default=data.DEFAULT_ROOT)
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def lr_at(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


@torch.no_grad()
def evaluate(model, loader) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += int((model(x).argmax(dim=1) == y).sum())
        total += len(y)
    return correct / total


def train(args) -> dict:
    torch.set_num_threads(args.threads)
    cfg = ViTConfig(family=args.family, feature_map=args.feature_map, patch_size=args.patch_size,
                    embed_dim=args.embed_dim, depth=args.depth, num_heads=args.heads,
                    mlp_ratio=args.mlp_ratio)
    model = build_model(cfg, seed=args.seed)
    train_loader = data.loader("train", args.batch_size, shuffle=True, seed=args.seed,
                               limit=args.train_limit, root=args.data_root)
    test_loader = data.loader("test", 500, limit=args.test_limit, root=args.data_root)
    total = max(1, int(round(args.epochs * len(train_loader))))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step, start, losses = 0, time.time(), []
    while step < total:
        model.train()
        for x, y in train_loader:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, args.lr, args.warmup_steps)
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            if not torch.isfinite(loss):
                raise RuntimeError(f"{args.family}: loss is {loss.item()} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
            if not args.quiet and step % 100 == 0:
                print(f"{args.family}: step {step}/{total} loss {sum(losses[-100:]) / 100:.4f} "
                      f"({time.time() - start:.0f} s)", flush=True)
            if step >= total:
                break
    train_seconds = time.time() - start
    acc = evaluate(model, test_loader)
    record = {
        "model_name": model_name(cfg), "family": args.family, "test_accuracy": acc,
        "test_images": len(test_loader.dataset), "train_images": len(train_loader.dataset),
        "epochs": args.epochs, "steps": total, "batch_size": args.batch_size, "lr": args.lr,
        "weight_decay": args.weight_decay, "seed": args.seed, "threads": args.threads,
        "final_train_loss": sum(losses[-50:]) / len(losses[-50:]),
        "train_seconds": round(train_seconds, 1), "torch_version": torch.__version__,
        "config": cfg.to_dict(),
    }
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, model_name(cfg))
    save_weights(model, base + ".h5", extra={"test_accuracy": acc, "seed": args.seed})
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    if not args.quiet:
        print(f"{args.family}: test accuracy {acc:.4f}, {train_seconds:.0f} s -> {base}.h5")
    return record


if __name__ == "__main__":
    train(parse_args())
