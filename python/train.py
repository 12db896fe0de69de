#!/usr/bin/env python3
"""Trains one of the project's DeiT-style ViTs on Fashion-MNIST and writes its weights (HDF5,
docs/model-weights.md) and a JSON record with its test accuracy on all test images.

    /usr/bin/python3 python/train.py --family inline --epochs 8 --out data/models
    python3 python/train.py --preset deit-t --family inline --local-residual --out data/models

Two presets: `vit7` (the default; the committed 7x7 models, data/README.md) and `deit-t` (the
14x14, 197-token DeiT-T-shaped models, for a GPU: augmentation, bfloat16 autocast on CUDA, float16
weights, a time budget). An option given on the command line overrides the preset.

Deterministic for a given seed, thread count and BLAS on the CPU (see data/README.md). The
shuffling order and the augmentation are drawn from CPU generators seeded by --seed, so every
family sees the same images in the same order with the same crops and flips.
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
from attnscope_dump.models import DEIT_T, ViTConfig, build_model  # noqa: E402
from attnscope_dump.weights_io import (model_name, round_to_float16, save_checkpoint,  # noqa: E402
                                       save_weights)

try:
    import h5py  # noqa: F401
    HAVE_H5PY = True
except ImportError:  # a GPU machine without it: a checkpoint, exported elsewhere
    HAVE_H5PY = False

# Every training setting a preset fixes; the command line overrides any of them.
PRESETS = {
    "vit7": dict(patch_size=4, embed_dim=64, depth=4, heads=2, mlp_ratio=2.0, epochs=8.0,
                 batch_size=128, lr=2e-3, weight_decay=0.05, warmup_steps=200, warmup_epochs=None,
                 label_smoothing=0.1, crop_pad=0, hflip=False, grad_clip=None,
                 weights_dtype="float32", time_budget=None, threads=2),
    # Fashion-MNIST at patch 2 with DeiT-T's attention shape. A step of batch 256 is about
    # 1 GFLOP per image forward: 30 epochs are some minutes on one H100 (--time-budget checks).
    "deit-t": dict(patch_size=DEIT_T["patch_size"], embed_dim=DEIT_T["embed_dim"],
                   depth=DEIT_T["depth"], heads=DEIT_T["num_heads"],
                   mlp_ratio=DEIT_T["mlp_ratio"], epochs=30.0, batch_size=256, lr=1e-3,
                   weight_decay=0.05, warmup_steps=None, warmup_epochs=3.0,
                   label_smoothing=0.1, crop_pad=2, hflip=True, grad_clip=1.0,
                   weights_dtype="float16", time_budget=540.0, threads=4),
}
# Steps over which the time budget projects the run's length (after the first, slower, steps).
PROBE_FROM, PROBE_TO = 10, 60


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="vit7")
    p.add_argument("--family", choices=FAMILIES, required=True)
    p.add_argument("--feature-map", default=None,
                   help="feature-map spec, e.g. focused=3 (default: the family's own)")
    p.add_argument("--local-residual", action="store_true",
                   help="add InLine's local residual (eq. 6) to every attention")
    p.add_argument("--out", default="data/models", help="output folder")
    p.add_argument("--epochs", type=float, help="may be fractional")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--warmup-epochs", type=float, help="overrides --warmup-steps")
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--crop-pad", type=int,
                   help="random crop after zero padding by this many pixels (0: none)")
    p.add_argument("--hflip", action=argparse.BooleanOptionalAction,
                   help="random horizontal flips")
    p.add_argument("--grad-clip", type=float, help="clip the gradient norm (0: no clipping)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
    p.add_argument("--patch-size", type=int)
    p.add_argument("--embed-dim", type=int)
    p.add_argument("--depth", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--mlp-ratio", type=float)
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda, cuda:1")
    p.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto",
                   help="bfloat16 autocast: auto = on CUDA only")
    p.add_argument("--weights-dtype", choices=("float32", "float16"),
                   help="float16: the weights are rounded before the test accuracy is measured")
    p.add_argument("--time-budget", type=float,
                   help="seconds: fail early when the run is projected to take longer, and stop "
                        "(writing nothing) when it does (0: no budget)")
    p.add_argument("--train-limit", type=int, default=None, help="use the first N training images")
    p.add_argument("--test-limit", type=int, default=None, help="evaluate on the first N test images")
    p.add_argument("--data-root", default=data.DEFAULT_ROOT)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def lr_at(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def augment(x: torch.Tensor, pad: int, hflip: bool, gen: torch.Generator) -> torch.Tensor:
    """Random crops of the zero-padded images (the padding is the normalised value of a black
    pixel, as the image border is) and random horizontal flips, one draw per image from `gen`
    (a CPU generator, so the draws do not depend on the device)."""
    b, _, h, w = x.shape
    if pad > 0:
        background = -data.MEAN / data.STD
        padded = F.pad(x, (pad, pad, pad, pad), value=background)
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        batch = torch.arange(b, device=x.device)[:, None, None, None]
        chan = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        x = padded[batch, chan, rows, cols]
    if hflip:
        flip = (torch.rand(b, generator=gen) < 0.5).to(x.device)[:, None, None, None]
        x = torch.where(flip, x.flip(-1), x)
    return x


@torch.no_grad()
def code_commit() -> str | None:
    """The commit of this checkout and whether it has local changes ("<sha>" or "<sha>+dirty"),
    recorded with every model; None outside a git checkout or without git."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sha + ("+dirty" if dirty else "")


