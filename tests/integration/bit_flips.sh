# One flipped bit in the global heap of an h5py-written file (where its string attributes live),
# or in an attribute's reference to it:
# every bit of the collection's header and of each entry's header, in a weights file and in a dump,
# read by info, an analysis and replay --model. Each run must end with exit 0 or 1 and at most one
# line on stderr: never a crash (HDF5 trusted the entry sizes: SIGSEGV in H5HG_read) and never an
# endless walk of the collection (an entry whose size became 0).
need_h5py
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
weights="$REPO/data/models/vit7-softmax-fmnist.h5"

# A small dump written by h5py (string attributes in its global heap), with images for replay.
expect_ok "$ATTNSCOPE" synth --out "$WORK/synth.h5" --images 2 --layers 2 --heads 2 --grid-height 2 \
  --grid-width 2 --head-dim 4
"$PYTHON" -c "import h5py, numpy as np
src = h5py.File('$WORK/synth.h5', 'r')
with h5py.File('$WORK/dump.h5', 'w') as f:
    for k, v in src.attrs.items():
        f.attrs[k] = v.decode() if isinstance(v, bytes) else v
    for l in range(2):
        for n in 'qkv': f[f'layers/{l}/{n}'] = src[f'layers/{l}/{n}'][...]"
expect_ok "$ATTNSCOPE" info "$WORK/dump.h5"

"$PYTHON" - "$ATTNSCOPE" "$WORK" "$weights" "$REPO/data/dumps/vit7-softmax-fmnist.h5" <<'PY' || exit 1
import os, struct, subprocess, sys
exe, work, weights, image_dump = sys.argv[1:5]

def heap_headers(b):
    """Offsets of the global heap collection's header and of every entry's 16-byte header."""
    g = b.find(b"GCOL")
    assert g >= 0, "no global heap collection: the file holds no variable-length strings"
    size = struct.unpack("<Q", b[g + 8:g + 16])[0]
    offsets, o = [g], g + 16
    while o + 16 <= g + size:
        idx, _, _, n = struct.unpack("<HHIQ", b[o:o + 16])
        offsets.append(o)
        if idx == 0:
            break
        o += 16 + (n + 7) // 8 * 8
    assert len(offsets) > 3, f"expected several strings in the heap, found {len(offsets) - 1}"
    return offsets

def flip_all(src, commands):
    b = bytearray(open(src, "rb").read())
    flipped = os.path.join(work, "flipped.h5")
    runs = refused = 0
    for start in heap_headers(b):
        for byte in range(start, start + 16):
            for bit in range(8):
                c = bytearray(b)
                c[byte] ^= 1 << bit
                open(flipped, "wb").write(c)
                for cmd in commands:
                    argv = [a.replace("FILE", flipped) for a in cmd]
                    try:
                        r = subprocess.run(argv, capture_output=True, timeout=30)
                    except subprocess.TimeoutExpired:
                        sys.exit(f"FAIL: {src} byte {byte} bit {bit}: {cmd[1]} ran past 30 s")
                    err = r.stderr.decode(errors="replace")
                    if r.returncode not in (0, 1) or err.count("\n") > 1:
                        sys.exit(f"FAIL: {src} byte {byte} bit {bit}: {cmd[1]} exit {r.returncode}: {err[-400:]}")
                    if r.returncode == 1 and "FILE" in " ".join(cmd) and flipped not in err:
                        sys.exit(f"FAIL: {src} byte {byte} bit {bit}: error names no file: {err}")
                    runs += 1
                    refused += r.returncode == 1
    return runs, refused

out = os.path.join(work, "out")
runs, refused = flip_all(weights, [
    [exe, "replay", "--model", "FILE", "--dump", image_dump, "--images", "0", "--out", out]])
print(f"weights: {runs} runs, {refused} refused")
assert refused > 100, "the flips must reach the strings the reader checks"
runs, refused = flip_all(os.path.join(work, "dump.h5"), [
    [exe, "info", "FILE"], [exe, "census", "--dump", "FILE", "--out", out]])
print(f"dump: {runs} runs, {refused} refused")
assert refused > 100
PY

# One bit flipped in a string attribute's heap reference (length, collection address, entry
# index) or in its string type's character size, inside the root object header of the weights file
# (a version-1 header: no checksum). HDF5 1.10 follows the reference unchecked (an index past its
# table: SIGSEGV; a character size of 2^31: gigabytes allocated); attnscope checks it first.
"$PYTHON" - "$ATTNSCOPE" "$WORK" "$weights" "$REPO/data/dumps/vit7-softmax-fmnist.h5" <<'PY' || exit 1
import os, struct, subprocess, sys
exe, work, weights, image_dump = sys.argv[1:5]
b = bytearray(open(weights, "rb").read())
g = b.find(b"GCOL")
refs, o = [], g + 16
while True:
    idx, _, _, n = struct.unpack("<HHIQ", b[o:o + 16])
    if idx == 0:
        break
    at = b.find(struct.pack("<IQI", n, g, idx))
    if at >= 0:
        refs.append(at)
    o += 16 + (n + 7) // 8 * 8
assert len(refs) >= 6, f"expected the string attributes' heap references, found {len(refs)}"
flipped, runs, refused = os.path.join(work, "ref.h5"), 0, 0
for at in refs:
    # the reference (16 bytes) and the base type's size (4 bytes, 20 before it in h5py's layout)
    for byte in list(range(at, at + 16)) + list(range(at - 20, at - 16)):
        for bit in range(8):
            c = bytearray(b)
            c[byte] ^= 1 << bit
            open(flipped, "wb").write(c)
            try:
                r = subprocess.run([exe, "replay", "--model", flipped, "--dump", image_dump, "--images", "0",
                                    "--out", os.path.join(work, "ref-out")], capture_output=True, timeout=30)
            except subprocess.TimeoutExpired:
                sys.exit(f"FAIL: byte {byte} bit {bit}: replay ran past 30 s")
            err = r.stderr.decode(errors="replace")
            if r.returncode not in (0, 1) or err.count("\n") > 1:
                sys.exit(f"FAIL: byte {byte} bit {bit}: exit {r.returncode}: {err[-400:]}")
            runs += 1
            refused += r.returncode == 1
print(f"heap references: {runs} runs, {refused} refused")
assert refused > runs // 2, (runs, refused)
PY

# The message for one such flip: the file, the attribute and the damaged entry.
"$PYTHON" -c "import struct
b = bytearray(open('$weights', 'rb').read()); g = b.find(b'GCOL')
b[g + 16 + 10] ^= 1   # bit 16 of the first entry's size
open('$WORK/one.h5', 'wb').write(b)"
expect_exit 1 "one.h5: attribute 'format': expected a readable string, found a damaged attribute: its heap reference says 21 bytes, the heap entry 1 holds 65557" \
  "$ATTNSCOPE" replay --model "$WORK/one.h5" --dump "$REPO/data/dumps/vit7-softmax-fmnist.h5" --out "$WORK/r"
# The same flip in a dump of the dumper (version-3 superblock: its headers are checksummed, the
# reference is not parsed here): the driver's walk of the collection refuses it.
"$PYTHON" -c "
b = bytearray(open('$REPO/data/dumps/vit7-softmax-fmnist.h5', 'rb').read()); g = b.find(b'GCOL')
assert b[8] >= 2, 'expected a version-2/3 superblock'
b[g + 16 + 10] ^= 1
open('$WORK/one-dump.h5', 'wb').write(b)"
expect_exit 1 "one-dump.h5: attribute 'format': expected a readable string, found damaged global heap collection at address" \
  "$ATTNSCOPE" info "$WORK/one-dump.h5"
