# rank over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain run's
# bytes (image_runs.bash), with the selection's order, --rank-tol, the model's out in one layer,
# and heads whose every row is degenerate.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 4 --head-dim 8 --seed 7
IMAGES=9 check_image_run all rank --dump "$WORK/d.h5" --variant softmax,linear:elu1,inline,mala@code
IMAGES=5 check_image_run some rank --dump "$WORK/d.h5" --variant softmax,inline --images 7,2,5,0,8 \
  --heads 1 --rank-tol 1e-6 --transform f2 --seed 4

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
"$PYTHON" -c "import h5py
f = h5py.File('$WORK/half.h5', 'r+'); f['layers/0/out'] = f['layers/0/v'][...] * 2; f.close()"
IMAGES=9 check_image_run half rank --dump "$WORK/half.h5" --variant linear:relu,softmax
# Layer 0 of linear:relu: every row degenerate, W = 0 (rank 0), the residual of out still measured.
expect_grep '^linear:relu@paper,0,1,9,0,0,0,0,' "$WORK/half/plain/rank.csv"
