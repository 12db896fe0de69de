# A plain run and an mpirun run of one command on the same --out publish the same files: while
# one is running the other is refused, exit 2, naming the running one's journal (was: both ran
# and silently overwrote each other's set).
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found"; exit 77; }
"$ATTNSCOPE" --version | grep -q '^mpi: yes' || { echo "SKIP: built without MPI"; exit 77; }
mpi() {
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe "$@"
}
A=$ATTNSCOPE
expect_ok "$A" synth --out "$WORK/d.h5" --images 8 --layers 1 --heads 1 --grid-height 2 --grid-width 2
wait_for_step() {  # wait_for_step FILE: until the run paused at publishing step 0 says so
  for _ in $(seq 300); do grep -q "publish step 0" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "FAIL: the background run never reached publishing"; cat "$1"; exit 1
}

# A plain run holds the folder (paused while publishing); an mpirun run on it is refused.
ATTNSCOPE_TEST_PUBLISH_HOOK=sleep@0 "$A" census --dump "$WORK/d.h5" --out "$WORK/o" >/dev/null 2>"$WORK/bg.txt" &
bg=$!
wait_for_step "$WORK/bg.txt"
rc=0
mpi -n 2 "$A" census --dump "$WORK/d.h5" --out "$WORK/o" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
wait "$bg" || { echo "FAIL: the plain run failed"; cat "$WORK/bg.txt"; exit 1; }
[ "$rc" -ne 0 ] || { echo "FAIL: mpirun ran beside the plain run"; exit 1; }
grep -q "another attnscope run (one process) is writing this results folder" "$WORK/err.txt" ||
  { echo "FAIL: mpirun's error:"; cat "$WORK/err.txt"; exit 1; }

# An mpirun run holds it; a plain run is refused.
ATTNSCOPE_TEST_PUBLISH_HOOK=sleep@0 mpi -n 2 "$A" census --dump "$WORK/d.h5" --out "$WORK/p" \
  >/dev/null 2>"$WORK/bg.txt" &
bg=$!
wait_for_step "$WORK/bg.txt"
expect_exit 2 "another attnscope run (under mpirun) is writing this results folder" \
  "$A" census --dump "$WORK/d.h5" --out "$WORK/p"
wait "$bg" || { echo "FAIL: the mpirun run failed"; cat "$WORK/bg.txt"; exit 1; }
# Negative control: one after the other, both run, and give the same set.
expect_ok "$A" census --dump "$WORK/d.h5" --out "$WORK/p"
expect_ok "$A" census --dump "$WORK/d.h5" --out "$WORK/o2"
cmp "$WORK/p/census.csv" "$WORK/o2/census.csv" || { echo "FAIL: sets differ"; exit 1; }
