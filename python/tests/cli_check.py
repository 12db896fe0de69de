"""`attnscope info` and `attnscope recompute` on a dump written by the dumper: the file is valid
for the C++ reader, and the outputs recomputed from its q, k, v with its own attributes (family,
feature map, convention, scale) equal the model's own per-head outputs and weights."""
import os
import subprocess

import numpy as np

from attnscope_dump.figures import read_csv


def info_and_recompute(attnscope_bin, dump, out_dir, tol=1e-5):
    """Returns (info stdout, recompute.csv columns); fails the test on any non-zero exit."""
    info = subprocess.run([attnscope_bin, "info", str(dump)], capture_output=True, text=True,
                          timeout=120)
    assert info.returncode == 0, f"attnscope info {dump}: {info.stdout}{info.stderr}"
    assert "schema      valid" in info.stdout, info.stdout
    r = subprocess.run([attnscope_bin, "recompute", "--dump", str(dump), "--out", str(out_dir),
                        "--tol", repr(tol), "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"attnscope recompute {dump} (tol {tol}): {r.stdout}{r.stderr}"
    csv = read_csv(os.path.join(str(out_dir), "recompute.csv"))
    rel = np.asarray(csv["out_max_rel_error"], dtype=float)
    assert rel.size and rel.max() < tol, f"{dump}: worst relative output error {rel.max()}"
    return info.stdout, csv
