# --device auto|cpu|cuda on every analysis: a bad name is exit 2 naming the flag; the device used
# is recorded in the run's parameters; --device cuda where it cannot be honoured (no device, a
# build without CUDA, an analysis without a CUDA path) is exit 2 with one line saying why and
# writes nothing. Where a CUDA device answers, confusion and locality on it must write the same
# results as on the CPU, and auto says on stderr which device it uses.
expect_ok "$ATTNSCOPE" synth --out d.h5 --images 3 --layers 2 --heads 2 --plant-duplicates 1 --plant-collinear 1

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
with_cuda_path() { case "$1" in confusion|locality) return 0 ;; *) return 1 ;; esac; }
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
      cmp "$f" "gpu_$name/$(basename "$f")" || { echo "FAIL: $name: $(basename "$f") differs between cpu and cuda"; exit 1; }
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
