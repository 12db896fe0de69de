# attnscope replay: the C++ forward pass of every committed model gives the logits PyTorch wrote
# into its dump (within 1e-4 of the largest logit) and the same predictions; interventions change
# them; a model and images that do not fit, a bad file, bad flags: one line, non-zero exit.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
expect_ok "$ATTNSCOPE" replay --help
expect_grep '^usage: attnscope replay ' "$WORK/out.txt"
for flag in --model --dump --images --layers --intervention --threads --seed --out; do
  expect_grep "$flag" "$WORK/out.txt"
done

models=("$REPO"/data/models/vit7-*-fmnist.h5)
[ "${#models[@]}" -eq 4 ] || { echo "FAIL: expected the 4 committed models, found ${models[*]}"; exit 1; }
for m in "${models[@]}"; do
  name=$(basename "$m" .h5)
  dump="$REPO/data/dumps/$name.h5"
  [ -f "$dump" ] || { echo "FAIL: $dump missing (make dumps writes it)"; exit 1; }
  expect_ok "$ATTNSCOPE" replay --model "$m" --dump "$dump" --out "$WORK/$name" --images 0-31 \
    --intervention none,local:3,random:9,f1,family=softmax
  "$PYTHON" - "$WORK/$name" "$dump" <<'PY' || exit 1
import csv, json, sys
import h5py, numpy as np
out, dump = sys.argv[1], sys.argv[2]
rows = {r["intervention"]: r for r in json.load(open(f"{out}/replay.json"))["results"]["rows"]}
err = rows["none"]["dump_logits_max_rel_error"]
assert err <= 1e-4, f"{out}: logits differ from the dump's by {err} of the largest"
logits = {}
for r in csv.DictReader(open(f"{out}/replay_logits.csv")):
    logits.setdefault(r["intervention"], []).append([float(v) for v in r["logits"].split()])
with h5py.File(dump, "r") as f:
    want, labels = f["logits"][:32], f["labels"][:32]
got = np.array(logits["none"])
assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), "logits CSV differs from the dump's"
assert (got.argmax(1) == want.argmax(1)).all(), "predictions differ from the dump's"
acc = (got.argmax(1) == labels).mean()
assert abs(rows["none"]["accuracy"] - acc) < 1e-12, (rows["none"]["accuracy"], acc)
# Every intervention moves the logits (masks and f1 change the attention of every layer).
for iv in ("local:3", "random:9"):
    assert np.abs(np.array(logits[iv]) - got).max() > 1e-3, f"{iv} left the logits unchanged"
PY
done

# The softmax model with its own family named: the same logits as none (the swap is a no-op).
s="$REPO/data/models/vit7-softmax-fmnist.h5"
sd="$REPO/data/dumps/vit7-softmax-fmnist.h5"
expect_ok "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/swap" --images 0-7 \
  --intervention none,family=softmax
[ "$(awk -F, 'NR > 1 && $2 == "none" { $2 = ""; print }' "$WORK/swap/replay_logits.csv")" = \
  "$(awk -F, 'NR > 1 && $2 == "family=softmax" { $2 = ""; print }' "$WORK/swap/replay_logits.csv")" ] ||
  { echo "FAIL: family=softmax on the softmax model changed the logits"; exit 1; }
# Interventions restricted to one block change less than in every block (a real restriction).
expect_ok "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/l0" --images 0-7 --intervention none,f1 --layers 0
cmp -s "$WORK/l0/replay_logits.csv" "$WORK/swap/replay_logits.csv" && { echo "FAIL: same file"; exit 1; }

# --attention float: the softmax model's logits within 1e-5 of the double run's (relative to the
# largest), not the same bits; a masked intervention and a kernel family: the same bits; recorded.
expect_ok "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/fl" --images 0-7 \
  --intervention none,local:3 --attention float
expect_ok "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/db" --images 0-7 \
  --intervention none,local:3 --attention double
"$PYTHON" - "$WORK/fl" "$WORK/db" <<'PY' || exit 1
import csv, json, sys
import numpy as np
def logits(d):
    out = {}
    for r in csv.DictReader(open(f"{d}/replay_logits.csv")):
        out.setdefault(r["intervention"], []).append([float(v) for v in r["logits"].split()])
    return {k: np.array(v) for k, v in out.items()}
f, d = logits(sys.argv[1]), logits(sys.argv[2])
err = np.abs(f["none"] - d["none"]).max()
assert 0 < err <= 1e-5 * np.abs(d["none"]).max(), f"float against double: {err}"
assert np.array_equal(f["local:3"], d["local:3"]), "a masked head left double"
assert json.load(open(f"{sys.argv[1]}/replay.json"))["parameters"]["attention"] == "float"
PY
expect_ok "$ATTNSCOPE" replay --model "$REPO/data/models/vit7-inline-fmnist.h5" \
  --dump "$REPO/data/dumps/vit7-inline-fmnist.h5" --out "$WORK/fli" --images 0-3 --attention float
expect_ok "$ATTNSCOPE" replay --model "$REPO/data/models/vit7-inline-fmnist.h5" \
  --dump "$REPO/data/dumps/vit7-inline-fmnist.h5" --out "$WORK/dbi" --images 0-3
cmp -s "$WORK/fli/replay_logits.csv" "$WORK/dbi/replay_logits.csv" ||
  { echo "FAIL: --attention float changed a kernel family's logits"; exit 1; }
expect_exit 2 "--attention: expected double or float, got 'half'" \
  "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/bad" --attention half

