# The progress bar goes to stderr only: never when stderr is not a terminal (unless forced), and
# it clears its line when done, so stdout and logs stay clean.
expect_ok "$ATTNSCOPE" synth --out "$WORK/a.h5" --images 3
expect_empty "$WORK/err.txt"

ATTNSCOPE_PROGRESS=always expect_ok "$ATTNSCOPE" synth --out "$WORK/b.h5" --images 3
expect_grep '^wrote ' "$WORK/out.txt"
expect_grep 'synth \[#*\.*\] [0-9]+/3 ' "$WORK/err.txt"
# The last thing written is "carriage return, clear to end of line".
tail -c 4 "$WORK/err.txt" | od -An -c | grep -q '\\r 033   \[   K' ||
  { echo "FAIL: the bar's line is not cleared at the end:"; od -c "$WORK/err.txt" | tail -3; exit 1; }
if grep -q 'synth \[' "$WORK/out.txt"; then echo "FAIL: progress on stdout"; exit 1; fi

ATTNSCOPE_PROGRESS=always expect_ok "$ATTNSCOPE" info "$WORK/b.h5" --check-values
expect_grep 'info \[' "$WORK/err.txt"
ATTNSCOPE_PROGRESS=never expect_ok "$ATTNSCOPE" info "$WORK/b.h5" --check-values
expect_empty "$WORK/err.txt"

# The bar shows done/total, the percentage, the rate and the ETA (the first image of a brute-force
# run over a 14x14 grid takes milliseconds, so the rate is measurable at the first draw).
expect_ok "$ATTNSCOPE" synth --out "$WORK/c.h5" --images 3 --grid-height 14 --grid-width 14
ATTNSCOPE_PROGRESS=always expect_ok "$ATTNSCOPE" confusion --dump "$WORK/c.h5" --reference \
  --threads 1 --out "$WORK/conf"
expect_grep 'confusion \[#*\.*\] [1-3]/3 [0-9]+% [0-9.]+/s( ETA [0-9]+s)?' "$WORK/err.txt"
