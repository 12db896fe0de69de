# attnscope locality: columns, agreement with the brute force, window and baseline, bad input.
dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 3 --layers 2 --heads 2 --grid-height 5 --grid-width 6

expect_ok "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/fast" --variant softmax,linear:elu1,inline@code
expect_grep 'uniform rows' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/ref" --variant softmax,linear:elu1,inline@code --reference
csv="$WORK/fast/locality.csv"
[ "$(head -1 "$csv")" = "variant,layer,head,window,mean,std,min,max,queries,uniform_baseline" ] || { echo "FAIL: header"; exit 1; }
[ "$(wc -l <"$csv")" -eq 13 ] || { echo "FAIL: 3 variants x 4 heads expected"; exit 1; }
# 3 images x 30 grid queries; baseline (4 corners x 4 + 14 edges x 6 + 12 interior x 9) / 30 / 31.
awk -F, 'NR > 1 && $9 != 90 { print "FAIL: queries " $9; exit 1 }' "$csv"
awk -F, 'NR > 1 { b = (4*4 + 14*6 + 12*9) / 30 / 31; if ($10 - b > 1e-9 || b - $10 > 1e-9) { print "FAIL: baseline " $10 " vs " b; exit 1 } }' "$csv"
paste -d, "$csv" "$WORK/ref/locality.csv" | awk -F, 'NR > 1 { d = $5 - $15; if (d < 0) d = -d; if (d > 1e-5) { print "FAIL: mean " $5 " vs reference " $15 " (" $1 " " $2 " " $3 ")"; exit 1 } }'
# Softmax masses are in [0, 1].
awk -F, '$1 == "softmax@paper" && ($7 < 0 || $8 > 1.000001) { print "FAIL: range " $0; exit 1 }' "$csv"

expect_ok "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/w5" --window 5 --heads 1 --transform l2norm
expect_grep '^softmax@paper,1,1,5,' "$WORK/w5/locality.csv"

expect_exit 2 "--window must be a positive odd number" "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/x" --window 4
expect_exit 2 "head index 2 out of range" "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/x" --heads 2
expect_exit 2 "unknown query transform" "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/x" --transform f9
expect_no_file "$WORK/x/locality.csv"

need_h5py
cp "$dump" "$WORK/attr.h5"
"$PYTHON" -c "import h5py; f = h5py.File('$WORK/attr.h5', 'r+'); f.attrs['grid_width'] = 7; f.close()"
expect_exit 1 "$WORK/attr.h5" "$ATTNSCOPE" locality --dump "$WORK/attr.h5" --out "$WORK/bad"
cp "$dump" "$WORK/inf.h5"
"$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/inf.h5', 'r+'); d = f['layers/1/k']; x = d[2]; x[0, 5, 1] = np.inf; d[2] = x; f.close()"
expect_exit 1 "/layers/1/k" "$ATTNSCOPE" locality --dump "$WORK/inf.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/locality.csv" "$WORK/bad/locality.json"
