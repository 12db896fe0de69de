# shellcheck shell=bash
# Sourced by the side-by-side scripts (after BUILD, PYTHON and CORES are set): deit_floor FILE
# measures, on the first of the benchmark's cores, the work that no exact float implementation of a
# DeiT-T softmax head can skip, and writes it to FILE (JSON):
# - the head's Q K^T product (197 x 64 by 64 x 197 in float: every logit is needed, since every
#   weight enters the row sums, the pivot distances and the diagnostics' sums), bench_portable's
#   BM_GemmPacked<float>/64/197, at this machine's rate;
# - the product followed by its softmax step in place (the rows' maxima, one exponential per
#   weight and the row sums), BM_ProductAndStepDeit;
# medians and minima of five repetitions, in microseconds, and the floors of one image of 36 heads
# on two threads (18 heads a thread): the products alone, and the products with the steps. A
# command that computes every weight cannot run below them on this machine, so the PyTorch
# script's time over a floor is the largest ratio it could reach here. Where bench_portable was
# not built (ATTNSCOPE_BENCH=OFF), FILE says so and nothing is measured; where it fails (one of its
# checks), deit_floor prints its messages and returns 1.
deit_floor() {
  local file=$1 bin=$BUILD/bench/bench_portable
  if [ ! -x "$bin" ]; then
    echo "{\"measured\": false, \"why\": \"no $bin (configure with -DATTNSCOPE_BENCH=ON)\"}" >"$file"
    return 0
  fi
  if ! taskset -c "${CORES%%,*}" "$bin" --benchmark_filter='^BM_GemmPacked<float>/64/197$|^BM_ProductAndStepDeit$' \
    --benchmark_repetitions=5 --benchmark_format=json >"$file.raw" 2>"$file.log"; then
    echo "deit_floor: $bin failed:" >&2
    cat "$file.log" >&2
    return 1
  fi
  "$PYTHON" - "$file.raw" "$file" "${CORES%%,*}" <<'PY'
import json, statistics, sys
raw, out, core = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for b in json.load(open(raw))["benchmarks"]:
    if b.get("run_type") == "iteration":
        assert b["time_unit"] == "us", b
        runs.setdefault(b["run_name"], []).append(b["real_time"])
gemm, head = runs["BM_GemmPacked<float>/64/197"], runs["BM_ProductAndStepDeit"]
per_image = 36 / 2 / 1000  # 36 heads on two threads, microseconds to milliseconds
floor = {"measured": True, "core": int(core),
         "gemm_us": {"median": statistics.median(gemm), "min": min(gemm)},
         "head_us": {"median": statistics.median(head), "min": min(head)}}
floor["products_ms"] = floor["gemm_us"]["median"] * per_image
floor["floor_ms"] = floor["head_us"]["median"] * per_image
json.dump(floor, open(out, "w"), indent=1)
PY
  rm -f "$file.raw" "$file.log"
}

# deit_floor_lines FLOOR_FILE TASK:TORCH_MS:ATTNSCOPE_MS ...: what the floor means for each task,
# against the PyTorch script's median and attnscope's median of the same run (ms per image).
deit_floor_lines() {
  "$PYTHON" - "$@" <<'PY'
import json, sys
floor = json.load(open(sys.argv[1]))
if not floor["measured"]:
    print(f"Floor: {floor['why']}.")
    sys.exit(0)
print(f"Floor of a DeiT-T head on this machine (core {floor['core']}, median / min of 5): "
      f"the float Q K^T product {floor['gemm_us']['median']:.1f} / {floor['gemm_us']['min']:.1f} us, "
      f"the product and its softmax step {floor['head_us']['median']:.1f} / {floor['head_us']['min']:.1f} us; "
      f"an image of 36 heads on 2 threads: the products alone {floor['products_ms']:.2f} ms, "
      f"with the exponentials {floor['floor_ms']:.2f} ms.")
print()
print("| task | PyTorch ms/image | attnscope ms/image | ratio | the most a command computing every weight could reach (PyTorch / products with exponentials; / products alone) | attnscope over that floor |")
print("|---|---|---|---|---|---|")
for arg in sys.argv[2:]:
    task, torch, mine = arg.split(":")
    torch, mine = float(torch), float(mine)
    print(f"| {task} | {torch:.2f} | {mine:.2f} | {torch / mine:.1f}x | {torch / floor['floor_ms']:.1f}x; "
          f"{torch / floor['products_ms']:.1f}x | {mine / floor['floor_ms']:.2f}x |")
PY
}
