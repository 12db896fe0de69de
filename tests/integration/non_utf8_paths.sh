# Paths that are not valid UTF-8 (legal on Linux) work as --out, --dump, --model and synth --out:
# the results are published, the JSON records name them with U+FFFD for the bytes that are not
# UTF-8, no journal is left (was: exit 1 with a raw [json.exception.type_error.316] naming no
# file, after every image was computed, the journal left behind).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
A=$ATTNSCOPE
bad="$WORK/$(printf 'caf\xe9-\xff')"
mkdir -p "$bad"
expect_ok "$A" synth --out "$bad/d.h5" --images 4 --layers 2 --heads 2 --grid-height 2 --grid-width 2
[ -f "$bad/d.h5.json" ] || { echo "FAIL: synth's record missing"; exit 1; }
expect_ok "$A" census --dump "$bad/d.h5" --out "$bad/census"
[ -f "$bad/census/census.json" ] && [ -f "$bad/census/census.csv" ] || { echo "FAIL: census set missing"; exit 1; }
[ ! -e "$bad/census/.attnscope-partial" ] || { echo "FAIL: journal left behind"; ls -la "$bad/census"; exit 1; }
"$PYTHON" -c "import json, sys
r = json.load(open(sys.argv[1]))
assert r['inputs']['dump'].endswith('caf\ufffd-\ufffd/d.h5'), r['inputs']['dump']" "$bad/census/census.json"
# The same results as from a plain path.
cp "$bad/d.h5" "$WORK/plain.h5"
expect_ok "$A" census --dump "$WORK/plain.h5" --out "$WORK/plain"
cmp "$bad/census/census.csv" "$WORK/plain/census.csv" || { echo "FAIL: results differ"; exit 1; }
# Shards and merge, and --resume, with such paths (the journal keeps the exact bytes).
expect_ok "$A" confusion --dump "$bad/d.h5" --shard 0/2 --out "$bad/s0"
expect_ok "$A" confusion --dump "$bad/d.h5" --shard 1/2 --out "$bad/s1"
expect_ok "$A" merge "$bad/s0" "$bad/s1" --out "$bad/merged"
expect_ok "$A" confusion --dump "$bad/d.h5" --out "$bad/whole"
cmp "$bad/merged/confusion_per_image.csv" "$bad/whole/confusion_per_image.csv" || { echo "FAIL: merged set differs"; exit 1; }
rc=0
ATTNSCOPE_TEST_KILL_AT=record:1 "$A" confusion --dump "$bad/d.h5" --out "$bad/res" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 137 ] || { echo "FAIL: not killed ($rc)"; exit 1; }
expect_ok "$A" confusion --dump "$bad/d.h5" --out "$bad/res" --resume
cmp "$bad/res/confusion_per_image.csv" "$bad/whole/confusion_per_image.csv" || { echo "FAIL: resumed set differs"; exit 1; }
# replay with a model file under such a path.
cp "$REPO/data/models/vit7-softmax-fmnist.h5" "$bad/m.h5"
expect_ok "$A" replay --model "$bad/m.h5" --dump "$REPO/data/dumps/vit7-softmax-fmnist.h5" --images 0-1 --out "$bad/rep"
[ -f "$bad/rep/replay.json" ] || { echo "FAIL: replay set missing"; exit 1; }
# An error still names the file (its bytes as given).
expect_exit 1 "m-missing.h5: expected an existing file" "$A" replay --model "$bad/m-missing.h5" \
  --dump "$REPO/data/dumps/vit7-softmax-fmnist.h5" --images 0 --out "$bad/rep2"
