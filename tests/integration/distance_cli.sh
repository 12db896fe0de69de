# attnscope distance: columns, agreement with --reference and with numpy (the ViT papers' recipe,
# written independently), the patch size from /images, --patch-size and grid units, --renormalise,
# the histogram, and bad input (one line, non-zero exit, no result set).
need_h5py

expect_ok "$ATTNSCOPE" distance --help
expect_grep '^usage: attnscope distance ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --patch-size --renormalise --bins --reference \
    --threads --out --resume --shard; do
  expect_grep "$flag" "$WORK/out.txt"
done

dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 3 --layers 2 --heads 2 --grid-height 4 --grid-width 5 \
  --head-dim 8 --seed 3
# /images: 3 images of 1 x 32 x 40 pixels, so 8 x 8 pixel patches on the 4 x 5 grid.
cp "$dump" "$WORK/img.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/img.h5', 'r+'); f['images'] = np.zeros((3, 1, 32, 40), np.float32); f.close()"

V=softmax,linear:elu1,inline@code,mala@code
expect_ok "$ATTNSCOPE" distance --dump "$WORK/img.h5" --out "$WORK/fast" --variant "$V"
expect_empty "$WORK/err.txt"
expect_grep '^mean attention distance in pixels \(3 images; patch 8x8 px from /images' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" distance --dump "$WORK/img.h5" --out "$WORK/ref" --variant "$V" --reference
csv="$WORK/fast/distance.csv"
[ "$(head -1 "$csv")" = "variant,layer,head,mean_distance,image_std,query_std,min,max,queries,images,mean_grid_mass,degenerate_rows,negative_weight_rows,rows_without_grid_mass" ] ||
  { echo "FAIL: header $(head -1 "$csv")"; exit 1; }
[ "$(wc -l <"$csv")" -eq 17 ] || { echo "FAIL: 4 variants x 4 heads expected"; exit 1; }
awk -F, 'NR > 1 && ($9 != 60 || $10 != 3) { print "FAIL: 3 images x 20 grid queries expected: " $0; exit 1 }' "$csv" || exit 1
# Softmax heads take the float path (1e-6 relative: its measured tolerance); the others, double.
paste -d, "$csv" "$WORK/ref/distance.csv" | awk -F, 'NR > 1 { d = $4 - $18; if (d < 0) d = -d;
  t = ($1 ~ /^softmax/) ? 1e-6 : 1e-9; r = $18 < 0 ? -$18 : $18; if (r > 1) t *= r;
  if (d > t) { print "FAIL: mean " $4 " vs reference " $18 " (" $1 " " $2 " " $3 ")"; exit 1 } }' || exit 1
expect_grep '"source": "/images"' "$WORK/fast/distance.json"
expect_grep '"prefix_tokens": "dropped as queries and keys"' "$WORK/fast/distance.json"
expect_grep '"weights": "signed: ' "$WORK/fast/distance.json"
"$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/../../python/attnscope_dump/result_set.py" verify "$WORK/fast/distance.json" >/dev/null ||
  { echo "FAIL: the manifest does not verify"; exit 1; }

# numpy, float64: the ViT papers' recipe (drop CLS rows and columns, no renormalisation, weight
# the pixel distance matrix, sum over keys, mean over queries, then over images).
"$PYTHON" - "$WORK/img.h5" "$csv" "$WORK/fast/distance_histogram.csv" <<'PY' || exit 1
import csv, sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
n, gh, gw, s = f.attrs["num_tokens"], f.attrs["grid_height"], f.attrs["grid_width"], f.attrs["scale"]
rows, cols = np.divmod(np.arange(gh * gw), gw)
dist = 8.0 * np.hypot(rows[:, None] - rows[None, :], cols[:, None] - cols[None, :])
def elu1(x): return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
def weights(fam, q, k):
    if fam == "softmax@paper":
        a = s * q @ k.T; a = np.exp(a - a.max(1, keepdims=True)); return a / a.sum(1, keepdims=True)
    if fam == "linear:elu1@paper":
        a = elu1(q) @ elu1(k).T; return a / a.sum(1, keepdims=True)
    if fam == "inline:identity@code":
        p = (s / n) * q @ k.T; return p - p.mean(1, keepdims=True) + 1.0 / n
    if fam == "mala:elu1@code":
        p = (s / n) * elu1(q) @ elu1(k).T; z = p.sum(1, keepdims=True); return (1 + 1 / z) * p - z / n
got = {(r["variant"], int(r["layer"]), int(r["head"])): r for r in csv.DictReader(open(sys.argv[2]))}
for (fam, layer, head), r in got.items():
    per_image = []
    for img in range(3):
        q = f[f"layers/{layer}/q"][img, head].astype(np.float64)
        k = f[f"layers/{layer}/k"][img, head].astype(np.float64)
        w = weights(fam, q, k)[1:, 1:]
        per_image.append((w * dist).sum(-1).mean())
    want = np.mean(per_image)
    assert abs(float(r["mean_distance"]) - want) <= (fam.startswith("softmax") and 1e-6 or 1e-9) * max(1, abs(want)), (fam, layer, head, r["mean_distance"], want)
