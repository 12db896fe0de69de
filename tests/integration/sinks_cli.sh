# attnscope sinks: columns, agreement with --reference and with numpy (received attention, the
# every-query sink test), a planted sink and a planted high-norm token found, --norms out, and
# bad input (one line, non-zero exit, no result set).
need_h5py

expect_ok "$ATTNSCOPE" sinks --help
expect_grep '^usage: attnscope sinks ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --threshold --norms --norm-ratio --reference \
    --threads --out --resume --shard; do
  expect_grep "$flag" "$WORK/out.txt"
done

dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 3 --layers 2 --heads 2 --grid-height 4 --grid-width 5 \
  --head-dim 8 --seed 3
# Planted: in layer 0, head 1, every query and key 0 point the same way, far out: key 0 takes
# nearly all of every softmax row (a sink). In layer 1, token 7's values are 100 times larger in
# every head (a high-norm token). /layers/L/out: the values again, for --norms out.
"$PYTHON" - "$dump" <<'PY'
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    q, k = f["layers/0/q"][...], f["layers/0/k"][...]
    u = np.ones(8, np.float32) / np.sqrt(8)
    q[:, 1] = np.abs(q[:, 1]) * 0.1 + 4 * u
    k[:, 1, 0] = 40 * u
    f["layers/0/q"][...] = q; f["layers/0/k"][...] = k
    v = f["layers/1/v"][...]; v[:, :, 7] *= 100; f["layers/1/v"][...] = v
PY
cp "$dump" "$WORK/out.h5"
"$PYTHON" -c "import h5py
f = h5py.File('$WORK/out.h5', 'r+')
for l in range(2): f[f'layers/{l}/out'] = f[f'layers/{l}/v'][...]
f.close()"

V=softmax,linear:elu1,inline@code,mala@code
expect_ok "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/fast" --variant "$V"
expect_empty "$WORK/err.txt"
expect_grep '^attention sinks \(3 images; a sink: one key above 0.5 of every query' "$WORK/out.txt"
expect_grep '^high-norm tokens \(\|\|v\|\| above 4 x the layer.s median\), per layer, mean per image: 0.00 1.00$' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/ref" --variant "$V" --reference
for f in sinks.csv sinks_keys.csv sinks_norms.csv; do
  [ -f "$WORK/fast/$f" ] || { echo "FAIL: no $f"; exit 1; }
done
[ "$(head -1 "$WORK/fast/sinks.csv")" = "variant,layer,head,images,sink_images,sink_share,top_key,top_key_received,prefix_received,mean_max_received,degenerate_rows" ] ||
  { echo "FAIL: header"; exit 1; }
[ "$(head -1 "$WORK/fast/sinks_keys.csv")" = "variant,layer,head,token,grid_row,grid_col,mean_received,sink_images" ] ||
  { echo "FAIL: keys header"; exit 1; }
# The planted sink: softmax, layer 0, head 1, in all 3 images, at key 0 (CLS).
expect_grep '^softmax@paper,0,1,3,3,1,0,(1|0\.9)' "$WORK/fast/sinks.csv"
expect_grep '^softmax@paper,1,1,3,0,0,' "$WORK/fast/sinks.csv"
# The planted high-norm token: layer 1, token 7 (grid row 1, column 1), every image.
expect_grep '^1,7,1,1,[0-9.]*,3,3$' "$WORK/fast/sinks_norms.csv"
awk -F, 'NR > 1 && $6 != 0 && !($1 == 1 && $2 == 7) { print "FAIL: unexpected high-norm token " $0; exit 1 }' \
  "$WORK/fast/sinks_norms.csv" || exit 1
paste -d, "$WORK/fast/sinks_keys.csv" "$WORK/ref/sinks_keys.csv" | awk -F, 'NR > 1 { d = $7 - $15; if (d < 0) d = -d;
  t = ($1 ~ /^softmax/) ? 1e-6 : 1e-9; r = $15 < 0 ? -$15 : $15; if (r > 1) t *= r;
  if (d > t || $8 != $16) { print "FAIL: fast " $0; exit 1 } }' || exit 1
