"""Model weights to and from HDF5, in the layout of docs/model-weights.md.

Every tensor of the state dict is one dataset whose path is its state-dict key with dots turned
into slashes (`blocks.0.attn.qkv.weight` -> `/blocks/0/attn/qkv/weight`), in PyTorch's own shape
and row-major order (a Linear weight is [out, in] and computes y = x W^T + b), float32 or float16
(the 14x14 models, to keep five of them small); a reader converts to float32. The model
configuration and the attention variant are root attributes, so a reader needs nothing else.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from .attention import FEATURE_MAPS, family
from .models import ViTConfig, VisionTransformer

FORMAT = "attnscope-vit-weights"
FORMAT_VERSION = 1
CHECKPOINT = "attnscope-vit-checkpoint"
_DTYPES = {"float32": np.float32, "float16": np.float16}


def round_to_float16(model: VisionTransformer) -> VisionTransformer:
    """Rounds every parameter to the nearest float16 in place (kept as float32), so the model
    computes what a float16 weights file of it gives back after load_weights."""
    with torch.no_grad():
        for t in model.state_dict().values():
            t.copy_(t.to(torch.float16).to(t.dtype))
    return model


def save_weights(model: VisionTransformer, path: str, extra: dict | None = None,
                 dtype: str = "float32") -> None:
    """Writes `model` to `path` atomically (temporary name, then rename). dtype "float16"
    rounds to nearest and stores each tensor as one chunk with gzip + shuffle; a value beyond
    float16's range is a ValueError naming the tensor."""
    import h5py  # here, so that the models import where h5py is missing
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be float32 or float16, not {dtype!r}")
    np_dtype = _DTYPES[dtype]
    cfg = model.config
    attn0 = model.blocks[0].attn
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        # HDF5 1.10 format: single-chunk indices and compact groups, 200 KB less per file.
        with h5py.File(tmp, "w", libver=("v110", "v110")) as f:
            f.attrs.update(
                format=FORMAT, format_version=FORMAT_VERSION, model_name=model_name(cfg),
                attention_family=cfg.family, feature_map=attn0.feature_map, convention="code",
                scale=float(attn0.scale), head_dim=attn0.head_dim,
                num_tokens=cfg.num_tokens, grid_height=cfg.grid, grid_width=cfg.grid,
                prefix_tokens=1, mlp_hidden=int(cfg.embed_dim * cfg.mlp_ratio),
                layer_norm_eps=1e-6, activation="gelu_erf",
                local_residual=int(cfg.local_residual), weights_dtype=dtype,
                config_json=json.dumps(cfg.to_dict(), sort_keys=True),
                image_mean=_mean_std()[0], image_std=_mean_std()[1])
            for key, val in (("image_size", cfg.image_size), ("patch_size", cfg.patch_size),
                             ("in_chans", cfg.in_chans), ("num_classes", cfg.num_classes),
                             ("embed_dim", cfg.embed_dim), ("depth", cfg.depth),
                             ("num_heads", cfg.num_heads)):
                f.attrs[key] = int(val)
            for key, val in (extra or {}).items():
                f.attrs[key] = val
            for key, tensor in model.state_dict().items():
                arr = tensor.detach().float().cpu().numpy()
                if np_dtype == np.float16 and np.abs(arr).max(initial=0.0) > 65504.0:
                    raise ValueError(f"{path}: tensor '{key}' has |value| "
                                     f"{np.abs(arr).max():.3g}, beyond float16's range")
                # One chunk per tensor: a chunk index costs more than gzip saves on small ones.
                opts = dict(compression="gzip", compression_opts=9, shuffle=True,
                            chunks=arr.shape) if np_dtype == np.float16 and arr.size > 1 else {}
                f.create_dataset(key.replace(".", "/"), data=arr.astype(np_dtype), **opts)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_weights(path: str) -> VisionTransformer:
    """Rebuilds the model from `path`; raises ValueError naming the file on a layout mismatch."""
    import h5py
    with h5py.File(path, "r") as f:
        if f.attrs.get("format") != FORMAT:
            raise ValueError(f"{path}: attribute 'format' is {f.attrs.get('format')!r}, "
                             f"expected {FORMAT!r}")
        cfg = ViTConfig(**json.loads(f.attrs["config_json"]))
        model = VisionTransformer(cfg)
        expected = model.state_dict()
        state = {}
        for key, ref in expected.items():
            name = key.replace(".", "/")
            if name not in f:
                raise ValueError(f"{path}: dataset '/{name}' missing")
            if f[name].dtype.kind != "f":
                raise ValueError(f"{path}: dataset '/{name}' has type {f[name].dtype}, "
                                 "expected float32 or float16")
            arr = f[name][()].astype(np.float32)
            if tuple(arr.shape) != tuple(ref.shape):
                raise ValueError(f"{path}: dataset '/{name}' has shape {arr.shape}, "
                                 f"expected {tuple(ref.shape)}")
            state[key] = torch.from_numpy(arr)
    model.load_state_dict(state)
    return model.eval()


def save_checkpoint(model: VisionTransformer, path: str, extra: dict | None = None,
                    dtype: str = "float32") -> None:
    """What save_weights would write, as a torch.save file, for a machine without h5py:
    export_checkpoint turns it into the weights file (python/export_weights.py)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be float32 or float16, not {dtype!r}")
    torch_dtype = torch.float16 if dtype == "float16" else torch.float32
    state = {k: t.detach().cpu().to(torch_dtype) for k, t in model.state_dict().items()}
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        torch.save({"format": CHECKPOINT, "config": model.config.to_dict(), "dtype": dtype,
                    "extra": dict(extra or {}), "state_dict": state}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def export_checkpoint(path: str, out_path: str) -> str:
    """Writes the weights file of a checkpoint of save_checkpoint; returns out_path."""
    ck = torch.load(path, map_location="cpu")
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT:
        raise ValueError(f"{path}: not a checkpoint written by train.py (no format "
                         f"{CHECKPOINT!r})")
    model = VisionTransformer(ViTConfig(**ck["config"]))
    model.load_state_dict({k: t.float() for k, t in ck["state_dict"].items()})
    save_weights(model, out_path, extra=ck["extra"], dtype=ck["dtype"])
    return out_path


def model_name(cfg: ViTConfig) -> str:
    """vit7-linear-fmnist; a feature map other than the family's own is named too
    (vit7-linear-focused=3-fmnist), and the local residual (vit14-inline-localres-fmnist)."""
    phi = family(cfg.family).resolve_map(cfg.feature_map)
    fmap = phi.name if phi is not None else "none"
    own = FEATURE_MAPS[cfg.family]
    return (f"vit{cfg.grid}-{cfg.family}" + (f"-{fmap}" if fmap != own else "")
            + ("-localres" if cfg.local_residual else "") + "-fmnist")


def _mean_std():
    from .data import MEAN, STD
    return MEAN, STD
