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

# With a token filter (the excluded tokens journaled with each image, confusion_excluded_tokens.csv
# beside the per-layer files): constant patches of /images, and a mask stored in the dump.
need_h5py
"$PYTHON" - "$WORK/d.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    px = np.zeros((9, 1, 10, 10), dtype=np.float32)  # 2 x 2 patches of the 5 x 5 grid
    rng = np.random.default_rng(1)
    for i in range(9):
        for r in range(5):
            for c in range(5):
                if (r * 5 + c) % (i % 4 + 2) != 0:
                    px[i, 0, 2*r:2*r+2, 2*c:2*c+2] = rng.standard_normal((2, 2))
    f["images"] = px
    f["token_masks/scatter"] = (np.arange(9 * 26).reshape(9, 26) * 7 % 5 < 2)
PY
IMAGES=9 check_image_run constant confusion --dump "$WORK/d.h5" --variant "$V" --exclude-tokens constant-patch
[ -s "$WORK/constant/plain/confusion_excluded_tokens.csv" ] || { echo "FAIL: no confusion_excluded_tokens.csv"; exit 1; }
IMAGES=5 check_image_run masked confusion --dump "$WORK/d.h5" --variant "$V" --images 7,2,5,0,8 \
  --exclude-tokens mask:token_masks/scatter
head -2 "$WORK/masked/plain/confusion_excluded_tokens.csv" | tail -1 | grep -q '^7,' \
  || { echo "FAIL: the first excluded-tokens row is not image 7"; exit 1; }
