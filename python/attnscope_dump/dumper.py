"""Runs a model over a data loader and writes a v1 attnscope dump (docs/dump-format.md),
streaming: each batch's tensors go to disk before the next batch runs, so memory holds one batch,
never the dump.

    from attnscope_dump import dump_model
    dump_model(model, loader, "dump.h5", dtype="float16", with_out=True)
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import h5py
import numpy as np
import torch

from .attention import attention_outputs
from .attention import family as family_entry
from .field_families import FIELD_FAMILIES, field_outputs, is_field_variant
from .hooks import call_kwargs, check_rotary, find_sites, rotary_sources, token_layout

_DTYPES = {"float16": np.float16, "float32": np.float32}
_F16_MAX = float(np.finfo(np.float16).max)
# HDF5 1.10 file format: datasets extended one batch at a time get an extensible-array chunk
# index, whose memory stays flat as chunks are added (the 1.8 B-tree index grows with them).
_LIBVER = ("v110", "v110")


@dataclass
class DumpSummary:
    path: str
    images: int
    layers: list = field(default_factory=list)  # source layer index of each /layers/L
    attributes: dict = field(default_factory=dict)


class _Writer:
    """Resizable, one-image-per-chunk datasets, appended batch by batch."""

    def __init__(self, f: h5py.File, np_dtype, compression: int):
        self.f, self.dtype, self.level = f, np_dtype, compression
        _cap_metadata_cache(f)

    def append(self, name: str, arr: np.ndarray, dtype=None, chunk_per_image=True):
        dtype = dtype or self.dtype
        if name not in self.f:
            chunks = (1,) + arr.shape[1:] if chunk_per_image and arr.ndim > 1 else None
            opts = dict(compression="gzip", compression_opts=self.level, shuffle=True) \
                if self.level > 0 else {}
            self.f.create_dataset(name, shape=(0,) + arr.shape[1:], maxshape=(None,) + arr.shape[1:],
                                  dtype=dtype, chunks=chunks or True, **opts)
        ds = self.f[name]
        start = ds.shape[0]
        ds.resize(start + arr.shape[0], axis=0)
        ds[start:] = arr.astype(dtype, copy=False)


def _cap_metadata_cache(f: h5py.File, max_bytes: int = 2 << 20) -> None:
    """HDF5's metadata cache may grow to 32 MiB as chunk indices grow; a dump needs little."""
    cfg = f.id.get_mdc_config()
    cfg.set_initial_size = True
    cfg.initial_size = max_bytes // 2
    cfg.min_size = max_bytes // 4
    cfg.max_size = max_bytes
    f.id.set_mdc_config(cfg)


def _split_batch(batch):
    if isinstance(batch, (list, tuple)):
        return batch[0], (batch[1] if len(batch) > 1 else None)
    if isinstance(batch, dict):
        return batch.get("pixel_values", batch.get("image")), batch.get("labels", batch.get("label"))
    return batch, None


def _logits_of(output):
    if isinstance(output, torch.Tensor):
        return output
    return getattr(output, "logits", None)


def _checked(name: str, layer: int, t: torch.Tensor, np_dtype) -> np.ndarray:
    a = t.detach().to(torch.float32).cpu().numpy()
    if not np.isfinite(a).all():
        raise ValueError(f"layer {layer} {name}: the model produced a non-finite value")
    if np_dtype == np.float16 and np.abs(a).max(initial=0.0) > _F16_MAX:
        raise ValueError(f"layer {layer} {name}: |value| {np.abs(a).max():.3g} overflows float16; "
                         "dump with dtype='float32'")
    return a


