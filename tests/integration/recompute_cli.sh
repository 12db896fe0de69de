# attnscope recompute: a dump without the model's tensors is refused; with them (written by the
# project's own dumper through h5py), the outputs match; a corrupted output fails with exit 3.
expect_ok "$ATTNSCOPE" recompute --help
expect_grep "--tol" "$WORK/out.txt"

expect_ok "$ATTNSCOPE" synth --out plain.h5 --images 2
expect_fail "out" "$ATTNSCOPE" recompute --dump plain.h5 --out r0
expect_fail "no-such.h5" "$ATTNSCOPE" recompute --dump no-such.h5 --out r0

"$PYTHON" -c "import h5py, numpy" 2>/dev/null || { echo "h5py not available"; exit 77; }
# Copy the synthetic dump and add per-layer out = softmax(s q k^T) v computed in numpy.
"$PYTHON" - <<'PY'
import h5py, numpy as np
with h5py.File("plain.h5", "r") as src, h5py.File("with_out.h5", "w") as dst:
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    s = src.attrs["scale"]
    for l in range(int(src.attrs["num_layers"])):
        g = dst.create_group(f"layers/{l}")
        q, k, v = (src[f"layers/{l}/{n}"][...].astype(np.float64) for n in "qkv")
        for n, x in zip("qkv", (q, k, v)):
            g.create_dataset(n, data=x.astype(np.float32))
        logits = s * np.einsum("bhnd,bhmd->bhnm", q, k)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        g.create_dataset("out", data=np.einsum("bhnm,bhmd->bhnd", w, v).astype(np.float32))
PY
expect_ok "$ATTNSCOPE" recompute --dump with_out.h5 --out r1
expect_grep "PASS" "$WORK/out.txt"
expect_grep "^variant,layer,head,images,out_max_abs_error" r1/recompute.csv
[ -f r1/recompute.json ] || { echo "FAIL: no recompute.json"; exit 1; }
# --max-memory bounds recompute's loop too (V and the model's tensors included): too small is
# refused naming what it needs; a budget for two images in flight gives the same results.
expect_exit 2 "--max-memory 1.0 KiB is too small" "$ATTNSCOPE" recompute --dump with_out.h5 \
  --out r-tiny --max-memory 1K
expect_ok "$ATTNSCOPE" recompute --dump with_out.h5 --out r-small --max-memory 4M
cmp r1/recompute.csv r-small/recompute.csv || { echo "FAIL: --max-memory changed the results"; exit 1; }
expect_grep '"images_in_flight"' r-small/recompute.json

"$PYTHON" - <<'PY'
import h5py
with h5py.File("with_out.h5", "r+") as f:
    f["layers/1/out"][0, 2, 5, 3] += 1.0
PY
rc=0
"$ATTNSCOPE" recompute --dump with_out.h5 --out r2 >"$WORK/out.txt" 2>&1 || rc=$?
[ "$rc" -eq 3 ] || { echo "FAIL: corrupted out gave exit $rc, expected 3"; cat "$WORK/out.txt"; exit 1; }
expect_grep "FAIL" "$WORK/out.txt"
"$PYTHON" - <<'PY'
import csv
rows = list(csv.DictReader(open("r2/recompute.csv")))
bad = [(r["layer"], r["head"]) for r in rows if float(r["out_max_abs_error"]) > 0.5]
assert bad == [("1", "2")], bad
PY
