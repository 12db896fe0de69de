#!/usr/bin/env python3
"""Executes figure notebooks headless (nbclient), in notebooks/, leaving the .ipynb files
untouched; each notebook writes its PNG itself.

    /usr/bin/python3 python/run_notebooks.py --results results/figures-data --figures figures \
        notebooks/*.ipynb
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import nbformat
from nbclient import NotebookClient


def run(path: str, timeout: int = 600) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
    client.execute()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--results", help="sets ATTNSCOPE_RESULTS for the notebooks")
    p.add_argument("--figures", help="sets ATTNSCOPE_FIGURES for the notebooks")
    args = p.parse_args(argv)
    for name, value in (("ATTNSCOPE_RESULTS", args.results), ("ATTNSCOPE_FIGURES", args.figures)):
        if value:
            os.environ[name] = os.path.abspath(value)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiets the kernel's debugger
    failed = 0
    for path in args.notebooks:
        start = time.time()
        try:
            run(path)
            print(f"{path}: ok ({time.time() - start:.1f} s)")
        except Exception as e:  # report every notebook, then fail
            failed += 1
            print(f"{path}: FAILED: {str(e).strip().splitlines()[-1] if str(e).strip() else e}",
                  file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
