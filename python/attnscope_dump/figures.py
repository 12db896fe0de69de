"""What the figure notebooks share: reading attnscope result files (CSV + the command's JSON run
metadata), where results and figures live, and saving a figure with its caption.

Every file is read only once the manifest of its result set (the command's JSON record) lists it
and the whole set matches it (result_set.py): an interrupted or mixed run is refused, not drawn.

No attention maths here: the notebooks draw what `attnscope` computed.

Environment: ATTNSCOPE_RESULTS (folder of result folders, default results/figures-data) and
ATTNSCOPE_FIGURES (where PNGs go, default figures/), both relative to the repository root;
ATTNSCOPE_MODELS (space-separated, default the five 197-token models' names) the models drawn.
"""
from __future__ import annotations

import csv
import os
import textwrap

import numpy as np

from .result_set import verified_path, verify

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = ("softmax", "linear", "inline", "mala")
# The models drawn (scripts/figures.sh exports the list it ran); each is named by its family, or
# by a family and what it adds ("inline-localres": InLine with its local residual, same attention).
MODELS = tuple(os.environ.get("ATTNSCOPE_MODELS",
                              "softmax linear inline inline-localres mala").split())
LABELS = {"softmax": "Softmax", "linear": "Linear (ReLU)", "inline": "InLine", "mala": "MALA",
          "inline-localres": "InLine + local res.", "softmax-l2norm": "Softmax, q/|q|"}
COLORS = {"softmax": "#1f77b4", "linear": "#d62728", "inline": "#2ca02c", "mala": "#9467bd",
          "inline-localres": "#bcbd22", "softmax-l2norm": "#17becf"}


def family_of_model(model: str) -> str:
    """The attention family a model computes ("inline-localres" -> "inline")."""
    return model.split("-")[0]


def _dir(env: str, default: str) -> str:
    path = os.environ.get(env, default)
    return path if os.path.isabs(path) else os.path.join(REPO, path)


def results_dir() -> str:
    return _dir("ATTNSCOPE_RESULTS", "results/figures-data")


def figures_dir() -> str:
    path = _dir("ATTNSCOPE_FIGURES", "figures")
    os.makedirs(path, exist_ok=True)
    return path


def result_path(path: str) -> str:
    """The absolute path of a result file (relative to results_dir()), after checking the
    manifest of its set; raises result_set.ResultSetError for a set that is not complete."""
    if not os.path.isabs(path):
        path = os.path.join(results_dir(), path)
    return verified_path(path)


def read_csv(path: str) -> dict:
    """Columns by name; a column whose every value parses as a number becomes a float array.
    Only a file of a complete result set is read (see result_path)."""
    path = result_path(path)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: empty file, expected a header line")
    header, body = rows[0], rows[1:]
    cols = {}
    for i, name in enumerate(header):
        values = [r[i] for r in body]
        try:
            cols[name] = np.array([float(v) for v in values])
        except ValueError:
            cols[name] = np.array(values, dtype=object)
    return cols


def select(cols: dict, **where) -> dict:
    """Rows where every named column equals the given value."""
    keep = np.ones(len(next(iter(cols.values()))), dtype=bool)
    for name, value in where.items():
        keep &= cols[name] == value
    return {k: v[keep] for k, v in cols.items()}


def command_of(result_subdir: str, command: str) -> str:
    """The command line that produced <result_subdir>: its command.txt (written by
    scripts/figures.sh), else the "command" of its <command>.json run metadata. Either way the
    set's manifest, <command>.json, must check out."""
    meta = verify(os.path.join(results_dir(), result_subdir, f"{command}.json"))
    txt = os.path.join(results_dir(), result_subdir, "command.txt")
    if os.path.exists(txt):
        with open(txt) as f:
            return f.read().strip()
    argv = meta.get("command_line")
    if isinstance(argv, list) and argv:
        return " ".join([os.path.basename(str(argv[0]))] + [str(a) for a in argv[1:]])
    cmd = meta.get("command", command)
    return " ".join(cmd) if isinstance(cmd, list) else str(cmd)


def shorten(command: str) -> str:
    """Drops the absolute prefix of paths under the repository, for readable captions."""
    return command.replace(REPO + os.sep, "")


def save(fig, name: str, caption: str) -> str:
    """Adds the caption under the axes (reserving room for it) and writes figures/<name>.png."""
    width_chars = int(fig.get_figwidth() * 14)
    wrapped = "\n".join(textwrap.wrap(caption, width=width_chars))
    lines = wrapped.count("\n") + 1
    caption_in = 0.12 * lines + 0.55  # caption lines plus the x-axis labels above them
    fig.subplots_adjust(bottom=min(0.6, caption_in / fig.get_figheight()))
    fig.text(0.01, 0.01, wrapped, ha="left", va="bottom", fontsize=7, family="monospace")
    path = os.path.join(figures_dir(), name + ".png")
    fig.savefig(path, dpi=110)
    return path
