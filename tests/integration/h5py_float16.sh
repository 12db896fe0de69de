# Dumps written by h5py as the format page shows (float16, gzip + shuffle, variable-length
# strings, numpy ints) are read by attnscope; attnscope's float16 is h5py's float16.
need_h5py

"$PYTHON" - "$WORK/py16.h5" <<'PY'
import sys, h5py, numpy as np
L, H, N, d, n = 2, 3, 1 + 4 * 5, 8, 5
rng = np.random.default_rng(0)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs.update(format="attnscope-dump", format_version=1, model_name="my_vit",
                   attention_family="linear", convention="paper", feature_map="elu1",
                   scale=d ** -0.5, num_layers=L, num_heads=H, head_dim=d, num_tokens=N,
                   grid_height=4, grid_width=5, prefix_tokens=1)
    f.attrs["model_name"] = np.bytes_("fixed_len_name")  # fixed-length strings are accepted too
    for l in range(L):
        g = f.create_group(f"layers/{l}")
        for name in ("q", "k", "v"):
            ds = g.create_dataset(name, shape=(n, H, N, d), dtype="float16", chunks=(1, H, N, d),
                                  compression="gzip", compression_opts=1, shuffle=True)
            for i in range(n):
                ds[i] = rng.standard_normal((H, N, d)).astype(np.float16)
    f["labels"] = np.arange(n, dtype=np.int64)
PY
expect_ok "$ATTNSCOPE" info "$WORK/py16.h5" --check-values
expect_grep '^model +fixed_len_name$' "$WORK/out.txt"
expect_grep '^dtype +float16$' "$WORK/out.txt"
expect_grep '^variant +linear:elu1@paper' "$WORK/out.txt"
expect_grep '^shape +5 images x 2 layers x 3 heads x 21 tokens x 8 dims$' "$WORK/out.txt"
expect_grep 'labels: yes' "$WORK/out.txt"
expect_grep '^values +all finite \(5 images read\)$' "$WORK/out.txt"

# An Inf in an h5py float16 dump is found and placed.
"$PYTHON" - "$WORK/py16.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    y = f["layers/1/k"][4]; y[2, 20, 7] = np.inf; f["layers/1/k"][4] = y
PY
expect_exit 1 "/layers/1/k: expected finite values, found Inf at image 4, head 2, token 20, dim 7" \
  "$ATTNSCOPE" info "$WORK/py16.h5" --check-values

# The other way: h5py sees attnscope's float16 as numpy.float16, equal to numpy's own rounding
# of the float32 dump of the same seed.
expect_ok "$ATTNSCOPE" synth --out "$WORK/a16.h5" --dtype f16 --images 3 --seed 4
expect_ok "$ATTNSCOPE" synth --out "$WORK/a32.h5" --dtype f32 --images 3 --seed 4
"$PYTHON" - "$WORK/a16.h5" "$WORK/a32.h5" <<'PY' || exit 1
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
assert isinstance(a.attrs["model_name"], str), type(a.attrs["model_name"])
for l in range(4):
    for n in "qkv":
        x, y = a[f"layers/{l}/{n}"], b[f"layers/{l}/{n}"]
        assert x.dtype == np.float16, x.dtype
        assert x.chunks == (1, 3, 50, 16), x.chunks
        assert np.array_equal(x[...], y[...].astype(np.float16)), (l, n)
PY
