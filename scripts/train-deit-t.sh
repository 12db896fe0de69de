#!/usr/bin/env bash
# Trains one of the five DeiT-T-shaped Fashion-MNIST models (patch 2: a 14x14 grid plus CLS,
# 197 tokens; embedding 192, 3 heads of 64, MLP ratio 4, depth 6) with the `deit-t` preset of
# python/train.py, one model per call, for a GPU machine:
#
#   scripts/train-deit-t.sh MODEL [more train.py options]
#   MODEL: softmax | linear | inline | inline-localres | mala
#
# Writes data/models/vit14-<MODEL>-fmnist.h5 (float16 weights, docs/model-weights.md) and .json
# (test accuracy on all 10 000 test images, every setting). Every model gets the same recipe and
# seed. Environment: PYTHON (python3), OUT (data/models), SEED (0), EPOCHS (the preset's),
# TIME_BUDGET (the preset's, seconds: the run fails early, writing nothing, when projected longer),
# DATA_ROOT (the folder of the four Fashion-MNIST .gz files; /usr/share/datasets/fashion-mnist).
# Where h5py is missing, train.py writes NAME.pt instead of NAME.h5: python/export_weights.py
# turns it into NAME.h5 on a machine that has h5py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-data/models}
SEED=${SEED:-0}
model=${1:-}
case "$model" in
  softmax | linear | inline | mala) args=(--family "$model") ;;
  inline-localres) args=(--family inline --local-residual) ;;
  *)
    echo "usage: scripts/train-deit-t.sh softmax|linear|inline|inline-localres|mala [train.py options]" >&2
    exit 2
    ;;
esac
shift
[ -n "${EPOCHS:-}" ] && args+=(--epochs "$EPOCHS")
[ -n "${TIME_BUDGET:-}" ] && args+=(--time-budget "$TIME_BUDGET")
[ -n "${DATA_ROOT:-}" ] && args+=(--data-root "$DATA_ROOT")
exec "$PYTHON" python/train.py --preset deit-t "${args[@]}" --seed "$SEED" --out "$OUT" "$@"