# Several models on the same images: one table, a column per model, the same numbers as alone.
l="$REPO/data/models/vit7-linear-fmnist.h5"
expect_ok "$ATTNSCOPE" replay --model "$s,$l" --dump "$sd" --out "$WORK/two" --images 0-7 --intervention none,f1
expect_grep '^intervention +vit7-softmax-fmnist +vit7-linear-fmnist' "$WORK/out.txt"
expect_ok "$ATTNSCOPE" replay --model "$l" --dump "$sd" --out "$WORK/one" --images 0-7 --intervention none,f1
[ "$(grep '^vit7-linear' "$WORK/two/replay_logits.csv")" = "$(grep '^vit7-linear' "$WORK/one/replay_logits.csv")" ] ||
  { echo "FAIL: a model's logits depend on the other models of the run"; exit 1; }
# The dump's own logits are compared only for the dump's own model.
grep -q '^vit7-softmax-fmnist,none,8,[0-9]*,[0-9.e-]*,1,[0-9.e-]\+$' "$WORK/two/replay.csv" || { echo "FAIL: own model row"; cat "$WORK/two/replay.csv"; exit 1; }
grep -q '^vit7-linear-fmnist,none,8,[0-9]*,[0-9.e-]*,1,$' "$WORK/two/replay.csv" || { echo "FAIL: other model row"; cat "$WORK/two/replay.csv"; exit 1; }

# An HDF5 image set (/images, /labels) instead of a dump: the same logits for the same images.
"$PYTHON" - "$sd" "$WORK/set.h5" <<'PY' || exit 1
import sys
import h5py
with h5py.File(sys.argv[1]) as f, h5py.File(sys.argv[2], "w") as g:
    g["images"] = f["images"][:8]
    g["labels"] = f["labels"][:8]
PY
expect_ok "$ATTNSCOPE" replay --model "$s" --image-set "$WORK/set.h5" --out "$WORK/set" --intervention none,f1
[ "$(grep -c ',none,' "$WORK/set/replay_logits.csv")" -eq 8 ] || { echo "FAIL: image set rows"; exit 1; }
diff <(grep ',none,' "$WORK/set/replay_logits.csv") <(grep ',none,' "$WORK/swap/replay_logits.csv") ||
  { echo "FAIL: image set and dump give different logits"; exit 1; }
expect_exit 2 "give either --dump or --image-set" "$ATTNSCOPE" replay --model "$s" --out "$WORK/bad"
expect_exit 2 "give either --dump or --image-set" "$ATTNSCOPE" replay --model "$s" --dump "$sd" --image-set "$WORK/set.h5" --out "$WORK/bad"
expect_exit 1 "/images: expected a dataset [images, C, H, W]" "$ATTNSCOPE" replay --model "$s" --image-set "$s" --out "$WORK/bad"

# Misfits and bad input: one line, exit code, nothing published.
expect_ok "$ATTNSCOPE" synth --out "$WORK/syn.h5" --images 2 --layers 1 --heads 1
expect_exit 1 "/images: expected the model's input images, found none" \
  "$ATTNSCOPE" replay --model "$s" --dump "$WORK/syn.h5" --out "$WORK/bad"
expect_exit 1 "expected an HDF5 file" "$ATTNSCOPE" replay --model "$WORK/out.txt" --dump "$sd" --out "$WORK/bad"
expect_exit 1 "attribute 'format': expected attnscope-vit-weights, found 'attnscope-dump'" \
  "$ATTNSCOPE" replay --model "$WORK/syn.h5" --dump "$sd" --out "$WORK/bad"
# A weights file with a mis-shaped tensor, one without a tensor, one with a family the registry
# does not know.
"$PYTHON" - "$s" "$WORK" <<'PY' || exit 1
import shutil, sys
import h5py, numpy as np
src, work = sys.argv[1], sys.argv[2]
for name, edit in (("shape", lambda f: (f.__delitem__("head/bias"), f.create_dataset("head/bias", data=np.zeros(5, np.float32)))),
                   ("missing", lambda f: f.__delitem__("blocks/2/mlp/fc1/weight")),
                   ("family", lambda f: f.attrs.__setitem__("attention_family", "sigmoid"))):
    shutil.copy(src, f"{work}/{name}.h5")
    with h5py.File(f"{work}/{name}.h5", "r+") as f:
        edit(f)
PY
expect_exit 1 "/head/bias: expected shape [10], found [5]" "$ATTNSCOPE" replay --model "$WORK/shape.h5" --dump "$sd" --out "$WORK/bad"
expect_exit 1 "/blocks/2/mlp/fc1/weight: expected a dataset of shape [128, 64], found none" \
  "$ATTNSCOPE" replay --model "$WORK/missing.h5" --dump "$sd" --out "$WORK/bad"
expect_exit 1 "attribute 'attention_family': expected a variant of the registry" \
  "$ATTNSCOPE" replay --model "$WORK/family.h5" --dump "$sd" --out "$WORK/bad"
expect_exit 2 "--intervention 'blur': expected none, local:K" \
  "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/bad" --intervention blur
expect_exit 2 "named twice" "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/bad" --intervention f1,f1
expect_exit 2 "--layers: the model has 4 blocks" "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/bad" --layers 7
expect_exit 2 "--images: the dump holds 128 images" "$ATTNSCOPE" replay --model "$s" --dump "$sd" --out "$WORK/bad" --images 500
expect_no_file "$WORK/bad/replay.csv" "$WORK/bad/replay.json"