def dump_model(model: torch.nn.Module, loader, path: str, *, layers=None, dtype: str = "float16",
               with_out: bool = True, with_attn: bool = False, with_labels: bool = True,
               with_logits: bool = True, with_images: bool = False, max_images: int | None = None,
               model_name: str | None = None, attention_family: str | None = None,
               feature_map: str | None = None, convention: str = "code", grid=None,
               prefix_tokens: int | None = None, compression: int = 4,
               device: str | torch.device | None = None,
               allow_rotary: bool = False, shard: int | None = None,
               num_shards: int | None = None, families=None,
               self_check: bool = True) -> DumpSummary:
    """Writes the dump of `model` over `loader` to `path` (atomically: a temporary name, renamed
    when complete). `loader` yields tensors, (images, labels) pairs or dicts with pixel_values.

    layers: source layer indices to keep (default all); they become /layers/0.. in order and the
    source indices are stored in the `source_layers` attribute. grid / prefix_tokens override
    what is read from the model ((height, width) and the number of prefix tokens).

    Each layer's family, feature map and convention come from its attention module: the
    released structures of released.STRUCTURES (InLine, FLatten, ...), the project's own models,
    or timm's, Hugging Face's and torchvision's softmax attention. Any other module is refused,
    never taken for softmax. families= states them instead: one spec "family[:map][@convention]"
    for every layer, or a dict {model layer: spec} (attention_family= with feature_map= and
    convention= is the same statement for every layer; convention= alone sets every layer's
    convention). A statement keeps a recognised structure's capture and changes its family; the
    self-check judges it. Each /layers/L group records its own
    `attention_family`, `feature_map` and `convention`; the root attributes are those of the
    first dumped layer. A module's local term (InLine's local residual, FLatten's depthwise
    convolution) is written apart, as /layers/L/local, so that out is exactly W V.

    self_check (default on): on the first batch, every layer's W V is recomputed from the
    captured q, k, v with the layer's family (attention.attention_outputs, the Python mirror of
    the registry) and compared with the model's own; a worst difference above 1e-3 of the
    head's largest output stops the dump with a ValueError naming the layer, its structure and
    its family.

    A model that rotates q and k (RoPE) is refused: q and k are read before the rotation, so they
    are not the vectors the attention used. allow_rotary=True dumps them anyway, with a warning
    and without the self-check.

    shard=i, num_shards=n: data-parallel dumping. Of the T images the loader yields (the first
    max_images when given), this call writes the i-th contiguous block, images
    [i*T//n, (i+1)*T//n), and records it in the attributes shard_index, num_shards,
    shard_first_image and total_images. Run every i (on as many processes or machines as wanted,
    each with the same loader order) and read the files as one dump with
    `attnscope ... --dump s0.h5 s1.h5 ...`. T is max_images, else len(loader.dataset), else
    counted from a list of batches. The images before the block are skipped without running the
    model.
    """
    np_dtype = _dtype(dtype)
    style, sites, keep, attrs = model_setup(model, layers, model_name, attention_family,
                                            feature_map, convention, grid, prefix_tokens,
                                            allow_rotary, families)
    if allow_rotary and rotary_sources(model, sites):
        self_check = False  # the warning says it: the dumped q and k are not the model's
    first, stop = 0, max_images
    if shard is not None or num_shards is not None:
        first, stop, total = _shard_block(loader, shard, num_shards, max_images)
        attrs.update(shard_index=int(shard), num_shards=int(num_shards),
                     shard_first_image=int(first), total_images=int(total))

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with hooked(model, sites, keep, with_attn, with_out or self_check) as stores:
            with h5py.File(tmp, "w", libver=_LIBVER) as f:
                f.attrs.update(attrs)
                f.attrs["source_layers"] = np.asarray(keep, dtype=np.int64)
                for slot, i in enumerate(keep):
                    info = sites[i].info
                    g = f.require_group(f"layers/{slot}")
                    g.attrs.update(attention_family=info.family, convention=info.convention,
                                   feature_map=_layer_map(info), **sites[i].geometry_attrs)
                    for name, arr in sites[i].geometry_arrays.items():
                        g.create_dataset(name, data=arr)
                check = [sites[i] for i in keep] if self_check else None
                n = _stream(model, loader, f, stores, keep, attrs, np_dtype, compression, first,
                            stop, with_out, with_attn, with_labels, with_logits, with_images,
                            device, call_kwargs(model, style, with_attn),
                            [sites[i].hint for i in keep], check,
                            [layer_shapes(attrs, sites[i].geometry_attrs) for i in keep])
                if n == 0:
                    raise ValueError("the loader yielded no images")
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return DumpSummary(path, n, keep, attrs)


