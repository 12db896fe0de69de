# replay over a dump's /images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with two models, interventions and an order other than the dump's.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
s="$REPO/data/models/vit7-softmax-fmnist.h5" l="$REPO/data/models/vit7-linear-fmnist.h5"
dump="$REPO/data/dumps/vit7-softmax-fmnist.h5"
[ -f "$dump" ] || { echo "FAIL: $dump missing (make dumps writes it)"; exit 1; }
IMAGES=6 check_image_run two replay --model "$s,$l" --dump "$dump" --images 9,0-3,40 \
  --intervention none,local:3,random:9
head -2 "$WORK/two/plain/replay_logits.csv" | tail -1 | grep -q '^vit7-softmax-fmnist,none,9,' \
  || { echo "FAIL: the first logits row is not image 9's"; head -3 "$WORK/two/plain/replay_logits.csv"; exit 1; }
# The models are part of what --resume checks.
ATTNSCOPE_TEST_KILL_AT=record:1 "$ATTNSCOPE" replay --model "$s" --dump "$dump" --images 0-3 \
  --out "$WORK/other" --resume >/dev/null 2>&1 && { echo "FAIL: the killed run exited 0"; exit 1; }
expect_exit 2 "belongs to a different run" "$ATTNSCOPE" replay --model "$l" --dump "$dump" --images 0-3 \
  --out "$WORK/other" --resume
