#!/usr/bin/env bash
# The same result files from every build and every CPU (docs/reliability.md, "Portability"): runs
# the analyses that write results (confusion, locality, mask, census, recompute, replay in double
# and in float, distance, entropy, sinks, rank, rollout) on the committed models' dumps with each
# command given, plus spikiness, verify and a synthetic dump, then compares every result file byte
# for byte, and the JSON records with the fields that are not results left out (times, paths,
# version, build, reading statistics).
#
# Usage: tests/portability/compare_builds.sh WORK LABEL=COMMAND [LABEL=COMMAND ...]
#   e.g. native=build/apps/attnscope v2=build-v2/apps/attnscope
#        'v2-noFMA=env GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F build-v2/apps/attnscope'
# (the last runs the portable build as a CPU without AVX2 or FMA would: glibc then picks its SSE2
# builds of libm, as it does on such a CPU). The first command is the reference. Exit 1 on any
# difference, naming the file and the two labels; 0 when every set is identical.
# Env: IMAGES (default 0-11: the images each analysis reads), THREADS (default 2), SKIP_VERIFY
# (labels that do not run verify; their comparison leaves verify out).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 WORK LABEL=COMMAND LABEL=COMMAND [...]" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$1; shift
IMAGES=${IMAGES:-0-11}
THREADS=${THREADS:-2}
PYTHON=${PYTHON:-/usr/bin/python3}
shopt -s nullglob
dumps=("$REPO"/data/dumps/vit7-*.h5)
[ ${#dumps[@]} -gt 0 ] || { echo "FAIL: no data/dumps/vit7-*.h5 (make dumps writes them)"; exit 1; }
rm -rf "$WORK" && mkdir -p "$WORK"

CODE4="softmax@code,linear:relu@code,inline:identity@code,mala:elu1@code"
# run LABEL COMMAND: every analysis with that command, results under $WORK/LABEL/.
run() {
  local label=$1 cmd=$2 out=$WORK/$1 d name
  local -a a
  read -r -a a <<<"$cmd"
  for d in "${dumps[@]}"; do
    name=$(basename "$d" .h5)
    local common=(--dump "$d" --images "$IMAGES" --threads "$THREADS")
    "${a[@]}" confusion "${common[@]}" --out "$out/$name/confusion" --variant "$CODE4" >/dev/null
    "${a[@]}" locality "${common[@]}" --out "$out/$name/locality" --variant "$CODE4" >/dev/null
    "${a[@]}" mask "${common[@]}" --out "$out/$name/mask" --variant softmax@code,inline:identity@code \
      --mask local:3,random:9 >/dev/null
    "${a[@]}" census "${common[@]}" --out "$out/$name/census" >/dev/null
    "${a[@]}" recompute "${common[@]}" --out "$out/$name/recompute" >/dev/null
    "${a[@]}" replay --model "$REPO/data/models/$name.h5" --dump "$d" --images "$IMAGES" --threads "$THREADS" \
      --intervention none,local:3,family=linear:relu --out "$out/$name/replay" >/dev/null
    # --attention float: the softmax heads in float (attention_heads.hpp), a fixed order too.
    "${a[@]}" replay --model "$REPO/data/models/$name.h5" --dump "$d" --images "$IMAGES" --threads "$THREADS" \
      --attention float --out "$out/$name/replay-float" >/dev/null
    # The per-head diagnostics: fixed-order float and double kernels, and (rank) singular_values.hpp's
    # fixed-order bidiagonalisation and dqds.
    "${a[@]}" distance "${common[@]}" --out "$out/$name/distance" --variant "$CODE4" >/dev/null
    "${a[@]}" entropy "${common[@]}" --out "$out/$name/entropy" --variant "$CODE4" >/dev/null
    "${a[@]}" sinks "${common[@]}" --out "$out/$name/sinks" --variant "$CODE4" >/dev/null
    "${a[@]}" rank --dump "$d" --images 0-3 --threads "$THREADS" --out "$out/$name/rank" --variant "$CODE4" >/dev/null
    "${a[@]}" rollout "${common[@]}" --out "$out/$name/rollout" --variant "$CODE4" >/dev/null
    "${a[@]}" spikiness "${common[@]}" --out "$out/$name/spikiness" \
      --variant softmax@code,linear:relu@code,mala:elu1@code --scales 0.25:8:9 >/dev/null
  done
  # The propositions' checks (their own random inputs) and a synthetic dump (normal draws). The
  # dump file's bytes hold HDF5's own bookkeeping, so its datasets are compared: one SHA-256 each.
  # SKIP_VERIFY lists labels that do not run verify: under the emulation of a CPU without FMA every
  # fused step of its products goes through glibc's software fma (minutes instead of seconds).
  case " ${SKIP_VERIFY:-} " in *" $label "*) ;; *) "${a[@]}" verify --out "$out/verify" >/dev/null ;; esac
  "${a[@]}" synth --out "$out/synth.h5" --images 3 --seed 5 --plant-duplicates 1 --plant-collinear 1 >/dev/null
  "$PYTHON" - "$out/synth.h5" >"$out/synth-datasets.sha256" <<'PY'
import hashlib, sys, h5py
f = h5py.File(sys.argv[1], "r")
def visit(name, obj):
    if isinstance(obj, h5py.Dataset):
        print(name, hashlib.sha256(obj[()].tobytes()).hexdigest())
f.visititems(visit)
PY
  rm -f "$out/synth.h5"
}

