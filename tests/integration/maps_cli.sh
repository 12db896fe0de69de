# attnscope maps: the HDF5 and CSV maps of chosen tokens, and bad input.
dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 2 --layers 2 --heads 2 --grid-height 4 --grid-width 5

expect_ok "$ATTNSCOPE" maps --dump "$dump" --out "$WORK/m" --tokens 0,2:3 --images 0-1 --layers 1 \
  --variant softmax,inline
csv="$WORK/m/maps.csv"
[ "$(head -1 "$csv")" = "variant,image,layer,head,query,query_row,query_col,row,col,weight" ] || { echo "FAIL: header"; exit 1; }
# 2 variants x 2 images x 1 layer x 2 heads x 2 tokens x 20 cells.
[ "$(wc -l <"$csv")" -eq 321 ] || { echo "FAIL: $(wc -l <"$csv") lines"; exit 1; }
expect_grep '^softmax@paper,1,1,0,14,2,3,3,4,' "$csv"
expect_grep '^inline:identity@paper,0,1,1,0,-1,-1,0,0,' "$csv"
need_h5py
"$PYTHON" - "$WORK/m/maps.h5" "$csv" <<'PY' || exit 1
import csv, sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
m = f["softmax@paper/image_1/layer_1/head_0/query_14"]
assert m.shape == (4, 5), m.shape
assert m.attrs["query_row"] == 2 and m.attrs["query_col"] == 3
total = m[()].sum() + m.attrs["prefix_weights"].sum()
assert abs(total - 1) < 1e-12, total
rows = [r for r in csv.DictReader(open(sys.argv[2])) if r["variant"] == "softmax@paper" and r["image"] == "1"
        and r["head"] == "0" and r["query"] == "14"]
grid = np.zeros((4, 5))
for r in rows:
    grid[int(r["row"]), int(r["col"])] = float(r["weight"])
assert np.array_equal(grid, m[()]), "CSV and HDF5 disagree"
PY

expect_exit 2 "--tokens" "$ATTNSCOPE" maps --dump "$dump" --out "$WORK/x" --tokens 4:0
expect_exit 2 "--tokens" "$ATTNSCOPE" maps --dump "$dump" --out "$WORK/x" --tokens 21
expect_exit 2 "--tokens" "$ATTNSCOPE" maps --dump "$dump" --out "$WORK/x"
expect_no_file "$WORK/x/maps.csv" "$WORK/x/maps.h5"

cp "$dump" "$WORK/nov.h5"
"$PYTHON" -c "import h5py; f = h5py.File('$WORK/nov.h5', 'r+'); del f['layers/0/v']; f.close()"
expect_exit 1 "/layers/0/v" "$ATTNSCOPE" maps --dump "$WORK/nov.h5" --out "$WORK/bad" --tokens 0
expect_no_file "$WORK/bad/maps.csv" "$WORK/bad/maps.h5"
