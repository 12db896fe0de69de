# An input changed in place, anywhere, is seen by --resume and by merge: the fingerprint of a run
# hashes every byte of every input (was: its size and its first and last MiB only, so a few
# images rescaled in the middle of an uncompressed dump, or a weights file edited in the middle,
# passed and the published set mixed old and new data).
need_h5py
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
A=$ATTNSCOPE

# An uncompressed 32-image dump of about 7 MiB: layers/2/q[0:3] lies far from both ends.
expect_ok "$A" synth --out "$WORK/d.h5" --images 32 --head-dim 32 --compression 0
size=$(stat -c %s "$WORK/d.h5")
[ "$size" -gt $((4 << 20)) ] || { echo "FAIL: the dump is only $size bytes"; exit 1; }
rescale() {  # rescale FILE DATASET: multiply its first three rows by 2, in place
  "$PYTHON" -c "import h5py, sys
with h5py.File(sys.argv[1], 'r+') as f:
    x = f[sys.argv[2]]
    assert x.compression is None
    x[0:3] = 2 * x[0:3]" "$1" "$2"
}
cp "$WORK/d.h5" "$WORK/d-orig.h5"
rescale "$WORK/d.h5" layers/2/q
"$PYTHON" -c "
a, b = open('$WORK/d-orig.h5', 'rb').read(), open('$WORK/d.h5', 'rb').read()
diff = [i for i in range(len(a)) if a[i] != b[i]]
assert len(a) == len(b) and diff, 'the edit changed no byte'
assert min(diff) > (1 << 20) and max(diff) < len(a) - (1 << 20), ('edit not in the middle', min(diff), max(diff))"

# --resume after the dump changed between the killed run and the resumed one.
cp "$WORK/d-orig.h5" "$WORK/r.h5"
rc=0
ATTNSCOPE_TEST_KILL_AT=record:2 "$A" census --dump "$WORK/r.h5" --out "$WORK/res" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 137 ] || { echo "FAIL: the run was not killed (exit $rc)"; exit 1; }
rescale "$WORK/r.h5" layers/2/q
expect_exit 2 "--resume: " "$A" census --dump "$WORK/r.h5" --out "$WORK/res" --resume
expect_grep "an input file \(dump or weights\) is not the one it was written for" "$WORK/err.txt"
expect_no_file "$WORK/res/census.json"

# Shards computed on one dump, merged after it changed in the middle.
cp "$WORK/d-orig.h5" "$WORK/s.h5"
expect_ok "$A" census --dump "$WORK/s.h5" --shard 0/2 --out "$WORK/s0"
expect_ok "$A" census --dump "$WORK/s.h5" --shard 1/2 --out "$WORK/s1"
rescale "$WORK/s.h5" layers/2/q
expect_exit 2 "a shard of a different run than the dump and flags give now" \
  "$A" merge "$WORK/s0" "$WORK/s1" --out "$WORK/m"
expect_no_file "$WORK/m/census.json"
cp "$WORK/d-orig.h5" "$WORK/s.h5"   # the same bytes again (a copy): merge goes through
expect_ok "$A" merge "$WORK/s0" "$WORK/s1" --out "$WORK/m"

# A weights file of over 2 MiB edited in the middle between a killed replay and its --resume.
"$PYTHON" -c "import h5py, numpy as np
src = h5py.File('$REPO/data/models/vit7-softmax-fmnist.h5', 'r')
with h5py.File('$WORK/w.h5', 'w') as f:
    f.create_dataset('pad_first', data=np.zeros(1 << 19, np.float32))
    for k, v in src.attrs.items(): f.attrs[k] = v
    for k in src: src.copy(src[k], f, name=k)
    f.create_dataset('pad_last', data=np.zeros(1 << 19, np.float32))"
dump="$REPO/data/dumps/vit7-softmax-fmnist.h5"
rc=0
ATTNSCOPE_TEST_KILL_AT=record:2 "$A" replay --model "$WORK/w.h5" --dump "$dump" --images 0-7 \
  --out "$WORK/rep" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 137 ] || { echo "FAIL: replay was not killed (exit $rc)"; exit 1; }
cp "$WORK/w.h5" "$WORK/w-orig.h5"
rescale "$WORK/w.h5" blocks/1/mlp/fc1/weight
"$PYTHON" -c "
a, b = open('$WORK/w-orig.h5', 'rb').read(), open('$WORK/w.h5', 'rb').read()
diff = [i for i in range(len(a)) if a[i] != b[i]]
assert len(a) > (2 << 20) and diff and min(diff) > (1 << 20) and max(diff) < len(a) - (1 << 20)"
expect_exit 2 "an input file (dump or weights) is not the one it was written for" \
  "$A" replay --model "$WORK/w.h5" --dump "$dump" --images 0-7 --out "$WORK/rep" --resume
cp "$WORK/w-orig.h5" "$WORK/w.h5"
expect_ok "$A" replay --model "$WORK/w.h5" --dump "$dump" --images 0-7 --out "$WORK/rep" --resume
