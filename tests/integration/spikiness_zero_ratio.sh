# linear_invariant where the higher key's weight is 0 (relu cuts it off: --keys bottom,top, or a
# key index the query ignores): r(a) = r(1) = 0 at every scale, the law holds and must PASS (was:
# 0/0 reported as deviation inf, FAIL, exit 3).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
expect_ok "$ATTNSCOPE" spikiness --synthetic --variant linear:relu --keys bottom,top --out "$WORK/syn"
expect_grep '^linear:relu@paper,linear_invariant,[0-9.e+-]+,[0-9]+,[0-9]+,PASS$' "$WORK/syn/spikiness_laws.csv"
expect_grep 'linear_invariant +[0-9.e+-]+ +PASS' "$WORK/out.txt"
dump="$REPO/data/dumps/vit7-linear-fmnist.h5"
expect_ok "$ATTNSCOPE" spikiness --dump "$dump" --images 0-1 --variant linear:relu --keys 49,top --out "$WORK/dump"
expect_grep '^linear:relu@code,linear_invariant,[0-9.e+-]+,[0-9]+,[0-9]+,PASS$' "$WORK/dump/spikiness_laws.csv"
# The deviation there is a real comparison (rounding-small), not a skip: points were compared.
"$PYTHON" -c "import csv
rows = list(csv.DictReader(open('$WORK/dump/spikiness_laws.csv')))
r = [x for x in rows if x['law'] == 'linear_invariant'][0]
assert float(r['max_deviation']) < 1e-9 and int(r['queries']) > 0, r"
# softmax on the same keys: its own law is unaffected (the bottom key's weight is not 0 there).
expect_ok "$ATTNSCOPE" spikiness --synthetic --variant softmax --keys bottom,top --out "$WORK/soft"
expect_grep '^softmax@paper,softmax_power,[0-9.e+-]+,[0-9]+,[0-9]+,PASS$' "$WORK/soft/spikiness_laws.csv"
