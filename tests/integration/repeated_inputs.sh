# One input or one intervention given twice is refused, whatever its spelling: the same dump
# twice in --dump (every count would double), one intervention under two spellings (it would run
# twice), one model twice in replay --model (its rows could not be told apart).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
s="$REPO/data/models/vit7-softmax-fmnist.h5"
sd="$REPO/data/dumps/vit7-softmax-fmnist.h5"
for pair in local:3,local:03 random:9,random:09 family=mala,family=mala:elu1 \
  family=softmax@code,family=softmax f1,f1; do
  expect_exit 2 "is named twice" "$ATTNSCOPE" replay --model "$s" --dump "$sd" --images 0 \
    --out "$WORK/iv" --intervention "none,$pair"
  expect_no_file "$WORK/iv/replay.json"
done
expect_exit 2 "--intervention 'local:03' is named twice: it repeats 'local:3' (both are local:3)" \
  "$ATTNSCOPE" replay --model "$s" --dump "$sd" --images 0 --out "$WORK/iv" --intervention local:3,local:03
# Negative control: different interventions run.
expect_ok "$ATTNSCOPE" replay --model "$s" --dump "$sd" --images 0 --out "$WORK/iv" --intervention local:3,local:5,random:9
cp "$s" "$WORK/copy.h5"
expect_exit 2 "--model: '$WORK/copy.h5' is model 'vit7-softmax-fmnist', as '$s' is" \
  "$ATTNSCOPE" replay --model "$s,$WORK/copy.h5" --dump "$sd" --images 0 --out "$WORK/mm"
expect_exit 2 "its rows could not be told apart" \
  "$ATTNSCOPE" replay --model "$s,$s" --dump "$sd" --images 0 --out "$WORK/mm"
expect_no_file "$WORK/mm/replay.json"

# The same dump twice in --dump, by one name or through another (a symbolic link, ./NAME), in
# every command that reads dumps: exit 2 before anything is computed (was: every count doubled).
expect_ok "$ATTNSCOPE" synth --out "$WORK/s.h5" --images 2 --layers 1 --heads 1 --grid-height 2 --grid-width 2
ln -s "$WORK/s.h5" "$WORK/link.h5"
for cmd in census confusion locality spikiness recompute mask; do
  expect_exit 2 "--dump: $WORK/s.h5 is given twice: its images would be counted twice" \
    "$ATTNSCOPE" $cmd --dump "$WORK/s.h5" "$WORK/s.h5" --out "$WORK/twice-$cmd"
  expect_no_file "$WORK/twice-$cmd/$cmd.json"
done
expect_exit 2 "--dump: $WORK/link.h5 is given twice (also as $WORK/s.h5)" \
  "$ATTNSCOPE" census --dump "$WORK/s.h5" --dump "$WORK/link.h5" --out "$WORK/twice"
(cd "$WORK" && expect_exit 2 "is given twice" "$ATTNSCOPE" census --dump s.h5 ./s.h5 --out twice)
expect_exit 2 "is given twice" "$ATTNSCOPE" maps --dump "$WORK/s.h5" "$WORK/s.h5" --tokens 0 --out "$WORK/twice-maps"
# Negative control: two different files are one dump of 4 images.
cp "$WORK/s.h5" "$WORK/t.h5"
expect_ok "$ATTNSCOPE" info "$WORK/s.h5"
expect_ok "$ATTNSCOPE" census --dump "$WORK/s.h5" "$WORK/t.h5" --out "$WORK/two"
"$PYTHON" -c "import json
r = json.load(open('$WORK/two/census.json'))
assert r['parameters']['images'] == 4 and len(r['inputs']['dump']) == 2, r"
