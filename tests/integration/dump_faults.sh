# Faults around a dump: unreadable chunks and filters, locked files, zero images, odd attributes
# and datasets, synth options that would give an unreadable dump, and source_layers in results.
need_h5py

expect_ok "$ATTNSCOPE" synth --out "$WORK/good.h5" --images 3 --layers 3 --heads 2 --grid-height 3 \
  --grid-width 3 --head-dim 4

py() { "$PYTHON" -c "import h5py, numpy as np, os, shutil, sys, time
$1"; }

# A chunk whose compressed bytes are damaged: one line with HDF5's diagnosis, from info and from
# an analysis (which reads on its prefetch thread); never HDF5's error stack.
py "shutil.copy('$WORK/good.h5', '$WORK/corrupt.h5')
f = h5py.File('$WORK/corrupt.h5', 'r'); c = f['layers/1/q'].id.get_chunk_info(1); f.close()
b = bytearray(open('$WORK/corrupt.h5', 'rb').read())
for i in range(c.byte_offset + 2, c.byte_offset + c.size - 2): b[i] ^= 0x5a
open('$WORK/corrupt.h5', 'wb').write(b)"
expect_exit 1 "/layers/1/q: expected readable data at image 1, found a read error (inflate() failed)" \
  "$ATTNSCOPE" info "$WORK/corrupt.h5" --check-values
expect_exit 1 "/layers/1/q: expected readable data at image 1, found a read error (inflate() failed)" \
  "$ATTNSCOPE" confusion --dump "$WORK/corrupt.h5" --out "$WORK/c"

# A filter libhdf5 lacks (h5py's lzf): refused when opening, by info too.
py "shutil.copy('$WORK/good.h5', '$WORK/lzf.h5')
f = h5py.File('$WORK/lzf.h5', 'r+'); x = f['layers/2/v'][...]; del f['layers/2/v']
f.create_dataset('layers/2/v', data=np.ones_like(x), chunks=(1,) + x.shape[1:], compression='lzf')"
expect_exit 1 "/layers/2/v: expected compression filters this HDF5 provides, found filter 32000 (lzf)" \
  "$ATTNSCOPE" info "$WORK/lzf.h5"
expect_empty "$WORK/out.txt"

# A file a writer holds open (HDF5's file lock) is "locked", with the way to read it anyway.
"$PYTHON" -c "import h5py, time
f = h5py.File('$WORK/good.h5', 'r+'); open('$WORK/ready', 'w').close(); time.sleep(60)" &
writer=$!
for _ in $(seq 100); do [ -e "$WORK/ready" ] && break; sleep 0.1; done
expect_exit 1 "found a file locked by another process" "$ATTNSCOPE" info "$WORK/good.h5"
expect_grep "HDF5_USE_FILE_LOCKING=FALSE" "$WORK/err.txt"
HDF5_USE_FILE_LOCKING=FALSE expect_ok "$ATTNSCOPE" info "$WORK/good.h5"
kill "$writer"; wait "$writer" 2>/dev/null || true

# A writer killed before closing leaves the "open for writing" mark: say so, and how to clear it.
py "src = h5py.File('$WORK/good.h5', 'r')
f = h5py.File('$WORK/stale.h5', 'w', libver='latest')
f.attrs.update(src.attrs)
for l in range(3):
    for n in 'qkv': f[f'layers/{l}/{n}'] = src[f'layers/{l}/{n}'][...]
f.flush(); os._exit(0)"
expect_exit 1 "found a file marked as open for writing" "$ATTNSCOPE" info "$WORK/stale.h5"
expect_grep "h5clear -s $WORK/stale.h5" "$WORK/err.txt"
if command -v h5clear >/dev/null; then
  h5clear -s "$WORK/stale.h5"
  expect_ok "$ATTNSCOPE" info "$WORK/stale.h5"
fi

# Zero images: not valid, said plainly.
py "shutil.copy('$WORK/good.h5', '$WORK/zero.h5'); f = h5py.File('$WORK/zero.h5', 'r+')
for l in range(3):
    for n in 'qkv': f[f'layers/{l}/{n}'].resize(0, axis=0)"
expect_exit 1 "/layers/0/q: expected at least one image, found no images" "$ATTNSCOPE" info "$WORK/zero.h5"
expect_empty "$WORK/out.txt"

# Smaller ones: a scalar q, a uint64 attribute, an extra layer group, nothing half-printed.
py "shutil.copy('$WORK/good.h5', '$WORK/scalar.h5'); f = h5py.File('$WORK/scalar.h5', 'r+')
del f['layers/0/q']; f['layers/0/q'] = np.float32(1)"
expect_exit 1 "/layers/0/q: expected a 4-D dataset [images, heads, tokens, dim], found a scalar" \
  "$ATTNSCOPE" info "$WORK/scalar.h5"
py "shutil.copy('$WORK/good.h5', '$WORK/u64.h5'); f = h5py.File('$WORK/u64.h5', 'r+')
f.attrs['num_heads'] = np.uint64(2**64 - 1)"
expect_exit 1 "attribute 'num_heads': expected an integer below 2^30, found 18446744073709551615" \
  "$ATTNSCOPE" info "$WORK/u64.h5"
py "shutil.copy('$WORK/good.h5', '$WORK/extra.h5'); f = h5py.File('$WORK/extra.h5', 'r+')
f.copy('layers/2', 'layers/3')"
expect_ok "$ATTNSCOPE" info "$WORK/extra.h5"
expect_grep '^attnscope info: warning: .*extra.h5: /layers/3: not among the num_layers = 3 layer groups, ignored$' \
  "$WORK/err.txt"
[ "$(wc -l <"$WORK/err.txt")" -eq 1 ] || { echo "FAIL: more than one warning line"; exit 1; }
py "shutil.copy('$WORK/good.h5', '$WORK/badmap.h5'); f = h5py.File('$WORK/badmap.h5', 'r+')
f.attrs['feature_map'] = 'sigmoid'"
expect_exit 1 "attribute 'feature_map'" "$ATTNSCOPE" info "$WORK/badmap.h5"
expect_empty "$WORK/out.txt"

# synth refuses what its own info would refuse, before writing anything.
expect_exit 2 "--family, --feature-map would write a dump that readers refuse" \
  "$ATTNSCOPE" synth --out "$WORK/s1.h5" --family linear --feature-map none
expect_exit 2 "--layers would write a dump that readers refuse" \
  "$ATTNSCOPE" synth --out "$WORK/s2.h5" --layers 2000000000
expect_exit 2 "images must be >= 1" "$ATTNSCOPE" synth --out "$WORK/s3.h5" --images 0
expect_no_file "$WORK/s1.h5" "$WORK/s2.h5" "$WORK/s3.h5"

# A feature map whose d x d matrix cannot be had names it and its size.
expect_ok "$ATTNSCOPE" synth --out "$WORK/wide.h5" --head-dim 200000 --images 1 --layers 1 --heads 1 \
  --grid-height 1 --grid-width 2 --prefix 0 --compression 0
expect_exit 1 "200000 x 200000 matrix of 320000000000 bytes" \
  "$ATTNSCOPE" confusion --dump "$WORK/wide.h5" --out "$WORK/w" --variant linear:relu_affine=1
