# census over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, and heads whose every row is
# degenerate (no smallest weight: +inf travels through the records as it is).
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 5 --head-dim 8 --seed 7
# Seed 7: no query of layer 1, head 1 is ReLU-killed by chance (the half run below counts on it).
IMAGES=9 check_image_run all census --dump "$WORK/d.h5"
# Some weights are negative (the counts are not all zero).
awk -F, 'NR > 1 { n += $5 } END { if (n == 0) { print "FAIL: no negative weight counted"; exit 1 } }' \
  "$WORK/all/plain/census.csv" || exit 1
IMAGES=5 check_image_run some census --dump "$WORK/d.h5" --variant inline,mala:elu1@code \
  --images 7,2,5,0,8 --layers 1 --sum-tol 1e-12

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
IMAGES=9 check_image_run half census --dump "$WORK/half.h5" --variant linear:relu,inline
expect_grep '^linear:relu@paper,0,1,0,0,0,inf,0,0$' "$WORK/half/plain/census.csv"
expect_grep '^linear:relu@paper,1,1,6084,0,' "$WORK/half/plain/census.csv"
