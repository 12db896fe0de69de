# attnscope rank: columns, agreement with --reference and with numpy (matrix_rank, effective rank,
# the singular value ratios of K, [K, 1], F_k, [F_k, 1], the key-value state, the rank-collapse
# residual of out), and bad input (one line, non-zero exit, no result set).
need_h5py

expect_ok "$ATTNSCOPE" rank --help
expect_grep '^usage: attnscope rank ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --rank-tol --reference --threads --out --resume --shard; do
  expect_grep "$flag" "$WORK/out.txt"
done

dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 3 --layers 2 --heads 2 --grid-height 4 --grid-width 5 \
  --head-dim 8 --seed 3
# out in layer 1 only (the residual is reported where the dump has it).
"$PYTHON" -c "import h5py
f = h5py.File('$dump', 'r+'); f['layers/1/out'] = f['layers/1/v'][...] + 1.0; f.close()"

V=softmax,linear:elu1,inline@code,mala@code
expect_ok "$ATTNSCOPE" rank --dump "$dump" --out "$WORK/fast" --variant "$V"
expect_empty "$WORK/err.txt"
expect_grep '^rank of the attention matrix \(3 images; N = 21\)' "$WORK/out.txt"
expect_grep '^rank-collapse residual of the model.s out, per layer: [0-9.]*$' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" rank --dump "$dump" --out "$WORK/ref" --variant "$V" --reference
csv="$WORK/fast/rank.csv"
[ "$(wc -l <"$csv")" -eq 17 ] || { echo "FAIL: 4 variants x 4 heads expected"; exit 1; }
expect_grep '"out_layers": \[\s*1\s*\]' <(tr -d '\n' <"$WORK/fast/rank.json")
# Same ranks and full-rank counts; the rest within rounding.
paste -d, "$csv" "$WORK/ref/rank.csv" | awk -F, 'NR > 1 { for (c = 4; c <= 33; ++c) { a = $c; b = $(c + 33);
  if (a == "nan" || b == "nan") { if (a != b) { print "FAIL: column " c ": " a " vs " b; exit 1 } continue }
  d = a - b; if (d < 0) d = -d; if (d > 1e-8 * (1 + (b < 0 ? -b : b))) { print "FAIL: column " c ": " a " vs reference " b " (" $1 " " $2 " " $3 ")"; exit 1 } } }' || exit 1
"$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/../../python/attnscope_dump/result_set.py" verify "$WORK/fast/rank.json" >/dev/null ||
  { echo "FAIL: the manifest does not verify"; exit 1; }

# numpy, float64.
"$PYTHON" - "$dump" "$csv" <<'PY' || exit 1
import csv, sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
n, s = f.attrs["num_tokens"], f.attrs["scale"]
def elu1(x): return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
def form(fam, q, k):
    """weights and key features (None for softmax)"""
    if fam == "softmax@paper":
        a = s * q @ k.T; a = np.exp(a - a.max(1, keepdims=True)); return a / a.sum(1, keepdims=True), None
    if fam == "linear:elu1@paper":
        a = elu1(q) @ elu1(k).T; return a / a.sum(1, keepdims=True), elu1(k)
    c = np.sqrt(s / n)
    if fam == "inline:identity@code":
        p = (s / n) * q @ k.T; return p - p.mean(1, keepdims=True) + 1.0 / n, c * k
    if fam == "mala:elu1@code":
        p = (s / n) * elu1(q) @ elu1(k).T; z = p.sum(1, keepdims=True); return (1 + 1 / z) * p - z / n, c * elu1(k)
def erank(m):
    sv = np.linalg.svd(m, compute_uv=False); p = sv / sv.sum(); p = p[p > 0]; return np.exp(-(p * np.log(p)).sum())
def ratio(m):
    sv = np.linalg.svd(m, compute_uv=False); return sv[min(m.shape) - 1] / sv[0]
ones = lambda m: np.hstack([m, np.ones((m.shape[0], 1))])
for r in csv.DictReader(open(sys.argv[2])):
    fam, layer, head = r["variant"], int(r["layer"]), int(r["head"])
    ranks, eranks, kvr, kr, k1r, fkr, fk1r, res = [], [], [], [], [], [], [], []
    for img in range(3):
        q = f[f"layers/{layer}/q"][img, head].astype(np.float64)
        k = f[f"layers/{layer}/k"][img, head].astype(np.float64)
        v = f[f"layers/{layer}/v"][img, head].astype(np.float64)
        w, fk = form(fam, q, k)
        ranks.append(np.linalg.matrix_rank(w)); eranks.append(erank(w))
        kr.append(ratio(k)); k1r.append(ratio(ones(k)))
        if fk is not None:
            kvr.append(np.linalg.matrix_rank(fk.T @ v)); fkr.append(ratio(fk)); fk1r.append(ratio(ones(fk)))
        if layer == 1:
            o = f[f"layers/1/out"][img, head].astype(np.float64)
            res.append(np.linalg.norm(o - o.mean(0)) / np.linalg.norm(o))
    def close(col, want, tol=1e-8):
        got = float(r[col]); assert abs(got - want) <= tol * max(1, abs(want)), (fam, layer, head, col, got, want)
    close("mean_rank", np.mean(ranks), 0); close("mean_erank", np.mean(eranks))
    close("mean_k_ratio", np.mean(kr)); close("min_k1_ratio", np.min(k1r))
    if fam == "softmax@paper":
        assert r["mean_kv_rank"] == "nan" and r["mean_fk_ratio"] == "nan", r
        assert int(r["fk_full_rank_images"]) == 0
    else:
        close("mean_kv_rank", np.mean(kvr), 0); close("mean_fk_ratio", np.mean(fkr)); close("max_fk1_ratio", np.max(fk1r))
    if layer == 1:
        close("mean_out_residual", np.mean(res)); assert int(r["out_images"]) == 3
    else:
        assert r["mean_out_residual"] == "nan" and int(r["out_images"]) == 0, r
PY

expect_ok "$ATTNSCOPE" rank --dump "$dump" --out "$WORK/tol" --rank-tol 1e-3 --variant inline@code --layers 0
expect_grep '"rank_tol": 0.001' "$WORK/tol/rank.json"

# Bad input.
expect_exit 2 "--rank-tol: expected a number >= 0" "$ATTNSCOPE" rank --dump "$dump" --out "$WORK/x" --rank-tol -1
expect_exit 2 "--rank-tol: expected a finite number" "$ATTNSCOPE" rank --dump "$dump" --out "$WORK/x" --rank-tol inf
# Refused either way: this command has no CUDA path, and a build without CUDA has none at all.
expect_exit 2 "--device cuda: " "$ATTNSCOPE" rank --dump "$dump" --out "$WORK/x" --device cuda
expect_grep "rank has no CUDA path|built without CUDA" "$WORK/err.txt"
expect_no_file "$WORK/x/rank.csv" "$WORK/x/rank.json"
cp "$dump" "$WORK/inf.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/inf.h5', 'r+'); d = f['layers/1/out']; x = d[0]; x[1, 2, 3] = np.inf; d[0] = x; f.close()"
expect_exit 1 "/layers/1/out" "$ATTNSCOPE" rank --dump "$WORK/inf.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/rank.csv" "$WORK/bad/rank_histogram.csv" "$WORK/bad/rank.json"
