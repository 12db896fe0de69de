# rollout over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, the fusions, layers given out of
# order, and layers whose every row is degenerate.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 3 --heads 2 --grid-height 5 \
  --grid-width 4 --head-dim 8 --seed 7
IMAGES=9 check_image_run all rollout --dump "$WORK/d.h5" --variant softmax,linear:elu1,inline,mala@code
IMAGES=5 check_image_run some rollout --dump "$WORK/d.h5" --variant softmax,inline --images 7,2,5,0,8 \
  --layers 2,0 --fusion min --transform f2 --seed 4

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
IMAGES=9 check_image_run half rollout --dump "$WORK/half.h5" --variant linear:relu,softmax --fusion max
