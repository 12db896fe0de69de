#!/usr/bin/env bash
# Reading cost per image as a dump grows in images: writes small uncompressed synthetic dumps
# (4 layers, 2 heads, 2 x 2 grid + 1 prefix token, head dim 8; one image per chunk, as attnscope
# and h5py write them) of each count in COUNTS, and times `attnscope info FILE --check-values`
# (reads q, k and v of every image, straight from the file) on each, for each build in BUILDS.
# The blocks are tiny, so what grows is the cost of finding each image's chunks: constant per
# image through the chunk index, linear in the image count through HDF5 1.10's walk of the
# chunks (docs/dump-format.md, "Direct reads"). Prints a markdown table: build, images, wall and
# user seconds, microseconds per image. Pinned to core CORE.
#
# Usage: bench/many_images.sh   (env: BUILDS="build" COUNTS="1024 4096 16384" CORE=0 REPEATS=2
#                                WORKDIR=${TMPDIR:-/tmp}/attnscope-many-$$)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILDS=${BUILDS:-build}
COUNTS=${COUNTS:-1024 4096 16384}
CORE=${CORE:-0}
REPEATS=${REPEATS:-2}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/attnscope-many-$$}
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
mkdir -p "$WORKDIR"
trap 'rm -rf "$WORKDIR"' EXIT
first=$(echo "$BUILDS" | awk '{print $1}')
for n in $COUNTS; do
  "$first/apps/attnscope" synth --out "$WORKDIR/many$n.h5" --images "$n" --compression 0 --seed 1 \
    --layers 4 --heads 2 --grid-height 2 --grid-width 2 --prefix 1 --head-dim 8 >/dev/null
done
echo "| build | images | wall s | user s | us per image |"
echo "|---|---|---|---|---|"
for r in $(seq 1 "$REPEATS"); do
  for n in $COUNTS; do
    for b in $BUILDS; do
      cat "$WORKDIR/many$n.h5" >/dev/null  # in the page cache for every build
      t=$( { taskset -c "$CORE" /usr/bin/time -f "%e %U" "$b/apps/attnscope" info "$WORKDIR/many$n.h5" \
               --check-values >/dev/null; } 2>&1 | tail -1)
      read -r wall user <<<"$t"
      awk -v b="$b" -v n="$n" -v w="$wall" -v u="$user" \
        'BEGIN { printf "| %s | %d | %.2f | %.2f | %.1f |\n", b, n, w, u, w * 1e6 / n }'
    done
  done
done
