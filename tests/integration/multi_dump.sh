# Several dump files read as one: a synth dump split into three shards with h5py gives, through
# confusion and locality, the same CSVs byte for byte as the single file (with --dump listing
# them or repeated, and under a tight --max-memory); the run JSON lists the files. Files that
# disagree, a bad second file and a budget below two images are refused on one line.
need_h5py

expect_ok "$ATTNSCOPE" synth --out "$WORK/all.h5" --images 10 --layers 3 --heads 2 --grid-height 4 \
  --grid-width 5 --head-dim 8 --plant-duplicates 2 --plant-collinear 1 --dtype f16 --seed 5

"$PYTHON" - "$WORK" <<'PY'
import sys, h5py
work = sys.argv[1]
with h5py.File(f"{work}/all.h5", "r") as src:
    for i, (a, b) in enumerate([(0, 3), (3, 4), (4, 10)]):
        with h5py.File(f"{work}/s{i}.h5", "w") as f:
            f.attrs.update(src.attrs)
            f.attrs["shard_first_image"] = a
            def copy(name, obj):
                if isinstance(obj, h5py.Dataset):
                    f.create_dataset(name, data=obj[a:b], chunks=(1,) + obj.shape[1:],
                                     compression="gzip", shuffle=True)
            src.visititems(copy)
PY

S="$WORK/s0.h5 $WORK/s1.h5 $WORK/s2.h5"
for cmd in confusion locality; do
  expect_ok "$ATTNSCOPE" $cmd --dump "$WORK/all.h5" --out "$WORK/one_$cmd" --threads 2
  # shellcheck disable=SC2086
  expect_ok "$ATTNSCOPE" $cmd --dump $S --out "$WORK/three_$cmd" --threads 2
  expect_ok "$ATTNSCOPE" $cmd --dump "$WORK/s0.h5" --dump "$WORK/s1.h5" "$WORK/s2.h5" \
    --out "$WORK/repeated_$cmd" --max-memory 30K --threads 1
  n=0
  for f in "$WORK/one_$cmd"/*.csv; do
    cmp "$f" "$WORK/three_$cmd/$(basename "$f")" || { echo "FAIL: $cmd $(basename "$f") differs (3 files)"; exit 1; }
    cmp "$f" "$WORK/repeated_$cmd/$(basename "$f")" || { echo "FAIL: $cmd $(basename "$f") differs (repeated --dump, 30K)"; exit 1; }
    n=$((n + 1))
  done
  [ "$n" -ge 1 ] || { echo "FAIL: $cmd wrote no CSV"; exit 1; }
  "$PYTHON" - "$WORK" "$cmd" <<'PY' || exit 1
import json, sys
work, cmd = sys.argv[1:]
one = json.load(open(f"{work}/one_{cmd}/{cmd}.json"))
three = json.load(open(f"{work}/three_{cmd}/{cmd}.json"))
assert one["inputs"]["dump"] == f"{work}/all.h5", one["inputs"]  # one file: a string, as ever
assert three["inputs"]["dump"] == [f"{work}/s{i}.h5" for i in range(3)], three["inputs"]
r = three["results"]
assert r["images"] == 10, r
assert 0 <= r["io_wait_seconds"] and 0 <= r["io_wait_share"] <= 1, r
q = json.load(open(f"{work}/repeated_{cmd}/{cmd}.json"))["results"]["read_queue"]
assert q["images_in_flight"] >= 2 and q["images_in_flight"] * q["image_bytes"] <= 30 * 1024 and q["images_in_flight"] < 16, q
PY
done

# A file of another shape: refused, naming both files, the attribute and both values.
expect_ok "$ATTNSCOPE" synth --out "$WORK/other.h5" --images 2 --layers 3 --heads 3 --grid-height 4 \
  --grid-width 5 --head-dim 8 --dtype f16
expect_exit 1 "attribute 'num_heads': expected 2 as in $WORK/s0.h5" \
  "$ATTNSCOPE" confusion --dump "$WORK/s0.h5" "$WORK/other.h5" --out "$WORK/x"
expect_grep "^attnscope confusion: $WORK/other.h5: .* found 3$" "$WORK/err.txt"
# A damaged second file is named.
head -c 2000 "$WORK/s1.h5" >"$WORK/cut.h5"
expect_exit 1 "$WORK/cut.h5" "$ATTNSCOPE" locality --dump "$WORK/s0.h5" "$WORK/cut.h5" --out "$WORK/x"
# Shards out of order.
expect_exit 1 "give the shards in order" "$ATTNSCOPE" locality --dump "$WORK/s1.h5" "$WORK/s0.h5" --out "$WORK/x"
# A budget below two images in flight names what is needed; nothing is written.
expect_exit 2 "--max-memory 10 KiB is too small" \
  "$ATTNSCOPE" confusion --dump $S --max-memory 10K --out "$WORK/small"
expect_grep "needs at least .* \([0-9]+ bytes\)" "$WORK/err.txt"
expect_no_file "$WORK/small/confusion.json"
expect_exit 2 "--max-memory: expected a size" "$ATTNSCOPE" locality --dump "$WORK/all.h5" --max-memory 2X --out "$WORK/x"
expect_exit 2 "--dump was given an empty value" "$ATTNSCOPE" locality --dump "$WORK/all.h5" "" --out "$WORK/x"
