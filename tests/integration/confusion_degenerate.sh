# attnscope confusion: degenerate pairs (two degenerate rows whose raw queries differ, the pairs
# that denominator-guarding code confuses) on a dump with queries planted where ReLU zeroes them;
# counts by hand, fast equal to --reference, softmax and InLine as negative controls.
need_h5py
dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 2 --layers 2 --heads 2 --head-dim 8 \
  --family linear --feature-map relu --seed 3
# Every key and every other query gets a positive first entry (no other row is degenerate).
# Image 0, layer 0, head 0: queries 0-4 entirely negative, query 1 = query 0 (the same query):
# C(5,2) - 1 = 9 pairs. Image 1, layer 1, head 1: queries 10-12, all distinct: 3 pairs.
"$PYTHON" - "$dump" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    for l in (0, 1):
        q, k = f[f"layers/{l}/q"][...], f[f"layers/{l}/k"][...]
        q[..., 0] = np.abs(q[..., 0]) + 0.5
        k[..., 0] = np.abs(k[..., 0]) + 0.5
        if l == 0:
            q[0, 0, 0:5] = -np.abs(q[0, 0, 0:5]) - 0.25
            q[0, 0, 1] = q[0, 0, 0]
        else:
            q[1, 1, 10:13] = -np.abs(q[1, 1, 10:13]) - 0.25
        f[f"layers/{l}/q"][...] = q
        f[f"layers/{l}/k"][...] = k
PY
variants=linear:relu,softmax,inline
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/fast" --variant "$variants"
cp "$WORK/out.txt" "$WORK/summary.txt"
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/ref" --variant "$variants" --reference
for f in confusion_per_image.csv confusion_per_head.csv confusion_histogram.csv; do
  cmp "$WORK/fast/$f" "$WORK/ref/$f" || { echo "FAIL: $f differs from the brute force"; exit 1; }
done
expect_grep '^linear:relu@paper,0,0,[0-9]+,5,9$' "$WORK/fast/confusion_per_head.csv"
expect_grep '^linear:relu@paper,1,1,[0-9]+,3,3$' "$WORK/fast/confusion_per_head.csv"
expect_grep '^linear:relu@paper,0,1,[0-9]+,0,0$' "$WORK/fast/confusion_per_head.csv"
expect_grep '^linear:relu@paper,1,0,[0-9]+,0,0$' "$WORK/fast/confusion_per_head.csv"
expect_grep '^linear:relu@paper,0,[0-9]+,9$' "$WORK/fast/confusion_per_image.csv"
expect_grep '^linear:relu@paper,1,[0-9]+,3$' "$WORK/fast/confusion_per_image.csv"
# Negative controls: no degenerate row, no degenerate pair.
awk -F, '($1 ~ /^(softmax|inline)/) && ($5 != 0 || $6 != 0) { print "FAIL: " $0; exit 1 }' \
  "$WORK/fast/confusion_per_head.csv"
awk -F, '($1 ~ /^(softmax|inline)/) && $4 != 0 { print "FAIL: " $0; exit 1 }' \
  "$WORK/fast/confusion_per_image.csv"
# The second histogram bins count + degenerate_pairs of each image; the first bins count alone.
"$PYTHON" - "$WORK/fast" <<'PY' || exit 1
import csv, sys
d = sys.argv[1]
def bin_of(c):
    return 0 if c == 0 else min(6, c.bit_length())
labels = ["0", "1", "2-3", "4-7", "8-15", "16-31", ">=32"]
want = {}
for r in csv.DictReader(open(f"{d}/confusion_per_image.csv")):
    h = want.setdefault(r["variant"], ([0] * 7, [0] * 7))
    c, p = int(r["count"]), int(r["degenerate_pairs"])
    h[0][bin_of(c)] += 1
    h[1][bin_of(c + p)] += 1
for r in csv.DictReader(open(f"{d}/confusion_histogram.csv")):
    b = labels.index(r["bin"])
    got = (int(r["images"]), int(r["images_with_degenerate_pairs"]))
    exp = (want[r["variant"]][0][b], want[r["variant"]][1][b])
    if got != exp:
        sys.exit(f"FAIL: histogram {r['variant']} bin {r['bin']}: {got}, expected {exp}")
PY
expect_grep '"degenerate_pairs": \{' "$WORK/fast/confusion.json"
expect_grep '"linear:relu@paper": 12' "$WORK/fast/confusion.json"
expect_grep '"histogram_with_degenerate_pairs"' "$WORK/fast/confusion.json"
expect_grep '^degenerate pairs, all images: linear:relu@paper 12, softmax@paper 0, inline:identity@paper 0$' \
  "$WORK/summary.txt"
# The degenerate pairs do not depend on --eps (zero rows are within any radius); a query radius
# that makes queries 10-12 of image 1 one query removes their pairs.
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/eps0" --variant linear:relu --eps 0
expect_grep '^linear:relu@paper,0,[0-9]+,9$' "$WORK/eps0/confusion_per_image.csv"
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/qeps" --variant linear:relu --query-eps 1e9
expect_grep '^linear:relu@paper,1,[0-9]+,0$' "$WORK/qeps/confusion_per_image.csv"
expect_grep '^linear:relu@paper,0,[0-9]+,0$' "$WORK/qeps/confusion_per_image.csv"
