# Checks for analyses that run over a dump's images (sourced by the image_runs_*.sh tests, after
# lib.sh): however a run's images are computed, its result files are the same bytes.
#
#   check_image_run NAME COMMAND ARGS...     (ARGS without --out)
#
# runs the command plainly into $WORK/NAME/plain, then the same run
#   - killed (SIGKILL) after its first record, again in the middle, again after every record is
#     in, and once while publishing (between two result files), each time continued with --resume;
#   - as 3 shards (--shard I/3) combined with attnscope merge;
#   - under mpirun with 1, 2 and 4 ranks (--oversubscribe),
# and compares every result file byte for byte with the plain run's, and the JSON records with
# their timing fields (elapsed time, start time, command line, threads, ms_per_image, I/O wait,
# read queue: how this process read, which a resumed or merged run did not)
# removed. IMAGES (default 8) is the number of images the run selects (for the kill points).

# negative_queries_copy SRC DST LAYER: a copy of dump SRC whose LAYER's queries are all negative,
# so that every linear:relu row of that layer is degenerate (needs h5py).
negative_queries_copy() {
  cp "$1" "$2"
  "${PYTHON:-/usr/bin/python3}" -c '
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    x = f["layers/" + sys.argv[2] + "/q"]; x[...] = -(np.abs(x[...]) + 1)
' "$2" "$3"
}

image_runs_mpirun() {
  command -v mpirun >/dev/null || { echo "FAIL: mpirun not found (the README's commands install openmpi-bin)"; exit 1; }
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    mpirun --oversubscribe "$@"
}

# same_results REFERENCE_DIR DIR MANIFEST: the same files, byte for byte, and the same record.
same_results() {
  local ref=$1 dir=$2 manifest=$3
  [ -f "$dir/$manifest" ] || { echo "FAIL: $dir/$manifest missing"; ls -la "$dir"; exit 1; }
  local f
  for f in "$ref"/*; do
    [ "$(basename "$f")" = "$manifest" ] && continue
    cmp -s "$f" "$dir/$(basename "$f")" || { echo "FAIL: $dir/$(basename "$f") differs from $f"; exit 1; }
  done
  for f in "$dir"/*; do
    [ -e "$ref/$(basename "$f")" ] || { echo "FAIL: $f is not in the plain run's results"; exit 1; }
  done
  if [ -e "$dir/.attnscope-partial" ]; then
    echo "FAIL: $dir/.attnscope-partial was left behind"; ls -la "$dir/.attnscope-partial"; exit 1
  fi
  "${PYTHON:-/usr/bin/python3}" - "$ref/$manifest" "$dir/$manifest" <<'PY' || exit 1
import json, sys
def strip(path):
    j = json.load(open(path))
    for k in ("command_line", "elapsed_s", "start_time", "threads"):
        j.pop(k, None)
    for section in ("parameters", "results"):
        s = j.get(section, {})
        for k in list(s):
            if k in ("threads", "ms_per_image", "read_queue") or k.startswith("io_") \
                    or k.endswith("_seconds"):
                s.pop(k)
    return j
a, b = strip(sys.argv[1]), strip(sys.argv[2])
if a != b:
    print("FAIL: records differ:", sys.argv[1], sys.argv[2])
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            print(" ", k, json.dumps(a.get(k))[:300], "|", json.dumps(b.get(k))[:300])
    sys.exit(1)
PY
}

check_image_run() {
  local name=$1; shift
  local cmd=$1
  local manifest="$cmd.json"
  local images=${IMAGES:-8}
  # Three distinct kill points need four images at least.
  [ "$images" -ge 4 ] || { echo "FAIL: check_image_run needs IMAGES >= 4, got $images"; exit 1; }
  local base="$WORK/$name"
  rm -rf "$base" && mkdir -p "$base"
  expect_ok "$ATTNSCOPE" "$@" --out "$base/plain"
  [ -f "$base/plain/$manifest" ] || { echo "FAIL: no $manifest in $base/plain"; exit 1; }

  # Killed at several points, each time continued with --resume.
  local rc=0 point
  for point in record:1 "record:$((images / 2))" finish; do
    rc=0
    ATTNSCOPE_TEST_KILL_AT=$point "$ATTNSCOPE" "$@" --out "$base/resumed" --resume \
      >/dev/null 2>"$WORK/err.txt" || rc=$?
    [ "$rc" -eq 137 ] || { echo "FAIL: kill at $point: exit $rc, expected 137"; cat "$WORK/err.txt"; exit 1; }
    [ ! -e "$base/resumed/$manifest" ] || { echo "FAIL: a killed run left $manifest"; exit 1; }
  done
  rc=0
  ATTNSCOPE_TEST_PUBLISH_HOOK=kill@2 "$ATTNSCOPE" "$@" --out "$base/resumed" --resume \
    >/dev/null 2>"$WORK/err.txt" || rc=$?
  [ "$rc" -eq 137 ] || { echo "FAIL: kill while publishing: exit $rc"; cat "$WORK/err.txt"; exit 1; }
  [ ! -e "$base/resumed/$manifest" ] || { echo "FAIL: a run killed publishing left $manifest"; exit 1; }
  expect_ok "$ATTNSCOPE" "$@" --out "$base/resumed" --resume
  same_results "$base/plain" "$base/resumed" "$manifest"

  # Three shards, merged.
  local i
  for i in 0 1 2; do
    expect_ok "$ATTNSCOPE" "$@" --shard "$i/3" --out "$base/shard$i"
    [ ! -e "$base/shard$i/$manifest" ] || { echo "FAIL: a shard wrote $manifest as if complete"; exit 1; }
  done
  expect_ok "$ATTNSCOPE" merge "$base/shard0" "$base/shard2" "$base/shard1" --out "$base/merged"
  same_results "$base/plain" "$base/merged" "$manifest"

  # MPI ranks.
  local r
  for r in 1 2 4; do
    if ! image_runs_mpirun -n "$r" "$ATTNSCOPE" "$@" --threads 1 --out "$base/ranks$r" \
        >"$WORK/out.txt" 2>"$WORK/err.txt"; then
      echo "FAIL: mpirun -n $r $*"; cat "$WORK/out.txt" "$WORK/err.txt"; exit 1
    fi
    same_results "$base/plain" "$base/ranks$r" "$manifest"
  done
}