cmp "$WORK/fast/sinks_norms.csv" "$WORK/ref/sinks_norms.csv" || { echo "FAIL: norms differ with --reference"; exit 1; }

# numpy: received attention (mean over queries, then images) and the every-query sink test.
"$PYTHON" - "$dump" "$WORK/fast/sinks_keys.csv" "$WORK/fast/sinks.csv" <<'PY' || exit 1
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
keys = {}
for r in csv.DictReader(open(sys.argv[2])):
    keys[(r["variant"], int(r["layer"]), int(r["head"]), int(r["token"]))] = r
heads = {(r["variant"], int(r["layer"]), int(r["head"])): r for r in csv.DictReader(open(sys.argv[3]))}
for (fam, layer, head), h in heads.items():
    recv, sinks = np.zeros(n), np.zeros(n, int)
    for img in range(3):
        w = weights(fam, f[f"layers/{layer}/q"][img, head].astype(np.float64), f[f"layers/{layer}/k"][img, head].astype(np.float64))
        recv += w.mean(0); sinks += (w.min(0) > 0.5)
    recv /= 3
    for j in range(n):
        r = keys[(fam, layer, head, j)]
        assert abs(float(r["mean_received"]) - recv[j]) <= (fam.startswith("softmax") and 1e-6 or 1e-9), (fam, layer, head, j, r["mean_received"], recv[j])
        assert int(r["sink_images"]) == sinks[j], (fam, layer, head, j)
    assert int(h["top_key"]) == int(np.argmax(recv)), (fam, layer, head)
    assert abs(float(h["prefix_received"]) - recv[0]) <= (fam.startswith("softmax") and 1e-6 or 1e-9)
PY

# --norms out reads the model's output; --norms none writes no norms file.
expect_ok "$ATTNSCOPE" sinks --dump "$WORK/out.h5" --out "$WORK/o" --norms out --norm-ratio 10
expect_grep '"norms": "out"' "$WORK/o/sinks.json"
expect_grep '^1,7,1,1,[0-9.]*,3,3$' "$WORK/o/sinks_norms.csv"
expect_ok "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/none" --norms none --threshold 0.9
[ ! -e "$WORK/none/sinks_norms.csv" ] || { echo "FAIL: --norms none wrote sinks_norms.csv"; exit 1; }
expect_grep '"threshold": 0.9' "$WORK/none/sinks.json"

# Bad input.
expect_exit 1 "d.h5: /layers/0/out: expected the model's attention output" "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/bad" --norms out
expect_no_file "$WORK/bad/sinks.csv" "$WORK/bad/sinks.json"
expect_exit 2 "--norms: expected v, out or none, found 'values'" "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/x" --norms values
expect_exit 2 "--norm-ratio: expected a finite number > 0" "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/x" --norm-ratio 0
expect_exit 2 "--threshold: expected a finite number" "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/x" --threshold nan
# Refused either way: this command has no CUDA path, and a build without CUDA has none at all.
expect_exit 2 "--device cuda: " "$ATTNSCOPE" sinks --dump "$dump" --out "$WORK/x" --device cuda
expect_grep "sinks has no CUDA path|built without CUDA" "$WORK/err.txt"
expect_no_file "$WORK/x/sinks.csv" "$WORK/x/sinks.json"
cp "$dump" "$WORK/inf.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/inf.h5', 'r+'); d = f['layers/1/v']; x = d[2]; x[0, 5, 1] = np.inf; d[2] = x; f.close()"
expect_exit 1 "/layers/1/v" "$ATTNSCOPE" sinks --dump "$WORK/inf.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/sinks.csv" "$WORK/bad/sinks_keys.csv" "$WORK/bad/sinks_norms.csv" "$WORK/bad/sinks.json"
