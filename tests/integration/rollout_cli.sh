# attnscope rollout: columns, agreement with --reference and with numpy (the recipe of the ViT
# rollout code: heads fused, + I, rows normalised, result = A @ result layer by layer, CLS row),
# the fusions, the layers in the model's order, and bad input (one line, non-zero exit, no result
# set).
need_h5py

expect_ok "$ATTNSCOPE" rollout --help
expect_grep '^usage: attnscope rollout ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --fusion --reference --threads --out --resume --shard; do
  expect_grep "$flag" "$WORK/out.txt"
done

dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 3 --layers 3 --heads 2 --grid-height 4 --grid-width 5 \
  --head-dim 8 --seed 3
V=softmax,linear:elu1,inline@code,mala@code
expect_ok "$ATTNSCOPE" rollout --dump "$dump" --out "$WORK/fast" --variant "$V"
expect_empty "$WORK/err.txt"
expect_grep '^attention rollout \(3 images; mean over 2 heads, 3 layers\)' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" rollout --dump "$dump" --out "$WORK/ref" --variant "$V" --reference
[ "$(head -1 "$WORK/fast/rollout.csv")" = "variant,image,token,grid_row,grid_col,value" ] || { echo "FAIL: header"; exit 1; }
[ "$(wc -l <"$WORK/fast/rollout.csv")" -eq $((4 * 3 * 21 + 1)) ] || { echo "FAIL: 4 variants x 3 images x 21 tokens"; exit 1; }
[ "$(wc -l <"$WORK/fast/rollout_mean.csv")" -eq $((4 * 21 + 1)) ] || { echo "FAIL: 4 variants x 21 tokens"; exit 1; }
paste -d, "$WORK/fast/rollout.csv" "$WORK/ref/rollout.csv" | awk -F, 'NR > 1 { d = $6 - $12; if (d < 0) d = -d;
  t = ($1 ~ /^softmax/) ? 1e-6 : 1e-9; r = $12 < 0 ? -$12 : $12; if (r > 1) t *= r;
  if (d > t) { print "FAIL: " $0; exit 1 } }' || exit 1
"$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/../../python/attnscope_dump/result_set.py" verify "$WORK/fast/rollout.json" >/dev/null ||
  { echo "FAIL: the manifest does not verify"; exit 1; }
expect_ok "$ATTNSCOPE" rollout --dump "$dump" --out "$WORK/max" --variant softmax,inline@code --fusion max --layers 2,0 --heads 1
expect_grep '"fusion": "max"' "$WORK/max/rollout.json"
expect_grep '"layers_in_order": \[\s*0,\s*2\s*\]' <(tr -d '\n' <"$WORK/max/rollout.json")

"$PYTHON" - "$dump" "$WORK/fast/rollout.csv" "$WORK/fast/rollout_mean.csv" "$WORK/max/rollout.csv" <<'PY' || exit 1
import csv, sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
n, s = f.attrs["num_tokens"], f.attrs["scale"]
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
def rollout(fam, img, layers, heads, fuse):
    result = np.eye(n)
    for l in layers:
        w = np.stack([weights(fam, f[f"layers/{l}/q"][img, h].astype(np.float64), f[f"layers/{l}/k"][img, h].astype(np.float64)) for h in heads])
        a = fuse(w, axis=0) + np.eye(n)
        a = a / a.sum(-1, keepdims=True)
        result = a @ result
    return result[0]
for path, layers, heads, fuse in ((sys.argv[2], [0, 1, 2], [0, 1], np.mean), (sys.argv[4], [0, 2], [1], np.max)):
    got = {}
    for r in csv.DictReader(open(path)):
        got.setdefault((r["variant"], int(r["image"])), {})[int(r["token"])] = float(r["value"])
    for (fam, img), row in got.items():
        want = rollout(fam, img, layers, heads, fuse)
        for t in range(n):
            assert abs(row[t] - want[t]) <= (fam.startswith("softmax") and 1e-6 or 1e-9), (path, fam, img, t, row[t], want[t])
        assert abs(sum(row.values()) - 1) < 1e-8
means = {(r["variant"], int(r["token"])): float(r["mean"]) for r in csv.DictReader(open(sys.argv[3]))}
for (fam, t), m in means.items():
    want = np.mean([rollout(fam, img, [0, 1, 2], [0, 1], np.mean)[t] for img in range(3)])
    assert abs(m - want) <= (fam.startswith("softmax") and 1e-6 or 1e-9), (fam, t, m, want)
PY

# Bad input.
expect_exit 2 "--fusion: expected mean, max or min, found 'median'" "$ATTNSCOPE" rollout --dump "$dump" --out "$WORK/x" --fusion median
# Refused either way: this command has no CUDA path, and a build without CUDA has none at all.
expect_exit 2 "--device cuda: " "$ATTNSCOPE" rollout --dump "$dump" --out "$WORK/x" --device cuda
expect_grep "rollout has no CUDA path|built without CUDA" "$WORK/err.txt"
expect_no_file "$WORK/x/rollout.csv" "$WORK/x/rollout.json"
expect_ok "$ATTNSCOPE" synth --out "$WORK/swin.h5" --images 2 --layers 2 --heads 2 --grid-height 3 --grid-width 3 --prefix 0
expect_exit 1 "swin.h5: attribute 'prefix_tokens': expected at least 1: a CLS token" "$ATTNSCOPE" rollout --dump "$WORK/swin.h5" --out "$WORK/bad"
cp "$dump" "$WORK/inf.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/inf.h5', 'r+'); d = f['layers/2/q']; x = d[2]; x[0, 5, 1] = -np.inf; d[2] = x; f.close()"
expect_exit 1 "/layers/2/q" "$ATTNSCOPE" rollout --dump "$WORK/inf.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/rollout.csv" "$WORK/bad/rollout_mean.csv" "$WORK/bad/rollout.json"
