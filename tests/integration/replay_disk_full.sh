# replay on a full disk (a real 1 MiB tmpfs, 0 to 768 KiB left): every failure is one line naming
# the result file as published (never the staging folder or a part file) and the reason, exit 1,
# nothing published; or the complete set (was: `.attnscope-tmp-PID-.../replay_logits.part-0:
# cannot write`, no reason).
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: mounting a tmpfs needs root"; exit 77; fi
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
m="$REPO/data/models/vit7-softmax-fmnist.h5"
sd="$REPO/data/dumps/vit7-softmax-fmnist.h5"
T="$WORK/tmpfs"
mkdir -p "$T"
mount -t tmpfs -o size=1m tmpfs "$T"
trap 'umount "$T" 2>/dev/null || umount -l "$T"' EXIT
failed=0 published=0
for free_kib in 0 8 32 64 128 256 384 512 768; do
  rm -rf "${T:?}"/*
  avail=$(( $(stat -f -c '%a*%S' "$T") ))
  fill=$(( avail - free_kib * 1024 ))
  [ "$fill" -gt 0 ] && head -c "$fill" /dev/zero >"$T/filler" 2>/dev/null || true
  rc=0
  "$ATTNSCOPE" replay --model "$m" --dump "$sd" --images 0-63 --intervention none,local:3,random:9,f1 \
    --out "$T/out" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  if [ "$rc" -eq 0 ]; then
    published=$((published + 1))
    [ -f "$T/out/replay.json" ] || { echo "FAIL: exit 0 without replay.json at $free_kib KiB"; exit 1; }
    continue
  fi
  failed=$((failed + 1))
  [ "$rc" -eq 1 ] || { echo "FAIL: exit $rc at $free_kib KiB:"; cat "$WORK/err.txt"; exit 1; }
  [ "$(wc -l <"$WORK/err.txt")" -eq 1 ] || { echo "FAIL: stderr at $free_kib KiB:"; cat "$WORK/err.txt"; exit 1; }
  if grep -qE '\.attnscope-(tmp|staging)|\.part-' "$WORK/err.txt"; then
    echo "FAIL: the error names a temporary file at $free_kib KiB:"; cat "$WORK/err.txt"; exit 1
  fi
  grep -q "No space left on device" "$WORK/err.txt" ||
    { echo "FAIL: no reason at $free_kib KiB:"; cat "$WORK/err.txt"; exit 1; }
  grep -qE "$T/out/(replay(_logits)?\.(csv|json)|\.attnscope-partial/replay\.journal): " "$WORK/err.txt" ||
    { echo "FAIL: the error does not name the results at $free_kib KiB:"; cat "$WORK/err.txt"; exit 1; }
  [ ! -e "$T/out/replay.json" ] || { echo "FAIL: a set was published at $free_kib KiB"; exit 1; }
done
echo "replay on a full disk: $failed failed cleanly, $published published"
[ "$failed" -ge 3 ] || { echo "FAIL: the disk was never full enough to fail"; exit 1; }
