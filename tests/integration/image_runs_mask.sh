# mask over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, seeded random masks, and heads with
# no row left to compare (their change is absent from the records, not zero).
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 5 --head-dim 8 --seed 3
IMAGES=9 check_image_run all mask --dump "$WORK/d.h5" --variant softmax,inline,mala \
  --mask local:3,random:4
IMAGES=5 check_image_run some mask --dump "$WORK/d.h5" --variant inline --images 7,2,5,0,8 \
  --heads 1 --mask random:6,local:5 --seed 11

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
IMAGES=9 check_image_run half mask --dump "$WORK/half.h5" --variant linear:relu,softmax --mask local:3
# Layer 0 of linear:relu: no value, every row degenerate, every image unmeasured.
expect_grep '^linear:relu@paper,local:3,0,1,0,,,,,,,0,234,9$' "$WORK/half/plain/mask_per_head.csv"
expect_grep '^linear:relu@paper,local:3,1,1,9,' "$WORK/half/plain/mask_per_head.csv"
