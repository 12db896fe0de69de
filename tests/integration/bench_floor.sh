# bench/deit_floor.sh, the side-by-side scripts' floor of a DeiT-T head: measured with this build's
# bench_portable it writes positive times and the floors derived from them (36 heads on two
# threads); its table's ratios are those of the numbers given; without bench_portable it says why
# and measures nothing; a bench_portable that fails its check stops it with the check's message. Nothing here compares times with each other: only what the script derives.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(dirname "$(dirname "$ATTNSCOPE")")"
# The first CPU this test may run on (a container's CPU set need not hold CPU 0).
CORES=$(taskset -pc $$ | sed 's/.*: *//; s/[,-].*//')
# shellcheck source=bench/deit_floor.sh
source "$REPO/bench/deit_floor.sh"

if [ -x "$BUILD/bench/bench_portable" ]; then
  deit_floor floor.json
  "$PYTHON" - floor.json "$CORES" <<'PY' || exit 1
import json, math, sys
f = json.load(open(sys.argv[1]))
assert f["measured"] and f["core"] == int(sys.argv[2]), f
for key in ("gemm_us", "head_us"):
    assert 0 < f[key]["min"] <= f[key]["median"] < math.inf, (key, f)
assert math.isclose(f["products_ms"], f["gemm_us"]["median"] * 36 / 2 / 1000, rel_tol=1e-12), f
assert math.isclose(f["floor_ms"], f["head_us"]["median"] * 36 / 2 / 1000, rel_tol=1e-12), f
PY
else
  echo "no $BUILD/bench/bench_portable (ATTNSCOPE_BENCH=OFF): the measured half not run"
fi

# The table from given numbers: products 0.9 ms, with the exponentials 1.8 ms per image.
cat >given.json <<'EOF'
{"measured": true, "core": 3, "gemm_us": {"median": 50.0, "min": 49.0}, "head_us": {"median": 100.0, "min": 98.0},
 "products_ms": 0.9, "floor_ms": 1.8}
EOF
has_line() {  # has_line LINE FILE: LINE is one of FILE's lines, exactly
  grep -qxF -- "$1" "$2" || { echo "FAIL: no line '$1' in $2:"; cat "$2"; exit 1; }
}
deit_floor_lines given.json confusion:18:3.6 locality:9:2.25 >lines.txt
cat lines.txt
has_line "Floor of a DeiT-T head on this machine (core 3, median / min of 5): the float Q K^T product 50.0 / 49.0 us, the product and its softmax step 100.0 / 98.0 us; an image of 36 heads on 2 threads: the products alone 0.90 ms, with the exponentials 1.80 ms." lines.txt
has_line "| confusion | 18.00 | 3.60 | 5.0x | 10.0x; 20.0x | 2.00x |" lines.txt
has_line "| locality | 9.00 | 2.25 | 4.0x | 5.0x; 10.0x | 1.25x |" lines.txt

# Without bench_portable: one line saying why, nothing measured.
BUILD="$WORK/nowhere" deit_floor none.json
deit_floor_lines none.json confusion:18:3.6 >none.txt
has_line "Floor: no $WORK/nowhere/bench/bench_portable (configure with -DATTNSCOPE_BENCH=ON)." none.txt
[ "$(wc -l <none.txt)" -eq 1 ] || { echo "FAIL: more than the one line without bench_portable"; cat none.txt; exit 1; }
# A bench_portable whose check fails: deit_floor passes its message on and returns non-zero.
mkdir -p failing/bench
printf '#!/bin/sh\necho "bench_portable: gemm_packed differs from the plain loop" >&2\nexit 1\n' >failing/bench/bench_portable
chmod +x failing/bench/bench_portable
rc=0
BUILD="$WORK/failing" deit_floor failing.json 2>failing.err || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: deit_floor returned 0 with a failing bench_portable"; exit 1; }
has_line "deit_floor: $WORK/failing/bench/bench_portable failed:" failing.err
has_line "bench_portable: gemm_packed differs from the plain loop" failing.err
echo "PASS"
