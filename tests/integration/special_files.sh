# Special files, created in this test's own scratch folder (never the system's /dev entries):
# - a result may replace only a regular file: `synth --out` naming a character device, a FIFO or
#   a symbolic link, or a results folder holding a device under a result's name, is refused and
#   the special file stays (was: as root, `synth --out /dev/null` made /dev/null a regular file);
# - standard output that cannot be written (a /dev/full-like device, a file on a full tmpfs) is
#   an error, exit 1, naming standard output and the reason (was: exit 0, the output lost).
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: mknod and mount need root"; exit 77; fi
A=$ATTNSCOPE
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
expect_ok "$A" synth --out "$WORK/d.h5" --images 2 --layers 1 --heads 1 --grid-height 2 --grid-width 2
mknod "$WORK/null" c 1 3     # a character device like /dev/null, in the scratch folder
mknod "$WORK/full" c 1 7     # like /dev/full: every write fails with ENOSPC
mkfifo "$WORK/fifo"
ln -s "$WORK/d.h5" "$WORK/link.h5"
for f in null fifo link.h5; do
  kind=$(stat -c %F "$WORK/$f")
  expect_exit 1 "$WORK/$f: expected a regular file or nothing (attnscope replaces only regular files)" \
    "$A" synth --out "$WORK/$f" --images 1
  [ "$(stat -c %F "$WORK/$f")" = "$kind" ] || { echo "FAIL: $f became $(stat -c %F "$WORK/$f")"; exit 1; }
  expect_no_file "$WORK/$f.json"
done
[ "$(stat -c '%t,%T' "$WORK/null")" = "1,3" ] || { echo "FAIL: the device node changed"; exit 1; }
mkdir -p "$WORK/res"
mknod "$WORK/res/census.csv" c 1 3
expect_exit 1 "$WORK/res/census.csv: expected a regular file or nothing" "$A" census --dump "$WORK/d.h5" --out "$WORK/res"
[ -c "$WORK/res/census.csv" ] || { echo "FAIL: the device in the results folder was replaced"; exit 1; }
expect_no_file "$WORK/res/census.json"
# Negative control: a regular file of the same name is replaced as before.
expect_ok "$A" synth --out "$WORK/d2.h5" --images 1
expect_ok "$A" synth --out "$WORK/d2.h5" --images 2
[ -f "$WORK/d2.h5" ] && [ ! -L "$WORK/d2.h5" ] || { echo "FAIL: d2.h5"; exit 1; }

# Standard output that cannot be written.
m="$REPO/data/models/vit7-softmax-fmnist.h5"
sd="$REPO/data/dumps/vit7-softmax-fmnist.h5"
check_stdout() {  # check_stdout TARGET cmd args...: stdout to TARGET must fail with ENOSPC
  local target=$1; shift
  local rc=0
  "$@" >"$target" 2>"$WORK/err.txt" || rc=$?
  [ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, expected 1: $* > $target"; cat "$WORK/err.txt"; exit 1; }
  [ "$(wc -l <"$WORK/err.txt")" -eq 1 ] || { echo "FAIL: stderr of $*:"; cat "$WORK/err.txt"; exit 1; }
  grep -q "standard output: cannot write: No space left on device" "$WORK/err.txt" ||
    { echo "FAIL: $*:"; cat "$WORK/err.txt"; exit 1; }
}
check_stdout "$WORK/full" "$A" info "$WORK/d.h5"
check_stdout "$WORK/full" "$A" census --dump "$WORK/d.h5" --out "$WORK/c1"
check_stdout "$WORK/full" "$A" confusion --dump "$WORK/d.h5" --out "$WORK/c2"
check_stdout "$WORK/full" "$A" locality --dump "$WORK/d.h5" --out "$WORK/c3"
check_stdout "$WORK/full" "$A" spikiness --synthetic --synth-images 1 --out "$WORK/c4"
check_stdout "$WORK/full" "$A" verify --trials 2
check_stdout "$WORK/full" "$A" replay --model "$m" --dump "$sd" --images 0 --out "$WORK/c5"
check_stdout "$WORK/full" "$A" synth --out "$WORK/d3.h5" --images 1
# A run whose summary was lost failed: its result set is withdrawn (its files stay, no manifest).
for s in c1/census c2/confusion c3/locality c4/spikiness c5/replay; do expect_no_file "$WORK/$s.json"; done
expect_no_file "$WORK/d3.h5.json"
expect_grep "withdrew the result set $WORK/d3.h5.json" "$WORK/err.txt"   # said (synth's, the last)
# Negative control: the same run with a working standard output publishes its set.
expect_ok "$A" census --dump "$WORK/d.h5" --out "$WORK/c1"
[ -f "$WORK/c1/census.json" ] || { echo "FAIL: census.json not published"; exit 1; }
check_stdout "$WORK/full" "$A" --version
check_stdout "$WORK/full" "$A" info --families
T="$WORK/tmpfs"
mkdir -p "$T"
mount -t tmpfs -o size=64k tmpfs "$T"
trap 'umount "$T" 2>/dev/null || umount -l "$T"' EXIT
dd if=/dev/zero of="$T/filler" bs=4k 2>/dev/null || true   # fill it
check_stdout "$T/out.txt" "$A" info "$WORK/d.h5"
check_stdout "$T/out.txt" "$A" census --dump "$WORK/d.h5" --out "$WORK/c6"
# Negative control: the same commands to a regular file on a disk with room exit 0.
expect_ok "$A" info "$WORK/d.h5"
[ -s "$WORK/out.txt" ] || { echo "FAIL: info printed nothing"; exit 1; }
