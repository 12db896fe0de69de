#!/usr/bin/env bash
# The GPU benchmark, in one run on a machine with a CUDA device: builds attnscope with CUDA
# (ATTNSCOPE_CUDA=ON), runs the GPU tests (GPU against CPU, exact counts) before any timing, then
# times softmax confusion side by side on the same dumps:
#   attnscope --device cuda | attnscope --device cpu, all cores | attnscope --device cpu, 2 threads
#   | bench/torch_gpu_confusion.py (PyTorch on the GPU: float32 softmax, torch.cdist, count)
# on a DeiT-T-shaped dump (12 layers x 3 heads, 14 x 14 grid + CLS, head dim 64, IMAGES images)
# and a 3,136-token one (56 x 56 grid, HIRES_IMAGES images). Every attnscope count is checked
# against the CPU's; PyTorch's counts are compared with them (images whose count differs).
# Prints the device (nvidia-smi), a markdown table and the raw results; everything goes under
# $OUT when it is set (else $BUILD/gpu-bench).
#
# Usage: bench/gpu_comparison.sh
#   env: BUILD=build-gpu IMAGES=1024 CPU2_IMAGES=256 HIRES_IMAGES=8 SKIP_BUILD=0 SKIP_TESTS=0
#        STOP_AFTER_TESTS=0 PYTHON=python3 DATA=$BUILD/gpu-bench-data OTHER_IMAGES=64 (locality, mask)
#        MODELS=dir of weight files (dumps of MODEL_IMAGES=1024 test images, float16; FMNIST=data root)
#        NCU=1 (Nsight Compute's SpeedOfLight over one launch of 32 DeiT-T images)
# Where one command may run only minutes, split it in two calls (the build folder stays):
#   STOP_AFTER_TESTS=1 bench/gpu_comparison.sh; SKIP_BUILD=1 SKIP_TESTS=1 bench/gpu_comparison.sh
# Fails at once, saying why, where no CUDA device answers (it never waits for one).
# DRY_RUN_CPU=1 runs the whole script on the CPU (the "GPU" runs with --device cpu, PyTorch on the
# CPU) to test the script itself; its table is headed as a dry run and holds no GPU figure.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
PYTHON=${PYTHON:-python3}
IMAGES=${IMAGES:-1024}
CPU2_IMAGES=${CPU2_IMAGES:-256}
HIRES_IMAGES=${HIRES_IMAGES:-8}
OTHER_IMAGES=${OTHER_IMAGES:-64}
MODEL_IMAGES=${MODEL_IMAGES:-1024}
DATA=${DATA:-$BUILD/gpu-bench-data}
RES=${OUT:-$BUILD/gpu-bench}
A=$BUILD/apps/attnscope
CORES=$(nproc)
DRY=${DRY_RUN_CPU:-0}
GPU_DEVICE=$([ "$DRY" = 1 ] && echo cpu || echo cuda)
mkdir -p "$RES"
say() { echo "gpu_comparison: $*" >&2; }

# --- The device ------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)  cores: $CORES"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  else
    echo "nvidia-smi: not found"
  fi
} | tee "$RES/machine.txt"

# --- Build and correctness first ---------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # With the benchmarks (bench_cuda_confusion: batches of images per launch) where Google Benchmark
  # is installed, without them otherwise.
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNSCOPE_CUDA=ON -DATTNSCOPE_BENCH=ON \
    >"$RES/configure.log" 2>&1 ||
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNSCOPE_CUDA=ON -DATTNSCOPE_BENCH=OFF \
      >"$RES/configure.log" 2>&1 ||
    { say "configure failed (see $RES/configure.log)"; tail -20 "$RES/configure.log"; exit 1; }
  # Only what this script runs: the command, the tests it runs and the GPU benchmark.
  targets="attnscope test_candidate_margin test_device"
  for t in tests/cuda/test_*.cpp; do targets="$targets $(basename "$t" .cpp)"; done
  if cmake --build "$BUILD" --target help 2>/dev/null | grep -q bench_cuda_confusion; then
    targets="$targets bench_cuda_confusion"
  fi
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j "$CORES" --target $targets >"$RES/build.log" 2>&1 ||
    { say "build failed (see $RES/build.log)"; tail -30 "$RES/build.log"; exit 1; }
fi
[ -x "$A" ] || { say "no $A: build first (or unset SKIP_BUILD)"; exit 1; }
"$A" synth --out "$RES/probe.h5" --images 1 --layers 1 --heads 1 >/dev/null
if [ "$DRY" != 1 ] && ! "$A" confusion --dump "$RES/probe.h5" --out "$RES/probe" --device cuda >/dev/null 2>"$RES/probe.err"; then
  say "no usable CUDA device: $(cat "$RES/probe.err")"
  exit 1
