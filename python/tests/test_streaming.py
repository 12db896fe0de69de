"""Streaming: the dumper's peak memory does not grow with the number of images.

Each run is a fresh interpreter (so peak RSS is its own), dumping a small model over lazily
generated batches; 32x more images (about 100 MB more dump) must not raise the peak by more
than a few MB."""
import os
import subprocess
import sys

from conftest import PYTHON_DIR

CHILD = r"""
import resource, sys, torch
sys.path.insert(0, sys.argv[1])
from attnscope_dump import dump_model
from attnscope_dump.models import ViTConfig, build_model
torch.set_num_threads(1)
n = int(sys.argv[2])
model = build_model(ViTConfig(family="softmax", embed_dim=32, depth=2, num_heads=2), seed=0)
def batches():
    g = torch.Generator().manual_seed(0)
    for _ in range(n // 64):
        yield torch.randn(64, 1, 28, 28, generator=g), torch.zeros(64, dtype=torch.long)
s = dump_model(model, batches(), sys.argv[3], dtype="float32", with_out=True, compression=0)
assert s.images == n, s.images
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


def _peak_kib(tmp_path, n):
    out = tmp_path / f"d{n}.h5"
    r = subprocess.run([sys.executable, "-c", CHILD, PYTHON_DIR, str(n), str(out)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().splitlines()[-1]), out.stat().st_size


def test_peak_memory_does_not_grow_with_images(tmp_path):
    small, small_bytes = _peak_kib(tmp_path, 64)
    big, big_bytes = _peak_kib(tmp_path, 2048)
    dump_growth_mib = (big_bytes - small_bytes) / 2 ** 20
    rss_growth_mib = (big - small) / 1024
    assert dump_growth_mib > 90, f"test too small: dump grew only {dump_growth_mib:.1f} MiB"
    assert rss_growth_mib < 12, (f"peak RSS grew {rss_growth_mib:.1f} MiB (64 -> 2048 images, "
                                 f"dump +{dump_growth_mib:.0f} MiB): the dumper holds data")