def _dtype(dtype: str):
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be float16 or float32, not {dtype!r}")
    return _DTYPES[dtype]


def model_setup(model, layers, model_name, attention_family, feature_map, convention, grid,
                prefix_tokens, allow_rotary, families=None):
    """(style, sites, keep, attrs): where the model's attention is read, each layer's family
    (recognised or stated by families= / attention_family=, see dump_model), the source indices
    of the layers to read (default all, validated), and the dump's attributes of those layers
    (num_layers included). Refuses unsupported and rotary models (see dump_model)."""
    if attention_family is not None or feature_map is not None:
        if families is not None:
            raise ValueError("give families= or attention_family= / feature_map=, not both")
        if attention_family is None:
            raise ValueError("feature_map= states a family's map: give attention_family= with it "
                             "(or families=)")
        families = attention_family + (f":{feature_map}" if feature_map else "") \
            + f"@{convention}"
    style, sites = find_sites(model, families)
    if convention != "code":  # the convention alone: every layer's, whatever its family
        for site in sites:
            site.info.convention = convention
    if not all(getattr(s, "captures_rotation", False) for s in sites):  # else each site records it
        check_rotary(model, sites, allow_rotary)
    keep = list(range(len(sites))) if layers is None else [int(i) for i in layers]
    for i in keep:
        if not 0 <= i < len(sites):
            raise ValueError(f"layer {i} out of range: the model has {len(sites)} layers")
    for i in keep:
        if getattr(sites[i], "reason", None) is not None:  # hooks.RefusedSite
            raise ValueError(sites[i].reason)
    if len(set(keep)) != len(keep):
        raise ValueError(f"layers {keep} name a layer twice: each model layer can be dumped once")
    if not keep:
        raise ValueError("layers is empty: name at least one model layer to dump")
    attrs = _attributes(model, style, [sites[i] for i in keep], model_name, grid, prefix_tokens)
    attrs["num_layers"] = len(keep)
    root = (attrs["grid_height"], attrs["grid_width"], attrs["prefix_tokens"])
    stage0 = attrs.pop("_first_stage", root)  # RoPE stages: the first stage's grid (grid=)
    for i in keep:
        hint = sites[i].layout_hint
        hint = hint(stage0) if callable(hint) else hint  # a later stage's grid from the first's
        layout = root if hint is None or i == keep[0] else hint
        if hasattr(sites[i], "set_layout"):
            sites[i].set_layout(layout)
        sites[i].geometry_attrs, sites[i].geometry_arrays = _layer_geometry(sites[i], layout, attrs)
    return style, sites, keep, attrs


def _layer_geometry(site, layout, root: dict):
    """(attributes of /layers/L that differ from the root's, with the site's keys and windows;
    its token_positions / window_mask arrays) for the per-layer format of docs/dump-format.md."""
    info = site.info
    gh, gw, prefix = layout
    own = {"num_heads": int(info.num_heads), "head_dim": int(info.head_dim),
           "scale": float(info.scale), "grid_height": int(gh), "grid_width": int(gw),
           "prefix_tokens": int(prefix)}
    attrs = {k: v for k, v in own.items() if v != root[k]}
    extra, arrays = site.geometry() if hasattr(site, "geometry") else ({}, {})
    attrs.update(extra)
    return attrs, arrays


def layer_shapes(attrs: dict, geometry: dict) -> dict:
    """The captured shape per image of each dataset of a layer: q, out, local; k, v; attn."""
    g = {**attrs, **geometry}
    h, d = g["num_heads"], g["head_dim"]
    if "windows" in g:
        t = g["window_height"] * g["window_width"]
        qs, ks, a = (h, g["windows"], t, d), (h, g["windows"], t, d), (h, g["windows"], t, t)
    else:
        n = g["prefix_tokens"] + g["grid_height"] * g["grid_width"]
        nk = g["prefix_tokens"] + g.get("key_grid_height", g["grid_height"]) \
            * g.get("key_grid_width", g["grid_width"])
        qs, ks, a = (h, n, d), (h, nk, d), (h, n, nk)
    return {"q": qs, "out": qs, "local": qs, "k": ks, "v": ks, "attn": a}


