# Helpers for CLI tests (sourced). Each helper prints what failed and exits non-zero.

# expect_fail "substring of the one-line error" cmd args...: the command must exit non-zero,
# print one line on stderr containing the substring, and not crash (exit code < 128).
expect_fail() {
  local want=$1; shift
  local rc=0
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  if [ "$rc" -eq 0 ]; then echo "FAIL: expected failure: $*"; cat "$WORK/out.txt"; exit 1; fi
  if [ "$rc" -ge 128 ]; then echo "FAIL: crashed with $rc: $*"; cat "$WORK/err.txt"; exit 1; fi
  if ! grep -qF -- "$want" "$WORK/err.txt"; then
    echo "FAIL: stderr of '$*' lacks '$want':"; cat "$WORK/err.txt"; exit 1
  fi
}

# expect_ok cmd args...: must exit 0; stdout lands in $WORK/out.txt.
expect_ok() {
  if ! "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; then
    echo "FAIL: $*"; cat "$WORK/out.txt" "$WORK/err.txt"; exit 1
  fi
}

# expect_grep PATTERN FILE
expect_grep() {
  grep -qE -- "$1" "$2" || { echo "FAIL: '$1' not in $2:"; head -50 "$2"; exit 1; }
}
