# Flag values that used to be accepted and replaced or wrapped without a word: --seed -1 (was
# 18446744073709551615), --tol nan / -1 (was the default), --eps inf (was recorded as null),
# --scales 1:1:5 (was five equal factors), and replay --help advertising several dump files.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
A=$ATTNSCOPE
expect_ok "$A" synth --out "$WORK/d.h5" --images 2 --layers 1 --heads 1 --grid-height 2 --grid-width 2
m="$REPO/data/models/vit7-softmax-fmnist.h5"
sd="$REPO/data/dumps/vit7-softmax-fmnist.h5"

for seed in -1 -18446744073709551615; do
  expect_exit 2 "--seed: expected a non-negative integer, found '$seed'" "$A" synth --out "$WORK/s.h5" --seed="$seed"
  expect_no_file "$WORK/s.h5"
  expect_exit 2 "--seed: expected a non-negative integer" "$A" replay --model "$m" --dump "$sd" --images 0 \
    --out "$WORK/r" --seed="$seed"
  expect_exit 2 "--seed: expected a non-negative integer" "$A" mask --dump "$WORK/d.h5" --out "$WORK/k" --seed="$seed"
done
expect_exit 2 "--seed: expected a non-negative integer, found '-1'" "$A" spikiness --synthetic --out "$WORK/sp" --seed -1
expect_ok "$A" synth --out "$WORK/s.h5" --images 1 --seed 18446744073709551615   # the largest seed is fine

for tol in nan inf -inf; do
  expect_exit 2 "--tol: expected a finite number, found" "$A" recompute --dump "$WORK/d.h5" --out "$WORK/rc" --tol "$tol"
done
expect_exit 2 "--tol: expected a tolerance >= 0, found -1" "$A" recompute --dump "$WORK/d.h5" --out "$WORK/rc" --tol=-1
expect_no_file "$WORK/rc/recompute.json"
for eps in inf nan; do
  expect_exit 2 "--eps: expected a finite number, found" "$A" confusion --dump "$WORK/d.h5" --out "$WORK/c" --eps "$eps"
done
expect_exit 2 "--query-eps: expected a finite number" "$A" confusion --dump "$WORK/d.h5" --out "$WORK/c" --query-eps inf
expect_exit 2 "--sum-tol: expected a finite number" "$A" census --dump "$WORK/d.h5" --out "$WORK/c" --sum-tol nan
expect_no_file "$WORK/c/confusion.json" "$WORK/c/census.json"

expect_exit 2 "--scales '1:1:5': the range gives factor 1 more than once" \
  "$A" spikiness --synthetic --out "$WORK/sp" --scales 1:1:5
expect_exit 2 "factor 1 is listed twice" "$A" spikiness --synthetic --out "$WORK/sp" --scales 1,1
expect_no_file "$WORK/sp/spikiness.json"
expect_ok "$A" spikiness --synthetic --out "$WORK/sp" --scales 1:1:1 --synth-images 1

expect_ok "$A" replay --help
expect_grep '^  --dump FILE +HDF5 dump to read \(docs/dump-format.md\), one' "$WORK/out.txt"
if grep -q -- '--dump FILE\.\.\.' "$WORK/out.txt"; then echo "FAIL: replay --help advertises several files"; exit 1; fi
expect_exit 2 "give one --dump file" "$A" replay --model "$m" --dump "$sd" "$sd" --images 0 --out "$WORK/r"