@contextlib.contextmanager
def hooked(model, sites, keep, with_attn: bool, with_out: bool):
    """The hooks of the layers `keep` installed, the model in eval mode; yields one store (dict)
    per kept layer, which captured_batches reads. On leaving, even by an error, the hooks are
    removed and the model's train/eval state and fused-attention flags restored."""
    stores = [dict() for _ in keep]
    handles = []
    was_training = model.training
    model.eval()
    try:
        for slot, i in enumerate(keep):
            handles += sites[i].install(stores[slot], with_attn, with_out)
        yield stores
    finally:
        for hnd in handles:
            hnd.remove()
        for site in sites:
            site.restore()
        model.train(was_training)


def _total_images(loader, max_images) -> int:
    """The number of images a sharded dump splits: max_images, the loader's dataset, or the
    images of a list of batches."""
    if max_images is not None:
        return int(max_images)
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    if isinstance(loader, (list, tuple)):
        return sum(len(_split_batch(b)[0]) for b in loader)
    raise ValueError("shard= needs the number of images to split: pass max_images=, or a loader "
                     "with a sized .dataset, or a list of batches")


def _shard_block(loader, shard, num_shards, max_images):
    """[first, stop) of shard `shard` of `num_shards` contiguous blocks, and the images split."""
    if shard is None or num_shards is None:
        raise ValueError("give both shard= and num_shards=")
    if isinstance(shard, bool) or isinstance(num_shards, bool) or int(num_shards) < 1 \
            or not 0 <= int(shard) < int(num_shards):
        raise ValueError(f"shard={shard!r}, num_shards={num_shards!r}: expected 0 <= shard < "
                         "num_shards")
    total = _total_images(loader, max_images)
    first, stop = int(shard) * total // int(num_shards), (int(shard) + 1) * total // int(num_shards)
    if first == stop:
        raise ValueError(f"shard {shard} of {num_shards} holds no image: there are only {total} "
                         "images; use fewer shards")
    return first, stop, total


def captured_batches(model, loader, stores, keep, names, attrs, np_dtype, first, stop, device,
                     kwargs, hints, check=None, shapes=None):
    """Runs the model over the loader's images [first, stop) (stop None: to the end), one batch
    at a time, the hooks of the layers `keep` writing into `stores`. Yields (x, y, output,
    captured) per batch, captured[slot][name] the layer's `name` ("q", "k", "v", "out", "attn",
    and "local" with "out" where the module has a local term) as a checked numpy array of
    np_dtype, [images, heads, tokens, dim] (attn: [.., tokens]). Nothing of a batch is kept once
    the next one runs: memory holds one batch. check: the sites of the layers, for the
    self-check on the first batch (see dump_model), or None. shapes: per layer, the shape per
    image of each dataset (layer_shapes); default the root's for every layer."""
    shapes = shapes or [layer_shapes(attrs, {})] * len(keep)
    pos = 0  # the loader's index of the batch's first image
    had_local = None  # per layer, whether the first batch brought a local term
    with torch.no_grad():
        for batch in loader:
            x, y = _split_batch(batch)
            lo = max(first - pos, 0)
            hi = len(x) if stop is None else min(len(x), stop - pos)
            pos += len(x)
            if pos <= first and len(x) > 0:
                continue  # wholly before the block
            x = x[lo:hi]
            y = None if y is None else y[lo:hi]
            if len(x) == 0:
                break
            for s in stores:
                s.clear()
            output = model(x.to(device) if device is not None else x, **kwargs)
            if check is not None and had_local is None:
                for src, site, s in zip(keep, check, stores):
                    _self_check(src, site.info, s)
            locals_now = ["out" in names and "local" in s for s in stores]
            if had_local is None:
                had_local = locals_now
            captured = []
            for slot, (src, s) in enumerate(zip(keep, stores)):
                if locals_now[slot] != had_local[slot]:
                    raise ValueError(f"layer {src}: its local term came in some batches only")
                layer = {}
                for name in names + (("local",) if locals_now[slot] else ()):
                    if name not in s:
                        raise ValueError(f"layer {src}: no '{name}' was captured ({hints[slot]})")
                    a = _checked(name, src, s[name], np_dtype)
                    want = shapes[slot][name]
                    if a.shape[1:] != want:
                        raise ValueError(f"layer {src} {name}: captured shape {a.shape[1:]}, "
                                         f"expected {want} from the layer's attributes")
                    layer[name] = a
                conv = s.get("local_conv")
                if locals_now[slot] and conv is not None and conv["per_image"]:
                    layer["local_kernel"] = _checked("local_kernel", src, conv["kernel"],
                                                     np.float32)
                if "agents" in s:  # per image, the family's own tokens (Agent attention)
                    layer["agents"] = _checked("agents", src, s["agents"], np_dtype)
                captured.append(layer)
            yield x, y, output, captured
            if stop is not None and pos >= stop:
                break


