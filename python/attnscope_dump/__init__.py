"""attnscope_dump: write attnscope dumps (docs/dump-format.md) from PyTorch vision transformers,
and the project's small ViTs with softmax, linear, InLine and MALA attention.

The dumper is imported on first use, so that the models and the training script also run where
h5py is missing (a GPU machine: python/train.py then writes a checkpoint that
python/export_weights.py turns into the HDF5 weights file elsewhere)."""

__all__ = ["dump_model", "DumpSummary"]


def __getattr__(name):
    if name in __all__:
        from . import dumper
        return getattr(dumper, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
