# attnscope synth writes a dump and its metadata; attnscope info describes and validates it.

# The top-level help lists both commands; --version prints the version.
expect_ok "$ATTNSCOPE" --help
expect_grep '^  synth ' "$WORK/out.txt"
expect_grep '^  info ' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" --version
expect_grep '^attnscope [0-9]+\.[0-9]+\.[0-9]+$' "$WORK/out.txt"

# Every command's --help prints its usage line and exits 0.
for cmd in synth info; do
  expect_ok "$ATTNSCOPE" "$cmd" --help
  expect_grep "^usage: attnscope $cmd " "$WORK/out.txt"
  expect_grep '--help' "$WORK/out.txt"
done
expect_ok "$ATTNSCOPE" synth --help
for flag in --out --layers --heads --grid-height --grid-width --prefix --head-dim --images --dtype \
    --seed --threads --compression --family --convention --feature-map --plant-collinear \
    --plant-duplicates --plant-shifted --plant-hyperplane; do
  expect_grep "$flag" "$WORK/out.txt"
done

# A small odd shape: 2 layers, 3 heads, 2 prefix tokens + 3x4 grid = 14 tokens, head dim 5.
expect_ok "$ATTNSCOPE" synth --out "$WORK/s.h5" --layers 2 --heads 3 --prefix 2 --grid-height 3 \
  --grid-width 4 --head-dim 5 --images 6 --seed 9 --plant-duplicates 1 --plant-collinear 2 \
  --plant-hyperplane --plant-shifted 1 --threads 1
expect_empty "$WORK/err.txt"
expect_grep '^wrote .*s\.h5: 6 images, 2 layers x 3 heads, 14 tokens \(2 \+ 3x4\), head dim 5, float32' \
  "$WORK/out.txt"
[ -f "$WORK/s.h5" ] || { echo "FAIL: no dump"; exit 1; }
expect_no_file "$WORK/s.h5.tmp"

# The metadata JSON sits next to the dump and records the run.
"$PYTHON" - "$WORK/s.h5.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
assert m["command"] == "synth", m
cl = m["command_line"]
assert cl[1] == "synth" and "--out" in cl and cl[cl.index("--out") + 1].endswith("s.h5"), cl
for key in ("version", "start_time", "elapsed_s", "threads", "inputs", "parameters", "results"):
    assert key in m, key
p = m["parameters"]
assert (p["layers"], p["heads"], p["prefix"], p["grid_height"], p["grid_width"], p["head_dim"],
        p["images"], p["seed"], p["plant_collinear"], p["plant_hyperplane"]) == \
       (2, 3, 2, 3, 4, 5, 6, 9, 2, True), p
assert m["threads"] == 1, m["threads"]
assert m["results"]["num_tokens"] == 14 and m["results"]["bytes"] > 0, m["results"]
assert m["start_time"].endswith("Z") and "T" in m["start_time"], m["start_time"]
PY

expect_ok "$ATTNSCOPE" info "$WORK/s.h5"
expect_empty "$WORK/err.txt"
expect_grep '^shape +6 images x 2 layers x 3 heads x 14 tokens x 5 dims$' "$WORK/out.txt"
expect_grep '^tokens +14 = 2 prefix \+ 3x4 grid$' "$WORK/out.txt"
expect_grep '^dtype +float32$' "$WORK/out.txt"
expect_grep '^variant +softmax@paper' "$WORK/out.txt"
expect_grep '^  /layers/1/v +\[6, 3, 14, 5\] +float32 +chunks \[1, 3, 14, 5\] +filters shuffle\+gzip\(1\)$' \
  "$WORK/out.txt"
expect_grep '^schema +valid$' "$WORK/out.txt"
if grep -q '^values' "$WORK/out.txt"; then echo "FAIL: values checked without --check-values"; exit 1; fi

expect_ok "$ATTNSCOPE" info "$WORK/s.h5" --check-values
expect_grep '^values +all finite \(6 images read\)$' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" info --file "$WORK/s.h5"

# The same seed gives the same data; float16 and other recorded attributes.
expect_ok "$ATTNSCOPE" synth --out "$WORK/t.h5" --layers 2 --heads 3 --prefix 2 --grid-height 3 \
  --grid-width 4 --head-dim 5 --images 6 --seed 9 --plant-duplicates 1 --plant-collinear 2 \
  --plant-hyperplane --plant-shifted 1 --threads 2
"$PYTHON" - "$WORK/s.h5" "$WORK/t.h5" <<'PY' || exit 1
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
for l in range(2):
    for n in "qkv":
        assert np.array_equal(a[f"layers/{l}/{n}"][...], b[f"layers/{l}/{n}"][...]), (l, n)
PY
expect_ok "$ATTNSCOPE" synth --out "$WORK/h.h5" --dtype f16 --images 2 --family linear \
  --feature-map relu --convention code --compression 0
expect_ok "$ATTNSCOPE" info "$WORK/h.h5" --check-values
expect_grep '^dtype +float16$' "$WORK/out.txt"
expect_grep '^variant +linear:relu@code' "$WORK/out.txt"
expect_grep 'filters none$' "$WORK/out.txt"
# The default shape (the demo's): 4 layers, 3 heads, CLS + 7x7, head dim 16, 32 images.
expect_ok "$ATTNSCOPE" synth --out "$WORK/default.h5"
expect_grep '32 images, 4 layers x 3 heads, 50 tokens \(1 \+ 7x7\), head dim 16' "$WORK/out.txt"
