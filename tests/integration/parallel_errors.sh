# An error raised inside a parallel loop (here: the exp feature map overflowing while `recompute`
# compares heads on several threads) ends the command with exit 1 and one line naming it: it
# never reaches std::terminate.
need_h5py
expect_ok "$ATTNSCOPE" synth --out lin.h5 --images 2 --family linear --feature-map exp
"$PYTHON" - <<'PY'
import h5py, numpy as np
with h5py.File("lin.h5", "r") as src, h5py.File("overflow.h5", "w") as dst:
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    for l in range(int(src.attrs["num_layers"])):
        g = dst.create_group(f"layers/{l}")
        q, k, v = (src[f"layers/{l}/{n}"][...] for n in "qkv")
        if l == 1:
            q = q * np.float32(1e3)  # exp(1e3 * |q|) is not finite even in double
        for n, x in zip("qkv", (q, k, v)):
            g.create_dataset(n, data=x.astype(np.float32))
        g.create_dataset("out", data=np.zeros_like(v, dtype=np.float32))
PY
for t in 1 4; do
  expect_exit 1 "feature map exp" "$ATTNSCOPE" recompute --dump overflow.h5 --out r$t --threads $t
  expect_no_file "r$t/recompute.csv" "r$t/recompute.json"
done
