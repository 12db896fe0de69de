# The families of the field that need per-layer model data (MLLA, RALA, MALA as released, PolaFormer,
# Agent attention) through every analysis, each on a small synthetic dump of its own: `attnscope
# synth` writes q, k, v, then h5py adds what the model would have recorded (RoPE tables, PolaFormer's
# scale and exponent, Agent attention's agents and biases: /layers/L/family_params, /layers/L/agents)
# and the module's output `out` computed by python/attnscope_dump/field_families.py in float64 (the
# dumper's own self-check, written apart from the C++ registry). Checked: recompute reproduces that
# out (both PolaFormer maps), and a wrong family does not; confusion's fast counts equal --reference;
# locality, maps, census, spikiness and mask run; distance, entropy, sinks, rank and rollout equal
# their --reference; rows that need not sum to 1 are said so on stderr; a dump without its
# parameters is refused naming the missing one.
need_h5py
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "SKIP: no torch for field_families.py"; exit 77; }
repo=$(cd "$(dirname "$script")/../.." && pwd)

expect_ok "$ATTNSCOPE" info --families
[ "$(grep -cE '^[a-z]' "$WORK/out.txt")" -ge 12 ] || { echo "FAIL: fewer than 12 families"; cat "$WORK/out.txt"; exit 1; }

# family convention feature_map prefix_tokens variant_spec(for --variant) other_parts
# (the RoPE tables and biases span every token, a CLS token's too: prefix 1 lets rollout run, whose
# map is the CLS row; the released MLLA, RALA, MALA and PolaFormer stages have none, as prefix 0)
for row in "mlla code none 0 mlla@code" "rala code none 0 rala@code" "mala code+rope elu1 1 mala_rope@code" \
           "polaformer code none 1 polaformer:same@code" "agent code none 1 agent@code"; do
  set -- $row
  family=$1 convention=$2 map=$3 prefix=$4 spec=$5
  d="$WORK/$family"
  expect_ok "$ATTNSCOPE" synth --out "$d.h5" --images 2 --layers 2 --heads 2 --head-dim 8 --grid-height 5 \
    --grid-width 5 --prefix "$prefix" --family "$family" --feature-map "$map" --convention "$convention" \
    --plant-duplicates 2 --seed 5
  "$PYTHON" - "$d.h5" "$family" "$convention" "$repo/python" <<'PY' || { echo "FAIL: $family: adding parameters"; exit 1; }
import sys
import h5py, numpy as np, torch
path, family, convention, pydir = sys.argv[1:5]
sys.path.insert(0, pydir)
from attnscope_dump.field_families import field_outputs
rng = np.random.default_rng(11)
with h5py.File(path, "r+") as f:
    scale = float(f.attrs["scale"])
    for l in range(int(f.attrs["num_layers"])):
        g = f[f"layers/{l}"]
        q, k, v = (np.asarray(g[x], dtype=np.float64) for x in ("q", "k", "v"))
        B, H, N, d = q.shape
        params, agents = {}, None
        if family in ("mlla", "rala", "mala"):
            angles = rng.uniform(-3, 3, size=(H, N, d // 2))
            params = {"rope_cos": np.cos(angles).astype(np.float32), "rope_sin": np.sin(angles).astype(np.float32)}
        elif family == "polaformer":
            params = {"feature_scale": rng.uniform(0.5, 1.5, size=(H, 1, d)).astype(np.float32),
                      "exponent": rng.uniform(1.0, 3.0, size=(H, 1, d)).astype(np.float32)}
        elif family == "agent":
            n = 4
            agents = rng.normal(size=(B, H, n, d)).astype(np.float32)
            params = {"agent_bias": (0.3 * rng.normal(size=(H, n, N))).astype(np.float32),
                      "token_bias": (0.3 * rng.normal(size=(H, N, n))).astype(np.float32)}
            g.create_dataset("agents", data=agents)
        fp = g.create_group("family_params")
        for name, value in params.items():
            fp.create_dataset(name, data=value)
        t = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64))
        out = field_outputs(family, convention, t(q), t(k), t(v), scale, {n: t(p) for n, p in params.items()},
                            None if agents is None else t(agents))
        g.create_dataset("out", data=out.numpy().astype(np.float32))
