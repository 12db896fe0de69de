# attnscope confusion: counts per layer (confusion_per_layer.csv, confusion_per_image_layer.csv,
# the summary and the JSON record) and the token filter --exclude-tokens: constant patches of
# /images against an independent numpy computation (given back as a mask), the same counts as the
# brute force, a mask of zeros changes nothing, and bad filters or masks give one line and no
# result files.
need_h5py
dump="$WORK/d.h5"
expect_ok "$ATTNSCOPE" synth --out "$dump" --images 6 --layers 3 --heads 2 --head-dim 8 \
  --plant-collinear 6 --plant-shifted 6 --plant-hyperplane --seed 5
cp "$dump" "$WORK/no_images.h5"
# /images [6, 1, 14, 14] (2 x 2 patches of the 7 x 7 grid): a flat background with noise in the
# cells (r, c), (r + c + i) % 3 != 0 of image i; image 1 also has one background patch with one
# pixel off (kept: the negative control). The masks: numpy's own constant patches, zeros, ones,
# and bad ones.
"$PYTHON" - "$dump" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    n, N = 6, 50
    px = np.full((n, 1, 14, 14), -0.42, dtype=np.float32)
    rng = np.random.default_rng(3)
    for i in range(n):
        for r in range(7):
            for c in range(7):
                if (r + c + i) % 3 != 0:
                    px[i, 0, 2*r:2*r+2, 2*c:2*c+2] = rng.standard_normal((2, 2))
    assert (0 + 2 + 1) % 3 == 0, "cell (0, 2) of image 1 is background"
    px[1, 0, 1, 5] = np.nextafter(np.float32(-0.42), np.float32(0))  # cell (0, 2) of image 1
    f["images"] = px
    p = px.reshape(n, 7, 2, 7, 2).transpose(0, 1, 3, 2, 4).reshape(n, 49, 4)
    constant = (p == p[:, :, :1]).all(-1)
    mask = np.zeros((n, N), dtype=bool)
    mask[:, 1:] = constant
    assert not mask[1, 1 + 2], "the patch one pixel off is kept"
    f["token_masks/constant"] = mask
    f["token_masks/zeros"] = np.zeros((n, N), dtype=np.uint8)
    f["token_masks/ones"] = np.ones((n, N), dtype=np.uint8)
    f["bad/shape"] = np.zeros((n, N - 1), dtype=np.uint8)
    f["bad/int64"] = np.zeros((n, N), dtype=np.int64)
    two = np.zeros((n, N), dtype=np.uint8); two[4, 7] = 2
    f["bad/value"] = two
    np.savetxt(sys.argv[1] + ".excluded.txt", mask.sum(1), fmt="%d")
PY

V=softmax,linear:relu,inline,mala:elu1@code
# Per layer, without a filter: the new files, their headers, and sums that agree with each other.
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/plain" --variant "$V"
expect_grep '^confused pairs per layer: mean per image \(total over 6 images\)$' "$WORK/out.txt"
expect_grep '^layer +softmax@paper +linear:relu@paper +inline:identity@paper +mala:elu1@code' "$WORK/out.txt"
expect_grep '^tokens excluded: none' "$WORK/out.txt"
[ "$(head -1 "$WORK/plain/confusion_per_layer.csv")" = \
  "variant,layer,count,images,mean_per_image,images_with_pairs,degenerate_pairs" ] || { echo "FAIL: per_layer header"; exit 1; }
[ "$(head -1 "$WORK/plain/confusion_per_image_layer.csv")" = "variant,image,layer,count,degenerate_pairs" ] \
  || { echo "FAIL: per_image_layer header"; exit 1; }
[ "$(wc -l <"$WORK/plain/confusion_per_layer.csv")" -eq 13 ] || { echo "FAIL: 4 variants x 3 layers expected"; exit 1; }
[ "$(wc -l <"$WORK/plain/confusion_per_image_layer.csv")" -eq 73 ] || { echo "FAIL: 4 x 6 images x 3 layers expected"; exit 1; }
expect_no_file "$WORK/plain/confusion_excluded_tokens.csv"
expect_grep '"exclude_tokens": "none"' "$WORK/plain/confusion.json"
check_sums() {  # check_sums DIR: per layer = sum of heads = sum of images; per image = sum of layers
  "$PYTHON" - "$1" <<'PY' || exit 1
import csv, json, sys
from collections import defaultdict
d = sys.argv[1]
rows = lambda name: list(csv.DictReader(open(f"{d}/{name}")))
heads, images, layers = defaultdict(int), defaultdict(int), defaultdict(int)
for r in rows("confusion_per_head.csv"):
    heads[r["variant"], r["layer"]] += int(r["count"])
for r in rows("confusion_per_image_layer.csv"):
    layers[r["variant"], r["layer"]] += int(r["count"])
    images[r["variant"], r["image"]] += int(r["count"])
per_layer = {(r["variant"], r["layer"]): r for r in rows("confusion_per_layer.csv")}
assert set(per_layer) == set(heads), (sorted(per_layer), sorted(heads))
record = json.load(open(f"{d}/confusion.json"))["results"]["per_layer"]
for key, r in per_layer.items():
    assert int(r["count"]) == heads[key] == layers[key], (key, r, heads[key], layers[key])
    assert int(r["images"]) == 6 and abs(float(r["mean_per_image"]) - int(r["count"]) / 6) <= 1e-9 * int(r["count"]), r
    with_pairs = sum(1 for x in rows("confusion_per_image_layer.csv")
                     if (x["variant"], x["layer"]) == key and int(x["count"]) > 0)
    assert int(r["images_with_pairs"]) == with_pairs, (r, with_pairs)
    j = [x for x in record[key[0]] if str(x["layer"]) == key[1]]
    assert len(j) == 1 and j[0]["count"] == int(r["count"]), (key, j)
for r in rows("confusion_per_image.csv"):
    assert int(r["count"]) == images[r["variant"], r["image"]], r
assert sum(heads.values()) > 0, "the planted pairs should be counted"
PY
}
check_sums "$WORK/plain"

