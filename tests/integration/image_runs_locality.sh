# locality over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, a seeded query transform, and heads
# whose every row is degenerate (empty statistics travel through the records as they are).
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 5 --head-dim 8 --plant-duplicates 1 --seed 7
IMAGES=9 check_image_run all locality --dump "$WORK/d.h5" --variant softmax,linear:elu1,inline,mala
# An order other than the dump's, a subset, another window, and f2's seeded projection.
IMAGES=5 check_image_run some locality --dump "$WORK/d.h5" --variant softmax,inline --images 7,2,5,0,8 \
  --heads 1 --window 5 --transform f2 --seed 4
awk -F, 'NR > 1 && $9 != 125 { print "FAIL: 5 images x 25 grid queries expected, found " $9; exit 1 }' \
  "$WORK/some/plain/locality.csv" || exit 1

# Layer 0's queries all negative: every linear:relu row of layer 0 is degenerate, so its heads'
# statistics are empty (no query, infinite range) in every record.
need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
IMAGES=9 check_image_run half locality --dump "$WORK/half.h5" --variant linear:relu,softmax
expect_grep '^linear:relu@paper,0,1,3,0,0,0,0,0,' "$WORK/half/plain/locality.csv"
expect_grep '^linear:relu@paper,1,1,3,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,225,' "$WORK/half/plain/locality.csv"
