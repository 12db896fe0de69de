# A run never harms its inputs or another process's file, and a refused run says one line:
# - results whose name is an input's (`maps --dump out/maps.h5 --out out`) are refused before
#   anything is computed, the dump intact (was: maps.h5 replaced the dump);
# - a result that would replace a file a writer holds open (HDF5's lock) is refused, the file
#   intact; the same name is replaced once the writer is gone (negative control);
# - notes and warnings wait until the run goes ahead: a run refused after them prints its error
#   line only (was: a "note: ... rows need not sum to 1" line before the error), while a run that
#   goes ahead still prints them;
# - info refuses what every analysis refuses: a layer whose own family needs data the dump lacks;
#   info --check-values with a huge OMP_NUM_THREADS is a usage error (was: a segfault);
# - replay's image sets must hold float images; --intervention's errors name --intervention;
#   synth refuses a layer block larger than an HDF5 chunk as a usage error naming the flags.
need_h5py
A=$ATTNSCOPE
PY=${PYTHON:-/usr/bin/python3}
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
expect_ok "$A" synth --out "$WORK/d.h5" --images 2 --layers 2 --heads 2 --grid-height 3 --grid-width 3

# Results onto an input.
mkdir -p "$WORK/out"
cp "$WORK/d.h5" "$WORK/out/maps.h5"
expect_exit 1 "$WORK/out/maps.h5: expected a results path that is not an input of the run" \
  "$A" maps --dump "$WORK/out/maps.h5" --out "$WORK/out" --images 0 --tokens 0
cmp -s "$WORK/d.h5" "$WORK/out/maps.h5" || { echo "FAIL: the input dump was changed"; exit 1; }
expect_no_file "$WORK/out/maps.json" "$WORK/out/maps.csv"
ln "$WORK/out/maps.h5" "$WORK/hardlink.h5"   # the same file under another name
expect_exit 1 "expected a results path that is not an input of the run" \
  "$A" maps --dump "$WORK/hardlink.h5" --out "$WORK/out" --images 0 --tokens 0
expect_ok "$A" maps --dump "$WORK/d.h5" --out "$WORK/out2" --images 0 --tokens 0   # control

# A file a writer holds open.
"$PY" - "$WORK/locked.h5" "$WORK/ready" <<'PY' &
import sys, time, h5py
f = h5py.File(sys.argv[1], "w")
f["x"] = [1, 2, 3]
f.flush()
open(sys.argv[2], "w").close()
time.sleep(60)
PY
writer=$!
for _ in $(seq 1 100); do [ -e "$WORK/ready" ] && break; sleep 0.1; done
[ -e "$WORK/ready" ] || { echo "FAIL: the writer did not start"; kill "$writer"; exit 1; }
before=$(sha256sum <"$WORK/locked.h5")
rc=0; "$A" synth --out "$WORK/locked.h5" --images 1 >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
kill "$writer" 2>/dev/null || true; wait "$writer" 2>/dev/null || true
[ "$rc" -eq 1 ] || { echo "FAIL: synth over a locked file: exit $rc"; cat "$WORK/err.txt"; exit 1; }
expect_grep "locked.h5: expected a file no other process is writing, found a file locked by another process" "$WORK/err.txt"
[ "$(wc -l <"$WORK/err.txt")" -eq 1 ] || { echo "FAIL: stderr:"; cat "$WORK/err.txt"; exit 1; }
[ "$(sha256sum <"$WORK/locked.h5")" = "$before" ] || { echo "FAIL: the locked file was replaced"; exit 1; }
expect_ok "$A" synth --out "$WORK/locked.h5" --images 1   # the writer is gone: replaced
expect_ok "$A" info "$WORK/locked.h5"

# Notes wait for the run to go ahead.
expect_exit 2 "mlla@paper: needs rope_cos" "$A" confusion --dump "$WORK/d.h5" --variant mlla --out "$WORK/n1"
expect_ok "$A" confusion --dump "$WORK/d.h5" --variant relu@code --out "$WORK/n2"
expect_grep "note: relu@code: attention rows need not sum to 1" "$WORK/err.txt"
expect_exit 2 "image index 5 out of range: the dump has 2 images" \
  "$A" confusion --dump "$WORK/d.h5" --variant relu@code --out "$WORK/n3" --images 5

