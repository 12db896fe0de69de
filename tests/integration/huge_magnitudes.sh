# Float32 dumps whose queries and keys reach 1e19, 1e30 and near FLT_MAX: the float logits of the
# fast softmax paths would overflow there. confusion counts exactly what --reference counts and
# locality measures what --reference measures, for every family; maps, census and spikiness give
# finite results; a family whose features overflow double (exp) is refused in one line that
# names the head.
need_h5py

expect_ok "$ATTNSCOPE" synth --out "$WORK/base.h5" --images 2 --layers 1 --heads 2 --plant-collinear 2 --seed 3
variants=softmax,softmax@code,linear:relu,linear:identity,linear:elu1,linear:relu_affine,inline,inline@code,inline:relu,mala,mala@code

for M in 1e19 1e30 3e38; do
  dump="$WORK/big$M.h5"
  # Q and K rescaled so that their largest entry is M (float32 holds up to 3.4e38).
  "$PYTHON" - "$WORK/base.h5" "$dump" "$M" <<'PY' || exit 1
import shutil, sys, h5py, numpy as np
shutil.copy(sys.argv[1], sys.argv[2])
M = float(sys.argv[3])
with h5py.File(sys.argv[2], "r+") as f:
    for l in range(int(f.attrs["num_layers"])):
        q, k = f[f"layers/{l}/q"], f[f"layers/{l}/k"]
        top = max(np.abs(q[...]).max(), np.abs(k[...]).max())
        for ds in (q, k):
            x = ds[...].astype(np.float64) * (M / top)
            assert np.isfinite(x.astype(np.float32)).all()
            ds[...] = x.astype(np.float32)
PY
  expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/c$M" --variant "$variants"
  expect_ok "$ATTNSCOPE" confusion --dump "$dump" --out "$WORK/r$M" --variant "$variants" --reference
  for f in confusion_per_head.csv confusion_per_image.csv confusion_histogram.csv; do
    if ! diff "$WORK/c$M/$f" "$WORK/r$M/$f"; then echo "FAIL: $f at $M differs from --reference"; exit 1; fi
  done
  # Rows this sharp are one-hot: softmax confuses queries that share their top key.
  expect_grep '^softmax@paper,0,0,[1-9][0-9]*,0,0$' "$WORK/c$M/confusion_per_head.csv"

  expect_ok "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/l$M" --variant "$variants"
  expect_ok "$ATTNSCOPE" locality --dump "$dump" --out "$WORK/lr$M" --variant "$variants" --reference
  "$PYTHON" - "$WORK/l$M/locality.csv" "$WORK/lr$M/locality.csv" "$M" <<'PY' || exit 1
import csv, math, sys
fast = list(csv.DictReader(open(sys.argv[1])))
ref = list(csv.DictReader(open(sys.argv[2])))
assert len(fast) == len(ref) == 22, (len(fast), len(ref))
for a, b in zip(fast, ref):
    where = f"{a['variant']} layer {a['layer']} head {a['head']} at {sys.argv[3]}"
    assert (a["variant"], a["layer"], a["head"]) == (b["variant"], b["layer"], b["head"]), where
    assert a["queries"] == b["queries"], (where, a["queries"], b["queries"])
    # Every grid query is measured (2 images x 49): none dropped as not-a-number.
    if not a["variant"].startswith(("linear", "mala")):
        assert int(a["queries"]) == 98, (where, a["queries"])
    # InLine and MALA weights reach 1e77 here: compare against the largest of the row statistics.
    scale = max(1.0, *(abs(float(b[c])) for c in ("mean", "min", "max", "std")))
    for c in ("mean", "std", "min", "max"):
        x, y = float(a[c]), float(b[c])
        assert math.isfinite(x) and abs(x - y) <= 1e-6 * scale, (where, c, x, y)
    if a["variant"].startswith("softmax"):
        assert 0.0 < float(a["mean"]) <= 1.0, (where, a["mean"])
PY

  expect_ok "$ATTNSCOPE" maps --dump "$dump" --out "$WORK/m$M" --variant "$variants" --tokens 0,25
  "$PYTHON" - "$WORK/m$M/maps.h5" <<'PY' || exit 1
import sys, h5py, numpy as np
seen = []
def check(name, obj):
    if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f":
        assert np.isfinite(obj[...]).all(), name
        seen.append(name)
with h5py.File(sys.argv[1], "r") as f:
    f.visititems(check)
assert seen, "no maps written"
PY
  expect_ok "$ATTNSCOPE" census --dump "$dump" --out "$WORK/n$M" --variant inline,mala,inline@code,mala@code
  # Softmax rows are one-hot at these magnitudes: its power law has no comparable point and says
  # NO DATA (exit 3, a law that could not be checked); no law may report a measured FAIL.
  rc=0
  "$ATTNSCOPE" spikiness --dump "$dump" --out "$WORK/s$M" --variant "$variants" --samples 10 \
    >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then echo "FAIL: spikiness exit $rc"; cat "$WORK/err.txt"; exit 1; fi
  if grep -E "[[:space:]]FAIL([[:space:]]|$)" "$WORK/out.txt"; then echo "FAIL: a law failed at $M"; exit 1; fi
  if [ "$rc" -eq 3 ] && grep "NO DATA" "$WORK/out.txt" | grep -qv "^softmax"; then
    echo "FAIL: a non-softmax law has no data at $M"; cat "$WORK/out.txt"; exit 1
  fi

  # exp features overflow double: refused, naming the head, with the usual exit code.
  # (Heads run in parallel: whichever fails first is named.)
  for cmd in confusion locality census spikiness maps; do
    extra=()
    if [ "$cmd" = maps ]; then extra=(--tokens 0); fi
    expect_exit 1 ": feature map exp: row " \
      "$ATTNSCOPE" "$cmd" --dump "$dump" --out "$WORK/x$M" --variant mala:exp "${extra[@]}"
    expect_grep "^attnscope $cmd: image [01], layer 0, head [01]: feature map exp" "$WORK/err.txt"
  done
done