PY
  expect_ok "$ATTNSCOPE" info "$d.h5"
  # recompute: the registry reproduces the module's output; the map's own channels for PolaFormer.
  expect_ok "$ATTNSCOPE" recompute --dump "$d.h5" --out "$d/rec"
  expect_grep "PASS" "$WORK/out.txt"
  if [ "$family" = polaformer ]; then
    expect_ok "$ATTNSCOPE" recompute --dump "$d.h5" --out "$d/rec2" --variant polaformer:opposite@code
    expect_grep "PASS" "$WORK/out.txt"
  fi
  # Negative control: another formula on the same data does not reproduce out.
  case $family in
    mlla) wrong=rala@code ;; rala) wrong=mlla@code ;; mala) wrong=mlla@paper ;;
    polaformer) wrong=linear:relu@code ;; *) wrong=softmax ;;
  esac
  rc=0; "$ATTNSCOPE" recompute --dump "$d.h5" --out "$d/rec-wrong" --variant "$wrong" >"$WORK/out.txt" 2>&1 || rc=$?
  grep -q "FAIL" "$WORK/out.txt" || { echo "FAIL: $family: $wrong reproduced out"; cat "$WORK/out.txt"; exit 1; }
  [ "$rc" -lt 128 ] || { echo "FAIL: $family: recompute crashed"; exit 1; }
  # Rows that need not sum to 1 are said so (all but Agent attention's).
  expect_ok "$ATTNSCOPE" confusion --dump "$d.h5" --out "$d/fast" --eps 0.2
  if [ "$family" = agent ]; then
    grep -q "need not sum to 1" "$WORK/err.txt" && { echo "FAIL: agent: rows said not to sum to 1"; exit 1; }
  else
    expect_grep "need not sum to 1" "$WORK/err.txt"
  fi
  expect_ok "$ATTNSCOPE" confusion --dump "$d.h5" --out "$d/ref" --eps 0.2 --reference
  expect_grep "^${spec%%@*}" "$d/fast/confusion_per_image.csv"
  cmp "$d/fast/confusion_per_image.csv" "$d/ref/confusion_per_image.csv" ||
    { echo "FAIL: $spec: fast and reference confusion counts differ"; exit 1; }
  expect_ok "$ATTNSCOPE" locality --dump "$d.h5" --out "$d/loc"
  expect_grep "^${spec%%@*}" "$d/loc/locality.csv"
  expect_ok "$ATTNSCOPE" maps --dump "$d.h5" --out "$d/maps" --images 0 --tokens 3
  expect_grep "^${spec%%@*}" "$d/maps/maps.csv"
  expect_ok "$ATTNSCOPE" census --dump "$d.h5" --out "$d/census" --variant "$spec"
  expect_grep "^${spec%%@*}" "$d/census/census.csv"
  expect_ok "$ATTNSCOPE" spikiness --dump "$d.h5" --out "$d/spk" --variant "$spec" --samples 8 --scales 0.5:4:5
  expect_grep "^${spec%%@*}" "$d/spk/spikiness_laws.csv"
  expect_ok "$ATTNSCOPE" mask --dump "$d.h5" --out "$d/mask" --variant "$spec" --mask local:3,random:4 --seed 1
  expect_grep "^${spec%%@*}" "$d/mask/mask_per_head.csv"
  tol=1e-9
  expect_ok "$ATTNSCOPE" distance --dump "$d.h5" --out "$d/dist"
  expect_ok "$ATTNSCOPE" distance --dump "$d.h5" --out "$d/dist-ref" --reference
  paste -d, "$d/dist/distance.csv" "$d/dist-ref/distance.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 { e = $4 - $18;
    if (e * e > t * t * (1 + $18 * $18)) { print "FAIL: " s ": distance " $4 " vs reference " $18; exit 1 } }' || exit 1
  expect_ok "$ATTNSCOPE" entropy --dump "$d.h5" --out "$d/ent"
  expect_ok "$ATTNSCOPE" entropy --dump "$d.h5" --out "$d/ent-ref" --reference
  paste -d, "$d/ent/entropy.csv" "$d/ent-ref/entropy.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 { e = $4 - $18;
    if (e * e > t * t * (1 + $18 * $18)) { print "FAIL: " s ": entropy " $4 " vs reference " $18; exit 1 } }' || exit 1
  expect_ok "$ATTNSCOPE" sinks --dump "$d.h5" --out "$d/sinks"
  expect_ok "$ATTNSCOPE" sinks --dump "$d.h5" --out "$d/sinks-ref" --reference
  paste -d, "$d/sinks/sinks_keys.csv" "$d/sinks-ref/sinks_keys.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 { e = $7 - $15;
    if (e * e > t * t * (1 + $15 * $15) || $8 != $16) { print "FAIL: " s ": sinks " $0; exit 1 } }' || exit 1
  expect_ok "$ATTNSCOPE" rank --dump "$d.h5" --out "$d/rank"
  expect_ok "$ATTNSCOPE" rank --dump "$d.h5" --out "$d/rank-ref" --reference
  paste -d, "$d/rank/rank.csv" "$d/rank-ref/rank.csv" | awk -F, -v s="$spec" 'NR > 1 && ($5 != $38 || $8 - $41 > 1e-8 || $41 - $8 > 1e-8) {
    print "FAIL: " s ": rank " $5 "/" $8 " vs reference " $38 "/" $41; exit 1 }' || exit 1
  if [ "$prefix" -ge 1 ]; then  # rollout reads the CLS row
    expect_ok "$ATTNSCOPE" rollout --dump "$d.h5" --out "$d/roll"
    expect_ok "$ATTNSCOPE" rollout --dump "$d.h5" --out "$d/roll-ref" --reference
    expect_grep "^${spec%%@*}" "$d/roll/rollout.csv"
    paste -d, "$d/roll/rollout.csv" "$d/roll-ref/rollout.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 && ($6 - $12 > t || $12 - $6 > t) {
      print "FAIL: " s ": rollout " $0; exit 1 }' || exit 1
  fi
  # The same dump without its parameters: refused in one line naming what is missing.
  cp "$d.h5" "$d-bare.h5"
  "$PYTHON" - "$d-bare.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    for l in range(int(f.attrs["num_layers"])):
        g = f[f"layers/{l}"]
        for name in ("family_params", "agents"):
            if name in g:
                del g[name]
PY
  missing=rope_cos; [ "$family" = polaformer ] && missing=feature_scale; [ "$family" = agent ] && missing=agents
  expect_fail "$missing" "$ATTNSCOPE" locality --dump "$d-bare.h5" --out "$d/bare"
done
