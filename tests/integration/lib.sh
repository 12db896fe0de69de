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

# expect_exit CODE "substring" cmd args...: the command must exit with exactly CODE and print
# exactly one line on stderr, starting with "attnscope" and containing the substring.
expect_exit() {
  local code=$1 want=$2; shift 2
  local rc=0
  "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: exit $rc, expected $code: $*"; cat "$WORK/out.txt" "$WORK/err.txt"; exit 1
  fi
  local lines
  lines=$(wc -l <"$WORK/err.txt")
  if [ "$lines" -ne 1 ]; then echo "FAIL: $lines lines on stderr of '$*':"; cat "$WORK/err.txt"; exit 1; fi
  if ! grep -q '^attnscope' "$WORK/err.txt"; then
    echo "FAIL: stderr of '$*' does not start with 'attnscope':"; cat "$WORK/err.txt"; exit 1
  fi
  if ! grep -qF -- "$want" "$WORK/err.txt"; then
    echo "FAIL: stderr of '$*' lacks '$want':"; cat "$WORK/err.txt"; exit 1
  fi
}

# expect_no_file PATH...: none of the paths (nor a temporary "PATH.tmp-*") may exist.
expect_no_file() {
  local p
  for p in "$@"; do
    if [ -e "$p" ] || compgen -G "$p.tmp-*" >/dev/null; then
      echo "FAIL: $p (or a temporary of it) was left behind"; ls -la "$(dirname "$p")"; exit 1
    fi
  done
}

# expect_empty FILE: the file must be empty (e.g. nothing on stderr after a success).
expect_empty() {
  if [ -s "$1" ]; then echo "FAIL: $1 is not empty:"; cat "$1"; exit 1; fi
}

# need_h5py: skips the test (exit 77) when $PYTHON cannot import h5py and numpy.
need_h5py() {
  if ! "${PYTHON:-/usr/bin/python3}" -c 'import h5py, numpy' 2>/dev/null; then
    echo "SKIP: ${PYTHON:-/usr/bin/python3} has no h5py/numpy"; exit 77
  fi
}
