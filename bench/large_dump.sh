#!/usr/bin/env bash
# Dumps larger than memory: writes a synthetic float16 dump of DeiT-T shape (12 layers, 3 heads,
# 14x14 grid + 1 prefix token, head dim 64, uncompressed) of SIZE_GB, and a smaller one of
# SMALL_GB, runs `confusion` and `locality` over each under /usr/bin/time -v, and prints a markdown
# table: images, wall time of the process, images per second (over the run JSON's elapsed_s; for
# synth over the wall time), peak RSS and the share of the streaming loop spent
# waiting for the reader (the run JSON's results.io_wait_share), and the seconds before the loop
# (elapsed_s less results.loop_seconds: start-up and the input check). Peak RSS at the two sizes shows
# that memory does not grow with the dump. When the binary was built with MPI, `confusion` is
# also run under `mpirun --oversubscribe -n R` for each R of RANKS, its CSVs checked byte for byte
# against the plain run. The generated files are deleted at the end, whatever happens.
#
# Usage: bench/large_dump.sh
#   env: SIZE_GB=10 SMALL_GB=1 RANKS="1 2" REPEATS=1 THREADS=$(nproc) MAX_MEMORY= (the default)
#        BUILD=build WORKDIR=${TMPDIR:-/tmp}/attnscope-large-$$ DROP_CACHES=0
# DROP_CACHES=1 empties the page cache before each run (needs root): without it, a dump smaller
# than the machine's free memory is read from the page cache, not from the disk.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_GB=${SIZE_GB:-10}
SMALL_GB=${SMALL_GB:-1}
RANKS=${RANKS:-"1 2"}
REPEATS=${REPEATS:-1}
THREADS=${THREADS:-$(nproc)}
MAX_MEMORY=${MAX_MEMORY:-}
BUILD=${BUILD:-build}
DROP_CACHES=${DROP_CACHES:-0}
A=$BUILD/apps/attnscope
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/attnscope-large-$$}

die() { echo "large_dump.sh: $*" >&2; exit 1; }
[ -x "$A" ] || die "$A not found: build it first (cmake --build $BUILD --target attnscope)"
command -v /usr/bin/time >/dev/null || die "needs /usr/bin/time (apt-get install time)"
command -v python3 >/dev/null || die "needs python3 (to read the run JSON)"

# DeiT-T: 12 layers x 3 heads x 197 tokens x 64 dims, q, k and v, 2 bytes each.
IMAGE_BYTES=$((12 * 3 * 197 * 64 * 3 * 2))
images_for() { python3 -c "import math; print(max(2, math.ceil($1 * 1e9 / $IMAGE_BYTES)))"; }
BIG_IMAGES=$(images_for "$SIZE_GB")
SMALL_IMAGES=$(images_for "$SMALL_GB")

# Disk space first: both dumps and 5% (at least 200 MB) for results and HDF5's metadata.
mkdir -p "$WORKDIR"
trap 'rm -rf "$WORKDIR"' EXIT
trap 'exit 130' INT TERM
need=$(( (BIG_IMAGES + SMALL_IMAGES) * IMAGE_BYTES ))
need=$(( need + (need / 20 > 200000000 ? need / 20 : 200000000) ))
avail=$(df -B1 --output=avail "$WORKDIR" | tail -1 | tr -d ' ')
if [ "$avail" -lt "$need" ]; then
  die "needs $((need / 1000000)) MB free in $WORKDIR for a ${SIZE_GB} GB and a ${SMALL_GB} GB dump, has $((avail / 1000000)) MB (set WORKDIR, or a smaller SIZE_GB)"
fi

# MPI: only when the binary says it was built with it (attnscope --version) and mpirun exists.
mpi=""
if command -v mpirun >/dev/null && "$A" --version 2>/dev/null | grep -q "^mpi: yes"; then
  mpi=yes
  # Open MPI refuses to start as root unless told (containers, CI).
  if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fi

export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
mem_flag=()
[ -n "$MAX_MEMORY" ] && mem_flag=(--max-memory "$MAX_MEMORY")

drop_caches() {
  [ "$DROP_CACHES" = 1 ] || return 0
  sync
  echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || die "DROP_CACHES=1 needs root (cannot write /proc/sys/vm/drop_caches)"
}

# timed NAME CMD...: runs under /usr/bin/time -v; peak RSS (KiB) and wall seconds to NAME.rss/.wall.
timed() {
  local name=$1; shift
  drop_caches
  /usr/bin/time -v "$@" >"$WORKDIR/$name.out" 2>"$WORKDIR/$name.time" ||
    { cat "$WORKDIR/$name.out" "$WORKDIR/$name.time" >&2; die "failed: $*"; }
  awk -F': ' '/Maximum resident set size/ {print $2}' "$WORKDIR/$name.time" >"$WORKDIR/$name.rss"
  awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s}' \
    "$WORKDIR/$name.time" >"$WORKDIR/$name.wall"
}

# stats FILE...: "median (min-max)" of one number per file.
stats() {
  python3 - "$@" <<'PY'
import statistics, sys
v = sorted(float(open(f).read()) for f in sys.argv[1:])
m = statistics.median(v)
print(f"{m:.4g}" if len(v) == 1 else f"{m:.4g} ({v[0]:.4g}-{v[-1]:.4g})")
PY
}

