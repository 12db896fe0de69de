#!/usr/bin/env bash
# Regenerates data/ from scratch: trains the four Fashion-MNIST ViTs (softmax, linear, InLine,
# MALA) with fixed seeds, writes their weights and accuracies to data/models/, dumps the first
# test images of each to data/dumps/, and validates the dumps with `attnscope info` when built.
# Settings are those of data/README.md; override with EPOCHS=, IMAGES=, SEED=, THREADS=.
# Takes about 45 minutes on 2 cores busy with other work (about 20 on idle ones).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
EPOCHS=${EPOCHS:-6}
IMAGES=${IMAGES:-128}
SEED=${SEED:-0}
THREADS=${THREADS:-1}
FAMILIES=(softmax linear inline mala)

scripts/install-deps.sh python
mkdir -p data/models data/dumps
# One thread and passive OpenMP waiting: steady speed on a shared machine, and the same
# floating-point reduction order on every run.
export OMP_WAIT_POLICY=PASSIVE
for fam in "${FAMILIES[@]}"; do
  echo "make-data: training $fam ($EPOCHS epochs, seed $SEED)"
  nice -n 10 "$PYTHON" python/train.py --family "$fam" --epochs "$EPOCHS" --seed "$SEED" \
    --threads "$THREADS" --out data/models --quiet
done
models=()
for fam in "${FAMILIES[@]}"; do models+=("data/models/vit7-$fam-fmnist.h5"); done
"$PYTHON" python/make_dumps.py --models "${models[@]}" --out data/dumps --images "$IMAGES" \
  --threads "$THREADS"
if [ -x "$BUILD/apps/attnscope" ]; then
  for fam in "${FAMILIES[@]}"; do
    "$BUILD/apps/attnscope" info "data/dumps/vit7-$fam-fmnist.h5" >/dev/null
  done
  echo "make-data: attnscope info accepts the four dumps"
fi
for fam in "${FAMILIES[@]}"; do
  "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); \
print(f\"{r['model_name']}: test accuracy {r['test_accuracy']:.4f}\")" \
    "data/models/vit7-$fam-fmnist.json"
done
