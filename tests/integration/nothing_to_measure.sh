# No data is not zero: a dump without images, or a selection whose every attention row is
# degenerate (a zero denominator), ends with one line saying so and exit 4, and writes no result
# file that could pass for a measurement.
need_h5py
expect_ok "$ATTNSCOPE" synth --out lin.h5 --images 2 --layers 2 --heads 2 --family linear \
  --feature-map relu

# neg.h5: every query negative, so relu(q) = 0: every linear:relu row has a zero denominator.
# half.h5: the same in layer 0 only. empty.h5: zero images.
"$PYTHON" - <<'PY'
import h5py, numpy as np
def copy(dst_name, change):
    with h5py.File("lin.h5", "r") as src, h5py.File(dst_name, "w") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        for l in range(int(src.attrs["num_layers"])):
            g = dst.create_group(f"layers/{l}")
            for n in "qkv":
                g.create_dataset(n, data=change(l, n, src[f"layers/{l}/{n}"][...]))
neg = lambda l, n, x: -(np.abs(x) + 1) if n == "q" else x
copy("neg.h5", neg)
copy("half.h5", lambda l, n, x: neg(l, n, x) if l == 0 else x)
copy("empty.h5", lambda l, n, x: x[:0])
PY

# expect_nothing "substring" cmd...: exit 4, one line naming why, nothing on stdout.
expect_nothing() {
  expect_exit 4 "$@"
  expect_empty "$WORK/out.txt"
}

runs=(
  "confusion --variant linear:relu"
  "locality --variant linear:relu"
  "census --variant linear:relu"
  "maps --variant linear:relu --tokens 5,9"
  "spikiness --variant linear:relu --samples 6 --scales 0.5:2:3"
  "mask --variant linear:relu --mask local:3,random:9"
  "distance --variant linear:relu"
  "entropy --variant linear:relu"
  "sinks --variant linear:relu"
  "rank --variant linear:relu"
  "rollout --variant linear:relu"
)
for a in "${runs[@]}"; do
  read -r -a cmd <<<"$a"
  expect_nothing "no valid queries" "$ATTNSCOPE" "${cmd[@]}" --dump neg.h5 --out "r-${cmd[0]}"
  [ -z "$(ls -A "r-${cmd[0]}" 2>/dev/null)" ] || { echo "FAIL: ${cmd[0]} left files:"; ls -la "r-${cmd[0]}"; exit 1; }
  # The same runs over valid rows succeed.
  expect_ok "$ATTNSCOPE" "${cmd[@]}" --dump lin.h5 --out "ok-${cmd[0]}"
done

# A dump with no image: every analysis says so. (The reader may also refuse such a dump as bad
# input, exit 1; either way nothing is measured, nothing is written and nothing goes to stdout.)
for a in confusion locality census "maps --tokens 5" "spikiness --samples 4" "recompute" mask distance entropy sinks rank rollout; do
  read -r -a cmd <<<"$a"
  rc=0
  "$ATTNSCOPE" "${cmd[@]}" --dump empty.h5 --out "e-${cmd[0]}" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  case $rc in
    4) expect_nothing "no images: empty.h5 holds 0 images" "$ATTNSCOPE" "${cmd[@]}" --dump empty.h5 --out "e-${cmd[0]}" ;;
    1) expect_exit 1 "empty.h5" "$ATTNSCOPE" "${cmd[@]}" --dump empty.h5 --out "e-${cmd[0]}" ;;
    *) echo "FAIL: ${cmd[0]} on a dump without images: exit $rc"; cat "$WORK/out.txt" "$WORK/err.txt"; exit 1 ;;
  esac
  [ ! -e "e-${cmd[0]}" ] || { echo "FAIL: ${cmd[0]} created e-${cmd[0]}"; ls -la "e-${cmd[0]}"; exit 1; }
done

# Degenerate rows among valid ones: maps skips them (never a map of zeros) and says how many
# (image 0, the default: 2 heads x 2 tokens in layer 0).
expect_ok "$ATTNSCOPE" maps --dump half.h5 --variant linear:relu --tokens 5,9 --out m
expect_grep "^skipped 4 degenerate rows" "$WORK/out.txt"
expect_grep '"degenerate_rows_skipped": 4' m/maps.json
if grep -q '^linear:relu@paper,[0-9]*,0,' m/maps.csv; then
  echo "FAIL: maps.csv holds maps of degenerate layer-0 rows"; exit 1
fi
expect_grep '^linear:relu@paper,0,1,0,5,' m/maps.csv