# info refuses what the analyses refuse; its thread count is checked.
expect_ok "$A" synth --out "$WORK/agent.h5" --images 1 --family agent
expect_exit 1 "/layers/0/agents: expected the layer's family parameter agents of agent@paper" "$A" info "$WORK/agent.h5"
expect_exit 1 "/layers/0/agents: expected the layer's family parameter agents of agent@paper" \
  "$A" distance --dump "$WORK/agent.h5" --out "$WORK/agent-distance"
expect_exit 2 "OMP_NUM_THREADS='100000': expected a thread count from 1 to 1024" \
  env OMP_NUM_THREADS=100000 "$A" info --check-values "$WORK/d.h5"
expect_ok env OMP_NUM_THREADS=2 "$A" info --check-values "$WORK/d.h5"

# replay's inputs and flags.
m="$REPO/data/models/vit7-softmax-fmnist.h5"
for dtype in uint8 float64 int32; do
  "$PY" - "$WORK/set-$dtype.h5" "$dtype" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["images"] = np.ones((2, 1, 28, 28), dtype=sys.argv[2])
PY
  expect_exit 1 "set-$dtype.h5: /images: expected float32 or float16 images" \
    "$A" replay --model "$m" --image-set "$WORK/set-$dtype.h5" --out "$WORK/r-$dtype"
  expect_no_file "$WORK/r-$dtype/replay.json"
done
"$PY" - "$WORK/set-float16.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f["images"] = np.zeros((2, 1, 28, 28), dtype=np.float16)
PY
expect_ok "$A" replay --model "$m" --image-set "$WORK/set-float16.h5" --out "$WORK/r-float16"   # control
expect_exit 2 "--intervention 'local:0': K must be odd" \
  "$A" replay --model "$m" --image-set "$WORK/set-float16.h5" --out "$WORK/r-bad" --intervention local:0

# synth: a layer's block beyond an HDF5 chunk.
expect_exit 2 "--heads x tokens x --head-dim: one image's block of a layer would take" \
  "$A" synth --out "$WORK/huge.h5" --head-dim 100000000
expect_no_file "$WORK/huge.h5"

# A summary lost to a closed pipe: exit 1 (not a silent SIGPIPE), the set withdrawn, the journal
# kept; --resume then publishes the set of a plain run without computing again.
expect_ok "$A" entropy --dump "$WORK/d.h5" --out "$WORK/plain"
set +o pipefail
"$A" entropy --dump "$WORK/d.h5" --out "$WORK/piped" 2>"$WORK/err.txt" | true
rc=${PIPESTATUS[0]}
set -o pipefail
[ "$rc" -eq 1 ] || { echo "FAIL: a closed pipe: exit $rc"; cat "$WORK/err.txt"; exit 1; }
expect_grep "standard output: cannot write: Broken pipe; withdrew the result set $WORK/piped/entropy.json \(its journal is kept for --resume\)" "$WORK/err.txt"
expect_no_file "$WORK/piped/entropy.json"
[ -f "$WORK/piped/.attnscope-partial/entropy.journal" ] || { echo "FAIL: the journal was not kept"; exit 1; }
expect_ok "$A" entropy --dump "$WORK/d.h5" --out "$WORK/piped" --resume
cmp "$WORK/plain/entropy.csv" "$WORK/piped/entropy.csv" || { echo "FAIL: resumed set differs"; exit 1; }
expect_no_file "$WORK/piped/.attnscope-partial/entropy.journal"

# The journal is attnscope's own file: never written through a link onto another file.
mkdir -p "$WORK/j1/.attnscope-partial" "$WORK/j2/.attnscope-partial" "$WORK/j3"
echo "short" >"$WORK/victim.txt"
ln -s "$WORK/victim.txt" "$WORK/j1/.attnscope-partial/entropy.journal"
expect_exit 1 "entropy.journal: expected a journal of attnscope's own (a regular file), found a symbolic link" \
  "$A" entropy --dump "$WORK/d.h5" --out "$WORK/j1"
ln "$WORK/victim.txt" "$WORK/j2/.attnscope-partial/entropy.journal"
expect_exit 1 "found a file with other names (hard links)" "$A" entropy --dump "$WORK/d.h5" --out "$WORK/j2"
[ "$(cat "$WORK/victim.txt")" = short ] || { echo "FAIL: the linked file was written"; exit 1; }
echo "a file" >"$WORK/j3/.attnscope-partial"   # where the journals' folder belongs
expect_exit 1 "j3/.attnscope-partial: cannot create the folder of the run's journal" \
  "$A" entropy --dump "$WORK/d.h5" --out "$WORK/j3"