fi
if [ "${SKIP_TESTS:-0}" != 1 ] && [ "$DRY" != 1 ]; then
  (cd "$BUILD" && ctest -R '^cuda\.|CandidateMargin|DeviceSelection|cli\.device_flags' --output-on-failure) \
    >"$RES/gpu_tests.log" 2>&1 && tests=passed || tests=FAILED
  grep -E "tests passed|tests failed|Skipped|Failed" "$RES/gpu_tests.log" | tail -20
  if [ "$tests" != passed ]; then say "GPU tests failed (see $RES/gpu_tests.log): no timing"; exit 1; fi
fi
if [ "${STOP_AFTER_TESTS:-0}" = 1 ]; then say "built and tested; STOP_AFTER_TESTS=1: no timing"; exit 0; fi

# --- Dumps ---------------------------------------------------------------------------------------
mkdir -p "$DATA"
deit="--layers 12 --heads 3 --grid-height 14 --grid-width 14 --prefix 1 --head-dim 64"
deit="$deit --plant-duplicates 1 --plant-collinear 1 --plant-shifted 1 --plant-hyperplane"
hires="--layers 2 --heads 3 --grid-height 56 --grid-width 56 --prefix 0 --head-dim 32 --plant-collinear 2"
[ -f "$DATA/deit.h5" ] || "$A" synth --out "$DATA/deit.h5" --images "$IMAGES" --compression 0 --seed 1 $deit >/dev/null
[ -f "$DATA/hires.h5" ] || "$A" synth --out "$DATA/hires.h5" --images "$HIRES_IMAGES" --compression 0 --seed 2 $hires >/dev/null
cat "$DATA/deit.h5" "$DATA/hires.h5" >/dev/null  # page cache: every tool reads the same cached bytes

# --- Runs ----------------------------------------------------------------------------------------
export OMP_WAIT_POLICY=PASSIVE
# timed NAME COMMAND...: stdout and stderr to NAME.out and NAME.err, wall seconds to NAME.wall;
# returns the command's status
timed() {
  local name=$1 t0 rc=0; shift
  t0=$(date +%s.%N)
  "$@" >"$RES/$name.out" 2>"$RES/$name.err" || rc=$?
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' >"$RES/$name.wall"
  return "$rc"
}
# run NAME DUMP IMAGES ARGS...: attnscope softmax confusion (a failure stops the script)
run() {
  local name=$1 dump=$2 n=$3; shift 3
  local variant=(--variant softmax) rest=()
  for x in "$@"; do  # --variant-from-dump: the dump's own family (a model's dump)
    if [ "$x" = --variant-from-dump ]; then variant=(); else rest+=("$x"); fi
  done
  timed "$name" "$A" confusion --dump "$dump" --out "$RES/$name" "${variant[@]}" --images "0-$((n - 1))" "${rest[@]}"
}
torch_run() {  # torch_run NAME DUMP IMAGES EXACT_CSV
  if "$PYTHON" bench/torch_gpu_confusion.py --dump "$2" --images "$3" --exact "$4" --device "$GPU_DEVICE" >"$RES/$1.json" 2>"$RES/$1.err"; then
    echo ok
  else
    say "PyTorch run $1 failed: $(tail -1 "$RES/$1.err")"
  fi
}
for shape in deit hires; do
  dump="$DATA/$shape.h5"
  n=$([ $shape = deit ] && echo "$IMAGES" || echo "$HIRES_IMAGES")
  n2=$([ $shape = deit ] && echo "$CPU2_IMAGES" || echo "$HIRES_IMAGES")
  run "${shape}_gpu" "$dump" "$n" --device "$GPU_DEVICE"
  run "${shape}_cpu_all" "$dump" "$n" --device cpu --threads "$CORES"
  run "${shape}_cpu_2" "$dump" "$n2" --device cpu --threads 2
  torch_run "${shape}_torch" "$dump" "$n" "$RES/${shape}_cpu_all/confusion_per_image.csv" >/dev/null || true
done

