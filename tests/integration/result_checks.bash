# Helpers for the CLI tests of result sets (sourced by disk_full.sh, atomic_results.sh,
# signals.sh; named .bash so that ctest does not take it for a test). The reader's check is
# python/attnscope_dump/result_set.py, the one the figure notebooks use.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESULT_SET_PY="$REPO/python/attnscope_dump/result_set.py"
PYTHON=${PYTHON:-/usr/bin/python3}

# set_ok MANIFEST: the set must be complete (every listed file present with its size and SHA-256).
set_ok() {
  if ! "${PYTHON:-/usr/bin/python3}" "$RESULT_SET_PY" verify "$1" >"$WORK/verify.txt" 2>&1; then
    echo "FAIL: result set of $1 does not verify:"; cat "$WORK/verify.txt"; ls -la "$(dirname "$1")"
    exit 1
  fi
}

# set_refused MANIFEST: the reader must refuse the set (missing manifest or files not matching).
set_refused() {
  if "${PYTHON:-/usr/bin/python3}" "$RESULT_SET_PY" verify "$1" >"$WORK/verify.txt" 2>&1; then
    echo "FAIL: result set of $1 verifies but should be refused:"; cat "$WORK/verify.txt"
    ls -la "$(dirname "$1")"; exit 1
  fi
}

# set_files MANIFEST: "name sha256" of each file the manifest lists, sorted (identifies a set).
set_files() {
  "${PYTHON:-/usr/bin/python3}" - "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for e in sorted(m["files"], key=lambda e: e["name"]):
    print(e["name"], e["sha256"])
PY
}

# snapshot DIR: "sha256  name" of every file in DIR (hidden ones included), to compare later.
snapshot() {
  # The journal a failed or interrupted run keeps for --resume is not a result (image_runs.bash).
  (cd "$1" && find . -type f -not -path './.attnscope-partial/*' -print0 | sort -z |
    xargs -0 -r sha256sum)
}

# expect_no_temp DIR: no staging folder (.attnscope-tmp-*) and no temporary file (*.tmp-*) under DIR.
expect_no_temp() {
  local left
  left=$(find "$1" -name '.attnscope-tmp-*' -o -name '*.tmp-*')
  if [ -n "$left" ]; then echo "FAIL: temporary files left under $1:"; echo "$left"; exit 1; fi
}
