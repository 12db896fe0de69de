#!/usr/bin/env bash
# attnscope replay against the PyTorch model it was exported from, side by side on the same pinned
# cores: images per second of the forward pass (no intervention), for every trained model: the
# committed 7x7 ones and the five DeiT-T-shaped 197-token ones (data/models/vit14-*-fmnist.h5:
# softmax, linear ReLU, InLine, InLine with its local residual, MALA).
#
# Both tools run the same IMAGES test images from one dump of each model (python/make_dumps.py:
# /images, /labels, /logits and one layer's q, k, v: replay reads the first three; the whole
# file is fingerprinted for --resume, a cost that grows with the file, see docs/benchmarks.md).
# attnscope's time is its whole run (reading the weights and the images and writing the results
# included), PyTorch's the forward passes only (batches of 64, torch.no_grad(), one warm-up batch
# first). The two alternate, REPEATS rounds per model, each run a fresh process, so that a load
# from elsewhere falls on both; each column gives the median and the lowest and highest rate.
# The logits' error is replay.csv's dump_logits_max_rel_error (against the dump's /logits,
# PyTorch's, relative to the largest of them), and the predictions are compared with the argmax
# of those logits.
#
# BEFORE=path/to/another/attnscope adds that binary's replay, run in the same rounds (its first
# BEFORE_REPEATS of them), and the ratio of the two: a before/after comparison under one load.
# ATTENTION=float runs attnscope's replay with --attention float (softmax heads in float, PyTorch's
# precision); BEFORE_ARGS adds arguments to the BEFORE binary's replay, so that
# BEFORE=$BUILD/apps/attnscope BEFORE_ARGS="--attention double" ATTENTION=float puts the two
# precisions of one binary side by side.
#
# Usage: bench/replay_vs_torch.sh   (env: BUILD=build PYTHON=/usr/bin/python3 CORES=0,1
#                                    DATA=$BUILD/bench-replay IMAGES=256 REPEATS=5 MODELS="..."
#                                    BEFORE= BEFORE_REPEATS=$REPEATS BEFORE_ARGS= ATTENTION=double)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
CORES=${CORES:-0,1}
DATA=${DATA:-$BUILD/bench-replay}
IMAGES=${IMAGES:-256}
REPEATS=${REPEATS:-5}
BEFORE=${BEFORE:-}
BEFORE_REPEATS=${BEFORE_REPEATS:-$REPEATS}
BEFORE_ARGS=${BEFORE_ARGS:-}
ATTENTION=${ATTENTION:-double}
A=$BUILD/apps/attnscope
[ -x "$A" ] || { echo "replay_vs_torch.sh: no $A (build it first)" >&2; exit 1; }
read -r -a models <<<"${MODELS:-$(echo data/models/vit7-{softmax,linear,inline,mala}-fmnist.h5 \
  data/models/vit14-{softmax,linear,inline,inline-localres,mala}-fmnist.h5)}"
mkdir -p "$DATA"
export OMP_NUM_THREADS=2 OMP_PROC_BIND=false OMP_WAIT_POLICY=PASSIVE PYTHONPATH=python
. bench/torch_blas.sh

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores ($CORES used), $(free -g | awk '/Mem:/{print $2}') GiB;" \
  "$("$PYTHON" -c 'import torch; c = [l.strip() for l in torch.__config__.show().splitlines() if "CPU capability" in l]; print("PyTorch", torch.__version__, *c)')"
echo "attnscope: $A ($(git rev-parse --short HEAD 2>/dev/null || echo ?)$(git diff --quiet 2>/dev/null || echo ' + changes')), $IMAGES images, $REPEATS rounds"
echo "attnscope replay --attention $ATTENTION"
[ -z "$BEFORE" ] || echo "before: $BEFORE $BEFORE_ARGS, $BEFORE_REPEATS rounds"
echo "load average at start: $(load)"

for m in "${models[@]}"; do
  name=$(basename "$m" .h5)
  dump="$DATA/dump-$name-$IMAGES.h5"
  if [ ! -f "$dump" ] || [ "$dump" -ot "$m" ]; then
    rm -rf "$DATA/dumps-$name"
    "$PYTHON" python/make_dumps.py --models "$m" --out "$DATA/dumps-$name" --images "$IMAGES" --no-out \
      --layers 0 --dtype float16 >/dev/null
    mv "$DATA/dumps-$name/$name.h5" "$dump"
  fi
