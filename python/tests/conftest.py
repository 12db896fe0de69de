"""Shared fixtures: tiny models and synthetic image loaders (no dataset needed), the attnscope
binary from $ATTNSCOPE, and the package on sys.path."""
from __future__ import annotations

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
for p in (PYTHON_DIR, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

torch.set_num_threads(1)


def image_loader(n: int, size: int = 16, channels: int = 1, batch: int = 8, seed: int = 0):
    """(images, labels) batches of seeded Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, size, size, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n, batch)]


@pytest.fixture
def loader16():
    return image_loader(12)


def tiny_vit(family: str, seed: int = 0, depth: int = 2, dim: int = 16, heads: int = 2,
             image_size: int = 16, patch: int = 4, feature_map: str | None = None,
             local_residual: bool = False):
    from attnscope_dump.models import ViTConfig, build_model
    cfg = ViTConfig(family=family, feature_map=feature_map, image_size=image_size,
                    patch_size=patch, num_classes=5, embed_dim=dim, depth=depth, num_heads=heads,
                    local_residual=local_residual)
    return build_model(cfg, seed=seed).eval()


def _model_variants():
    """(family, feature map spec or None) for the model tests: every family with its own map, and
    every family that takes a map with the focused one."""
    from attnscope_dump.attention import FAMILIES, family
    return ([(f, None) for f in FAMILIES]
            + [(f, "focused=3") for f in FAMILIES if family(f).takes_map])


MODEL_VARIANTS = _model_variants()
MODEL_VARIANT_IDS = [f if m is None else f"{f}:{m}" for f, m in MODEL_VARIANTS]


@pytest.fixture(scope="session")
def attnscope_bin():
    path = os.environ.get("ATTNSCOPE")
    if not path:
        pytest.skip("ATTNSCOPE is not set (make test sets it to build/apps/attnscope)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"ATTNSCOPE={path} is not an executable file: build it first (make build)")
    return path


@pytest.fixture(scope="session")
def attnscope_module():
    """The Python module attnscope built beside $ATTNSCOPE (<build>/python/attnscope), imported.
    Skips, saying why, where the module was not built (ATTNSCOPE_PYTHON=OFF or no pybind11)."""
    path = os.environ.get("ATTNSCOPE")
    if not path:
        pytest.skip("ATTNSCOPE is not set (make test sets it to build/apps/attnscope)")
    build_python = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "python")
    if not os.path.isdir(os.path.join(build_python, "attnscope")):
        pytest.skip(f"the Python module was not built ({build_python}/attnscope is missing: "
                    "install pybind11-dev and python3-dev, configure with ATTNSCOPE_PYTHON=AUTO or ON)")
    # Imported from the build tree by path: python/ (on sys.path for attnscope_dump) holds the
    # package's sources without the compiled extension, and the build's copy of attnscope_dump
    # must not shadow the sources the other tests check.
    import importlib.util
    package = os.path.join(build_python, "attnscope")
    spec = importlib.util.spec_from_file_location(
        "attnscope", os.path.join(package, "__init__.py"), submodule_search_locations=[package])
    module = importlib.util.module_from_spec(spec)
    sys.modules["attnscope"] = module
    spec.loader.exec_module(module)
    return module
