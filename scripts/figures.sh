#!/usr/bin/env bash
# Draws the papers' figures from our own results. Runs the attnscope analyses on the dumps of the
# five 197-token Fashion-MNIST ViTs (data/dumps/vit14-*, written by `make dumps` from the weights in
# data/models) into results/figures-data/, then executes the notebooks headless; each writes its
# PNG to figures/ with a caption quoting the command that produced its data. Override with DUMPS=,
# RESULTS=, FIGURES=, ATTNSCOPE=, PREFIX=vit7 for the small 50-token models (their four
# families; the 7x7 grid's centre query is token 25), and FIG_IMAGES=N to run the confusion,
# locality, distance, entropy and rollout analyses on the first N images only, and rank on 2
# (`make demo` does, to stay quick; the captions quote the commands, so they say so).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
A=${ATTNSCOPE:-$BUILD/apps/attnscope}
DUMPS=${DUMPS:-data/dumps}
R=${RESULTS:-results/figures-data}
FIGS=${FIGURES:-figures}
PREFIX=${PREFIX:-vit14}
if [ "$PREFIX" = vit7 ]; then
  MODELS=(softmax linear inline mala)
  QUERY=25    # token 25 = grid row 3, column 3: the centre of the 7x7 grid (CLS is token 0)
else
  MODELS=(softmax linear inline inline-localres mala)
  QUERY=106   # token 106 = grid row 7, column 7: the centre of the 14x14 grid (CLS is token 0)
fi
# Each model's own variant (the dumps' attributes say the same; named here for the captions).
# InLine with its local residual computes the same attention as InLine; the residual is added to
# the attention's output, outside the N x N map.
declare -A VARIANT=([softmax]=softmax@code [linear]=linear:relu@code
                    [inline]=inline:identity@code [inline-localres]=inline:identity@code
                    [mala]=mala:elu1@code)
export ATTNSCOPE_MODELS="${MODELS[*]}"  # the notebooks draw these models (figures.py)

[ -x "$A" ] || { echo "figures.sh: $A not found or not executable: run make build" >&2; exit 1; }
for m in "${MODELS[@]}"; do
  [ -f "$DUMPS/$PREFIX-$m-fmnist.h5" ] || {
    echo "figures.sh: $DUMPS/$PREFIX-$m-fmnist.h5 missing: run make dumps" >&2; exit 1; }
done
scripts/install-deps.sh python
mkdir -p "$R" "$FIGS"
# Runs a command quietly and records its command line in <its --out folder>/command.txt, which the
# figure captions quote (the program named by its base name, e.g. attnscope).
run() {
  local out="" prev=""
  for a in "$@"; do [ "$prev" = "--out" ] && out=$a; prev=$a; done
  echo "+ $*"
  "$@" >/dev/null
  [ -z "$out" ] || echo "${1##*/} ${*:2}" >"$out/command.txt"
}

LAYERS=$([ "$PREFIX" = vit7 ] && echo 0,1,2,3 || echo 0,1,2,3,4,5)
SWEEP=()
[ -z "${FIG_IMAGES:-}" ] || SWEEP=(--images "0-$((FIG_IMAGES - 1))")
for m in "${MODELS[@]}"; do
  d="$DUMPS/$PREFIX-$m-fmnist.h5"
  v="${VARIANT[$m]}"
  # Fig. 2: each model under its own attention and under linear (ReLU) attention on the same
  # queries and keys, counted per layer; once over every token, once without the tokens whose
  # image patch is constant (Fashion-MNIST's flat background: such tokens differ only by their
  # position embedding, so their rows nearly coincide).
  both=$v; [ "$v" = linear:relu@code ] || both="$v,linear:relu@code"
  run "$A" confusion --dump "$d" --out "$R/confusion-$m" --variant "$both" "${SWEEP[@]}"
  run "$A" confusion --dump "$d" --out "$R/confusion-$m-no-constant" --variant "$both" \
    --exclude-tokens constant-patch "${SWEEP[@]}"
  run "$A" locality --dump "$d" --out "$R/locality-$m" --variant "$v" --window 3 "${SWEEP[@]}"
  run "$A" maps --dump "$d" --out "$R/maps-$m" --variant "$v" --images 0 --tokens "$QUERY" \
    --layers "$LAYERS" --heads 0
done
run "$A" maps --dump "$DUMPS/$PREFIX-softmax-fmnist.h5" --out "$R/maps-softmax-l2norm" \
  --variant softmax@code --transform l2norm --images 0 --tokens "$QUERY" --layers "$LAYERS" --heads 0
for m in softmax linear mala; do
  run "$A" spikiness --dump "$DUMPS/$PREFIX-$m-fmnist.h5" --out "$R/spikiness-$m" \
    --variant "${VARIANT[$m]}" --scales 0.25:8:33
done
# Confusion against the radius: every family on every model's Q and K (its own and the
# counterfactuals), 9 radii log-spaced from 1e-4 to 1e-2.
ALL_VARIANTS="softmax@code,linear:relu@code,inline:identity@code,mala:elu1@code"
for m in "${MODELS[@]}"; do
  for eps in 1e-4 1.778e-4 3.162e-4 5.623e-4 1e-3 1.778e-3 3.162e-3 5.623e-3 1e-2; do
    run "$A" confusion --dump "$DUMPS/$PREFIX-$m-fmnist.h5" --out "$R/confusion-eps-$m-$eps" \
      --variant "$ALL_VARIANTS" --eps "$eps" "${SWEEP[@]}"
  done
done
# The ViT diagnostics of each model under its own attention: mean attention distance (pixels of the
# 28 x 28 image, patch 2), entropy, rank and rollout. rank takes an SVD per head (its slow part):
# 16 images, or 2 with FIG_IMAGES (the demo).
RANK_IMAGES=(--images 0-15)
[ -z "${FIG_IMAGES:-}" ] || RANK_IMAGES=(--images 0-1)
for m in "${MODELS[@]}"; do
  d="$DUMPS/$PREFIX-$m-fmnist.h5"
  v="${VARIANT[$m]}"
  run "$A" distance --dump "$d" --out "$R/distance-$m" --variant "$v" "${SWEEP[@]}"
  run "$A" entropy --dump "$d" --out "$R/entropy-$m" --variant "$v" "${SWEEP[@]}"
  run "$A" rank --dump "$d" --out "$R/rank-$m" --variant "$v" "${RANK_IMAGES[@]}"
  run "$A" rollout --dump "$d" --out "$R/rollout-$m" --variant "$v" "${SWEEP[@]}"
done
run "$PYTHON" python/inline_fig1.py --dump "$DUMPS/$PREFIX-linear-fmnist.h5" --out "$R/inline-fig1" \
  --layer 2 --head 0 --image 0 --token "$QUERY"

"$PYTHON" python/run_notebooks.py --results "$R" --figures "$FIGS" notebooks/*.ipynb
echo "figures.sh: PNGs in $FIGS/"
