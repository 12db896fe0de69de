# Finite but huge weights (3e38 in the last block's fc2) drive the forward pass out of range:
# replay stops with one line naming the image, the block and the file, exit 1, no result set
# (was: NaN logits, exit 0, class 0 predicted and dump_logits_max_rel_error = 0).
need_h5py
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dump="$REPO/data/dumps/vit7-softmax-fmnist.h5"
cp "$REPO/data/models/vit7-softmax-fmnist.h5" "$WORK/huge.h5"
"$PYTHON" -c "import h5py
with h5py.File('$WORK/huge.h5', 'r+') as f:
    f['blocks/3/mlp/fc2/weight'][...] = 3e38; f.attrs['model_name'] = 'huge'"
expect_exit 1 ", block 3 of $WORK/huge.h5: expected finite activations, found NaN or Inf" \
  "$ATTNSCOPE" replay --model "$WORK/huge.h5" --dump "$dump" --images 0-3 --out "$WORK/out"
expect_grep "^attnscope replay: image [0-3], block 3 of" "$WORK/err.txt"
expect_no_file "$WORK/out/replay.json" "$WORK/out/replay.csv"
# The same under an intervention and with the model second: still refused, never a row of NaN.
expect_exit 1 "block 3 of $WORK/huge.h5" "$ATTNSCOPE" replay \
  --model "$REPO/data/models/vit7-softmax-fmnist.h5,$WORK/huge.h5" --dump "$dump" --images 0-3 \
  --intervention none,f1 --out "$WORK/out2"
expect_no_file "$WORK/out2/replay.json"
# Negative control: the untouched model runs, and its comparison with the dump is a real number.
expect_ok "$ATTNSCOPE" replay --model "$REPO/data/models/vit7-softmax-fmnist.h5" --dump "$dump" \
  --images 0-3 --out "$WORK/good"
"$PYTHON" -c "import json
r = json.load(open('$WORK/good/replay.json'))['results']['rows'][0]
e = r['dump_logits_max_rel_error']
assert isinstance(e, float) and 0 < e < 1e-4, e"