# --- Locality and masking: the per-head GPU paths (one head per launch, a stream per thread) -----
# other NAME COMMAND DEVICE THREADS IMAGES: a failure is reported and the script goes on
other() {
  local name=$1 cmd=$2 dev=$3 thr=$4 n=$5
  timed "$name" "$A" "$cmd" --dump "$DATA/deit.h5" --out "$RES/$name" --images "0-$((n - 1))" --device "$dev" \
    --threads "$thr" || say "$name failed: $(tail -1 "$RES/$name.err")"
}
for cmd in locality mask; do
  other "${cmd}_gpu" "$cmd" "$GPU_DEVICE" "$CORES" "$OTHER_IMAGES"
  other "${cmd}_cpu_all" "$cmd" cpu "$CORES" "$OTHER_IMAGES"
  other "${cmd}_cpu_2" "$cmd" cpu 2 "$OTHER_IMAGES"
done

# --- The committed 197-token models' dumps (MODELS: a folder of weight files; FMNIST: the data) ---
if [ -n "${MODELS:-}" ]; then
  for w in "$MODELS"/*.h5; do
    m=$(basename "$w" .h5)
    [ -f "$DATA/$m.h5" ] || "$PYTHON" python/make_dumps.py --models "$w" --out "$DATA" --images "$MODEL_IMAGES" \
      --dtype float16 --compression 0 --threads "$CORES" ${FMNIST:+--data-root "$FMNIST"} >"$RES/make_$m.log" 2>&1 ||
      { say "dump of $m failed: $(tail -1 "$RES/make_$m.log")"; continue; }
    run "model_${m}_gpu" "$DATA/$m.h5" "$MODEL_IMAGES" --device "$GPU_DEVICE" --variant-from-dump
    run "model_${m}_cpu_all" "$DATA/$m.h5" "$MODEL_IMAGES" --device cpu --threads "$CORES" --variant-from-dump
    run "model_${m}_cpu_2" "$DATA/$m.h5" "$CPU2_IMAGES" --device cpu --threads 2 --variant-from-dump
  done
fi

# --- How far from the device's limits: Nsight Compute on one launch of 32 DeiT-T images ---------
if [ "${NCU:-0}" = 1 ] && command -v ncu >/dev/null && [ "$DRY" != 1 ]; then
  ncu --clock-control none --section SpeedOfLight --csv --page details \
    "$A" confusion --dump "$DATA/deit.h5" --out "$RES/ncu_run" --variant softmax --images 0-31 --device cuda \
    >"$RES/ncu.csv" 2>"$RES/ncu.err" || say "ncu failed: $(tail -1 "$RES/ncu.err")"
  "$PYTHON" - "$RES/ncu.csv" <<'PY' | tee "$RES/ncu_summary.md"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(head)}
per = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    name = r[ix["Kernel Name"]][:60]
    per[name][r[ix["Metric Name"]]].append((r[ix["Metric Value"]], r[ix["Metric Unit"]]))
print("| kernel | launches | total duration | mean DRAM throughput % | mean compute (SM) throughput % |")
print("|---|---|---|---|---|")
def num(x):
    return float(x.replace(",", ""))
for name, m in sorted(per.items()):
    d = m.get("Duration", [])
    unit = d[0][1] if d else ""
    tot = sum(num(v) for v, _ in d)
    dram = [num(v) for v, _ in m.get("DRAM Throughput", [])]
    sm = [num(v) for v, _ in m.get("Compute (SM) Throughput", [])]
    avg = lambda xs: f"{sum(xs) / len(xs):.1f}" if xs else "-"
    print(f"| {name} | {len(d)} | {tot:.1f} {unit} | {avg(dram)} | {avg(sm)} |")
PY
fi

# --- Batches of images per launch (count_confusion_cuda_batch, inputs in host memory) -------------
if [ -x "$BUILD/bench/bench_cuda_confusion" ] && [ "$DRY" != 1 ]; then
  "$BUILD/bench/bench_cuda_confusion" >"$RES/bench_cuda_confusion.txt" 2>&1 ||
    say "bench_cuda_confusion failed (see $RES/bench_cuda_confusion.txt)"
  cat "$RES/bench_cuda_confusion.txt"
fi

# --- Table ---------------------------------------------------------------------------------------
"$PYTHON" - "$RES" "$CORES" "$DRY" <<'PY' | tee "$RES/table.md"
import csv, json, os, sys
res, cores, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if dry:
    print("DRY RUN ON THE CPU (DRY_RUN_CPU=1): a test of this script; no figure below is a GPU figure.\n")

def counts(name):
    return {int(r["image"]): int(r["count"]) for r in csv.DictReader(open(f"{res}/{name}/confusion_per_image.csv"))}

print("ms/image: attnscope's streaming loop (results.loop_seconds / images: reading, copies, GPU and judging) and")
print("its whole run (elapsed_s / images: start-up, device set-up and the input fingerprint too); the")
print("per-image median / min / max is the time between finished images (the GPU finishes a batch of")
print("images at once: its median is no per-image cost); PyTorch: per batch (h5py read included) / batch size.\n")
print("| shape | tool | images | ms/image (loop) | ms/image (whole run) | per image median / min / max | speed-up vs CPU 2 threads (loop) | counts |")
print("|---|---|---|---|---|---|---|---|")

def images_of(j):
    if "images" in j["results"]:
        return j["results"]["images"]
    return int(j["parameters"]["images"])  # the number of images selected

def whole(j):
    return 1e3 * j["elapsed_s"] / images_of(j)

def loop(j):
    """ms per image of the streaming loop alone (results.loop_seconds; older builds: io_wait / share)."""
    r = j["results"]
    s = r.get("loop_seconds") or (r["io_wait_seconds"] / r["io_wait_share"] if r.get("io_wait_share") else 0.0)
    return 1e3 * s / images_of(j)

shapes = [("deit", "DeiT-T (197 tokens)"), ("hires", "3,136 tokens")]
shapes += sorted((n[len("model_"):-len("_gpu")], "model " + n[len("model_"):-len("_gpu")])
                 for n in os.listdir(res) if n.startswith("model_") and n.endswith("_gpu") and os.path.isdir(f"{res}/{n}"))
for shape, label in shapes:
    key = shape if shape in ("deit", "hires") else f"model_{shape}"
    if not os.path.exists(f"{res}/{key}_cpu_2/confusion.json"):
        continue
    cpu = counts(f"{key}_cpu_all")
    base = loop(json.load(open(f"{res}/{key}_cpu_2/confusion.json")))
    gpu_tool = "attnscope --device cpu (dry run)" if dry else "attnscope --device cuda"
    for tool, name in ((gpu_tool, "gpu"), (f"attnscope --device cpu, {cores} threads", "cpu_all"),
                       ("attnscope --device cpu, 2 threads", "cpu_2")):
        j = json.load(open(f"{res}/{key}_{name}/confusion.json"))
        m = j["results"]["ms_per_image"]
        mine = counts(f"{key}_{name}")
        same = all(cpu[i] == c for i, c in mine.items())
        print(f"| {label} | {tool} ({j['parameters']['device']}) | {j['results']['images']} | {loop(j):.3f} | "
              f"{whole(j):.3f} | {m['median']:.3f} / {m['min']:.3f} / {m['max']:.3f} | {base / loop(j):.1f}x | "
              f"{'= CPU exact' if same else 'DIFFER FROM CPU'} |")
    tj = f"{res}/{key}_torch.json"
    if os.path.exists(tj) and os.path.getsize(tj) > 0:
        t = json.load(open(tj))
        m = t["ms_per_image"]
        print(f"| {label} | PyTorch {'CPU (dry run)' if dry else 'GPU'} script ({t['device']}, float32, batch {t['batch']}) | {t['images']} | "
              f"{m['median']:.3f} (median batch) | - | {m['median']:.3f} / {m['min']:.3f} / {m['max']:.3f} | {base / m['median']:.1f}x | "
              f"{t['images_with_wrong_counts']} of {t['compared_images']} images wrong |")
    elif shape in ("deit", "hires"):
        print(f"| {label} | PyTorch GPU script | - | not run (see {shape}_torch.err) | - | - | - | - |")

print("\n| analysis (DeiT-T dump) | tool | images | ms/image (loop) | ms/image (whole run) | speed-up vs CPU 2 threads (loop) |")
print("|---|---|---|---|---|---|")
for cmd in ("locality", "mask"):
    if not os.path.exists(f"{res}/{cmd}_cpu_2/{cmd}.json"):
        continue
    base = loop(json.load(open(f"{res}/{cmd}_cpu_2/{cmd}.json")))
    for tool, name in (("--device cuda" if not dry else "--device cpu (dry run)", "gpu"),
                       (f"--device cpu, {cores} threads", "cpu_all"), ("--device cpu, 2 threads", "cpu_2")):
        p = f"{res}/{cmd}_{name}/{cmd}.json"
        if not os.path.exists(p):
            print(f"| {cmd} | attnscope {tool} | - | failed (see {cmd}_{name}.err) | - | - |")
            continue
        j = json.load(open(p))
        print(f"| {cmd} | attnscope {tool} ({j['parameters']['device']}) | {images_of(j)} | {loop(j):.3f} | "
              f"{whole(j):.3f} | {base / loop(j):.1f}x |")
PY
say "results under $RES"
