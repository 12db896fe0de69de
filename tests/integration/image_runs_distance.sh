# distance over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, --renormalise and a seeded query
# transform, and heads whose every row is degenerate (empty statistics and histograms travel
# through the records as they are).
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 4 --head-dim 8 --seed 7
IMAGES=9 check_image_run all distance --dump "$WORK/d.h5" --variant softmax,linear:elu1,inline,mala@code
IMAGES=5 check_image_run some distance --dump "$WORK/d.h5" --variant softmax,inline --images 7,2,5,0,8 \
  --heads 1 --renormalise --bins 7 --patch-size 3 --transform f2 --seed 4
# 5 images x 20 grid queries, measured or (renormalised signed rows) without grid mass.
awk -F, 'NR > 1 && ($9 + $14 != 100 || $10 != 5) { print "FAIL: 5 images x 20 grid queries expected: " $0; exit 1 }' \
  "$WORK/some/plain/distance.csv" || exit 1
awk -F, '$1 ~ /^inline/ { n += $14 } END { if (n == 0) { print "FAIL: no InLine row without grid mass"; exit 1 } }' \
  "$WORK/some/plain/distance.csv" || exit 1

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
IMAGES=9 check_image_run half distance --dump "$WORK/half.h5" --variant linear:relu,softmax
expect_grep '^linear:relu@paper,0,1,0,0,0,0,0,0,0,0,180,0,0$' "$WORK/half/plain/distance.csv"
expect_grep '^linear:relu@paper,1,0,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,180,9,' "$WORK/half/plain/distance.csv"