# constant-patch: the recorded filter, the tokens per image as numpy counts them, the summary line;
# the same counts as the brute force; fewer pairs than without it, but not none.
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/cp" --variant "$V" --exclude-tokens constant-patch
expect_grep '^tokens excluded \(--exclude-tokens constant-patch\): [0-9.]+ of 50 per image on average \(min [0-9]+, max [0-9]+\)' \
  "$WORK/out.txt"
expect_grep '"exclude_tokens": "constant-patch"' "$WORK/cp/confusion.json"
[ "$(head -1 "$WORK/cp/confusion_excluded_tokens.csv")" = "image,excluded_tokens" ] || { echo "FAIL: excluded header"; exit 1; }
diff <(tail -n +2 "$WORK/cp/confusion_excluded_tokens.csv" | cut -d, -f2) "$dump.excluded.txt" \
  || { echo "FAIL: excluded tokens per image differ from numpy's constant patches"; exit 1; }
check_sums "$WORK/cp"
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/cp-ref" --variant "$V" --exclude-tokens constant-patch \
  --reference
for f in confusion_per_image.csv confusion_per_image_layer.csv confusion_per_head.csv confusion_per_layer.csv \
    confusion_histogram.csv confusion_excluded_tokens.csv; do
  cmp "$WORK/cp/$f" "$WORK/cp-ref/$f" || { echo "FAIL: $f with the filter differs from the brute force"; exit 1; }
done
"$PYTHON" - "$WORK/plain" "$WORK/cp" <<'PY' || exit 1
import csv, sys
total = lambda d: sum(int(r["count"]) for r in csv.DictReader(open(f"{d}/confusion_per_image.csv")))
plain, filtered = total(sys.argv[1]), total(sys.argv[2])
assert 0 < filtered < plain, (plain, filtered)
PY

# The same tokens given as a mask (numpy's constant patches): the same result files.
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/mask" --variant "$V" \
  --exclude-tokens mask:token_masks/constant
expect_grep '"exclude_tokens": "mask:/token_masks/constant"' "$WORK/mask/confusion.json"
for f in confusion_per_image.csv confusion_per_image_layer.csv confusion_per_head.csv confusion_per_layer.csv \
    confusion_histogram.csv confusion_excluded_tokens.csv; do
  cmp "$WORK/cp/$f" "$WORK/mask/$f" || { echo "FAIL: $f from the mask differs from constant-patch"; exit 1; }
done
# A mask of zeros excludes nothing: the files of the plain run.
expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/zeros" --variant "$V" --exclude-tokens mask:/token_masks/zeros
for f in confusion_per_image.csv confusion_per_image_layer.csv confusion_per_head.csv confusion_per_layer.csv \
    confusion_histogram.csv; do
  cmp "$WORK/plain/$f" "$WORK/zeros/$f" || { echo "FAIL: $f with a mask of zeros differs"; exit 1; }
done

# Bad filters and masks: one line, exit 2 (flag) or 1 (dump), exit 4 when no pair is left; no result files.
bad() {  # bad CODE "substring" FILTER [DUMP]
  rm -rf "$WORK/bad"
  expect_exit "$1" "$2" "$ATTNSCOPE" confusion --dump "${4:-$dump}" --out "$WORK/bad" --variant "$V" \
    --exclude-tokens "$3"
  expect_no_file "$WORK/bad/confusion.json" "$WORK/bad/confusion_per_image.csv" \
    "$WORK/bad/confusion_per_layer.csv" "$WORK/bad/confusion_per_image_layer.csv" \
    "$WORK/bad/confusion_excluded_tokens.csv" "$WORK/bad/confusion_per_head.csv"
}
bad 2 "--exclude-tokens: unknown token filter, found 'background'" background
bad 2 "--exclude-tokens: mask: needs a dataset of the dump" mask:
bad 2 "--exclude-tokens was given an empty value" ""
bad 1 "$WORK/no_images.h5: /images: expected a dataset [images, C, H, W]" constant-patch "$WORK/no_images.h5"
bad 1 "$dump: /token_masks/absent: expected a dataset, found none" mask:token_masks/absent
bad 1 "/bad/shape: expected shape [6, 50], found [6, 49]" mask:bad/shape
bad 1 "/bad/int64: expected dtype bool or uint8" mask:bad/int64
bad 1 "/bad/value: expected values 0 or 1 (1 = exclude the token), found 2 at image 4, token 7" mask:bad/value
bad 4 "--exclude-tokens mask:/token_masks/ones leaves fewer than two tokens" mask:token_masks/ones
