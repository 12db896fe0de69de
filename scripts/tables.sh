#!/usr/bin/env bash
# The papers' tables re-run on the five 197-token models with `attnscope replay` (docs/tables.md):
# InLine Table 2 (local k x k and random-n masks), InLine Table 1 and MALA Table 1 (query maps
# before the attention), the family swaps, and each model's accuracy on all 10 000 test images.
# Results go to $RESULTS (results/tables), one folder per table; python/tables.py prints them as
# the markdown tables of docs/tables.md.
#
# Usage: scripts/tables.sh   (env: BUILD=build IMAGES=2000 THREADS=$(nproc) SEED=0
#                             RESULTS=results/tables PREFIX=vit14 ACCURACY=1)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
A=${ATTNSCOPE:-$BUILD/apps/attnscope}
IMAGES=${IMAGES:-2000}
THREADS=${THREADS:-$(nproc)}
SEED=${SEED:-0}
R=${RESULTS:-results/tables}
PREFIX=${PREFIX:-vit14}
ACCURACY=${ACCURACY:-1}
SET=$BUILD/image-sets/fmnist-test.h5
[ -x "$A" ] || { echo "tables.sh: $A not found: run make build" >&2; exit 1; }
if [ "$PREFIX" = vit7 ]; then
  MODELS=(softmax linear inline mala)
  MASKS=none,local:3,local:5,random:9,random:25  # a 7x7 window covers the whole 7x7 grid
else
  MODELS=(softmax linear inline inline-localres mala)
  MASKS=none,local:3,local:5,local:7,random:9,random:25,random:49
fi
weights=""
for m in "${MODELS[@]}"; do
  f=data/models/$PREFIX-$m-fmnist.h5
  [ -f "$f" ] || { echo "tables.sh: $f missing" >&2; exit 1; }
  weights="$weights${weights:+,}$f"
done
[ -f "$SET" ] || "$PYTHON" python/make_image_set.py --images 10000 --out "$SET"
mkdir -p "$R"
run() {  # run NAME IMAGES INTERVENTIONS
  local out="$R/$1"
  echo "+ attnscope replay --model $weights --image-set $SET --images $2 --intervention $3 --seed $SEED --out $out"
  "$A" replay --model "$weights" --image-set "$SET" --images "$2" --intervention "$3" \
    --seed "$SEED" --threads "$THREADS" --out "$out" >/dev/null
  echo "attnscope replay --model $weights --image-set $SET --images $2 --intervention $3 --seed $SEED --out $out" \
    >"$out/command.txt"
}
last=$((IMAGES - 1))
run masking "0-$last" "$MASKS"
run query-maps "0-$last" none,f1,f2,l2norm
run family-swaps "0-$last" none,family=softmax,family=linear:relu,family=inline:identity,family=mala:elu1
[ "$ACCURACY" = 0 ] || run accuracy 0-9999 none
"$PYTHON" python/tables.py "$R"
