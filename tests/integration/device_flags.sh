# --device auto|cpu|cuda on every analysis: a bad name is exit 2 naming the flag; the device used
# is recorded in the run's parameters; --device cuda where it cannot be honoured (no device, a
# build without CUDA, an analysis without a CUDA path) is exit 2 with one line saying why and
# writes nothing. Where a CUDA device answers, confusion, locality, mask and census on it must
# write the same results as on the CPU (confusion's counts exactly), and auto says on stderr which
# device it uses.
expect_ok "$ATTNSCOPE" synth --out d.h5 --images 3 --layers 2 --heads 2 --plant-duplicates 1 --plant-collinear 1
# cuBLAS is loaded when a GPU path first needs it, never linked: a run on the CPU does not pay for
# loading it (0.1 s and 200 MB of resident memory per process).
if ldd "$ATTNSCOPE" | grep -q 'libcublas'; then
  echo "FAIL: the command links libcublas: $(ldd "$ATTNSCOPE" | grep libcublas | tr '\n' ' ')"
  exit 1
fi

analyses=(
  "confusion"
  "locality"
  "census"
  "mask"
  "maps --tokens 5"
  "spikiness --samples 4 --scales 0.5:2:3"
)
# recompute needs a dump with the model's own tensors (synth writes none) and verify's checks
# take minutes: flags only.
expect_exit 2 "--device must be auto, cpu or cuda, got 'gpu'" "$ATTNSCOPE" recompute --dump d.h5 --out bad --device gpu
expect_exit 2 "--device must be auto, cpu or cuda, got 'gpu'" "$ATTNSCOPE" verify --trials 1 --out bad --device gpu
expect_exit 2 "--device cuda: " "$ATTNSCOPE" verify --trials 1 --out bad --device cuda
expect_no_file bad
for c in recompute verify; do
  expect_ok "$ATTNSCOPE" "$c" --help
  expect_grep '--device auto\|cpu\|cuda \(=auto\)' "$WORK/out.txt"
done
with_cuda_path() { case "$1" in confusion|locality|mask|census) return 0 ;; *) return 1 ;; esac; }
# same_csv A B: the same rows and text fields; numbers equal (confusion's counts are exact) or,
# for locality's masses, mask's changes and census's extremes, within 1e-6.
same_csv() {
  "$PYTHON" - "$1" "$2" <<'PY'
import csv, sys
a, b = (list(csv.reader(open(p))) for p in sys.argv[1:3])
assert len(a) == len(b) and a[0] == b[0], f"{sys.argv[1]}: rows or header differ"
exact = "confusion" in sys.argv[1]
for ra, rb in zip(a[1:], b[1:]):
    for x, y in zip(ra, rb):
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            assert x == y, f"{sys.argv[1]}: {x} != {y}"
            continue
        ok = fx == fy if exact else (abs(fx - fy) <= 1e-6 * max(1.0, abs(fx)) or (fx != fx and fy != fy))
        assert ok, f"{sys.argv[1]}: {x} (cpu) vs {y} (cuda) in {ra}"
PY
}
dump_of() { case "$1" in verify) ;; *) echo --dump d.h5 ;; esac; }

expect_ok "$ATTNSCOPE" replay --help
expect_grep '--device auto\|cpu\|cuda' "$WORK/out.txt"

# Which case this machine is: a CUDA device, a CUDA build without one, or a CPU-only build.
gpu=0
if "$ATTNSCOPE" confusion --dump d.h5 --out probe --device cuda >/dev/null 2>probe.err; then
  gpu=1
fi
echo "device probe: gpu=$gpu $(cat probe.err)"

for a in "${analyses[@]}"; do
  read -r -a cmd <<<"$a"
  read -r -a dump <<<"$(dump_of "${cmd[0]}")"
  cmd+=("${dump[@]}")
  name=${cmd[0]}
  expect_ok "$ATTNSCOPE" "${cmd[@]}" --help
  expect_grep '--device auto\|cpu\|cuda \(=auto\)' "$WORK/out.txt"
  expect_exit 2 "--device must be auto, cpu or cuda, got 'gpu'" "$ATTNSCOPE" "${cmd[@]}" --out bad --device gpu
  expect_no_file bad

  expect_ok "$ATTNSCOPE" "${cmd[@]}" --out "cpu_$name" --device cpu
  expect_grep '"device": "cpu \(requested\)"' "cpu_$name/$name.json"

  if [ "$gpu" = 1 ] && with_cuda_path "$name"; then
    expect_ok "$ATTNSCOPE" "${cmd[@]}" --out "gpu_$name" --device cuda
    expect_grep '"device": "cuda:0 ' "gpu_$name/$name.json"
    for f in "cpu_$name"/*.csv; do
      same_csv "$f" "gpu_$name/$(basename "$f")" || { echo "FAIL: $name: $(basename "$f") differs between cpu and cuda"; exit 1; }
    done
    expect_ok "$ATTNSCOPE" "${cmd[@]}" --out "auto_$name"
    [ "$(wc -l <"$WORK/err.txt")" -eq 1 ] || { echo "FAIL: $name auto: not one line on stderr"; cat "$WORK/err.txt"; exit 1; }
    expect_grep "^attnscope $name: using cuda:0 " "$WORK/err.txt"
  else
    expect_ok "$ATTNSCOPE" "${cmd[@]}" --out "auto_$name"
    expect_empty "$WORK/err.txt"  # the CPU is the silent default
    expect_grep '"device": "cpu \((no CUDA device: .+|built without CUDA|'"$name"' has no CUDA path)\)"' \
      "auto_$name/$name.json"
    if [ "$gpu" = 1 ]; then
      expect_exit 2 "--device cuda: $name has no CUDA path" "$ATTNSCOPE" "${cmd[@]}" --out nope --device cuda
    else
      expect_exit 2 "--device cuda: " "$ATTNSCOPE" "${cmd[@]}" --out nope --device cuda
      expect_grep 'no CUDA device: |built without CUDA|has no CUDA path' "$WORK/err.txt"
    fi
    expect_no_file nope
  fi
done

# --reference is the CPU's plain double loops: it has no CUDA path, whatever the machine.
for name in confusion locality; do
  expect_exit 2 "--device cuda: " "$ATTNSCOPE" "$name" --dump d.h5 --out nope --reference --device cuda
  expect_grep "$name --reference has no CUDA path|built without CUDA" "$WORK/err.txt"
  expect_ok "$ATTNSCOPE" "$name" --dump d.h5 --out "ref_$name" --reference --images 0
  expect_empty "$WORK/err.txt"
  expect_grep '"device": "cpu \(' "ref_$name/$name.json"
done
expect_no_file nope
