# Image runs that must fail, and fail whole: a rank or a shard that fails, resumes and merges of
# mismatched inputs, a damaged journal or shard, two runs on one results folder, and commands
# that do not split over MPI ranks. Nothing that looks complete is left behind.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
need_h5py
A="$ATTNSCOPE"
expect_ok "$A" synth --out "$WORK/d.h5" --images 8 --layers 2 --heads 2 --grid-height 4 \
  --grid-width 4 --head-dim 8 --seed 1
expect_ok "$A" synth --out "$WORK/other.h5" --images 8 --layers 2 --heads 2 --grid-height 4 \
  --grid-width 4 --head-dim 8 --seed 2
# A copy whose image 7 holds a NaN: the process that reads image 7 fails.
cp "$WORK/d.h5" "$WORK/bad.h5"
"$PYTHON" -c '
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    x = f["layers/1/q"]; y = x[7]; y[0, 3, 2] = np.nan; x[7] = y
' "$WORK/bad.h5"

# --- a rank that fails fails the run: one message from rank 0, every rank non-zero, no set.
rc=0
image_runs_mpirun -n 4 "$A" confusion --dump "$WORK/bad.h5" --threads 1 --out "$WORK/ranks" \
  >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: mpirun with a failing rank exited $rc, expected 1"; cat "$WORK/err.txt"; exit 1; }
expect_grep '^attnscope confusion: rank 3 of 4: .*bad\.h5.*/layers/1/q.*NaN' "$WORK/err.txt"
[ "$(grep -c '^attnscope' "$WORK/err.txt")" -eq 1 ] || { echo "FAIL: not one line from attnscope"; cat "$WORK/err.txt"; exit 1; }
expect_no_file "$WORK/ranks/confusion.json" "$WORK/ranks/confusion_per_image.csv"

# --- a shard that fails publishes nothing, and merge refuses the incomplete set of shards.
expect_ok "$A" confusion --dump "$WORK/bad.h5" --shard 0/2 --out "$WORK/s0"
expect_exit 1 "NaN" "$A" confusion --dump "$WORK/bad.h5" --shard 1/2 --out "$WORK/s1"
expect_no_file "$WORK/s1/confusion.shard-1-of-2.json" "$WORK/s1/confusion.json"
expect_exit 1 "none" "$A" merge "$WORK/s0" "$WORK/s1" --out "$WORK/m"
expect_exit 2 "shard 1/2 is missing" "$A" merge "$WORK/s0" --out "$WORK/m"
expect_no_file "$WORK/m/confusion.json"

# --- merge refuses shards of different runs, a shard given twice, and a changed shard.
expect_ok "$A" confusion --dump "$WORK/d.h5" --shard 0/2 --out "$WORK/g0"
expect_ok "$A" confusion --dump "$WORK/d.h5" --shard 1/2 --out "$WORK/g1"
expect_ok "$A" confusion --dump "$WORK/d.h5" --shard 1/2 --eps 1e-2 --out "$WORK/e1"
expect_ok "$A" confusion --dump "$WORK/d.h5" --shard 0/3 --out "$WORK/t0"
expect_exit 2 "a shard of a different run" "$A" merge "$WORK/g0" "$WORK/e1" --out "$WORK/m"
expect_exit 2 "shard of 3, the others are of 2" "$A" merge "$WORK/g0" "$WORK/g1" "$WORK/t0" \
  --out "$WORK/m"
cp -r "$WORK/g1" "$WORK/g1copy"
expect_exit 2 "is given twice" "$A" merge "$WORK/g0" "$WORK/g1" "$WORK/g1copy" --out "$WORK/m"
cp -r "$WORK/g1" "$WORK/g1bad"
printf 'x' | dd of="$WORK/g1bad/confusion.shard-1-of-2.journal" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_exit 1 "changed after the shard was published" "$A" merge "$WORK/g0" "$WORK/g1bad" --out "$WORK/m"
expect_no_file "$WORK/m/confusion.json"
# The dump the shards were computed on must be the one merge is given now.
mv "$WORK/d.h5" "$WORK/d-saved.h5" && cp "$WORK/other.h5" "$WORK/d.h5"
expect_exit 2 "a shard of a different run than the dump and flags give now" \
  "$A" merge "$WORK/g0" "$WORK/g1" --out "$WORK/m"
mv "$WORK/d-saved.h5" "$WORK/d.h5"
expect_ok "$A" merge "$WORK/g0" "$WORK/g1" --out "$WORK/m"
expect_ok "$A" confusion --dump "$WORK/d.h5" --out "$WORK/plain"
same_results "$WORK/plain" "$WORK/m" confusion.json

# --- --resume refuses another dump or other flags; a damaged journal is named.
rc=0
ATTNSCOPE_TEST_KILL_AT=record:3 "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 137 ] || { echo "FAIL: kill hook: exit $rc"; exit 1; }
expect_exit 2 "belongs to a different run (an input file (dump or weights) is not the one it was written for" \
  "$A" confusion --dump "$WORK/other.h5" --out "$WORK/r" --resume
