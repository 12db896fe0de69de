# attnscope census: negative / zero InLine and MALA weights per layer and head, checked against
# an independent numpy computation; code+rope without its RoPE tables refused; bad input.
need_h5py

expect_ok "$ATTNSCOPE" census --help
expect_grep '^usage: attnscope census ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --sum-tol --threads --out; do
  expect_grep "$flag" "$WORK/out.txt"
done

expect_ok "$ATTNSCOPE" synth --out "$WORK/s.h5" --images 3 --layers 2 --heads 2 --seed 11
expect_ok "$ATTNSCOPE" census --dump "$WORK/s.h5" --out "$WORK/a"
expect_empty "$WORK/err.txt"
expect_grep '^weight census over 3 images' "$WORK/out.txt"
expect_grep '^variant,layer,head,weights,negative,zero,most_negative,rows_not_summing_to_one,max_row_sum_error$' \
  "$WORK/a/census.csv"
[ "$(($(wc -l <"$WORK/a/census.csv") - 1))" -eq $((2 * 2 * 2)) ] || { echo "FAIL: rows"; exit 1; }
expect_grep '"totals"' "$WORK/a/census.json"

# Independent counts: numpy, float64, the formulas of the papers (eq. 4 and eq. 8-9).
"$PYTHON" - "$WORK/s.h5" "$WORK/a/census.csv" <<'PY' || exit 1
import csv, sys
import h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
n = f.attrs["num_tokens"]
def elu1(x): return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
want = {}
for layer in range(2):
    q_all, k_all = f[f"layers/{layer}/q"][...].astype(np.float64), f[f"layers/{layer}/k"][...].astype(np.float64)
    for head in range(2):
        for fam in ("inline:identity@paper", "mala:elu1@paper"):
            neg = 0; worst = np.inf; bad = 0
            for img in range(q_all.shape[0]):
                q, k = q_all[img, head], k_all[img, head]
                if fam.startswith("inline"):
                    p = q @ k.T
                    w = p - p.mean(axis=1, keepdims=True) + 1.0 / n
                else:
                    p = elu1(q) @ elu1(k).T
                    s = p.sum(axis=1, keepdims=True)
                    w = (1 + 1 / s) * p - s / n
                neg += int((w < 0).sum()); worst = min(worst, w.min())
                bad += int((np.abs(w.sum(axis=1) - 1) > 1e-6).sum())
            want[(fam, layer, head)] = (neg, worst, bad)
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == len(want), len(rows)
for r in rows:
    neg, worst, bad = want[(r["variant"], int(r["layer"]), int(r["head"]))]
    assert int(r["weights"]) == 3 * n * n, r
    assert int(r["negative"]) == neg, (r, neg)
    assert abs(float(r["most_negative"]) - worst) <= 1e-9 * max(1, abs(worst)), (r, worst)
    assert int(r["rows_not_summing_to_one"]) == bad == 0, (r, bad)
    assert float(r["max_row_sum_error"]) < 1e-9, r
PY

# Chosen variants and selection; the code convention.
expect_ok "$ATTNSCOPE" census --dump "$WORK/s.h5" --variant mala@code,inline:relu --layers 1 \
  --heads 0 --images 0-1 --out "$WORK/b"
expect_grep '^mala:elu1@code,1,0,5000,' "$WORK/b/census.csv"
expect_grep '^inline:relu@paper,1,0,5000,' "$WORK/b/census.csv"
[ "$(wc -l <"$WORK/b/census.csv")" -eq 3 ] || { echo "FAIL: rows"; exit 1; }

# code+rope is MALA as released (mala_rope@code), computed with the RoPE tables a dump of it
# records: refused, naming them, on dumps without them, whether asked for or the dump's own
# convention (field_families_cli.sh runs it on dumps with them); another family's code+rope is
# refused with the reason.
expect_fail "rope_cos" "$ATTNSCOPE" census --dump "$WORK/s.h5" --variant mala@code+rope --out "$WORK/e"
expect_exit 2 "inline has no such convention" "$ATTNSCOPE" census --dump "$WORK/s.h5" --variant inline@code+rope --out "$WORK/e"
expect_ok "$ATTNSCOPE" synth --out "$WORK/rope.h5" --images 1 --layers 1 --heads 1 --family mala \
  --convention code+rope --feature-map elu1
expect_fail "rope_cos" "$ATTNSCOPE" census --dump "$WORK/rope.h5" --out "$WORK/e"

# Bad input.
expect_exit 2 "--sum-tol must be >= 0" "$ATTNSCOPE" census --dump "$WORK/s.h5" --sum-tol -1 --out "$WORK/e"
expect_exit 2 "head index 5 out of range" "$ATTNSCOPE" census --dump "$WORK/s.h5" --heads 5 --out "$WORK/e"
expect_exit 2 "required" "$ATTNSCOPE" census --out "$WORK/e"
expect_exit 1 "$WORK/absent.h5" "$ATTNSCOPE" census --dump "$WORK/absent.h5" --out "$WORK/e"
cp "$WORK/s.h5" "$WORK/nan.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/nan.h5', 'r+'); x = f['layers/1/k']; y = x[2]; y[0, 3, 1] = np.inf; x[2] = y; f.close()"
expect_exit 1 "/layers/1/k" "$ATTNSCOPE" census --dump "$WORK/nan.h5" --out "$WORK/e"
expect_no_file "$WORK/e/census.csv" "$WORK/e/census.json"
