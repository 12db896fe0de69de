# Disk full: every command that writes runs on a small tmpfs with 0, 4, 8, ... KiB free, over an
# older result set of the same command. Each run either publishes its complete new set, or fails
# with one line on stderr naming the file and "No space left on device" (exit 1, no crash), leaving
# the folder exactly as it was: the older set untouched, nothing new, no temporary file.
source "$(dirname "${BASH_SOURCE[0]}")/result_checks.bash"

if [ "$(id -u)" -ne 0 ]; then
  # Not root: a user namespace may still mount a tmpfs.
  if [ -z "${ATTNSCOPE_IN_USERNS:-}" ] && unshare -rm true 2>/dev/null; then
    ATTNSCOPE_IN_USERNS=1 exec unshare -rm bash "$REPO/tests/integration/run_cli_test.sh" \
      "$REPO/tests/integration/disk_full.sh"
  fi
  echo "SKIP: mounting a tmpfs needs root or user namespaces (unshare -rm), neither available"
  exit 77
fi

T="$WORK/tmpfs"
mkdir -p "$T"
mount -t tmpfs -o size=1m tmpfs "$T"
trap 'umount "$T" 2>/dev/null || umount -l "$T"' EXIT

expect_ok "$ATTNSCOPE" synth --out "$WORK/s.h5" --images 4 --layers 2 --heads 2
REAL_DUMP="$REPO/data/dumps/vit7-softmax-fmnist.h5"  # has the model's outputs, for recompute

# cmd_args COMMAND OUT old|new: sets ARGS (the command line) and MANIFEST; "new" differs from "old"
# so that a mix of the two would show.
cmd_args() {
  local c=$1 o=$2 v=$3
  MANIFEST="$o/$c.json"
  case $c in
    synth)
      MANIFEST="$o/d.h5.json"
      ARGS=(synth --out "$o/d.h5" --images 2 --layers 1 --heads 2 --seed "$([ "$v" = old ] && echo 1 || echo 2)") ;;
    confusion)
      ARGS=(confusion --dump "$WORK/s.h5" --out "$o" --variant "$([ "$v" = old ] && echo softmax || echo softmax,linear:relu)") ;;
    locality)
      ARGS=(locality --dump "$WORK/s.h5" --out "$o" --window "$([ "$v" = old ] && echo 3 || echo 5)") ;;
    maps)
      ARGS=(maps --dump "$WORK/s.h5" --out "$o" --tokens "$([ "$v" = old ] && echo 0 || echo 0,1,2,3)" --images 0-3) ;;
    spikiness)
      ARGS=(spikiness --dump "$WORK/s.h5" --out "$o" --samples "$([ "$v" = old ] && echo 4 || echo 8)" --scales 0.5,1,2) ;;
    census)
      ARGS=(census --dump "$WORK/s.h5" --out "$o" --variant "$([ "$v" = old ] && echo inline || echo inline,mala)") ;;
    mask)
      ARGS=(mask --dump "$WORK/s.h5" --out "$o" --mask "$([ "$v" = old ] && echo local:3 || echo local:3,random:9)") ;;
    recompute)
      ARGS=(recompute --dump "$REAL_DUMP" --out "$o" --images "$([ "$v" = old ] && echo 0 || echo 0-3)") ;;
    verify)
      ARGS=(verify --out "$o" --no-timing --trials "$([ "$v" = old ] && echo 1 || echo 2)") ;;
    distance|entropy|sinks|rank|rollout)
      ARGS=("$c" --dump "$WORK/s.h5" --out "$o" --variant "$([ "$v" = old ] && echo softmax || echo softmax,inline)") ;;
  esac
}

# A run that wrote its results: exit 0, or 3 when a check it reports failed (verify, recompute).
wrote() { [ "$1" -eq 0 ] || [ "$1" -eq 3 ]; }

for c in synth confusion locality maps spikiness census mask recompute verify distance entropy sinks rank rollout; do
  failures=0
  for free_kib in 0 4 8 16 32 64 128 256 512; do
    rm -rf "${T:?}"/* "$T"/.[!.]* 2>/dev/null || true
    o="$T/$c"
    mkdir -p "$o"
    cmd_args "$c" "$o" old
    rc=0
    "$ATTNSCOPE" "${ARGS[@]}" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
    wrote "$rc" || { echo "FAIL: $c (older run, disk not full) exited $rc"; cat "$WORK/err.txt"; exit 1; }
    set_ok "$MANIFEST"
    before=$(snapshot "$o")

    # Fill the file system, then give back free_kib KiB.
    cat /dev/zero >"$T/filler" 2>/dev/null || true
    [ "$free_kib" -eq 0 ] || truncate -s "-${free_kib}K" "$T/filler"
    cmd_args "$c" "$o" new
    rc=0
    "$ATTNSCOPE" "${ARGS[@]}" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
    expect_no_temp "$T"
    if wrote "$rc"; then
      set_ok "$MANIFEST"  # enough room: the new set, complete
      break
    fi
    failures=$((failures + 1))
    if [ "$rc" -ne 1 ]; then
      echo "FAIL: $c with $free_kib KiB free exited $rc (expected 1)"; cat "$WORK/err.txt"; exit 1
    fi
    if [ "$(wc -l <"$WORK/err.txt")" -ne 1 ] || ! grep -q "^attnscope $c: .*No space left on device" "$WORK/err.txt"; then
      echo "FAIL: $c with $free_kib KiB free: expected one line 'attnscope $c: ... No space left on device', got:"
      cat "$WORK/err.txt"; exit 1
    fi
    after=$(snapshot "$o")
    if [ "$before" != "$after" ]; then
      echo "FAIL: $c with $free_kib KiB free changed the older results:"
      diff <(echo "$before") <(echo "$after"); exit 1
    fi
    set_ok "$MANIFEST"
  done
  [ "$failures" -gt 0 ] || { echo "FAIL: $c never ran out of space"; exit 1; }
  echo "$c: $failures disk-full runs failed cleanly"
done
