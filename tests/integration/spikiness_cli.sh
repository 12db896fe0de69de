# attnscope spikiness: the magnitude sweep from a dump and from synthetic heads, its files, the
# laws it checks (re-checked here from the CSV), query transforms, and bad input.
need_h5py

expect_ok "$ATTNSCOPE" spikiness --help
expect_grep '^usage: attnscope spikiness ' "$WORK/out.txt"
for flag in --dump --synthetic --variant --images --layers --heads --tokens --samples --scales \
    --keys --scale-space --topk --dist-samples --transform --seed --threads --out; do
  expect_grep "$flag" "$WORK/out.txt"
done

expect_ok "$ATTNSCOPE" synth --out "$WORK/s.h5" --images 3 --layers 2 --heads 2 --seed 5
expect_ok "$ATTNSCOPE" spikiness --dump "$WORK/s.h5" --samples 6 --scales 0.5,1,2,4 \
  --dist-samples 2 --out "$WORK/a"
expect_grep '^laws' "$WORK/out.txt"
if grep -q FAIL "$WORK/out.txt"; then echo "FAIL: a law failed"; cat "$WORK/out.txt"; exit 1; fi
for f in spikiness.csv spikiness_laws.csv spikiness_weights.csv spikiness_samples.csv spikiness.json; do
  [ -s "$WORK/a/$f" ] || { echo "FAIL: $f missing"; exit 1; }
done
expect_grep '^variant,source,sample,layer,head,token,scale,ratio,max_weight,entropy,effective_keys,topk_mass,negatives,zeros$' \
  "$WORK/a/spikiness.csv"
expect_grep '^variant,law,max_deviation,queries,scales,pass$' "$WORK/a/spikiness_laws.csv"
expect_grep '^variant,sample,scale,rank,weight$' "$WORK/a/spikiness_weights.csv"
expect_grep '^mala:elu1@paper,mala_ratio,.*,6,4,PASS$' "$WORK/a/spikiness_laws.csv"

# The laws again, from the CSV alone: softmax r(a) = r(1)^a, linear r(a) = r(1); row counts.
"$PYTHON" - "$WORK/a" <<'PY' || exit 1
import csv, math, sys, collections
d = sys.argv[1]
rows = list(csv.DictReader(open(f"{d}/spikiness.csv")))
assert len(rows) == 4 * 6 * 4, len(rows)  # variants x samples x scales
assert {r["source"] for r in rows} == {"dump"}
by = collections.defaultdict(dict)
for r in rows:
    by[(r["variant"], r["sample"])][float(r["scale"])] = r
for (variant, sample), s in by.items():
    r1 = float(s[1.0]["ratio"])
    for a, r in s.items():
        ra = float(r["ratio"])
        if variant.startswith("softmax"):
            assert abs(math.log(ra) - a * math.log(r1)) <= 1e-7 * max(1, abs(a * math.log(r1))), (variant, sample, a)
        if variant.startswith("linear"):
            assert abs(ra / r1 - 1) <= 1e-8, (variant, sample, a, ra, r1)
        assert 1 - 1e-9 <= float(r["effective_keys"]) <= 50 + 1e-9
    if variant.startswith("softmax"):  # spikier with magnitude
        assert float(s[4.0]["entropy"]) < float(s[0.5]["entropy"]), (sample,)
w = list(csv.DictReader(open(f"{d}/spikiness_weights.csv")))
assert len(w) == 4 * 2 * 4 * 50, len(w)  # variants x dist-samples x scales x N
PY

# Same seed, same files; --tokens crosses the selection.
expect_ok "$ATTNSCOPE" spikiness --dump "$WORK/s.h5" --samples 6 --scales 0.5,1,2,4 \
  --dist-samples 2 --out "$WORK/b"
cmp "$WORK/a/spikiness.csv" "$WORK/b/spikiness.csv" || { echo "FAIL: not reproducible"; exit 1; }
expect_ok "$ATTNSCOPE" spikiness --dump "$WORK/s.h5" --images 1 --layers 1 --heads 0 --tokens 0,7 \
  --variant softmax,mala@code --scales 1:8:4 --keys top,3 --out "$WORK/c"
[ "$(($(wc -l <"$WORK/c/spikiness.csv") - 1))" -eq $((2 * 2 * 4)) ] || { echo "FAIL: rows"; exit 1; }
expect_grep '^softmax@paper,0,1,1,0,0,' "$WORK/c/spikiness_samples.csv"
expect_grep ',3$' "$WORK/c/spikiness_samples.csv"

# Synthetic heads, a query transform, and query-space scaling (the MALA laws do not apply).
expect_ok "$ATTNSCOPE" spikiness --synthetic --samples 5 --transform f2 --scale-space query \
  --out "$WORK/d"
expect_grep '^softmax@paper,synthetic,' "$WORK/d/spikiness.csv"
expect_grep '^mala:elu1@paper,mala_ratio,0,0,33,n/a$' "$WORK/d/spikiness_laws.csv"
expect_grep '"transform": "f2"' "$WORK/d/spikiness.json"

# Bad input: one line on stderr, exit 2 (usage) or 1 (input), nothing half-written.
expect_exit 2 "exactly one of --dump and --synthetic" "$ATTNSCOPE" spikiness --out "$WORK/e"
expect_exit 2 "exactly one of --dump and --synthetic" "$ATTNSCOPE" spikiness --synthetic \
  --dump "$WORK/s.h5" --out "$WORK/e"
expect_exit 2 "every factor must be finite and > 0" "$ATTNSCOPE" spikiness --synthetic --scales 0:1:3 --out "$WORK/e"
expect_exit 2 "--scales" "$ATTNSCOPE" spikiness --synthetic --scales 1:2 --out "$WORK/e"
expect_exit 2 "--keys" "$ATTNSCOPE" spikiness --synthetic --keys top --out "$WORK/e"
expect_exit 2 "--keys: key index 99 is out of range [0, 50)" "$ATTNSCOPE" spikiness --synthetic \
  --keys top,99 --out "$WORK/e"
expect_exit 2 "--tokens: token 50 is out of range [0, 50)" "$ATTNSCOPE" spikiness --dump "$WORK/s.h5" \
  --tokens 50 --out "$WORK/e"
expect_exit 2 "--scale-space" "$ATTNSCOPE" spikiness --synthetic --scale-space phi --out "$WORK/e"
expect_exit 2 "layer index 7 out of range" "$ATTNSCOPE" spikiness --dump "$WORK/s.h5" --layers 7 --out "$WORK/e"
expect_fail "rope_cos" "$ATTNSCOPE" spikiness --synthetic --variant mala@code+rope --out "$WORK/e"
expect_exit 2 "code+rope" "$ATTNSCOPE" spikiness --synthetic --variant inline@code+rope --out "$WORK/e"
expect_exit 2 "unknown query transform 'f9'" "$ATTNSCOPE" spikiness --synthetic --transform f9 --out "$WORK/e"
expect_exit 1 "$WORK/absent.h5" "$ATTNSCOPE" spikiness --dump "$WORK/absent.h5" --out "$WORK/e"
echo "hello" >"$WORK/text.h5"
expect_exit 1 "$WORK/text.h5" "$ATTNSCOPE" spikiness --dump "$WORK/text.h5" --out "$WORK/e"
expect_no_file "$WORK/e/spikiness.csv" "$WORK/e/spikiness.json"
