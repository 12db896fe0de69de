#!/usr/bin/env bash
# Two builds of attnscope side by side in one run: the confusion and locality cases of
# run_comparison.sh (DeiT-T shape, softmax; Swin stage-1 shape N = 3136, the kernel families),
# each run ROUNDS times alternating BEFORE and AFTER on the same pinned cores and the same cached
# dumps, so that both see the same machine. Prints a markdown table of ms per image (median over
# the rounds of each run's median, with the lowest and highest run median) and checks that both
# builds give the same per-image counts and per-layer masses, value for value in every column the
# older build writes (a newer build may add columns).
#
# Usage: BEFORE=/path/to/old/attnscope bench/compare_builds.sh
#        (env: AFTER=build/apps/attnscope DATA=build/bench-data ROUNDS=5 CORES=0,1 IMAGES=256
#         RESULT_TOL=0: counts always exactly; other numbers exactly, or within this relative
#         tolerance for a change that moves them in their last digits; TORCH=1: each round also
#         runs bench/torch_baseline.py on the DeiT-T cases after the two builds, and a second
#         table gives every round's ms per image and whole run of the three, and the ratios)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BEFORE:?set BEFORE to the attnscope binary to compare against}"
AFTER=${AFTER:-build/apps/attnscope}
PYTHON=${PYTHON:-/usr/bin/python3}
DATA=${DATA:-build/bench-data}
ROUNDS=${ROUNDS:-5}
CORES=${CORES:-0,1}
IMAGES=${IMAGES:-256}
OUT=$DATA/compare
mkdir -p "$DATA" "$OUT"
export OMP_NUM_THREADS=2 OMP_PROC_BIND=false OMP_WAIT_POLICY=PASSIVE
TORCH=${TORCH:-0}
[ "$TORCH" = 1 ] && . bench/torch_blas.sh

deit="$DATA/compare-deit.h5" swin="$DATA/compare-swin.h5"
[ -f "$deit" ] || "$AFTER" synth --out "$deit" --images "$IMAGES" --compression 0 --seed 1 --layers 12 \
  --heads 3 --grid-height 14 --grid-width 14 --prefix 1 --head-dim 64 --plant-duplicates 1 \
  --plant-collinear 1 --plant-shifted 1 --plant-hyperplane >/dev/null
[ -f "$swin" ] || "$AFTER" synth --out "$swin" --images 2 --compression 0 --seed 1 --layers 2 --heads 3 \
  --grid-height 56 --grid-width 56 --prefix 0 --head-dim 32 --plant-collinear 2 --family linear \
  --feature-map relu >/dev/null
cat "$deit" "$swin" >/dev/null  # both builds read the same cached bytes

# case NAME ANALYSIS DUMP ARGS...: one row of the table
cases=(
  "conf_deit|confusion|$deit|--variant softmax"
  "loc_deit|locality|$deit|--variant softmax"
  "conf_swin_kernel|confusion|$swin|--variant linear:relu,inline,mala"
  "conf_swin_softmax|confusion|$swin|--variant softmax"
)
for round in $(seq "$ROUNDS"); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name analysis dump args <<<"$c"
    for build in before after; do
      bin=$BEFORE; [ $build = after ] && bin=$AFTER
      # shellcheck disable=SC2086
      taskset -c "$CORES" "$bin" "$analysis" --dump "$dump" --out "$OUT/$name-$build-$round" \
        --threads 2 $args >/dev/null
    done
    if [ "$TORCH" = 1 ] && [ "$dump" = "$deit" ]; then  # the PyTorch script, timed as a process
      start=$(date +%s.%N)
      taskset -c "$CORES" env "$TORCH_ENV" "$PYTHON" bench/torch_baseline.py --dump "$dump" --task "$analysis" \
        --threads 2 --images "$IMAGES" >"$OUT/$name-torch-$round.out"
      echo "$start $(date +%s.%N)" | awk '{ printf "%.2f", $2 - $1 }' >"$OUT/$name-torch-$round.wall"
    fi
  done
done

"$PYTHON" - "$OUT" "$ROUNDS" "${RESULT_TOL:-0}" "${cases[@]}" <<'PY'
import csv, json, statistics, sys
out, rounds, tol, cases = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
print("| case | before: ms/image | after: ms/image | after / before | same results |")
print("|---|---|---|---|---|")
for c in cases:
    name, analysis = c.split("|")[:2]
    med = {}
    for build in ("before", "after"):
        runs = [json.load(open(f"{out}/{name}-{build}-{r}/{analysis}.json"))["results"]["ms_per_image"]["median"]
                for r in range(1, rounds + 1)]
        med[build] = (statistics.median(runs), min(runs), max(runs))
    files = {"confusion": ["confusion_per_image.csv", "confusion_per_head.csv"],
             "locality": ["locality.csv"]}[analysis]
    def table(path, columns=None):
        rows = list(csv.DictReader(open(path)))
        columns = columns or list(rows[0].keys()) if rows else columns or []
        return [[r[c] for c in columns] for r in rows], columns
    def close(a, b):
        if a == b or tol == 0.0:
            return a == b
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        return abs(x - y) <= tol * max(1.0, abs(x))
    def same_as_before(r, f):
        old, cols = table(f"{out}/{name}-before-{r}/{f}")
        new, _ = table(f"{out}/{name}-after-{r}/{f}", cols)
        return len(old) == len(new) and all(len(o) == len(n) and all(close(a, b) for a, b in zip(o, n))
                                            for o, n in zip(old, new))
    same = all(same_as_before(r, f) for r in range(1, rounds + 1) for f in files)
    fmt = lambda m: "%.2f (%.2f-%.2f)" % m
    print(f"| {name} ({c.split('|')[3]}) | {fmt(med['before'])} | {fmt(med['after'])} | "
          f"{med['after'][0] / med['before'][0]:.3f} | {('yes' if tol == 0.0 else f'within {tol:g}') if same else 'NO'} |")
    if not same:
        sys.exit(f"{name}: the two builds' results differ")
PY

[ "$TORCH" = 1 ] || exit 0
"$PYTHON" - "$OUT" "$ROUNDS" "${cases[@]:0:2}" <<'PY'
import json, sys
out, rounds, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print()
print("| case | round | before: ms/image median / mean | after | PyTorch | after's ratio, medians / means "
      "| whole run, s: before / after / PyTorch |")
print("|---|---|---|---|---|---|---|")
for c in cases:
    name, analysis = c.split("|")[:2]
    for r in range(1, rounds + 1):
        rec = {b: json.load(open(f"{out}/{name}-{b}-{r}/{analysis}.json")) for b in ("before", "after")}
        ms = {b: rec[b]["results"]["ms_per_image"] for b in rec}
        ms["torch"] = json.load(open(f"{out}/{name}-torch-{r}.out"))["ms_per_image"]
        wall = open(f"{out}/{name}-torch-{r}.wall").read().strip()
        cell = lambda m: "%.2f / %.2f" % (m["median"], m["mean"])
        print(f"| {name} | {r} | {cell(ms['before'])} | {cell(ms['after'])} | {cell(ms['torch'])} | "
              f"{ms['torch']['median'] / ms['after']['median']:.1f}x / {ms['torch']['mean'] / ms['after']['mean']:.1f}x | "
              f"{rec['before']['elapsed_s']:.2f} / {rec['after']['elapsed_s']:.2f} / {wall} |")
PY
