# Bad command lines: exit 2, one line on stderr naming the problem, and no output file left.

out="$WORK/x.h5"
expect_exit 2 "unrecognised option '--bogus'" "$ATTNSCOPE" synth --out "$out" --bogus
expect_exit 2 "'--layers' is invalid" "$ATTNSCOPE" synth --out "$out" --layers abc
expect_exit 2 "'--images' is invalid" "$ATTNSCOPE" synth --out "$out" --images 1.5
expect_exit 2 "--out" "$ATTNSCOPE" synth
expect_exit 2 "--dtype must be f32 or f16" "$ATTNSCOPE" synth --out "$out" --dtype f64
expect_exit 2 "head dim must be >= 1" "$ATTNSCOPE" synth --out "$out" --head-dim 0
expect_exit 2 "compression must be" "$ATTNSCOPE" synth --out "$out" --compression 12
expect_exit 2 "need 52 distinct tokens, there are 50" "$ATTNSCOPE" synth --out "$out" \
  --plant-duplicates 20 --plant-collinear 6
expect_exit 2 "shifted pairs need the planted hyperplane" "$ATTNSCOPE" synth --out "$out" \
  --plant-shifted 1
expect_exit 2 "family must be" "$ATTNSCOPE" synth --out "$out" --family cosine
expect_exit 2 "--threads must be >= 0" "$ATTNSCOPE" synth --out "$out" --threads -3
expect_exit 2 "the required argument for option '--layers' is missing" "$ATTNSCOPE" synth --out "$out" --layers
expect_no_file "$out" "$out.json"

expect_exit 2 "--file" "$ATTNSCOPE" info
expect_exit 2 "unrecognised option '--values'" "$ATTNSCOPE" info "$out" --values
expect_exit 2 "unexpected argument 'b.h5'" "$ATTNSCOPE" info a.h5 b.h5

# The dispatcher itself.
expect_fail "unknown command 'nosuch'" "$ATTNSCOPE" nosuch
rc=0; "$ATTNSCOPE" nosuch 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: unknown command exit $rc"; exit 1; }
rc=0; "$ATTNSCOPE" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: no command exit $rc"; exit 1; }

# An output path that cannot be written: exit 1 naming it, nothing left.
expect_exit 1 "$WORK/no/such/dir/x.h5" "$ATTNSCOPE" synth --out "$WORK/no/such/dir/x.h5"
echo "not a folder" >"$WORK/plain"
expect_exit 1 "$WORK/plain/x.h5" "$ATTNSCOPE" synth --out "$WORK/plain/x.h5"

# A layer too large for one HDF5 chunk is refused with the options (it failed with HDF5's words
# while creating the datasets); a failure after the output was started, running out of memory,
# leaves nothing either (caught, reported, exit 1).
big="$WORK/big.h5"
expect_exit 2 "--heads x tokens x --head-dim: one image's block of a layer would take 4608000512 bytes" \
  "$ATTNSCOPE" synth --out "$big" --grid-height 3000 --grid-width 3000 --head-dim 64 --images 1 --layers 1 --heads 2
expect_no_file "$big" "$big.json"
( ulimit -v 800000
  expect_exit 1 "attnscope synth: out of memory" "$ATTNSCOPE" synth --out "$big" \
    --grid-height 1000 --grid-width 1000 --head-dim 64 --images 1 --layers 1 --heads 1 --threads 1 )
expect_no_file "$big" "$big.json"
