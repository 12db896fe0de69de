# sinks over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), with the selection's order, --norms v, out and none, and heads
# whose every row is degenerate.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 4 --head-dim 8 --seed 7
IMAGES=9 check_image_run all sinks --dump "$WORK/d.h5" --variant softmax,linear:elu1,inline,mala@code
IMAGES=5 check_image_run some sinks --dump "$WORK/d.h5" --variant softmax,inline --images 7,2,5,0,8 \
  --heads 1 --threshold 0.05 --norms none --transform f2 --seed 4

need_h5py
negative_queries_copy "$WORK/d.h5" "$WORK/half.h5" 0
"$PYTHON" -c "import h5py
f = h5py.File('$WORK/half.h5', 'r+')
for l in range(2): f[f'layers/{l}/out'] = f[f'layers/{l}/v'][...] * 3
f.close()"
IMAGES=9 check_image_run half sinks --dump "$WORK/half.h5" --variant linear:relu,softmax --norms out --norm-ratio 2
expect_grep '^linear:relu@paper,0,1,0,0,0,0,0,0,0,189$' "$WORK/half/plain/sinks.csv"
