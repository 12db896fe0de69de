#!/usr/bin/env bash
# Side-by-side benchmark of the five per-head diagnostics (`attnscope distance`, `entropy`, `sinks`,
# `rank`, `rollout`) against the PyTorch CPU scripts a researcher would write
# (bench/torch_diagnostics.py), softmax at DeiT-T's shape (12 layers, 3 heads, 14 x 14 grid + CLS,
# d = 64), on the same cores, the tools interleaved. Checks the results first (every head's mean,
# or every token's for rollout, against PyTorch's within 1e-4 relative; sink shares and high-norm
# counts exactly; numerical ranks exactly; and attnscope's fast path against its own --reference
# within 1e-6 relative, the float path's measured tolerance), then prints a markdown table: ms per
# image (median / min / max over the images of run 1, the medians and the means of the REPEATS
# runs), the ratios of medians and of means, peak RSS.
#
# Usage: bench/diagnostics_vs_torch.sh   (env: BUILD=build DATA=$BUILD/bench-data CORES=0,1
#        IMAGES=256 RANK_IMAGES=16 REF_IMAGES=4 REPEATS=3 TASKS="distance entropy sinks rank rollout")
# Reads the DeiT-T dump of bench/run_comparison.sh ($DATA/deit.h5), writing it if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${DATA:-$BUILD/bench-data}
CORES=${CORES:-0,1}
IMAGES=${IMAGES:-256}
RANK_IMAGES=${RANK_IMAGES:-16}
REF_IMAGES=${REF_IMAGES:-4}
REPEATS=${REPEATS:-3}
TASKS=${TASKS:-distance entropy sinks rank rollout}
A=$BUILD/apps/attnscope
OUT=$DATA/diagnostics
mkdir -p "$DATA" "$OUT"
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
export OMP_NUM_THREADS=2 OMP_PROC_BIND=false OMP_WAIT_POLICY=PASSIVE
. bench/torch_blas.sh
. bench/deit_floor.sh
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
head -c $((IMAGES * 8 * 1024 * 1024)) "$DATA/deit.h5" >/dev/null  # warm the page cache for every tool
args() { [ "$1" = distance ] && echo "--patch-size 16" || true; }
count() { [ "$1" = rank ] && echo "$RANK_IMAGES" || echo "$IMAGES"; }
for r in $(seq 1 "$REPEATS"); do
  for t in $TASKS; do
    n=$(count "$t")
    # shellcheck disable=SC2046
    run "${t}_fast$r" "$A" "$t" --dump "$DATA/deit.h5" --out "$OUT/${t}_fast$r" --variant softmax --threads 2 \
      $(args "$t") --images "0-$((n - 1))"
    run "${t}_torch$r" env "$TORCH_ENV" "$PYTHON" bench/torch_diagnostics.py --dump "$DATA/deit.h5" --task "$t" --images "$n"
  done
done
for t in $TASKS; do
  for mode in ref fast_few; do
    # shellcheck disable=SC2046
    run "${t}_$mode" "$A" "$t" --dump "$DATA/deit.h5" --out "$OUT/${t}_$mode" --variant softmax --threads 2 \
      $(args "$t") --images "0-$((REF_IMAGES - 1))" $([ $mode = ref ] && echo --reference)
  done
done

rm -f "$OUT/medians.txt"
deit_floor "$OUT/floor.json"  # the machine's floor for a DeiT-T head (bench/deit_floor.sh)

"$PYTHON" - "$OUT" "$REPEATS" "$TASKS" <<'PY'
import csv, json, statistics, sys
out, repeats, tasks = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def rows(path):
    return list(csv.DictReader(open(path)))
def per_head(path, col):
    return {(int(r["layer"]), int(r["head"])): float(r[col]) for r in rows(path)}
def rel(a, b, scale=None):
    return abs(a - b) / (scale if scale is not None else max(abs(b), 1e-300))
# (result file, column compared with PyTorch's per-head value index, the same for fast vs --reference)
CHECK = {"distance": ("distance.csv", "mean_distance", None), "entropy": ("entropy.csv", "mean_entropy", None),
         "sinks": ("sinks.csv", "mean_max_received", 0), "rank": ("rank.csv", "mean_erank", 1)}
