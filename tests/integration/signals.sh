# SIGINT, SIGTERM and SIGHUP: the command removes its temporary files and folders, prints one line
# and exits with 128 + the signal number; the older result set stays as it was, and the journal
# of the images done stays for --resume. A signal during
# publishing waits until the new set is complete. A signal ignored at start stays ignored.
source "$(dirname "${BASH_SOURCE[0]}")/result_checks.bash"

expect_ok "$ATTNSCOPE" synth --out s.h5 --images 40 --layers 4 --heads 4 --grid-height 14 \
  --grid-width 14
OLD=(confusion --dump s.h5 --out r --variant softmax)
SLOW=(confusion --dump s.h5 --out r --variant softmax,linear:relu --reference)
expect_ok "$ATTNSCOPE" "${OLD[@]}"
before=$(snapshot r)

# wait_for DESCRIPTION COMMAND...: polls COMMAND every 20 ms for up to 30 s.
wait_for() {
  local what=$1; shift
  for _ in $(seq 1 1500); do
    if "$@"; then return 0; fi
    sleep 0.02
  done
  echo "FAIL: timed out waiting for $what"; exit 1
}
staging_exists() { [ -n "$(find "$1" -maxdepth 1 -name '.attnscope-tmp-*' -print -quit)" ]; }
# A run over images journals each image as it finishes: signalled mid-run once one is in.
journal_started() { [ "$(stat -c %s "$1/.attnscope-partial/confusion.journal" 2>/dev/null || echo 0)" -gt 400 ]; }
said() { grep -q "$1" "$WORK/err.txt"; }

# interrupted SIGNAL CODE: run SLOW, signal it once its staging folder exists, check the outcome.
interrupted() {
  local sig=$1 code=$2 rc=0
  set -m  # a job of its own: a background job of a script would otherwise ignore SIGINT
  "$ATTNSCOPE" "${SLOW[@]}" >"$WORK/out.txt" 2>"$WORK/err.txt" &
  local pid=$!
  set +m
  wait_for "the first journaled image" journal_started r
  kill -s "$sig" "$pid"
  wait "$pid" || rc=$?
  if [ "$rc" -ne "$code" ]; then echo "FAIL: $sig: exit $rc, expected $code"; cat "$WORK/err.txt"; exit 1; fi
  if [ "$(wc -l <"$WORK/err.txt")" -ne 1 ] ||
     ! grep -q "^attnscope confusion: interrupted by $sig; temporary files removed$" "$WORK/err.txt"; then
    echo "FAIL: $sig: expected one line 'interrupted by $sig', got:"; cat "$WORK/err.txt"; exit 1
  fi
  expect_no_temp r
  [ "$(snapshot r)" = "$before" ] || { echo "FAIL: $sig changed the older results"; exit 1; }
  set_ok r/confusion.json
  [ -f r/.attnscope-partial/confusion.journal ] || { echo "FAIL: $sig: no journal kept"; exit 1; }
}
interrupted SIGTERM 143
# --resume continues the interrupted run and ends with the set of an uninterrupted one.
expect_ok "$ATTNSCOPE" "${SLOW[@]}" --resume
set_ok r/confusion.json
expect_ok "$ATTNSCOPE" "${SLOW[@]/#r/r-plain}"
for f in confusion_per_image.csv confusion_per_head.csv confusion_histogram.csv; do
  cmp r/$f r-plain/$f || { echo "FAIL: the resumed run's $f differs"; exit 1; }
done
expect_ok "$ATTNSCOPE" "${OLD[@]}"
before=$(snapshot r)
interrupted SIGINT 130
rm -r r/.attnscope-partial  # each run below starts afresh (without --resume it would say so)
interrupted SIGHUP 129
rm -r r/.attnscope-partial

# Every file staged, nothing published yet (the hook pauses 3 s at step 0): SIGTERM publishes
# nothing.
rc=0
ATTNSCOPE_TEST_PUBLISH_HOOK=sleep@0 "$ATTNSCOPE" confusion --dump s.h5 --out r \
  --variant softmax,linear:relu >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
wait_for "publish step 0" said "publish step 0"
kill -TERM "$pid"
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || { echo "FAIL: SIGTERM at step 0: exit $rc"; cat "$WORK/err.txt"; exit 1; }
expect_no_temp r
[ "$(snapshot r)" = "$before" ] || { echo "FAIL: SIGTERM at step 0 changed the older results"; exit 1; }

# Half published (old manifest gone, one file renamed): SIGTERM waits for the rest, then exits 143.
rc=0
ATTNSCOPE_TEST_PUBLISH_HOOK=sleep@2 "$ATTNSCOPE" confusion --dump s.h5 --out r \
  --variant softmax,linear:relu >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
wait_for "publish step 2" said "publish step 2"
kill -TERM "$pid"
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || { echo "FAIL: SIGTERM at step 2: exit $rc"; cat "$WORK/err.txt"; exit 1; }
expect_no_temp r
set_ok r/confusion.json
grep -q 'linear:relu' r/confusion_per_head.csv || { echo "FAIL: the new set was not published"; exit 1; }

# A signal ignored when the command starts stays ignored: the run completes.
rc=0
(trap '' TERM; ATTNSCOPE_TEST_PUBLISH_HOOK=sleep@0 exec "$ATTNSCOPE" "${OLD[@]}") \
  >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
wait_for "publish step 0" said "publish step 0"
kill -TERM "$pid"
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: an ignored SIGTERM stopped the run (exit $rc)"; exit 1; }
set_ok r/confusion.json

# synth: the dump being written (an open HDF5 file in the staging folder) goes too.
mkdir -p d
expect_ok "$ATTNSCOPE" synth --out d/x.h5 --images 2
d_before=$(snapshot d)
rc=0
"$ATTNSCOPE" synth --out d/x.h5 --images 4000 --layers 4 --heads 4 >"$WORK/out.txt" 2>"$WORK/err.txt" &
pid=$!
wait_for "synth's staging folder" staging_exists d
sleep 0.3
kill -TERM "$pid"
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || { echo "FAIL: synth SIGTERM: exit $rc"; cat "$WORK/err.txt"; exit 1; }
expect_no_temp d
[ "$(snapshot d)" = "$d_before" ] || { echo "FAIL: interrupted synth changed the older dump"; exit 1; }
set_ok d/x.h5.json
