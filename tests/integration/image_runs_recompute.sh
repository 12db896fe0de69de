# recompute over a dump's images: resumed after kills, shards + merge and MPI ranks give the plain
# run's bytes (image_runs.bash), also for an order other than the dump's.
source "$(dirname "${BASH_SOURCE[0]}")/image_runs.bash"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dump="$REPO/data/dumps/vit7-linear-fmnist.h5"
[ -f "$dump" ] || { echo "FAIL: $dump missing (make dumps writes it)"; exit 1; }
IMAGES=8 check_image_run first recompute --dump "$dump" --images 0-7
IMAGES=4 check_image_run shuffled recompute --dump "$dump" --images 30,2,17,5
