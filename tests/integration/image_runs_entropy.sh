# entropy over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, --log-eps and a seeded query
# transform, and heads whose every row is degenerate.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 4 --head-dim 8 --seed 7
IMAGES=9 check_image_run all entropy --dump "$WORK/d.h5" --variant softmax,linear:elu1,inline,mala@code
IMAGES=5 check_image_run some entropy --dump "$WORK/d.h5" --variant softmax,inline --images 7,2,5,0,8 \
  --heads 1 --log-eps 1e-6 --bins 7 --transform f2 --seed 4
awk -F, 'NR > 1 && ($10 != 105 || $11 != 5) { print "FAIL: 5 images x 21 queries expected: " $0; exit 1 }' \
  "$WORK/some/plain/entropy.csv" || exit 1

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
IMAGES=9 check_image_run half entropy --dump "$WORK/half.h5" --variant linear:relu,softmax
expect_grep '^linear:relu@paper,0,1,0,0,0,0,0,0,0,0,189,0,0$' "$WORK/half/plain/entropy.csv"
expect_grep '^linear:relu@paper,1,0,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,[0-9.e-]*,189,9,0,0,0$' "$WORK/half/plain/entropy.csv"