def _stream(model, loader, f, stores, keep, attrs, np_dtype, compression, first, stop, with_out,
            with_attn, with_labels, with_logits, with_images, device, kwargs, hints,
            check=None, shapes=None) -> int:
    """Writes the loader's images [first, stop) (stop None: to the end); returns how many.
    check: the sites of the dumped layers, for the self-check on the first batch, or None."""
    w = _Writer(f, np_dtype, compression)
    names = ("q", "k", "v") + (("out",) if with_out else ()) + (("attn",) if with_attn else ())
    n = 0
    for x, y, output, captured in captured_batches(model, loader, stores, keep, names, attrs,
                                                   np_dtype, first, stop, device, kwargs, hints,
                                                   check, shapes):
        if n == 0:
            _write_family_params(f, stores)
        for slot, layer in enumerate(captured):
            for name, a in layer.items():
                w.append(f"layers/{slot}/{name}", a,
                         dtype=np.float32 if name == "local_kernel" else None)
        if n == 0:
            _write_local_conv(f, stores, captured)
        if with_labels and y is not None:
            w.append("labels", np.asarray(y.cpu(), dtype=np.int64), dtype=np.int64)
        logits = _logits_of(output)
        if with_logits and logits is not None:
            w.append("logits", logits.detach().float().cpu().numpy(), dtype=np.float32)
        if with_images:
            w.append("images", x.detach().float().cpu().numpy(), dtype=np.float32)
        n += len(x)
    return n


def _write_family_params(f: h5py.File, stores) -> None:
    """/layers/L/family_params/NAME, float32 [heads, rows, cols], as the first batch's modules
    computed them (docs/dump-format.md, "Family parameters")."""
    for slot, s in enumerate(stores):
        for name, t in (s.get("params") or {}).items():
            a = t.detach().to(torch.float32).cpu().numpy() if torch.is_tensor(t) else np.asarray(t)
            if not np.isfinite(a).all():
                raise ValueError(f"layer {slot} family parameter {name}: non-finite value")
            f.create_dataset(f"layers/{slot}/family_params/{name}", data=a.astype(np.float32))


def _write_local_conv(f: h5py.File, stores, captured) -> None:
    """The local term's depthwise kernel where a layer's site knows it (docs/dump-format.md,
    "The local term's kernel"): /layers/L/local_kernel float32, [heads, head_dim, kh, kw] when
    the same for every image (a module's own weights, written here once) or per image (InLine's
    kernels made from each image's tokens, appended with the batches), its zero padding as the
    dataset's attributes; /layers/L/local_bias float32 [heads, head_dim] when the conv has one."""
    for slot, (s, layer) in enumerate(zip(stores, captured)):
        conv = s.get("local_conv")
        if conv is None or "local" not in layer:
            continue
        name = f"layers/{slot}/local_kernel"
        if not conv["per_image"]:
            f.create_dataset(name, data=conv["kernel"].numpy().astype(np.float32))
        f[name].attrs.update(padding_height=int(conv["padding"][0]),
                             padding_width=int(conv["padding"][1]))
        if conv["bias"] is not None:
            f.create_dataset(f"layers/{slot}/local_bias",
                             data=conv["bias"].numpy().astype(np.float32))


