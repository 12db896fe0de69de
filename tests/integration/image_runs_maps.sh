# maps over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes, maps.h5 included (image_runs.bash); and the selection's order is kept.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 6 --layers 2 --heads 2 --grid-height 4 \
  --grid-width 5 --seed 5
IMAGES=6 check_image_run all maps --dump "$WORK/d.h5" --images 0-5 --tokens 0,2:3 --variant softmax,inline
IMAGES=4 check_image_run some maps --dump "$WORK/d.h5" --tokens 7 --images 4,1,3,0 --layers 1
head -2 "$WORK/some/plain/maps.csv" | tail -1 | grep -q '^softmax@paper,4,1,' \
  || { echo "FAIL: the first map is not image 4's"; head -3 "$WORK/some/plain/maps.csv"; exit 1; }