labels=()
for spec in "$@"; do
  label=${spec%%=*} cmd=${spec#*=}
  [ -n "$label" ] && [ "$label" != "$spec" ] || { echo "bad LABEL=COMMAND: $spec" >&2; exit 2; }
  echo "compare_builds: running the analyses with $label ($cmd)"
  run "$label" "$cmd"
  labels+=("$label")
done

ref=${labels[0]}
status=0
for label in "${labels[@]:1}"; do
  # Every file but the JSON records: byte for byte.
  # verify_timing.csv holds measured times, not results.
  skip=()
  [ -d "$WORK/$label/verify" ] || skip=(-x verify)
  if ! diff -r -q -x '*.json' -x '.attnscope-partial' -x verify_timing.csv "${skip[@]}" "$WORK/$ref" "$WORK/$label" \
    >"$WORK/diff-$label.txt"; then
    echo "FAIL: result files of $ref and $label differ:"; cat "$WORK/diff-$label.txt"; status=1
  fi
  # The JSON records: equal once the fields that describe the run rather than its results are out.
  if ! "$PYTHON" - "$WORK/$ref" "$WORK/$label" <<'PY'; then status=1; fi
import json, os, sys
a_root, b_root = sys.argv[1], sys.argv[2]
# Fields that are not results: when, how long, where, which build, how the input was read.
DROP = {"elapsed_s", "started", "finished", "timing", "ms_per_image", "io_wait_seconds", "io_wait_share",
        "read_queue", "version", "build", "command_line", "argv", "out", "host", "threads_used",
        "peak_rss", "files", "created", "cuda", "mpi"}
def clean(x):
    if isinstance(x, dict):
        out = {k: clean(v) for k, v in x.items() if k not in DROP and not k.endswith("_seconds")
               and not k.endswith("_s") and "path" not in k and "time" not in k and "timing" not in k}
        # "cpu (built without CUDA)" and "cpu (no CUDA device: ...)": the same device, other builds.
        if isinstance(out.get("device"), str):
            out["device"] = out["device"].split(" (")[0]
        return out
    if isinstance(x, list):
        return [clean(v) for v in x]
    if isinstance(x, str):
        # The longer root first: one label's directory may begin with the other's name.
        for root in sorted((a_root, b_root), key=len, reverse=True):
            x = x.replace(root, "<root>")
        return x
    return x
bad = 0
for d, _, files in os.walk(a_root):
    for f in files:
        if not f.endswith(".json"):
            continue
        pa = os.path.join(d, f)
        pb = os.path.join(b_root, os.path.relpath(pa, a_root))
        if not os.path.exists(pb) and not os.path.isdir(os.path.dirname(pb)):
            continue  # a command this label skipped (SKIP_VERIFY): the diff above left it out too
        if not os.path.exists(pb):
            print("FAIL: %s has no counterpart %s" % (pa, pb)); bad = 1; continue
        if clean(json.load(open(pa))) != clean(json.load(open(pb))):
            print("FAIL: the records %s and %s differ in a result field" % (pa, pb)); bad = 1
sys.exit(bad)
PY
  [ $status -eq 0 ] && echo "compare_builds: $label gives the same result files as $ref"
done
n=$(find "$WORK/$ref" -type f ! -name '*.json' | wc -l)
[ "$n" -gt 0 ] || { echo "FAIL: no result file was written"; exit 1; }
[ $status -eq 0 ] && echo "compare_builds: ${#labels[@]} builds, $n result files each, identical"
exit $status