def _layer_map(info) -> str:
    if info.family in FIELD_FAMILIES and info.family != "mala":
        return "none"  # their maps are part of the family (ELU+1, PolaFormer's signed powers)
    return info.feature_map if family_entry(info.family).takes_map else "none"


def _self_check(layer: int, info, store: dict, tol: float = 1e-3) -> None:
    """The model's own W V against the layer's family recomputed from its q, k, v (in float64)."""
    if is_field_variant(info.family, info.convention):
        if "params" not in store:
            raise ValueError(f"layer {layer}: no family parameters were captured for "
                             f"{info.family}@{info.convention}")
        mine = field_outputs(info.family, info.convention, store["q"], store["k"], store["v"],
                             info.scale, store["params"], store.get("agents"))
        return _compare(layer, info, mine, store["out"].detach().double().cpu(), tol)
    if info.convention != "code" and info.family != "softmax":  # softmax: one form in both
        raise ValueError(f"layer {layer}: self_check recomputes the code convention only, the "
                         f"layer states '{info.convention}'; dump with self_check=False")
    if "out" not in store:
        raise ValueError(f"layer {layer}: no per-head output was captured for the self-check")
    q, k, v, out = (store[n].detach().double().cpu() for n in ("q", "k", "v", "out"))
    mine = attention_outputs(info.family, q, k, v, info.scale, _layer_map(info))
    _compare(layer, info, mine, out, tol)


def _compare(layer: int, info, mine: torch.Tensor, out: torch.Tensor, tol: float) -> None:
    per_head = tuple(range(2, out.ndim))  # a head's tokens (of every window) and dims
    worst = (mine - out).abs().amax(dim=per_head) / out.abs().amax(dim=per_head).clamp_min(1e-30)
    if worst.max().item() > tol:
        b, h = divmod(int(worst.argmax()), worst.shape[1])
        raise ValueError(
            f"layer {layer} ({info.structure}): the model's attention output is not "
            f"{info.family}:{_layer_map(info)}@{info.convention} of the captured q, k, v: worst "
            f"difference {worst.max().item():.3g} of the head's largest output (image {b}, head "
            f"{h}; tolerance {tol:g}); the family is wrong or the module computes more than it "
            "(state the family with families=, or dump with self_check=False)")


def _attributes(model, style, sites, model_name, grid, prefix):
    """The root attributes: the first dumped layer's family and geometry (a layer of another
    shape records its own, see _layer_geometry)."""
    first = sites[0].info
    layout = token_layout(model, style)
    if layout is None and sites[0].layout_hint is not None and not callable(sites[0].layout_hint):
        layout = sites[0].layout_hint
    if grid is None or prefix is None:
        if layout is None:
            raise ValueError("cannot read the token grid from the model: pass grid=(h, w) and "
                             "prefix_tokens=")
    gh, gw = (grid if grid is not None else layout[:2])
    prefix = prefix if prefix is not None else layout[2]
    extra = {}
    if callable(sites[0].layout_hint):  # a later RoPE stage first: grid= is the first stage's
        extra["_first_stage"] = (int(gh), int(gw), int(prefix))
        gh, gw, prefix = sites[0].layout_hint(extra["_first_stage"])
    return {**extra,
        "format": "attnscope-dump", "format_version": 1,
        "model_name": model_name or type(model).__name__,
        "attention_family": first.family,
        "convention": first.convention,
        "feature_map": _layer_map(first),
        "scale": float(first.scale), "num_heads": int(first.num_heads),
        "head_dim": int(first.head_dim), "num_tokens": int(prefix + gh * gw),
        "grid_height": int(gh), "grid_width": int(gw), "prefix_tokens": int(prefix),
    }
