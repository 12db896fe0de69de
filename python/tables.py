#!/usr/bin/env python3
"""Prints the result folders of scripts/tables.sh as the markdown tables of docs/tables.md.

    /usr/bin/python3 python/tables.py results/tables

Each folder is an `attnscope replay` result set (replay.csv + its manifest replay.json, checked
before reading): a row per intervention, a column per model, accuracy in % on the images the run
names. The `accuracy` folder is printed beside each model's training-time test accuracy
(data/models/<model>.json), which it must equal.
"""
from __future__ import annotations

import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnscope_dump.result_set import verify  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(folder: str):
    """(models in column order, interventions in row order, {(model, intervention): row})."""
    verify(os.path.join(folder, "replay.json"))
    with open(os.path.join(folder, "replay.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    models = list(dict.fromkeys(r["model"] for r in rows))
    interventions = list(dict.fromkeys(r["intervention"] for r in rows))
    return models, interventions, {(r["model"], r["intervention"]): r for r in rows}


def short(model: str) -> str:
    return model.split("-", 1)[1].rsplit("-fmnist", 1)[0] if "-" in model else model


def table(folder: str) -> str:
    models, interventions, cells = read(folder)
    images = cells[(models[0], interventions[0])]["images"]
    out = [f"{os.path.basename(folder)}: accuracy % on {images} images", "",
           "| intervention | " + " | ".join(short(m) for m in models) + " |",
           "|---|" + "---|" * len(models)]
    for i in interventions:
        out.append(f"| `{i}` | " + " | ".join(
            f"{100 * float(cells[(m, i)]['accuracy']):.2f}" for m in models) + " |")
    return "\n".join(out)


def accuracy_table(folder: str) -> str:
    models, interventions, cells = read(folder)
    out = ["| model | training run (PyTorch, GPU) | `attnscope replay` (CPU) | images | agree |",
           "|---|---|---|---|---|"]
    for m in models:
        r = cells[(m, "none")]
        with open(os.path.join(REPO, "data", "models", m + ".json")) as f:
            trained = json.load(f)
        ours = int(r["correct"]) / int(r["images"])
        theirs = float(trained["test_accuracy"])
        same = int(r["images"]) == int(trained["test_images"]) and round(ours, 4) == round(theirs, 4)
        out.append(f"| {m} | {100 * theirs:.2f} | {100 * ours:.2f} | {r['images']} | "
                   f"{'yes' if same else 'NO'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    root = (argv or sys.argv[1:] or ["results/tables"])[0]
    for name in ("masking", "query-maps", "family-swaps"):
        if os.path.exists(os.path.join(root, name, "replay.json")):
            print(table(os.path.join(root, name)) + "\n")
    if os.path.exists(os.path.join(root, "accuracy", "replay.json")):
        print(accuracy_table(os.path.join(root, "accuracy")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
