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
