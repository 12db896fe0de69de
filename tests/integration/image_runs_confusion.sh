# confusion over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash); and the selection's order (not the dump's) is kept.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 9 --layers 2 --heads 2 --grid-height 5 \
  --grid-width 5 --head-dim 8 --plant-duplicates 1 --plant-collinear 1 --seed 3
V=softmax,linear:relu,inline,mala
IMAGES=9 check_image_run all confusion --dump "$WORK/d.h5" --variant "$V"
# An order other than the dump's, and a subset.
IMAGES=5 check_image_run some confusion --dump "$WORK/d.h5" --variant "$V" --images 7,2,5,0,8 \
  --heads 1 --eps 1e-2
expect_grep '^softmax@paper,7,' "$WORK/some/plain/confusion_per_image.csv"
head -2 "$WORK/some/plain/confusion_per_image.csv" | tail -1 | grep -q '^softmax@paper,7,' \
  || { echo "FAIL: the first image row is not image 7"; exit 1; }
