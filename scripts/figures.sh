#!/usr/bin/env bash
# Draws the papers' figures from our own results. Runs the attnscope analyses on the committed
# dumps of the four Fashion-MNIST ViTs (data/dumps) into results/figures-data/, then executes the
# notebooks headless; each writes its PNG to figures/ with a caption quoting the command that
# produced its data. Override with DUMPS=, RESULTS=, FIGURES=, ATTNSCOPE=.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD=${BUILD:-build}
A=${ATTNSCOPE:-$BUILD/apps/attnscope}
DUMPS=${DUMPS:-data/dumps}
R=${RESULTS:-results/figures-data}
FIGS=${FIGURES:-figures}
FAMILIES=(softmax linear inline mala)
# Each family's own variant (the dumps' attributes say the same; named here for the captions).
declare -A VARIANT=([softmax]=softmax@code [linear]=linear:relu@code
                    [inline]=inline:identity@code [mala]=mala:elu1@code)
QUERY=25   # token 25 = grid row 3, column 3: the centre of the 7x7 grid (CLS is token 0)

[ -x "$A" ] || { echo "figures.sh: $A not found or not executable: run make build" >&2; exit 1; }
for fam in "${FAMILIES[@]}"; do
  [ -f "$DUMPS/vit7-$fam-fmnist.h5" ] || {
    echo "figures.sh: $DUMPS/vit7-$fam-fmnist.h5 missing: run make data" >&2; exit 1; }
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

for fam in "${FAMILIES[@]}"; do
  d="$DUMPS/vit7-$fam-fmnist.h5"
  v="${VARIANT[$fam]}"
  run "$A" confusion --dump "$d" --out "$R/confusion-$fam" --variant "$v"
  run "$A" locality --dump "$d" --out "$R/locality-$fam" --variant "$v" --window 3
  run "$A" maps --dump "$d" --out "$R/maps-$fam" --variant "$v" --images 0 --tokens "$QUERY" \
    --layers 0,1,2,3 --heads 0
done
run "$A" maps --dump "$DUMPS/vit7-softmax-fmnist.h5" --out "$R/maps-softmax-l2norm" \
  --variant softmax@code --transform l2norm --images 0 --tokens "$QUERY" --layers 0,1,2,3 --heads 0
for fam in softmax linear mala; do
  run "$A" spikiness --dump "$DUMPS/vit7-$fam-fmnist.h5" --out "$R/spikiness-$fam" \
    --variant "${VARIANT[$fam]}" --scales 0.25:8:33
done
# Confusion against the radius: every family on every model's Q and K (its own and the
# counterfactuals), 9 radii log-spaced from 1e-4 to 1e-2.
ALL_VARIANTS=$(for fam in "${FAMILIES[@]}"; do printf '%s,' "${VARIANT[$fam]}"; done)
ALL_VARIANTS=${ALL_VARIANTS%,}
for fam in "${FAMILIES[@]}"; do
  for eps in 1e-4 1.778e-4 3.162e-4 5.623e-4 1e-3 1.778e-3 3.162e-3 5.623e-3 1e-2; do
    run "$A" confusion --dump "$DUMPS/vit7-$fam-fmnist.h5" --out "$R/confusion-eps-$fam-$eps" \
      --variant "$ALL_VARIANTS" --eps "$eps"
  done
done
run "$PYTHON" python/inline_fig1.py --dump "$DUMPS/vit7-linear-fmnist.h5" --out "$R/inline-fig1" \
  --layer 2 --head 0 --image 0 --token "$QUERY"

"$PYTHON" python/run_notebooks.py --results "$R" --figures "$FIGS" notebooks/*.ipynb
echo "figures.sh: PNGs in $FIGS/"
