# Bad dumps: exit 1, one line naming the file and the dataset or attribute, no crash.
need_h5py

expect_exit 1 "$WORK/absent.h5: expected an existing file" "$ATTNSCOPE" info "$WORK/absent.h5"
echo "hello" >"$WORK/text.h5"
expect_exit 1 "$WORK/text.h5: expected an HDF5 file" "$ATTNSCOPE" info "$WORK/text.h5"
expect_exit 1 "expected a regular file" "$ATTNSCOPE" info "$WORK"

expect_ok "$ATTNSCOPE" synth --out "$WORK/good.h5" --images 4 --layers 3

# Truncated: every cut is a clean error naming the file (the superblock records the true size).
size=$(stat -c %s "$WORK/good.h5")
for keep in 10 2000 $((size / 2)) $((size - 1)); do
  cp "$WORK/good.h5" "$WORK/cut.h5"
  truncate -s "$keep" "$WORK/cut.h5"
  expect_exit 1 "$WORK/cut.h5" "$ATTNSCOPE" info "$WORK/cut.h5" --check-values
done
cp "$WORK/good.h5" "$WORK/cut.h5" && truncate -s $((size / 2)) "$WORK/cut.h5"
expect_exit 1 "truncated file" "$ATTNSCOPE" info "$WORK/cut.h5"

# Edits made with h5py, each with the message it must produce.
edit() {  # edit NAME PYTHON-STATEMENTS (f is the open file)
  cp "$WORK/good.h5" "$WORK/$1.h5"
  "$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/$1.h5', 'r+')
$2
f.close()"
}
edit noq 'del f["layers/1/q"]'
expect_exit 1 "$WORK/noq.h5: /layers/1/q: expected a dataset, found none" "$ATTNSCOPE" info "$WORK/noq.h5"
edit nolayer 'del f["layers/2"]'
expect_exit 1 "/layers/2: expected a layer group (num_layers = 3), found none" \
  "$ATTNSCOPE" info "$WORK/nolayer.h5"
edit int32 'x = f["layers/0/k"][...]; del f["layers/0/k"]; f["layers/0/k"] = x.astype(np.int32)'
expect_exit 1 "/layers/0/k: expected dtype float32 or float16, found int32" \
  "$ATTNSCOPE" info "$WORK/int32.h5"
edit f64 'x = f["layers/2/v"][...]; del f["layers/2/v"]; f["layers/2/v"] = x.astype(np.float64)'
expect_exit 1 "/layers/2/v: expected dtype float32 or float16, found float64" \
  "$ATTNSCOPE" info "$WORK/f64.h5"
edit rank 'x = f["layers/1/k"][...]; del f["layers/1/k"]; f["layers/1/k"] = x[:, 0]'
expect_exit 1 "/layers/1/k: expected shape [4, 3, 50, 16], found [4, 50, 16]" \
  "$ATTNSCOPE" info "$WORK/rank.h5"
edit images 'x = f["layers/1/v"][...]; del f["layers/1/v"]; f["layers/1/v"] = x[:3]'
expect_exit 1 "/layers/1/v: expected shape [4, 3, 50, 16], found [3, 3, 50, 16]" \
  "$ATTNSCOPE" info "$WORK/images.h5"
edit noattr 'del f.attrs["head_dim"]'
expect_exit 1 "attribute 'head_dim': expected a root attribute" "$ATTNSCOPE" info "$WORK/noattr.h5"
edit strattr 'f.attrs["num_heads"] = "three"'
expect_exit 1 "attribute 'num_heads': expected an integer, found string" \
  "$ATTNSCOPE" info "$WORK/strattr.h5"
edit tokens 'f.attrs["num_tokens"] = 51'
expect_exit 1 "attribute 'num_tokens': expected prefix_tokens + grid_height * grid_width = 50, found 51" \
  "$ATTNSCOPE" info "$WORK/tokens.h5"
edit badmap 'f.attrs["feature_map"] = "sigmoid"'
expect_exit 1 "attribute 'feature_map'" "$ATTNSCOPE" info "$WORK/badmap.h5"

# NaN / Inf: the schema is valid, --check-values names dataset, image, head, token and dim.
edit nan 'x = f["layers/2/q"]; y = x[3]; y[1, 17, 4] = np.nan; x[3] = y'
expect_ok "$ATTNSCOPE" info "$WORK/nan.h5"
expect_exit 1 "$WORK/nan.h5: /layers/2/q: expected finite values, found NaN at image 3, head 1, token 17, dim 4" \
  "$ATTNSCOPE" info "$WORK/nan.h5" --check-values
edit inf 'x = f["layers/0/v"]; y = x[0]; y[2, 0, 15] = -np.inf; x[0] = y'
expect_exit 1 "/layers/0/v: expected finite values, found Inf at image 0, head 2, token 0, dim 15" \
  "$ATTNSCOPE" info "$WORK/inf.h5" --check-values
