# attnscope entropy: columns, agreement with --reference and with numpy (written independently:
# -sum w log w over every key of every query, |w| renormalised on rows with a negative weight),
# the log(w + eps) convention, and bad input (one line, non-zero exit, no result set).
need_h5py

expect_ok "$ATTNSCOPE" entropy --help
expect_grep '^usage: attnscope entropy ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --log-eps --bins --reference --threads --out \
    --resume --shard; do
  expect_grep "$flag" "$WORK/out.txt"
done

dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 3 --layers 2 --heads 2 --grid-height 4 --grid-width 5 \
  --head-dim 8 --seed 3
V=softmax,linear:elu1,inline@code,mala@code,inline@paper
expect_ok "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/fast" --variant "$V"
expect_empty "$WORK/err.txt"
expect_grep '^attention entropy as a share of log N \(3 images; N = 21 keys, every query' "$WORK/out.txt"
expect_grep 'rows with negative weights: entropy of \|w\| renormalised' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/ref" --variant "$V" --reference
csv="$WORK/fast/entropy.csv"
[ "$(head -1 "$csv")" = "variant,layer,head,mean_entropy,mean_normalised,image_std,query_std,min,max,queries,images,degenerate_rows,negative_weight_rows,mean_negative_mass" ] ||
  { echo "FAIL: header $(head -1 "$csv")"; exit 1; }
[ "$(wc -l <"$csv")" -eq 21 ] || { echo "FAIL: 5 variants x 4 heads expected"; exit 1; }
awk -F, 'NR > 1 && ($10 != 63 || $11 != 3) { print "FAIL: 3 images x 21 queries expected: " $0; exit 1 }' "$csv" || exit 1
paste -d, "$csv" "$WORK/ref/entropy.csv" | awk -F, 'NR > 1 { d = $4 - $18; if (d < 0) d = -d;
  t = ($1 ~ /^softmax/) ? 1e-6 : 1e-9; r = $18 < 0 ? -$18 : $18; if (r > 1) t *= r;
  if (d > t) { print "FAIL: mean " $4 " vs reference " $18 " (" $1 " " $2 " " $3 ")"; exit 1 } }' || exit 1
expect_grep '"negative_weights": "rows with a negative weight: the entropy of' "$WORK/fast/entropy.json"
"$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/../../python/attnscope_dump/result_set.py" verify "$WORK/fast/entropy.json" >/dev/null ||
  { echo "FAIL: the manifest does not verify"; exit 1; }

expect_ok "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/eps" --variant "$V" --log-eps 1e-6
expect_grep '"log_eps": 1e-06' "$WORK/eps/entropy.json"

# numpy, float64, for both conventions.
"$PYTHON" - "$dump" "$csv" "$WORK/eps/entropy.csv" "$WORK/fast/entropy_histogram.csv" <<'PY' || exit 1
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
    if fam.startswith("inline:identity"):
        c = s / n if fam.endswith("@code") else 1.0
        p = c * q @ k.T; return p - p.mean(1, keepdims=True) + 1.0 / n
    if fam == "mala:elu1@code":
        p = (s / n) * elu1(q) @ elu1(k).T; z = p.sum(1, keepdims=True); return (1 + 1 / z) * p - z / n
def entropy(w, eps):
    neg = (w < 0).any(1, keepdims=True)
    p = np.where(neg, np.abs(w) / np.abs(w).sum(1, keepdims=True), w)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(p > 0, p * np.log(p + eps), 0.0)
    return -t.sum(1), neg[:, 0], np.maximum(-w, 0).sum(1)
for path, eps in ((sys.argv[2], 0.0), (sys.argv[3], 1e-6)):
    for r in csv.DictReader(open(path)):
        fam, layer, head = r["variant"], int(r["layer"]), int(r["head"])
        means, negs, masses = [], 0, []
        for img in range(3):
            q = f[f"layers/{layer}/q"][img, head].astype(np.float64)
            k = f[f"layers/{layer}/k"][img, head].astype(np.float64)
            h, neg, mass = entropy(weights(fam, q, k), eps)
            means.append(h.mean()); negs += int(neg.sum()); masses.extend(mass)
        want = np.mean(means)
        assert abs(float(r["mean_entropy"]) - want) <= (fam.startswith("softmax") and 1e-6 or 1e-9) * max(1, want), (path, fam, layer, head, r["mean_entropy"], want)
        assert abs(float(r["mean_normalised"]) - want / np.log(n)) <= (fam.startswith("softmax") and 1e-6 or 1e-9), (fam, r["mean_normalised"])
        assert int(r["negative_weight_rows"]) == negs, (fam, layer, head, r["negative_weight_rows"], negs)
        assert abs(float(r["mean_negative_mass"]) - np.mean(masses)) <= 1e-9 * max(1, np.mean(masses)), fam
        if fam in ("softmax@paper", "linear:elu1@paper"):
            assert negs == 0, fam
        if fam == "inline:identity@paper":
            assert negs > 0, fam
hist = list(csv.DictReader(open(sys.argv[4])))
assert len(hist) == 20 * (32 + 2), len(hist)
top = max(float(h["hi"]) for h in hist if h["bin"] == "31")
assert abs(top - np.log(n)) < 1e-9, top
PY

# Bad input: one line naming the flag or the file and dataset, non-zero exit, nothing published.
expect_exit 2 "--log-eps: expected a number >= 0" "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/x" --log-eps -1e-6
expect_exit 2 "--log-eps: expected a finite number" "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/x" --log-eps nan
expect_exit 2 "--bins: expected 1 to 1000000 bins" "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/x" --bins 0
# Refused either way: this command has no CUDA path, and a build without CUDA has none at all.
expect_exit 2 "--device cuda: " "$ATTNSCOPE" entropy --dump "$dump" --out "$WORK/x" --device cuda
expect_grep "entropy has no CUDA path|built without CUDA" "$WORK/err.txt"
expect_no_file "$WORK/x/entropy.csv" "$WORK/x/entropy.json"
cp "$dump" "$WORK/inf.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/inf.h5', 'r+'); d = f['layers/0/q']; x = d[1]; x[1, 2, 3] = np.nan; d[1] = x; f.close()"
expect_exit 1 "/layers/0/q: expected finite values, found NaN at image 1" "$ATTNSCOPE" entropy --dump "$WORK/inf.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/entropy.csv" "$WORK/bad/entropy_histogram.csv" "$WORK/bad/entropy.json"