done

echo
if [ -n "$BEFORE" ]; then
  echo "| model | tokens | attnscope replay: images/s, median (min-max) | PyTorch: images/s, median (min-max) | ratio of medians | max logit error (rel.) | predictions as PyTorch's | before: images/s, median (min-max) | before: ratio to PyTorch | after / before | load average (start, end) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
else
  echo "| model | tokens | attnscope replay: images/s, median (min-max) | PyTorch: images/s, median (min-max) | ratio of medians | max logit error (rel.) | predictions as PyTorch's | load average (start, end) |"
  echo "|---|---|---|---|---|---|---|---|"
fi
for m in "${models[@]}"; do
  name=$(basename "$m" .h5)
  dump="$DATA/dump-$name-$IMAGES.h5"
  out="$DATA/out-$name"
  start=$(load)
  ours=() theirs=() before=()
  rate() { "$PYTHON" -c "import json; j = json.load(open('$1/replay.json')); print(j['results']['rows'][0]['images'] / j['elapsed_s'])"; }
  for ((r = 0; r < REPEATS; ++r)); do
    if [ -n "$BEFORE" ] && [ "$r" -lt "$BEFORE_REPEATS" ]; then
      taskset -c "$CORES" "$BEFORE" replay --model "$m" --dump "$dump" --out "$out-before" --threads 2 $BEFORE_ARGS >/dev/null
      before+=("$(rate "$out-before")")
    fi
    taskset -c "$CORES" "$A" replay --model "$m" --dump "$dump" --out "$out" --threads 2 --attention "$ATTENTION" >/dev/null
    ours+=("$(rate "$out")")
    theirs+=("$(taskset -c "$CORES" env "$TORCH_ENV" "$PYTHON" - "$m" "$dump" <<'PY'
import sys, time
import h5py, torch
from attnscope_dump.weights_io import load_weights
torch.set_num_threads(2)
model = load_weights(sys.argv[1]).eval()
with h5py.File(sys.argv[2], "r") as f:
    x = torch.from_numpy(f["images"][...])
with torch.no_grad():
    model(x[:64])  # warm-up
    t = time.perf_counter()
    for i in range(0, len(x), 64):
        model(x[i:i + 64])
    print(len(x) / (time.perf_counter() - t))
PY
)")
  done
  "$PYTHON" - "$m" "$dump" "$out" "$start" "$(load)" "${ours[*]}" "${theirs[*]}" "${before[*]:-}" <<'PY'
import csv, json, statistics, sys
import h5py, numpy as np
model, dump, out, start, end = sys.argv[1:6]
ours = [float(v) for v in sys.argv[6].split()]
theirs = [float(v) for v in sys.argv[7].split()]
before = [float(v) for v in sys.argv[8].split()]
row = json.load(open(f"{out}/replay.json"))["results"]["rows"][0]
with h5py.File(dump, "r") as f:
    want = np.argmax(f["logits"][...], axis=1)
    tokens = f.attrs["num_tokens"] if "num_tokens" in f.attrs else f["layers/0/q"].shape[2]
got = {int(r["image"]): int(r["predicted"]) for r in csv.DictReader(open(f"{out}/replay_logits.csv"))}
same = sum(got[i] == int(want[i]) for i in range(len(want)))
name = model.split("/")[-1].removesuffix(".h5")
fmt = lambda v: f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
cells = [name, str(tokens), fmt(ours), fmt(theirs), f"{statistics.median(ours) / statistics.median(theirs):.2f}x",
         f"{row['dump_logits_max_rel_error']:.2g}", f"{same}/{len(want)}"]
if before:
    cells += [fmt(before), f"{statistics.median(before) / statistics.median(theirs):.2f}x",
              f"{statistics.median(ours) / statistics.median(before):.1f}x"]
print("| " + " | ".join(cells + [f"{start}; {end}"]) + " |")
PY
done
echo
echo "load average at end: $(load)"
