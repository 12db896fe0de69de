#!/usr/bin/env bash
# The demo behind `make demo`: writes a small synthetic dump with planted structure, describes and
# validates it, then does the same for every dump committed under data/dumps/ (if any). It builds
# nothing (the Makefile has built $BUILD/apps/attnscope). Results go to $RESULTS (results/demo).
#
# Each step is one `step "what it shows" command...` line: it echoes the command, runs it and
# stops the demo at the first failure. Add analyses by appending steps to the lists below.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
A=${ATTNSCOPE:-$BUILD/apps/attnscope}
R=${RESULTS:-results/demo}
SEED=${SEED:-0}

[ -x "$A" ] || { echo "demo.sh: $A not found or not executable: run make build" >&2; exit 1; }
mkdir -p "$R"

step() {
  local what=$1; shift
  echo
  echo "== $what"
  echo "+ $*"
  "$@"
}

# --- a synthetic dump: DeiT-like toy (4 layers, 3 heads, CLS + 7x7, d = 16, 32 images) with
# duplicated and collinear queries, and keys on a hyperplane with shifted query pairs.
SYNTH="$R/synth.h5"
step "synthetic dump with planted structure" \
  "$A" synth --out "$SYNTH" --seed "$SEED" --plant-duplicates 1 --plant-collinear 2 \
  --plant-hyperplane --plant-shifted 1
step "its schema, and every value checked finite" "$A" info "$SYNTH" --check-values

# --- the analyses on the synthetic dump: planted pairs show up as confusion under linear attention.
# The code convention scales phi by (s/N)^1/2, so InLine and MALA rows have the magnitudes of
# probability rows (under the paper convention their weights reach far outside [0, 1]).
ALL4="softmax@code,linear:relu@code,inline@code,mala@code"
step "confusion events, all four families (planted collinear pairs)" \
  "$A" confusion --dump "$SYNTH" --out "$R/synth-confusion" --variant "$ALL4"
step "local 3x3 attention mass" "$A" locality --dump "$SYNTH" --out "$R/synth-locality" --variant "$ALL4"
# verify: every row is deterministic (the cost rows count multiply-adds; measured times are
# printed as information only), so a failure is real and stops the demo.
step "the propositions of both papers, checked numerically" "$A" verify --out "$R/verify"

# --- dumps of the committed Fashion-MNIST ViTs (data/dumps, written by `make dumps`;
# data/README.md): the four 50-token models (128 images) and the five 197-token ones (64 images).
shopt -s nullglob
DUMPS=(data/dumps/*.h5)
CODE4="softmax@code,linear:relu@code,inline:identity@code,mala:elu1@code"
for d in "${DUMPS[@]}"; do
  name=$(basename "$d" .h5)
  step "committed dump $d" "$A" info "$d"
  step "$name: our recomputation against the model's own attention outputs" \
    "$A" recompute --dump "$d" --out "$R/$name/recompute"
  step "$name: confusion under its own family and the three counterfactuals, per layer" \
    "$A" confusion --dump "$d" --out "$R/$name/confusion" --variant "$CODE4"
  step "$name: local 3x3 attention mass" \
    "$A" locality --dump "$d" --out "$R/$name/locality" --variant "$CODE4"
  step "$name: negative and zero InLine/MALA weights" "$A" census --dump "$d" --out "$R/$name/census"
  case "$name" in
    vit7-*)  # a 7x7 window would cover the 7x7 grid: the windows and random counts that leave keys
      step "$name: masking local windows and random keys (InLine Table 2, layer by layer)" \
        "$A" mask --dump "$d" --out "$R/$name/mask" --variant softmax@code,inline:identity@code \
        --mask local:3,local:5,random:9,random:25 ;;
    *)  # 197 tokens: background tokens of Fashion-MNIST left out of the pairs, and Table 2's grid
      step "$name: confusion without the tokens whose image patch is constant" \
        "$A" confusion --dump "$d" --out "$R/$name/confusion-no-constant" --variant "$CODE4" \
        --exclude-tokens constant-patch
      step "$name: masking local windows and random keys (InLine Table 2, first 4 images)" \
        "$A" mask --dump "$d" --out "$R/$name/mask" --variant softmax@code,inline:identity@code \
        --mask local:3,local:5,local:7,random:9,random:25,random:49 --images 0-3 ;;
  esac
done
# --- the families beyond the papers' four, on the synthetic dump (every analysis runs on each)
NEW3="linear:focused=3@code,efficient@code,cosformer@code"
step "confusion events under FLatten's focused map, Efficient Attention and cosFormer" \
  "$A" confusion --dump "$SYNTH" --out "$R/synth-confusion-more-families" --variant "$NEW3"
SOFTMAX_DUMP=data/dumps/vit14-softmax-fmnist.h5
if [ -f "$SOFTMAX_DUMP" ]; then
  step "spikiness against query magnitude (MALA Fig. 2) on the softmax model's queries" \
    "$A" spikiness --dump "$SOFTMAX_DUMP" --out "$R/spikiness" \
    --variant softmax@code,linear:relu@code,mala:elu1@code --scales 0.25:8:33
fi

# --- the papers' figures from the 197-token models' dumps (notebooks -> PNGs). `make figures`
# redraws figures/ itself; the demo draws into its results folder, with the confusion and locality
# analyses on the first 8 images only, to stay quick.
FIGS=$R/figures
VIT14=(data/dumps/vit14-{softmax,linear,inline,inline-localres,mala}-fmnist.h5)
have_vit14() { for f in "${VIT14[@]}"; do [ -f "$f" ] || return 1; done; }
if have_vit14; then
  step "the papers' figures from our five 197-token models" \
    env PYTHON="${PYTHON:-/usr/bin/python3}" BUILD="$BUILD" ATTNSCOPE="$A" RESULTS="$R/figures-data" \
    FIGURES="$FIGS" FIG_IMAGES=8 scripts/figures.sh
fi

echo
echo "== done"
echo "results: $R/ (CSV tables and a JSON record per analysis)"
if have_vit14; then echo "figures: $FIGS/*.png (the committed ones, drawn by make figures: figures/, captions in figures/README.md)"; fi
ls "$R"
