#!/usr/bin/env bash
# Side-by-side benchmark of `attnscope distance` and `attnscope entropy` against the PyTorch CPU
# script a researcher would write (bench/torch_diagnostics.py), softmax at DeiT-T's shape (12
# layers, 3 heads, 14 x 14 grid + CLS, d = 64), on the same cores. Checks the results first (every
# head's mean against PyTorch's float32 within 1e-4 relative, and attnscope's fast path against its
# own --reference), then prints a markdown table: ms per image (median / min / max over the images
# of one run, and the spread of the medians over REPEATS runs), ratio, peak RSS.
#
# Usage: bench/diagnostics_vs_torch.sh   (env: BUILD=build DATA=$BUILD/bench-data CORES=0,1
#                                          IMAGES=256 REF_IMAGES=4 REPEATS=3)
# Reads the DeiT-T dump of bench/run_comparison.sh ($DATA/deit.h5), writing it if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${DATA:-$BUILD/bench-data}
CORES=${CORES:-0,1}
IMAGES=${IMAGES:-256}
REF_IMAGES=${REF_IMAGES:-4}
REPEATS=${REPEATS:-3}
A=$BUILD/apps/attnscope
OUT=$DATA/diagnostics
mkdir -p "$DATA" "$OUT"
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
export OMP_NUM_THREADS=2 OMP_PROC_BIND=false OMP_WAIT_POLICY=PASSIVE
pin() { taskset -c "$CORES" "$@"; }
run() {  # run NAME CMD...: pinned under /usr/bin/time -v; stdout to NAME.out, peak RSS (KiB) to NAME.rss
  local name=$1; shift
  pin /usr/bin/time -v "$@" >"$OUT/$name.out" 2>"$OUT/$name.time"
  grep 'Maximum resident set size' "$OUT/$name.time" | awk '{print $NF}' >"$OUT/$name.rss"
}
if [ ! -f "$DATA/deit.h5" ]; then
  "$A" synth --out "$DATA/deit.h5" --images 1024 --compression 0 --seed 1 --layers 12 --heads 3 \
    --grid-height 14 --grid-width 14 --prefix 1 --head-dim 64 >/dev/null
fi
head -c $((IMAGES * 5 * 1024 * 1024)) "$DATA/deit.h5" >/dev/null  # warm the page cache for every tool
sel="--images 0-$((IMAGES - 1))"
for r in $(seq 1 "$REPEATS"); do
  run "dist_fast$r" "$A" distance --dump "$DATA/deit.h5" --out "$OUT/dist_fast$r" --variant softmax --patch-size 16 --threads 2 $sel
  run "dist_torch$r" "$PYTHON" bench/torch_diagnostics.py --dump "$DATA/deit.h5" --task distance --images "$IMAGES"
  run "ent_fast$r" "$A" entropy --dump "$DATA/deit.h5" --out "$OUT/ent_fast$r" --variant softmax --threads 2 $sel
  run "ent_torch$r" "$PYTHON" bench/torch_diagnostics.py --dump "$DATA/deit.h5" --task entropy --images "$IMAGES"
done
run dist_ref "$A" distance --dump "$DATA/deit.h5" --out "$OUT/dist_ref" --variant softmax --patch-size 16 --threads 2 \
  --reference --images 0-$((REF_IMAGES - 1))
run dist_fast_few "$A" distance --dump "$DATA/deit.h5" --out "$OUT/dist_fast_few" --variant softmax --patch-size 16 \
  --threads 2 --images 0-$((REF_IMAGES - 1))
run ent_ref "$A" entropy --dump "$DATA/deit.h5" --out "$OUT/ent_ref" --variant softmax --threads 2 \
  --reference --images 0-$((REF_IMAGES - 1))
run ent_fast_few "$A" entropy --dump "$DATA/deit.h5" --out "$OUT/ent_fast_few" --variant softmax --threads 2 \
  --images 0-$((REF_IMAGES - 1))

"$PYTHON" - "$OUT" "$REPEATS" <<'PY'
import csv, json, statistics, subprocess, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def heads(path, col):
    return {(int(r["layer"]), int(r["head"])): float(r[col]) for r in csv.DictReader(open(path))}
# Correctness before timing.
for task, col in (("dist", "mean_distance"), ("ent", "mean_entropy")):
    name = "distance" if task == "dist" else "entropy"
    fast = heads(f"{out}/{task}_fast1/{name}.csv", col)
    torch = json.load(open(f"{out}/{task}_torch1.out"))["per_head"]
    worst = max(abs(fast[(l, h)] - torch[l][h]) / abs(torch[l][h]) for (l, h) in fast)
    few, ref = heads(f"{out}/{task}_fast_few/{name}.csv", col), heads(f"{out}/{task}_ref/{name}.csv", col)
    worst_ref = max(abs(few[k] - ref[k]) / abs(ref[k]) for k in ref)
    assert worst < 1e-4 and worst_ref < 1e-9, (task, worst, worst_ref)
    print(f"{name}: attnscope (double) vs PyTorch (float32): worst relative difference {worst:.1e} over "
          f"{len(fast)} heads; fast vs --reference: {worst_ref:.1e}")
print()
print("| task | tool | ms/image median / min / max (run 1) | medians of the runs | ratio vs PyTorch | peak RSS (MiB) |")
print("|---|---|---|---|---|---|")
for task, name in (("dist", "distance"), ("ent", "entropy")):
    meds = {}
    rows = []
    for tool in ("fast", "torch"):
        ms = []
        for r in range(1, repeats + 1):
            j = json.load(open(f"{out}/{task}_{tool}{r}.out" if tool == "torch" else f"{out}/{task}_fast{r}/{name}.json"))
            ms.append(j["ms_per_image"] if tool == "torch" else j["results"]["ms_per_image"])
        meds[tool] = statistics.median(m["median"] for m in ms)
        rss = int(open(f"{out}/{task}_{tool}1.rss").read()) // 1024
        rows.append((tool, ms, rss))
    for tool, ms, rss in rows:
        label = "attnscope" if tool == "fast" else "PyTorch"
        spread = " / ".join("%.2f" % m["median"] for m in ms)
        print(f"| {name} softmax, DeiT-T | {label} | {ms[0]['median']:.2f} / {ms[0]['min']:.2f} / {ms[0]['max']:.2f} | "
              f"{spread} | {meds['torch'] / meds[tool]:.2f}x | {rss} |")
PY
echo
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, pinned to cores $CORES, 2 threads each;" \
  "attnscope $("$A" --version | head -1 | cut -d' ' -f2) (arch $("$A" --version | sed -n 's/^arch: //p')), torch" \
  "$("$PYTHON" -c 'import torch; print(torch.__version__)')"
