#!/usr/bin/env bash
# attnscope replay against the PyTorch model it was exported from, side by side in one run on the
# same pinned cores: images per second of the forward pass (no intervention), for every family and
# both model sizes. The 7x7 models are the committed ones; the 197-token (DeiT-T-shaped) models are
# freshly initialised (speed does not depend on training: the same shapes and the same work).
# Both tools run the same images from one dump; attnscope's time is its whole run (reading the
# weights and images included), PyTorch's the forward passes only, best of three batches passes.
#
# Usage: bench/replay_vs_torch.sh   (env: BUILD=build PYTHON=/usr/bin/python3 CORES=0,1
#                                    DATA=build/bench-replay IMAGES=256)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
CORES=${CORES:-0,1}
DATA=${DATA:-$BUILD/bench-replay}
IMAGES=${IMAGES:-256}
A=$BUILD/apps/attnscope
mkdir -p "$DATA"
export OMP_NUM_THREADS=2 OMP_PROC_BIND=false OMP_WAIT_POLICY=PASSIVE PYTHONPATH=python

# The 197-token models: initialised with seed 0, exported as float32.
for f in softmax linear inline mala; do
  [ -f "$DATA/vit14-$f.h5" ] || "$PYTHON" - "$f" "$DATA/vit14-$f.h5" <<'PY'
import sys
from attnscope_dump.models import DEIT_T, ViTConfig, build_model
from attnscope_dump.weights_io import save_weights
save_weights(build_model(ViTConfig(family=sys.argv[1], **DEIT_T), seed=0), sys.argv[2])
PY
done
models=(data/models/vit7-{softmax,linear,inline,mala}-fmnist.h5 "$DATA"/vit14-{softmax,linear,inline,mala}.h5)
for m in "${models[@]}"; do
  name=$(basename "$m" .h5)
  [ -f "$DATA/dump-$name.h5" ] || "$PYTHON" python/make_dumps.py --models "$m" --out "$DATA/dumps-$name" \
    --images "$IMAGES" --no-out --dtype float16 >/dev/null
  [ -f "$DATA/dump-$name.h5" ] || mv "$DATA/dumps-$name"/*.h5 "$DATA/dump-$name.h5"
done

echo "| model | family | tokens | attnscope replay: images/s | PyTorch: images/s | ratio |"
echo "|---|---|---|---|---|---|"
for m in "${models[@]}"; do
  name=$(basename "$m" .h5)
  dump="$DATA/dump-$name.h5"
  best=0
  for r in 1 2 3; do
    taskset -c "$CORES" "$A" replay --model "$m" --dump "$dump" --out "$DATA/out-$name" --threads 2 >/dev/null
    ips=$("$PYTHON" -c "import json; j = json.load(open('$DATA/out-$name/replay.json')); print(j['results']['rows'][0]['images'] / j['elapsed_s'])")
    best=$("$PYTHON" -c "print(max($best, $ips))")
  done
  taskset -c "$CORES" "$PYTHON" - "$m" "$dump" "$best" <<'PY'
import sys, time
import h5py, torch
from attnscope_dump.weights_io import load_weights
torch.set_num_threads(2)
model = load_weights(sys.argv[1]).eval()
with h5py.File(sys.argv[2], "r") as f:
    x = torch.from_numpy(f["images"][...])
rates = []
with torch.no_grad():
    for _ in range(3):
        t = time.perf_counter()
        for i in range(0, len(x), 64):
            model(x[i:i + 64])
        rates.append(len(x) / (time.perf_counter() - t))
cfg = model.config
ours = float(sys.argv[3])
print(f"| {cfg.family} {cfg.grid}x{cfg.grid} | {cfg.family} | {cfg.num_tokens} | {ours:.0f} | {max(rates):.0f} | {ours / max(rates):.2f}x |")
PY
done