rows=()
# row LABEL IMAGES NAME...: one table row from the repeats NAME... (their .wall, .rss, .json)
row() {
  local label=$1 n=$2; shift 2
  local walls=() rates=() rss=() io=() setup=()
  for name in "$@"; do
    walls+=("$WORKDIR/$name.wall")
    # images/s over the run's own elapsed time (its JSON, to the microsecond) where there is one
    python3 - "$WORKDIR/$name" "$n" >"$WORKDIR/$name.rate" <<'PY'
import json, os, sys
base, n = sys.argv[1], int(sys.argv[2])
t = float(open(base + ".wall").read())
if os.path.exists(base + ".json"):
    t = json.load(open(base + ".json"))["elapsed_s"]
print(n / t)
PY
    rates+=("$WORKDIR/$name.rate")
    python3 -c "print(int(open('$WORKDIR/$name.rss').read()) / 1024)" >"$WORKDIR/$name.mib"
    rss+=("$WORKDIR/$name.mib")
    if [ -f "$WORKDIR/$name.json" ]; then
      python3 -c "import json; print(json.load(open('$WORKDIR/$name.json'))['results'].get('io_wait_share', float('nan')))" >"$WORKDIR/$name.io"
      io+=("$WORKDIR/$name.io")
      # elapsed_s less the streaming loops' time: start-up and the input check (the fingerprint
      # that hashes every byte of the dump).
      python3 -c "import json; j = json.load(open('$WORKDIR/$name.json')); print(j['elapsed_s'] - j['results'].get('loop_seconds', float('nan')))" >"$WORKDIR/$name.setup"
      setup+=("$WORKDIR/$name.setup")
    fi
  done
  local io_text="n/a" setup_text="n/a"
  [ ${#io[@]} -gt 0 ] && io_text=$(stats "${io[@]}")
  [ ${#setup[@]} -gt 0 ] && setup_text=$(stats "${setup[@]}")
  rows+=("| $label | $n | $(stats "${walls[@]}") | $(stats "${rates[@]}") | $(stats "${rss[@]}") | $io_text | $setup_text |")
}

for size in "$SMALL_GB" "$SIZE_GB"; do
  n=$(images_for "$size")
  dump="$WORKDIR/deit_t_${size}GB.h5"
  echo "writing $dump ($n images, $((n * IMAGE_BYTES / 1000000)) MB)" >&2
  timed "synth_$size" "$A" synth --out "$dump" --images "$n" --layers 12 --heads 3 --grid-height 14 \
    --grid-width 14 --prefix 1 --head-dim 64 --dtype f16 --compression 0 --seed 1 \
    --plant-duplicates 1 --plant-collinear 1 --threads "$THREADS"
  row "synth, ${size} GB" "$n" "synth_$size"
  for cmd in confusion locality; do
    names=()
    for r in $(seq 1 "$REPEATS"); do
      name="${cmd}_${size}_$r"
      echo "$cmd over ${size} GB (repeat $r of $REPEATS)" >&2
      timed "$name" "$A" "$cmd" --dump "$dump" --out "$WORKDIR/res_$name" --threads "$THREADS" "${mem_flag[@]}"
      cp "$WORKDIR/res_$name/$cmd.json" "$WORKDIR/$name.json"
      names+=("$name")
    done
    row "$cmd, ${size} GB" "$n" "${names[@]}"
  done
  if [ -n "$mpi" ]; then
    for R in $RANKS; do
      t=$(( THREADS / R > 0 ? THREADS / R : 1 ))
      name="confusion_${size}_mpi$R"
      echo "mpirun -n $R confusion over ${size} GB" >&2
      timed "$name" mpirun --oversubscribe -n "$R" "$A" confusion --dump "$dump" \
        --out "$WORKDIR/res_$name" --threads "$t" "${mem_flag[@]}"
      for f in "$WORKDIR/res_confusion_${size}_1"/*.csv; do
        cmp -s "$f" "$WORKDIR/res_$name/$(basename "$f")" ||
          die "mpirun -n $R: $(basename "$f") differs from the plain run"
      done
      [ -f "$WORKDIR/res_$name/confusion.json" ] && cp "$WORKDIR/res_$name/confusion.json" "$WORKDIR/$name.json"
      row "confusion, ${size} GB, mpirun -n $R ($t threads each)" "$n" "$name"
    done
  fi
  rm -f "$dump"  # the next size needs the disk
done

echo
echo "attnscope $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $THREADS threads, ${REPEATS} repeat(s): median (min-max); --max-memory ${MAX_MEMORY:-default}; page cache $([ "$DROP_CACHES" = 1 ] && echo dropped before each run || echo kept)"
echo
echo "| run | images | wall s | images/s | peak RSS MiB | io-wait share | set-up s (start-up + input check) |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [ -z "$mpi" ]; then
  echo
  echo "MPI ranks ($RANKS) skipped: $A was not built with MPI (attnscope --version) or mpirun is missing."
fi