def evaluate(model, loader, device) -> float:
    model.eval()
    correct = total = 0
    for x, y in loader:
        correct += int((model(x.to(device)).argmax(dim=1).cpu() == y).sum())
        total += len(y)
    return correct / total


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"train.py: --device {name}: CUDA is not available")
    return dev


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class OverBudget(RuntimeError):
    pass


def train(args) -> dict:
    torch.set_num_threads(args.threads)
    device = _device(args.device)
    amp = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")
    cfg = ViTConfig(family=args.family, feature_map=args.feature_map, patch_size=args.patch_size,
                    embed_dim=args.embed_dim, depth=args.depth, num_heads=args.heads,
                    mlp_ratio=args.mlp_ratio, local_residual=args.local_residual)
    name = model_name(cfg)
    model = build_model(cfg, seed=args.seed).to(device)
    train_loader = data.loader("train", args.batch_size, shuffle=True, seed=args.seed,
                               limit=args.train_limit, root=args.data_root)
    test_loader = data.loader("test", 500, limit=args.test_limit, root=args.data_root)
    aug_gen = torch.Generator().manual_seed(args.seed + 1)
    total = max(1, int(round(args.epochs * len(train_loader))))
    warmup = args.warmup_steps if args.warmup_epochs is None \
        else int(round(args.warmup_epochs * len(train_loader)))
    budget = args.time_budget or None
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step, start, losses, probe_start = 0, time.time(), [], None
    while step < total:
        model.train()
        for x, y in train_loader:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total, args.lr, warmup)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if args.crop_pad or args.hflip:
                x = augment(x, args.crop_pad, args.hflip, aug_gen)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x), y, label_smoothing=args.label_smoothing)
            # On CUDA, reading the loss waits for the GPU: only every 100 steps.
            if (device.type != "cuda" or step % 100 == 0) and not torch.isfinite(loss):
                raise RuntimeError(f"{name}: loss is {loss.item()} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if args.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            opt.step()
            losses.append(loss.detach())
            step += 1
            if budget is not None:
                probe_start = _check_budget(name, step, total, start, budget, probe_start, device,
                                            args)
            if not args.quiet and (step % 100 == 0 or step == total):
                recent = [t.item() for t in losses[-100:]]
                print(f"{name}: step {step}/{total} loss {sum(recent) / len(recent):.4f} "
                      f"({time.time() - start:.0f} s)", flush=True)
            if step >= total:
                break
    _sync(device)
    train_seconds = time.time() - start
    acc_trained = evaluate(model, test_loader, device)
    if args.weights_dtype == "float16":
        round_to_float16(model)  # the accuracy below is that of the stored weights
    acc = evaluate(model, test_loader, device) if args.weights_dtype == "float16" else acc_trained
    record = {
        "model_name": name, "family": args.family, "local_residual": args.local_residual,
        "test_accuracy": acc, "test_accuracy_before_rounding": acc_trained,
        "test_images": len(test_loader.dataset), "train_images": len(train_loader.dataset),
        "preset": args.preset, "epochs": args.epochs, "steps": total, "warmup_steps": warmup,
        "batch_size": args.batch_size, "lr": args.lr, "weight_decay": args.weight_decay,
        "label_smoothing": args.label_smoothing, "crop_pad": args.crop_pad, "hflip": args.hflip,
        "grad_clip": args.grad_clip, "seed": args.seed, "threads": args.threads,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "amp": "bf16" if amp else "off", "weights_dtype": args.weights_dtype,
        "final_train_loss": sum(t.item() for t in losses[-50:]) / len(losses[-50:]),
        "train_seconds": round(train_seconds, 1), "torch_version": torch.__version__,
        "code_commit": code_commit(),
        "config": cfg.to_dict(),
    }
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, name)
    extra = {"test_accuracy": acc, "seed": args.seed}
    written = base + (".h5" if HAVE_H5PY else ".pt")
    if HAVE_H5PY:
        save_weights(model.cpu(), written, extra=extra, dtype=args.weights_dtype)
    else:
        save_checkpoint(model.cpu(), written, extra=extra, dtype=args.weights_dtype)
        print(f"train.py: h5py is missing: wrote {written}; turn it into {base}.h5 with "
              f"python/export_weights.py {written}", file=sys.stderr)
    with open(base + ".json", "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    if not args.quiet:
        print(f"{name}: test accuracy {acc:.4f} on {len(test_loader.dataset)} images, "
              f"{train_seconds:.0f} s -> {written}")
    return record


def _check_budget(name, step, total, start, budget, probe_start, device, args):
    """Raises OverBudget when the run has taken, or is projected to take, longer than `budget`
    seconds; returns the time the projection's probe started."""
    if step == PROBE_FROM:
        _sync(device)
        return time.time()
    if step == PROBE_TO and probe_start is not None and total > PROBE_TO:
        _sync(device)
        now = time.time()
        per_step = (now - probe_start) / (PROBE_TO - PROBE_FROM)
        projected = (now - start) + per_step * (total - step)
        fit = args.epochs * (step + (budget - (now - start)) / per_step) / total
        if not args.quiet:
            print(f"{name}: {per_step * 1e3:.1f} ms/step, projected {projected:.0f} s "
                  f"(budget {budget:.0f} s)", flush=True)
        if projected > budget:
            raise OverBudget(f"{name}: projected {projected:.0f} s for {total} steps exceeds "
                             f"--time-budget {budget:.0f} s; about {fit:.1f} epochs would fit")
    if time.time() - start > budget:
        raise OverBudget(f"{name}: --time-budget {budget:.0f} s reached at step {step} of {total}")
    return probe_start


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except OverBudget as e:
        print(f"train.py: {e}; nothing written", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