# Correctness before timing.
for t in tasks:
    torch = json.load(open(f"{out}/{t}_torch1.out"))
    if t == "rollout":
        fast = {int(r["token"]): float(r["mean"]) for r in rows(f"{out}/rollout_fast1/rollout_mean.csv")}
        top = max(abs(x) for x in torch["per_head"])
        worst = max(rel(fast[j], x, top) for j, x in enumerate(torch["per_head"]))
        few = {int(r["token"]): float(r["mean"]) for r in rows(f"{out}/rollout_fast_few/rollout_mean.csv")}
        ref = {int(r["token"]): float(r["mean"]) for r in rows(f"{out}/rollout_ref/rollout_mean.csv")}
        worst_ref = max(rel(few[j], ref[j], max(abs(x) for x in ref.values())) for j in ref)
        what = f"{len(fast)} tokens of the mean CLS row (relative to its largest entry)"
    else:
        name, col, idx = CHECK[t]
        fast = per_head(f"{out}/{t}_fast1/{name}", col)
        pick = (lambda v: v) if idx is None else (lambda v: v[idx])
        worst = max(rel(fast[(l, h)], pick(torch["per_head"][l][h])) for (l, h) in fast)
        few, ref = per_head(f"{out}/{t}_fast_few/{name}", col), per_head(f"{out}/{t}_ref/{name}", col)
        worst_ref = max(rel(few[k], ref[k]) for k in ref)
        what = f"{len(fast)} heads' {col}"
        if t == "sinks":
            share = per_head(f"{out}/sinks_fast1/sinks.csv", "sink_share")
            assert all(share[(l, h)] == torch["per_head"][l][h][1] for (l, h) in share), "sink shares differ"
            high = {}
            for r in rows(f"{out}/sinks_fast1/sinks_norms.csv"):
                high[int(r["layer"])] = high.get(int(r["layer"]), 0) + int(r["high_norm_images"])
            assert [high[l] for l in sorted(high)] == [int(x) for x in torch["high_norm_tokens"]], "high-norm counts differ"
            what += ", sink shares and high-norm counts equal"
        if t == "rank":
            ranks = per_head(f"{out}/rank_fast1/rank.csv", "mean_rank")
            assert all(ranks[(l, h)] == torch["per_head"][l][h][0] for (l, h) in ranks), "numerical ranks differ"
            k_ratio = per_head(f"{out}/rank_fast1/rank.csv", "mean_k_ratio")
            worst = max(worst, max(rel(k_ratio[(l, h)], torch["per_head"][l][h][2]) for (l, h) in k_ratio))
            what += " and mean_k_ratio, numerical ranks equal"
    assert worst < 1e-4 and worst_ref < 1e-6, (t, worst, worst_ref)
    print(f"{t}: attnscope vs PyTorch: worst relative difference {worst:.1e} over {what}; "
          f"fast vs --reference: {worst_ref:.1e}")
print()
# Two ratios: of the medians of the time between finished images, and of their means (the loop's
# time over its images). attnscope's commands that keep two images in flight finish some images
# moments apart, so their median interval can sit below their mean: the ratio of means is the
# one that counts throughput.
print("| task | tool | ms/image median / min / max (run 1) | medians of the runs | means of the runs | ratio of medians | ratio of means | peak RSS (MiB) |")
print("|---|---|---|---|---|---|---|---|")
for t in tasks:
    meds, means, table = {}, {}, []
    for tool in ("fast", "torch"):
        ms = []
        for r in range(1, repeats + 1):
            if tool == "torch":
                ms.append(json.load(open(f"{out}/{t}_torch{r}.out"))["ms_per_image"])
            else:
                ms.append(json.load(open(f"{out}/{t}_fast{r}/{t}.json"))["results"]["ms_per_image"])
        meds[tool] = statistics.median(m["median"] for m in ms)
        means[tool] = statistics.median(m["mean"] for m in ms)
        table.append((tool, ms, int(open(f"{out}/{t}_{tool}1.rss").read()) // 1024))
    if t != "rank":  # rank's time is its singular values, not the weights: no floor of products for it
        with open(f"{out}/medians.txt", "a") as f:
            f.write(f"{t}:{meds['torch']}:{meds['fast']}\n")
    for tool, ms, rss in table:
        label = "attnscope" if tool == "fast" else "PyTorch"
        spread = " / ".join("%.2f" % m["median"] for m in ms)
        mean_spread = " / ".join("%.2f" % m["mean"] for m in ms)
        print(f"| {t} softmax, DeiT-T | {label} | {ms[0]['median']:.2f} / {ms[0]['min']:.2f} / {ms[0]['max']:.2f} | "
              f"{spread} | {mean_spread} | {meds['torch'] / meds[tool]:.2f}x | {means['torch'] / means[tool]:.2f}x | {rss} |")
PY
echo
if [ -s "$OUT/medians.txt" ]; then
  # shellcheck disable=SC2046  # one argument a line
  deit_floor_lines "$OUT/floor.json" $(cat "$OUT/medians.txt")
  echo
fi
echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, pinned to cores $CORES, 2 threads each;" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end;" \
  "attnscope $("$A" --version | head -1 | cut -d' ' -f2) (arch $("$A" --version | sed -n 's/^arch: //p')), torch" \
  "$("$PYTHON" -c 'import torch; print(torch.__version__)')"
