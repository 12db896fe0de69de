# spikiness over the images holding its sampled queries, from a dump and from the synthetic model:
# resumed after kills, shards + merge and MPI ranks give the plain run's bytes (image_runs.bash).
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 6 --layers 2 --heads 2 --grid-height 4 \
  --grid-width 4 --seed 2
# --tokens samples every selected image: one record per image.
IMAGES=6 check_image_run tokens spikiness --dump "$WORK/d.h5" --tokens 0,5 --scales 0.5:4:5 \
  --dist-samples 3
# Random samples: the run reads the images holding one (here all 6).
IMAGES=6 check_image_run sampled spikiness --dump "$WORK/d.h5" --samples 30 --scales 0.5,1,2 \
  --variant softmax,mala
IMAGES=4 check_image_run synthetic spikiness --synthetic --synth-images 4 --tokens 1 --scales 1,3
# The sampled queries are part of what --resume checks: other layers, the same number of samples.
ATTNSCOPE_TEST_KILL_AT=record:1 "$ATTNSCOPE" spikiness --dump "$WORK/d.h5" --samples 30 --layers 0 \
  --out "$WORK/other" --resume >/dev/null 2>&1 && { echo "FAIL: the killed run exited 0"; exit 1; }
expect_exit 2 "belongs to a different run" "$ATTNSCOPE" spikiness --dump "$WORK/d.h5" --samples 30 \
  --layers 1 --out "$WORK/other" --resume
