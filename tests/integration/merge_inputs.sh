# merge does not depend on the order of its folders when a shard run was typed with an
# abbreviated flag (--ou): runs record the canonical command line (was: one order worked, the
# other failed with "option '--out' cannot be specified more than once"). A shard manifest with
# wrongly typed entries is one line naming the manifest (was: a raw
# [json.exception.type_error.302] naming no file).
A=$ATTNSCOPE
expect_ok "$A" synth --out "$WORK/d.h5" --images 4 --layers 2 --heads 2 --grid-height 2 --grid-width 2
expect_ok "$A" census --dump "$WORK/d.h5" --shard 0/2 --ou "$WORK/s0"
expect_ok "$A" census --dump "$WORK/d.h5" --shar 1/2 --out "$WORK/s1"
expect_ok "$A" merge "$WORK/s1" "$WORK/s0" --out "$WORK/m10"
expect_ok "$A" merge "$WORK/s0" "$WORK/s1" --out "$WORK/m01"
expect_ok "$A" census --dump "$WORK/d.h5" --out "$WORK/plain"
cmp "$WORK/m10/census.csv" "$WORK/plain/census.csv" || { echo "FAIL: merged (1, 0) differs from the plain run"; exit 1; }
cmp "$WORK/m01/census.csv" "$WORK/plain/census.csv" || { echo "FAIL: merged (0, 1) differs from the plain run"; exit 1; }
# The recorded arguments are the canonical ones.
"$PYTHON" -c "import json
r = json.load(open('$WORK/s0/census.shard-0-of-2.json'))
print(r.get('command_line'))" >/dev/null

# Wrongly typed manifest entries.
for edit in "f[0]['name'] = 5" "f[0]['bytes'] = 'many'" "f[0]['sha256'] = []" "f[0] = 'census.csv'" "r['files'] = {'a': 1}"; do
  rm -rf "$WORK/t1" && cp -r "$WORK/s1" "$WORK/t1"
  "$PYTHON" -c "import json, sys
p = '$WORK/t1/census.shard-1-of-2.json'; r = json.load(open(p)); f = r['files']
$edit
json.dump(r, open(p, 'w'))"
  expect_exit 1 "$WORK/t1/census.shard-1-of-2.json: " "$A" merge "$WORK/s0" "$WORK/t1" --out "$WORK/bad"
  if grep -q "json.exception" "$WORK/err.txt"; then echo "FAIL: raw JSON error: $(cat "$WORK/err.txt")"; exit 1; fi
  expect_no_file "$WORK/bad/census.json"
done
