# attnscope mask: the help, the tables and their columns, one row per variant x mask x layer x
# head, the same random draw for a fixed seed, empty rows reported, bad flags.
expect_ok "$ATTNSCOPE" mask --help
expect_grep '^usage: attnscope mask ' "$WORK/out.txt"
for flag in --dump --variant --images --layers --heads --mask --threads --seed --out; do
  expect_grep "$flag" "$WORK/out.txt"
done

expect_ok "$ATTNSCOPE" synth --out "$WORK/s.h5" --images 3 --layers 2 --heads 2 --seed 7
expect_ok "$ATTNSCOPE" mask --dump "$WORK/s.h5" --out "$WORK/a" --variant softmax,inline@code \
  --mask local:3,random:9 --seed 1
expect_empty "$WORK/err.txt"
expect_grep "^local:3 +[0-9.e-]+ \\(" "$WORK/out.txt"
expect_grep '^variant,mask,layer,head,values,change_mean,change_std,change_min,change_max,removed_mass_mean,removed_mass_std,empty_rows,degenerate_rows,unmeasured$' \
  "$WORK/a/mask_per_head.csv"
[ "$(($(wc -l <"$WORK/a/mask_per_head.csv") - 1))" -eq $((2 * 2 * 2 * 2)) ] || { echo "FAIL: rows"; exit 1; }
[ "$(($(wc -l <"$WORK/a/mask.csv") - 1))" -eq 4 ] || { echo "FAIL: summary rows"; exit 1; }
# Each head contributes one change value per image.
awk -F, 'NR > 1 && $5 != 3 { bad = 1 } END { exit bad }' "$WORK/a/mask_per_head.csv" ||
  { echo "FAIL: values per head"; exit 1; }
expect_grep '"totals"' "$WORK/a/mask.json"

# Seeded: the same seed gives the same tables; another seed another random draw.
expect_ok "$ATTNSCOPE" mask --dump "$WORK/s.h5" --out "$WORK/b" --variant softmax,inline@code \
  --mask local:3,random:9 --seed 1
cmp "$WORK/a/mask_per_head.csv" "$WORK/b/mask_per_head.csv" || { echo "FAIL: not reproducible"; exit 1; }
expect_ok "$ATTNSCOPE" mask --dump "$WORK/s.h5" --out "$WORK/c" --variant softmax --mask random:9 --seed 2
[ "$(grep -c '^softmax@paper,random:9' "$WORK/a/mask_per_head.csv")" -eq 4 ] || { echo "FAIL: a"; exit 1; }
if diff <(grep '^softmax@paper,random:9' "$WORK/a/mask_per_head.csv") \
        <(grep '^softmax@paper,random:9' "$WORK/c/mask_per_head.csv") >/dev/null; then
  echo "FAIL: --seed does not change the random draw"; exit 1
fi

# A window covering the whole grid of a dump without prefix tokens leaves rows with no key:
# reported as empty, never a division by zero, and a run where nothing is left exits 4.
expect_ok "$ATTNSCOPE" synth --out "$WORK/np.h5" --images 1 --layers 1 --heads 1 --prefix 0 \
  --grid-height 3 --grid-width 3 --seed 7
expect_exit 4 "no head output could be compared" "$ATTNSCOPE" mask --dump "$WORK/np.h5" \
  --out "$WORK/d" --mask local:5
expect_no_file "$WORK/d/mask.csv" "$WORK/d/mask.json"
expect_ok "$ATTNSCOPE" mask --dump "$WORK/np.h5" --out "$WORK/e" --mask local:5,local:1
expect_grep '^softmax@paper,local:5,0,,,,,,,9,0,1$' "$WORK/e/mask.csv"
expect_grep "9 empty" "$WORK/out.txt"

# Bad flags: exit 2, one line, nothing written.
expect_exit 2 "--mask 'local:4': K must be odd" "$ATTNSCOPE" mask --dump "$WORK/s.h5" --out "$WORK/f" --mask local:4
expect_exit 2 "--mask 'gauss:3': unknown mask kind" "$ATTNSCOPE" mask --dump "$WORK/s.h5" --out "$WORK/f" --mask gauss:3
expect_exit 2 "named twice" "$ATTNSCOPE" mask --dump "$WORK/s.h5" --out "$WORK/f" --mask random:9,random:9
expect_no_file "$WORK/f/mask.csv"
