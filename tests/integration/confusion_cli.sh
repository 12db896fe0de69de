# attnscope confusion: result files and columns, fast counts equal to the brute force on a dump
# with planted pairs, selections, and bad input (flags and malformed dumps).
dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 6 --layers 2 --heads 2 --dtype f16 \
  --plant-duplicates 1 --plant-collinear 2 --plant-shifted 1 --plant-hyperplane

variants=softmax,linear:relu,inline,mala:elu1@code
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/fast" --variant "$variants"
expect_grep '>=32' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/ref" --variant "$variants" --reference
for f in confusion_per_image.csv confusion_per_head.csv confusion_histogram.csv; do
  cmp "$WORK/fast/$f" "$WORK/ref/$f" || { echo "FAIL: $f differs from the brute force"; exit 1; }
done
[ "$(head -1 "$WORK/fast/confusion_per_image.csv")" = "variant,image,count,degenerate_pairs" ] || { echo "FAIL: per_image header"; exit 1; }
[ "$(head -1 "$WORK/fast/confusion_per_head.csv")" = "variant,layer,head,count,degenerate_rows,degenerate_pairs" ] || { echo "FAIL: per_head header"; exit 1; }
[ "$(head -1 "$WORK/fast/confusion_histogram.csv")" = "variant,bin,images,images_with_degenerate_pairs" ] || { echo "FAIL: histogram header"; exit 1; }
[ "$(wc -l <"$WORK/fast/confusion_per_image.csv")" -eq 25 ] || { echo "FAIL: 4 variants x 6 images expected"; exit 1; }
[ "$(wc -l <"$WORK/fast/confusion_histogram.csv")" -eq 29 ] || { echo "FAIL: 4 variants x 7 bins expected"; exit 1; }
expect_grep '^linear:relu@paper,0,1,' "$WORK/fast/confusion_per_head.csv"
# Each histogram (both columns) sums to the number of images.
awk -F, 'NR > 1 { s[$1] += $3; t[$1] += $4 } END { for (v in s) if (s[v] != 6 || t[v] != 6) { print "FAIL: " v " histograms sum to " s[v] ", " t[v]; exit 1 } }' \
  "$WORK/fast/confusion_histogram.csv"
# The planted shifted pair gives every softmax head at least one confused pair per image.
awk -F, '$1 == "softmax@paper" && $4 < 6 { print "FAIL: softmax head " $2 "," $3 " counted " $4; exit 1 }' \
  "$WORK/fast/confusion_per_head.csv"
expect_grep '"eps": 0.001' "$WORK/fast/confusion.json"

# Default variant is the dump's own; selections and the query transform.
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/sel" --images 1-2,5 --layers 1 --heads 0 --transform f1
[ "$(wc -l <"$WORK/sel/confusion_per_image.csv")" -eq 4 ] || { echo "FAIL: 3 images expected"; exit 1; }
[ "$(wc -l <"$WORK/sel/confusion_per_head.csv")" -eq 2 ] || { echo "FAIL: 1 head expected"; exit 1; }
expect_grep '^softmax@paper,5,' "$WORK/sel/confusion_per_image.csv"
expect_grep '"transform": "f1"' "$WORK/sel/confusion.json"

# Bad flags.
expect_exit 2 "image index 6 out of range" "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/x" --images 6
expect_exit 2 "--layers" "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/x" --layers 1-x
expect_exit 2 "--eps" "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/x" --eps -1
expect_exit 2 "bogus" "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/x" --variant bogus
expect_exit 2 "--dump" "$ATTNSCOPE" confusion --out "$WORK/x"
expect_no_file "$WORK/x/confusion_per_image.csv"

# Malformed dumps: one line on stderr, exit 1, no result files.
need_h5py
edit() {  # edit NAME PYTHON-STATEMENTS (f is the open copy of the dump)
  cp "$dump" "$WORK/$1.h5"
  "$PYTHON" -c "import h5py, numpy as np
f = h5py.File('$WORK/$1.h5', 'r+')
$2
f.close()"
}
expect_exit 1 "$WORK/absent.h5" "$ATTNSCOPE" confusion --dump "$WORK/absent.h5" --out "$WORK/bad"
edit nok 'del f["layers/1/k"]'
expect_exit 1 "/layers/1/k" "$ATTNSCOPE" confusion --dump "$WORK/nok.h5" --out "$WORK/bad"
edit nan 'd = f["layers/1/q"]; x = d[4]; x[1, 3, 2] = np.nan; d[4] = x'
expect_exit 1 "/layers/1/q" "$ATTNSCOPE" confusion --dump "$WORK/nan.h5" --out "$WORK/bad"
edit shape 'd = f["layers/0/q"][:, :, :, :8]; del f["layers/0/q"]; f["layers/0/q"] = d'
expect_exit 1 "/layers/0/q" "$ATTNSCOPE" confusion --dump "$WORK/shape.h5" --out "$WORK/bad"
expect_no_file "$WORK/bad/confusion_per_image.csv" "$WORK/bad/confusion_per_head.csv" \
  "$WORK/bad/confusion_histogram.csv" "$WORK/bad/confusion.json"