expect_exit 2 "parameters.eps: 0.01 here, 0.001 in the journal" \
  "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r" --resume --eps 1e-2
expect_exit 2 "belongs to a different run" \
  "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r" --resume --images 0-5
J="$WORK/r/.attnscope-partial/confusion.journal"
cp "$J" "$WORK/journal.saved"
printf 'xxxx' | dd of="$J" bs=1 seek=60 conv=notrunc 2>/dev/null
expect_exit 1 "confusion.journal at byte" "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r" --resume
cp "$WORK/journal.saved" "$J"
# A torn last record (a kill in the middle of a write) is dropped, and the run goes on.
head -c -3 "$WORK/journal.saved" >"$J"
expect_ok "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r" --resume
same_results "$WORK/plain" "$WORK/r" confusion.json
# Without --resume an interrupted run's journal is discarded, and says so.
rc=0
ATTNSCOPE_TEST_KILL_AT=record:2 "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r2" >/dev/null 2>&1 || rc=$?
expect_ok "$A" confusion --dump "$WORK/d.h5" --out "$WORK/r2"
expect_grep "started over; the interrupted run's journal .* was discarded" "$WORK/err.txt"
same_results "$WORK/plain" "$WORK/r2" confusion.json

# --- two runs on one results folder: the second is refused while the first holds it.
ATTNSCOPE_TEST_PUBLISH_HOOK=sleep@0 "$A" confusion --dump "$WORK/d.h5" --out "$WORK/busy" \
  >/dev/null 2>&1 &
first=$!
for _ in $(seq 50); do [ -e "$WORK/busy/.attnscope-partial/confusion.journal" ] && break; sleep 0.1; done
expect_exit 2 "another attnscope run is writing this results folder" \
  "$A" confusion --dump "$WORK/d.h5" --out "$WORK/busy"
wait "$first" || { echo "FAIL: the first run failed"; exit 1; }
same_results "$WORK/plain" "$WORK/busy" confusion.json

# --- bad --shard values, and commands that do not split over ranks.
expect_exit 2 "--shard: expected I/N" "$A" confusion --dump "$WORK/d.h5" --shard 3/3 --out "$WORK/x"
expect_exit 2 "--shard: expected I/N" "$A" confusion --dump "$WORK/d.h5" --shard 1 --out "$WORK/x"
expect_exit 2 "--shard: expected I/N" "$A" confusion --dump "$WORK/d.h5" --shard -1/2 --out "$WORK/x"
expect_exit 2 "name the folders" "$A" merge
expect_exit 1 "not a folder" "$A" merge "$WORK/nowhere"
rc=0
image_runs_mpirun -n 2 "$A" synth --out "$WORK/mpi-synth.h5" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: synth ran over 2 ranks"; exit 1; }
expect_grep "synth: runs as one process, not over 2 MPI ranks" "$WORK/err.txt"
expect_no_file "$WORK/mpi-synth.h5"

# --- a journal of another layout (2 ranks) is not continued by a plain --resume, which says so.
rc=0
ATTNSCOPE_TEST_KILL_AT=record:2 image_runs_mpirun -n 2 "$A" confusion --dump "$WORK/d.h5" \
  --threads 1 --out "$WORK/lay" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the killed MPI run exited 0"; exit 1; }
[ -f "$WORK/lay/.attnscope-partial/confusion.rank-0-of-2.journal" ] ||
  { echo "FAIL: no rank journal kept"; ls -la "$WORK/lay/.attnscope-partial"; exit 1; }
expect_ok "$A" confusion --dump "$WORK/d.h5" --out "$WORK/lay" --resume
expect_grep "no journal of this run's layout \(confusion.journal\) but confusion.rank-0-of-2.journal" \
  "$WORK/err.txt"
for f in confusion_per_image.csv confusion_per_head.csv confusion_histogram.csv; do
  cmp "$WORK/plain/$f" "$WORK/lay/$f" || { echo "FAIL: $f differs after a fresh start"; exit 1; }
done
# The other layout's journals stay (it may still be continued with 2 ranks).
[ -f "$WORK/lay/.attnscope-partial/confusion.rank-1-of-2.journal" ] || { echo "FAIL: removed"; exit 1; }
# The other ranks' journals of the run's own layout are not another layout's: 4 ranks on 2
# images with --resume say nothing (rank 0's journal may be empty while rank 1's holds records).
expect_ok "$A" synth --out "$WORK/two.h5" --images 2 --layers 1 --heads 1 --grid-height 2 --grid-width 2
rc=0
image_runs_mpirun -n 4 "$A" entropy --dump "$WORK/two.h5" --threads 1 --out "$WORK/four" --resume \
  >/dev/null 2>"$WORK/err.txt" || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: 4 ranks on 2 images exited $rc"; cat "$WORK/err.txt"; exit 1; }
if grep -q "no journal of this run's layout" "$WORK/err.txt"; then
  echo "FAIL: the run's own ranks' journals called another layout's:"; cat "$WORK/err.txt"; exit 1
fi
