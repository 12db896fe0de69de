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

# --- committed dumps (data/dumps/*.h5; data/models holds weights, not dumps), schema only.
shopt -s nullglob
DUMPS=(data/dumps/*.h5)
for d in "${DUMPS[@]}"; do
  step "committed dump $d" "$A" info "$d"
done

echo
echo "== done: results in $R/"
ls -l "$R"
