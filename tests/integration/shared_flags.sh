# The shared flags --dump, --variant and --images are declared once: every command that takes one
# shows it with the same value name and the same help text, only the "(default: ...)" differing
# (and spikiness's --dump naming its alternative, --synthetic). maps's documented default image (0)
# is the one it uses.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
for cmd in confusion locality maps census spikiness recompute distance entropy sinks rank rollout; do
  expect_ok "$ATTNSCOPE" "$cmd" --help
  cp "$WORK/out.txt" "$WORK/help_$cmd.txt"
done
"$PYTHON" - "$WORK" "$REPO/docs/cli/common-flags.md" <<'PY' || exit 1
import re, sys
work, doc = sys.argv[1], open(sys.argv[2]).read()

def flags(cmd):
    """--flag -> (value name, description with all white space removed) from Boost's help."""
    out, cur = {}, None
    for line in open(f"{work}/help_{cmd}.txt"):
        m = re.match(r"  (--[a-z-]+)( [^ (]+)?( \(=[^)]*\))?  +(.*)", line)
        if m:
            cur = m.group(1)
            out[cur] = [(m.group(2) or "").strip(), m.group(4)]
        elif cur and line.startswith("      "):
            out[cur][1] += line.strip()  # Boost wraps anywhere, even inside a word
        else:
            cur = None
    return {k: (v, re.sub(r"\s", "", d)) for k, (v, d) in out.items()}

def shared_part(desc):
    return re.sub(r"(;or--[a-z-]+)?(\(default:.*\))?$", "", desc)

takes = {"--dump": ["confusion", "locality", "maps", "census", "spikiness", "recompute", "distance", "entropy", "sinks", "rank", "rollout"],
         "--variant": ["confusion", "locality", "maps", "census", "spikiness", "distance", "entropy", "sinks", "rank", "rollout"],
         "--images": ["confusion", "locality", "maps", "census", "spikiness", "recompute", "distance"]}
want = {"--dump": ("FILE...", "HDF5dumptoread(docs/dump-format.md);severalfilesarereadasonedump,theirimagesintheordergiven"),
        "--variant": ("SPEC[,SPEC...]", "attentionvariants,e.g.softmax,linear:relu,inline,mala:elu1@code"),
        "--images": ("LIST", "images,e.g.0-9,15")}
bad = []
for flag, cmds in takes.items():
    for cmd in cmds:
        f = flags(cmd)
        if flag not in f:
            bad.append(f"{cmd}: no {flag}")
            continue
        value, desc = f[flag]
        if (value, shared_part(desc)) != want[flag]:
            bad.append(f"{cmd} {flag}: {value!r} {desc!r}, expected {want[flag]}")
        if flag != "--dump" and "(default:" not in desc:
            bad.append(f"{cmd} {flag}: no default in {desc!r}")
    if f"`{flag}" not in doc:
        bad.append(f"{flag} is not in docs/cli/common-flags.md")
if "(default:0)" not in flags("maps")["--images"][1]:
    bad.append("maps --images does not say its default is image 0")
if "(default:all)" not in flags("recompute")["--images"][1]:
    bad.append("recompute --images does not say its default is all")
if bad:
    print("FAIL:\n  " + "\n  ".join(bad))
    sys.exit(1)
PY

# maps without --images draws image 0 only, as its help says.
expect_ok "$ATTNSCOPE" synth --out "$WORK/d.h5" --images 3 --layers 1 --heads 1 --grid-height 2 --grid-width 2
expect_ok "$ATTNSCOPE" maps --dump "$WORK/d.h5" --out "$WORK/m" --tokens 0
[ "$(cut -d, -f2 "$WORK/m/maps.csv" | sort -u | tr '\n' ' ')" = "0 image " ] ||
  { echo "FAIL: maps without --images drew images $(cut -d, -f2 "$WORK/m/maps.csv" | sort -u | tr '\n' ' ')"; exit 1; }
