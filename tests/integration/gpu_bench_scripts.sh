# The GPU benchmark's scripts, on whatever this machine is: bench/torch_gpu_confusion.py counts on
# the CPU when asked (--device cpu) and compares with attnscope's exact counts; without a CUDA
# device both it and bench/gpu_comparison.sh stop at once with one clear line instead of waiting.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="$(dirname "$(dirname "$ATTNSCOPE")")"
if ! "$PYTHON" -c "import torch, h5py" 2>/dev/null; then
  echo "SKIP: $PYTHON cannot import torch and h5py (the benchmark's PyTorch script needs them)"; exit 77
fi
expect_ok "$ATTNSCOPE" synth --out d.h5 --images 3 --layers 2 --heads 2 --plant-duplicates 1 --plant-collinear 1
expect_ok "$ATTNSCOPE" confusion --dump d.h5 --out exact --variant softmax --device cpu
expect_ok "$PYTHON" "$REPO/bench/torch_gpu_confusion.py" --dump d.h5 --device cpu --batch 2 \
  --exact exact/confusion_per_image.csv
"$PYTHON" - "$WORK/out.txt" <<'PY' || exit 1
import json, sys
j = json.load(open(sys.argv[1]))
assert j["images"] == 3 and len(j["counts"]) == 3, j
assert j["compared_images"] == 3 and 0 <= j["images_with_wrong_counts"] <= 3, j
assert j["device"] == "cpu" and j["ms_per_image"]["min"] > 0, j
PY

if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "PyTorch sees a CUDA device: the no-device checks do not apply here"
else
  rc=0
  timeout 60 "$PYTHON" "$REPO/bench/torch_gpu_confusion.py" --dump d.h5 >out.txt 2>err.txt || rc=$?
  [ "$rc" -eq 1 ] || { echo "FAIL: torch_gpu_confusion.py without a GPU: exit $rc, expected 1"; cat err.txt; exit 1; }
  expect_grep "^torch_gpu_confusion.py: no CUDA device visible to PyTorch" err.txt
fi
if "$ATTNSCOPE" confusion --dump d.h5 --out probe --device cuda >/dev/null 2>&1; then
  echo "attnscope sees a CUDA device: bench/gpu_comparison.sh would run the whole benchmark; not run here"
else
  rc=0
  OUT="$WORK/bench" SKIP_BUILD=1 BUILD="$BUILD_DIR" PYTHON="$PYTHON" timeout 120 "$REPO/bench/gpu_comparison.sh" \
    >out.txt 2>err.txt || rc=$?
  [ "$rc" -eq 1 ] || { echo "FAIL: gpu_comparison.sh without a GPU: exit $rc, expected 1"; cat out.txt err.txt; exit 1; }
  expect_grep "^gpu_comparison: no usable CUDA device: " err.txt
  expect_no_file "$WORK/bench/table.md"
fi