hist = list(csv.DictReader(open(sys.argv[3])))
assert len(hist) == len(got) * (32 + 2), len(hist)
for key in got:
    counts = sum(int(h["queries"]) for h in hist if (h["variant"], int(h["layer"]), int(h["head"])) == key)
    assert counts == 60, (key, counts)
top = max(float(h["hi"]) for h in hist if h["bin"] == "31")
assert abs(top - 8 * np.hypot(3, 4)) < 1e-9, top
PY

# --patch-size overrides /images (both recorded); without /images and the flag: grid units.
expect_ok "$ATTNSCOPE" distance --dump "$WORK/img.h5" --out "$WORK/p16" --patch-size 16 --layers 1 --heads 0
expect_grep '"source": "--patch-size"' "$WORK/p16/distance.json"
expect_grep '"images_height": 8' "$WORK/p16/distance.json"
expect_ok "$ATTNSCOPE" distance --dump "$dump" --out "$WORK/grid" --layers 1 --heads 0
expect_grep '"source": "grid"' "$WORK/grid/distance.json"
expect_grep 'patch 1x1 px from grid' "$WORK/out.txt"
# Distances scale with the patch size: 16 px patches give twice the 8 px distances.
a=$(awk -F, '$1 == "softmax@paper" && $2 == 1 && $3 == 0 { print $4 }' "$WORK/fast/distance.csv")
b=$(awk -F, 'NR == 2 { print $4 }' "$WORK/p16/distance.csv")
c=$(awk -F, 'NR == 2 { print $4 }' "$WORK/grid/distance.csv")
awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN { if ((b - 2 * a) ^ 2 > 1e-14 * b * b || (a - 8 * c) ^ 2 > 1e-14 * a * a) {
  print "FAIL: distances do not scale with the patch size: " a " " b " " c; exit 1 } }' || exit 1

# --renormalise divides by the grid mass: softmax distances grow (the CLS column's mass is gone).
expect_ok "$ATTNSCOPE" distance --dump "$WORK/img.h5" --out "$WORK/renorm" --renormalise --variant softmax
expect_grep '"renormalise": true' "$WORK/renorm/distance.json"
paste -d, "$WORK/renorm/distance.csv" <(grep -E '^(variant|softmax)' "$csv") | awk -F, 'NR > 1 && !($4 > $18) {
  print "FAIL: a renormalised distance is not larger: " $4 " vs " $18; exit 1 }' || exit 1

# Bad input: one line naming the file and dataset or flag, non-zero exit, nothing published.
expect_exit 2 "--patch-size: expected a positive size" "$ATTNSCOPE" distance --dump "$dump" --out "$WORK/x" --patch-size 0
expect_exit 2 "--patch-size: expected a finite number" "$ATTNSCOPE" distance --dump "$dump" --out "$WORK/x" --patch-size inf
expect_exit 2 "--bins: expected 1 to 1000000 bins" "$ATTNSCOPE" distance --dump "$dump" --out "$WORK/x" --bins 0
# Refused either way: this command has no CUDA path, and a build without CUDA has none at all.
expect_exit 2 "--device cuda: " "$ATTNSCOPE" distance --dump "$dump" --out "$WORK/x" --device cuda
expect_grep "distance has no CUDA path|built without CUDA" "$WORK/err.txt"
expect_exit 2 "head index 2 out of range" "$ATTNSCOPE" distance --dump "$dump" --out "$WORK/x" --heads 2
expect_no_file "$WORK/x/distance.csv" "$WORK/x/distance.json"
cp "$dump" "$WORK/odd.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/odd.h5', 'r+'); f['images'] = np.zeros((3, 1, 30, 40), np.float32); f.close()"
expect_exit 1 "odd.h5: /images: expected an image size divisible by the patch grid (4 x 5)" \
  "$ATTNSCOPE" distance --dump "$WORK/odd.h5" --out "$WORK/bad"
expect_ok "$ATTNSCOPE" distance --dump "$WORK/odd.h5" --out "$WORK/odd" --patch-size 7.5
expect_grep '"source": "--patch-size"' "$WORK/odd/distance.json"
cp "$dump" "$WORK/inf.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/inf.h5', 'r+'); d = f['layers/1/k']; x = d[2]; x[0, 5, 1] = np.inf; d[2] = x; f.close()"
expect_exit 1 "/layers/1/k" "$ATTNSCOPE" distance --dump "$WORK/inf.h5" --out "$WORK/bad"
cp "$dump" "$WORK/attr.h5"
"$PYTHON" -c "import h5py; f = h5py.File('$WORK/attr.h5', 'r+'); f.attrs['grid_width'] = 7; f.close()"
expect_exit 1 "$WORK/attr.h5" "$ATTNSCOPE" distance --dump "$WORK/attr.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/distance.csv" "$WORK/bad/distance_histogram.csv" "$WORK/bad/distance.json"
