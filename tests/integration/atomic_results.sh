# A run's result files appear together or not at all. Killed with SIGKILL at each step of
# publishing (test hook ATTNSCOPE_TEST_PUBLISH_HOOK=kill@N) and at random moments, a results
# folder holds the older complete set, the newer complete set, or a set the reader refuses (no
# manifest): never a mix that passes. A doctored set is refused too.
source "$(dirname "${BASH_SOURCE[0]}")/result_checks.bash"

expect_ok "$ATTNSCOPE" synth --out s.h5 --images 8 --layers 4 --heads 4 --grid-height 14 \
  --grid-width 14
OLD=(confusion --dump s.h5 --out r --variant softmax)
NEW=(confusion --dump s.h5 --out r --variant softmax,linear:relu --reference)
M=r/confusion.json

expect_ok "$ATTNSCOPE" "${NEW[@]}"
set_ok "$M"
B=$(set_files "$M")
expect_ok "$ATTNSCOPE" "${OLD[@]}"
set_ok "$M"
A=$(set_files "$M")
[ "$A" != "$B" ] || { echo "FAIL: the two runs wrote identical sets"; exit 1; }

# state MANIFEST: old, new or refused; a set that verifies but is neither is a failure.
state() {
  if ! "$PYTHON" "$RESULT_SET_PY" verify "$1" >/dev/null 2>&1; then echo refused; return; fi
  local now
  now=$(set_files "$1")
  if [ "$now" = "$A" ]; then echo old; elif [ "$now" = "$B" ]; then echo new; else
    echo "FAIL: a set that verifies but is neither run's:" >&2; echo "$now" >&2; echo mix
  fi
}

# --- SIGKILL at every publishing step: 0 staged, 1 old manifest gone, 2-6 the five renames
# (per image, per image and layer, per head, per layer, histogram), 7 new manifest in place.
expected=(old refused refused refused refused refused refused new)
for n in 0 1 2 3 4 5 6 7; do
  expect_ok "$ATTNSCOPE" "${OLD[@]}"  # back to the older set; also clears the killed run's folder
  expect_no_temp r
  rc=0
  ATTNSCOPE_TEST_PUBLISH_HOOK="kill@$n" "$ATTNSCOPE" "${NEW[@]}" >/dev/null 2>"$WORK/err.txt" || rc=$?
  [ "$rc" -eq 137 ] || { echo "FAIL: kill@$n: exit $rc, expected 137"; cat "$WORK/err.txt"; exit 1; }
  grep -q "publish step $n" "$WORK/err.txt" || { echo "FAIL: kill@$n: hook not reached"; exit 1; }
  st=$(state "$M")
  if [ "$st" != "${expected[$n]}" ]; then
    echo "FAIL: killed at publishing step $n: folder holds '$st', expected '${expected[$n]}'"
    ls -la r; exit 1
  fi
  echo "killed at step $n: $st"
done
rc=0
ATTNSCOPE_TEST_PUBLISH_HOOK=kill@8 "$ATTNSCOPE" "${NEW[@]}" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: there are more than 8 publishing steps (exit $rc)"; exit 1; }
[ "$(state "$M")" = new ] || { echo "FAIL: completed run did not publish the new set"; exit 1; }

# --- Files of the older set that the newer one lacks go before the new manifest appears:
# verify with timing writes verify_timing.csv, without it does not.
V_OLD=(verify --out v --trials 1 --timing-max-n 128)
V_NEW=(verify --out v --trials 1 --no-timing)
for n in 0 1 2 3 4; do
  rc=0; "$ATTNSCOPE" "${V_OLD[@]}" >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || { echo "FAIL: verify exited $rc"; exit 1; }
  set_ok v/verify.json
  [ -f v/verify_timing.csv ] || { echo "FAIL: verify wrote no verify_timing.csv"; exit 1; }
  rc=0
  ATTNSCOPE_TEST_PUBLISH_HOOK="kill@$n" "$ATTNSCOPE" "${V_NEW[@]}" >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 137 ] || { echo "FAIL: verify kill@$n: exit $rc, expected 137"; exit 1; }
  # Steps: 0 staged, 1 manifest gone, 2 verify.csv renamed, 3 verify_timing.csv removed,
  # 4 new manifest in place.
  if [ "$n" -eq 0 ] || [ "$n" -eq 4 ]; then set_ok v/verify.json; else set_refused v/verify.json; fi
  if [ "$n" -ge 3 ] && [ -e v/verify_timing.csv ]; then
    echo "FAIL: verify_timing.csv of the older run survives step $n"; exit 1
  fi
done
grep -q verify_timing v/verify.json && { echo "FAIL: the new manifest lists verify_timing.csv"; exit 1; }

# --- SIGKILL at random moments of whole runs (old and new alternate): half anywhere in the run,
# half close to its end, where it publishes.
t0=$(date +%s%N)
expect_ok "$ATTNSCOPE" "${NEW[@]}"
run_ms=$((($(date +%s%N) - t0) / 1000000))
for i in $(seq 1 8); do
  if [ $((i % 4)) -lt 2 ]; then ms=$((RANDOM % (run_ms + 1))); else ms=$((run_ms - 100 + RANDOM % 150)); fi
  [ "$ms" -ge 0 ] || ms=0
  delay=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  # The older set again, through the slow path (the same files, byte for byte).
  if [ $((i % 2)) -eq 0 ]; then args=("${OLD[@]}" --reference); else args=("${NEW[@]}"); fi
  "$ATTNSCOPE" "${args[@]}" >/dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  st=$(state "$M")
  [ "$st" != mix ] || { echo "FAIL: killed after ${delay}s: a mixed set passes"; exit 1; }
  echo "run $i killed after ${delay}s: $st"
done

# --- Doctored sets are refused.
expect_ok "$ATTNSCOPE" "${NEW[@]}"
cp -a r r_new
expect_ok "$ATTNSCOPE" "${OLD[@]}"
set_ok "$M"
cp r/confusion_per_head.csv saved.csv
# Same size, one byte changed.
"$PYTHON" - r/confusion_per_head.csv <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-2] = ord("7") if b[-2] != ord("7") else ord("8")
open(p, "wb").write(bytes(b))
PY
set_refused "$M"
cp saved.csv r/confusion_per_head.csv
set_ok "$M"
cp r_new/confusion_per_image.csv r/confusion_per_image.csv  # a file of the other run: a mix
set_refused "$M"
cp -a r_new/. r/
set_ok "$M"
rm r/confusion_histogram.csv  # a listed file missing
set_refused "$M"
cp -a r_new/. r/
rm r/confusion.json  # no manifest
set_refused "$M"
echo '{"command": "confusion"}' >"$M"  # a record without the list of files
set_refused "$M"
