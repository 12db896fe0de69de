"""Live analysis of a model: the dumper's hooks (attnscope_dump) hand each batch's q and k straight
to the analyses, which keep only their running totals; no dump is written and memory does not grow
with the number of images. Each analysis publishes the result set the command writes for a dump of
the same images (the same CSV files, byte for byte, and a JSON manifest)."""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

from . import _attnscope as _core

ANALYSES = ("locality", "census", "confusion", "entropy", "distance", "rank")
#: What analyze runs when `analyses` is left out: the analyses of q and k (rank also reads v).
DEFAULT_ANALYSES = ("locality", "census", "confusion")


def _dumper():
    """attnscope_dump, beside this package in the build tree and in an installed copy, or in the
    source tree's python/ folder."""
    try:
        from attnscope_dump import dumper
    except ImportError as e:
        raise ImportError("attnscope.analyze needs the package attnscope_dump (python/attnscope_dump, "
                          "copied beside attnscope by the build)") from e
    return dumper


def _own_variant(attrs) -> str:
    """The model's own variant, as a dump of it names it."""
    fmap = attrs["feature_map"]
    return attrs["attention_family"] + ("" if fmap == "none" else ":" + fmap)


def analyze(model, loader, analyses=DEFAULT_ANALYSES, *, out: str = "results/analyze",
            layers=None, variants=None, dtype: str = "float16", max_images: int | None = None,
            window: int = 3, sum_tol: float = 1e-6, eps: float = 1e-3,
            query_eps: float = 1e-6, log_eps: float = 0.0, bins: int = 32,
            patch_size: float = 1.0, renormalise: bool = False, rank_tol: float = 0.0,
            with_out: bool = True, model_name: str | None = None,
            attention_family: str | None = None, feature_map: str | None = None,
            convention: str = "code", grid=None, prefix_tokens: int | None = None,
            device=None, allow_rotary: bool = False) -> dict:
    """Runs `model` over `loader` (as attnscope_dump.dump_model does: tensors, (images, labels)
    pairs or dicts with pixel_values) and analyses every batch as it comes.

    analyses: any of "locality" (window), "census" (sum_tol), "confusion" (eps, query_eps),
    "entropy" (log_eps, bins), "distance" (patch_size in pixels, 1: distances in patches, as for
    a dump without /images; renormalise, bins) and "rank" (rank_tol; reads v, and with
    ``with_out`` the attention module's own output for the rank-collapse residual, as a dump
    with /out gives it); each publishes into ``out/<analysis>/`` the files of
    ``attnscope <analysis> --out out/<analysis>``.
    layers: the model's layers to analyse (default all; results name the model's indices).
    variants: specs (default the model's own variant), without @convention read under the
    model's convention, as the command reads them under a dump's.
    dtype: q and k are rounded to it first, as a dump of that dtype stores them ("float16", the
    dumper's default, or "float32"): the numbers then equal the command's on such a dump.
    The other arguments are dump_model's. Returns {analysis: manifest path}."""
    dumper = _dumper()
    for name in analyses:
        if name not in ANALYSES:
            raise ValueError(f"analyses: expected some of {', '.join(ANALYSES)}, got '{name}'")
    if not analyses:
        raise ValueError("analyses: expected at least one analysis")
    if max_images is not None and (isinstance(max_images, bool) or not isinstance(max_images, int)
                                   or max_images < 1):
        raise ValueError(f"max_images: expected a positive number of images or None, got {max_images!r}")
    if not out:
        raise ValueError("out: expected a results folder, got an empty path")
    np_dtype = dumper._dtype(dtype)
    style, sites, keep, attrs = dumper.model_setup(model, layers, model_name, attention_family,
                                                   feature_map, convention, grid, prefix_tokens,
                                                   allow_rotary)
    specs = list(variants) if variants else [_own_variant(attrs)]
    grid3 = [attrs["prefix_tokens"], attrs["grid_height"], attrs["grid_width"]]
    options = {"locality": {"window": window}, "census": {"sum_tol": sum_tol},
               "confusion": {"eps": eps, "query_eps": query_eps},
               "entropy": {"log_eps": log_eps, "bins": bins},
               "distance": {"patch_size": patch_size, "renormalise": renormalise, "bins": bins},
               "rank": {"rank_tol": rank_tol}}
    runs = {name: _core.live(name, os.path.join(out, name), specs, keep, attrs["num_heads"],
                             grid3, attrs["scale"], options[name], attrs["convention"])
            for name in analyses}
    need_v = any(run.needs_v for run in runs.values())
    need_out = need_v and with_out
    names = ("q", "k") + (("v",) if need_v else ()) + (("out",) if need_out else ())
    start, started = time.monotonic(), datetime.datetime.now(datetime.timezone.utc)
    images = 0
    with dumper.hooked(model, sites, keep, False, need_out) as stores:
        for x, _, _, captured in dumper.captured_batches(
                model, loader, stores, keep, names, attrs, np_dtype, 0, max_images, device,
                dumper.call_kwargs(model, style, False), [sites[i].hint for i in keep]):
            # Rounded as the dump stores them (float16 -> float32 is exact on the C++ side).
            t = {name: [layer[name].astype(np_dtype, copy=False) for layer in captured]
                 for name in names}
            for run in runs.values():
                if run.needs_v:
                    run.add(t["q"], t["k"], t["v"], t.get("out"))
                else:
                    run.add(t["q"], t["k"])
            images += len(x)
    if images == 0:
        raise ValueError("the loader yielded no images")
    manifests = {}
    for name, run in runs.items():
        record = {
            "command": name, "version": _core.__version__,
            "command_line": [sys.argv[0] if sys.argv else "python", "attnscope.analyze", name],
            "start_time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "inputs": {"model": attrs["model_name"], "source": "live (attnscope.analyze)"},
            "parameters": {"variants": [_core.variant_name(s, attrs["convention"]) for s in specs],
                           "images": images, "layers": keep,
                           "heads": list(range(attrs["num_heads"])), "dtype": dtype,
                           **options[name]},
            "results": {}, "elapsed_s": time.monotonic() - start,
            "threads": os.cpu_count(),
        }
        manifests[name] = run.publish(json.dumps(record))
    return manifests
