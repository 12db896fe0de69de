"""attnscope_dump: write attnscope dumps (docs/dump-format.md) from PyTorch vision transformers,
and the project's small ViTs with softmax, linear, InLine and MALA attention."""
from .dumper import DumpSummary, dump_model

__all__ = ["dump_model", "DumpSummary"]
