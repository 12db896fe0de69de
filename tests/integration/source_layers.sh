# A dump of model layers [2, 0] (source_layers): every CSV and JSON reports the model's layer
# indices, and --layers takes model indices.
need_h5py

expect_ok "$ATTNSCOPE" synth --out "$WORK/s3.h5" --images 2 --layers 3 --heads 2 --grid-height 3 \
  --grid-width 3 --head-dim 4
# Dump layer 0 <- model layer 2, dump layer 1 <- model layer 0, as the dumper writes layers=[2, 0];
# with each layer's own softmax output, so that recompute has something to compare.
"$PYTHON" - "$WORK/s3.h5" "$WORK/sub.h5" <<'PY'
import sys, h5py, numpy as np
src = h5py.File(sys.argv[1], "r")
with h5py.File(sys.argv[2], "w") as f:
    f.attrs.update(src.attrs)
    f.attrs["num_layers"] = 2
    f.attrs["source_layers"] = np.array([2, 0], dtype=np.int64)
    for pos, model in enumerate([2, 0]):
        for n in "qkv":
            f[f"layers/{pos}/{n}"] = src[f"layers/{model}/{n}"][...]
        q, k, v = (src[f"layers/{model}/{n}"][...].astype(np.float64) for n in "qkv")
        logits = f.attrs["scale"] * q @ k.transpose(0, 1, 3, 2)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        f[f"layers/{pos}/out"] = (w @ v).astype(np.float32)
PY
expect_ok "$ATTNSCOPE" info "$WORK/sub.h5"
expect_grep '^source +model layers 2,0 ' "$WORK/out.txt"

layers_of() {  # layers_of CSV: the distinct values of its layer column, in order of appearance
  "$PYTHON" -c "import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
seen = []
[seen.append(r['layer']) for r in rows if r['layer'] not in seen]
print(','.join(seen))" "$1"
}
expect_layers() {  # expect_layers WANT CSV
  local got; got=$(layers_of "$2")
  [ "$got" = "$1" ] || { echo "FAIL: layers of $2 are '$got', expected '$1'"; exit 1; }
}

expect_ok "$ATTNSCOPE" confusion --dump "$WORK/sub.h5" --out "$WORK/conf"
expect_layers "2,0" "$WORK/conf/confusion_per_head.csv"
expect_ok "$ATTNSCOPE" locality --dump "$WORK/sub.h5" --out "$WORK/loc"
expect_layers "2,0" "$WORK/loc/locality.csv"
expect_ok "$ATTNSCOPE" census --dump "$WORK/sub.h5" --out "$WORK/cen"
expect_layers "2,0" "$WORK/cen/census.csv"
expect_ok "$ATTNSCOPE" recompute --dump "$WORK/sub.h5" --out "$WORK/rec"
expect_layers "2,0" "$WORK/rec/recompute.csv"
expect_ok "$ATTNSCOPE" spikiness --dump "$WORK/sub.h5" --out "$WORK/spk" --samples 40
"$PYTHON" -c "import csv, sys
got = {r['layer'] for r in csv.DictReader(open(sys.argv[1]))}
assert got <= {'2', '0'} and '2' in got, got" "$WORK/spk/spikiness_samples.csv" || exit 1
expect_ok "$ATTNSCOPE" maps --dump "$WORK/sub.h5" --out "$WORK/maps" --tokens 1
expect_layers "0,2" "$WORK/maps/maps.csv"
for c in distance entropy sinks rank; do
  expect_ok "$ATTNSCOPE" "$c" --dump "$WORK/sub.h5" --out "$WORK/$c"
  expect_layers "2,0" "$WORK/$c/$c.csv"
done
expect_layers "2,0" "$WORK/sinks/sinks_keys.csv"
# rollout multiplies the layers in the model's order: 0, then 2.
expect_ok "$ATTNSCOPE" rollout --dump "$WORK/sub.h5" --out "$WORK/roll"
"$PYTHON" -c "import json, sys
p = json.load(open(sys.argv[1]))['parameters']
assert p['layers_in_order'] == [0, 2] and p['layers'] == [2, 0], p" "$WORK/roll/rollout.json" || exit 1

# --layers takes the model's indices; one the dump lacks names the layers it holds.
expect_ok "$ATTNSCOPE" confusion --dump "$WORK/sub.h5" --out "$WORK/conf0" --layers 0
expect_layers "0" "$WORK/conf0/confusion_per_head.csv"
"$PYTHON" -c "import json, sys
assert json.load(open(sys.argv[1]))['parameters']['layers'] == [0]" "$WORK/conf0/confusion.json" || exit 1
"$PYTHON" -c "import json, sys
assert json.load(open(sys.argv[1]))['parameters']['layers'] == [2, 0]" "$WORK/conf/confusion.json" || exit 1
expect_exit 2 "--layers: model layer 1 is not in" \
  "$ATTNSCOPE" locality --dump "$WORK/sub.h5" --out "$WORK/x" --layers 1
expect_grep "holds model layers 2,0" "$WORK/err.txt"
