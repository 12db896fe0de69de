#!/usr/bin/env python3
"""The include graph's layering, checked: no header includes itself through others, and every
include goes down the layers of the tree (docs/cuda.md, "What runs on the GPU"):

    core (lib/include/attnscope/*.hpp, lib/src/) <- kernels (lib/cuda/) <- GPU side
    (lib/include/attnscope/gpu/, lib/src/gpu/) <- analyses <- run <- apps, python/module

(lib/src/reference/ sits on core; tests and bench may include anything). Besides: the kernels'
headers (.cuh) are included only by GPU code (lib/cuda/, lib/src/gpu/, an analysis's
<name>_cuda.* files, tests/cuda/); no CPU file of the engine includes a family's own header
(softmax.hpp); dump.hpp reaches neither variant.hpp nor family.hpp.

Prints each violation and exits 1, or prints a summary and exits 0. Before the tree, a negative
control: a small tree written to a scratch folder with one violation of each kind must give each
of them. Usage:
    scripts/check_includes.py [repository root]
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
SOURCES = (".hpp", ".cpp", ".cuh", ".cu", ".h")
TREES = ("lib", "analyses", "run", "apps", "python/module", "tests", "bench")
# Where "attnscope/x.hpp" can be found, in order.
PUBLIC_INCLUDE_DIRS = ("lib/include", "analyses/include", "run/include")
# Private directories a target adds to its include path (a quoted include is also looked up next
# to the including file first).
PRIVATE_INCLUDE_DIRS = ("lib/src", "lib/cuda", "lib/src/reference", "tests/support", "analyses/src")
LAYERS = {"core": 0, "reference": 1, "kernels": 1, "gpu": 2, "analyses": 3, "run": 4, "front": 5, "tests": 6}


def layer(path):
    if path.startswith(("lib/include/attnscope/gpu/", "lib/src/gpu/")):
        return "gpu"
    if path.startswith("lib/cuda/"):
        return "kernels"
    if path.startswith("lib/src/reference/"):
        return "reference"
    if path.startswith("lib/"):
        return "core"
    if path.startswith("analyses/"):
        return "analyses"
    if path.startswith("run/"):
        return "run"
    if path.startswith(("apps/", "python/")):
        return "front"
    return "tests"


def may_include(a, b):
    """Whether a file of layer a may include one of layer b."""
    if a == b or a == "tests":
        return True
    if a == "reference":
        return b == "core"
    if b == "reference":
        return False
    if a == "kernels":
        return b == "core"
    if b == "kernels":
        return a in ("gpu", "analyses")  # the analyses' own GPU paths; checked further below
    return LAYERS[b] < LAYERS[a]


def is_gpu_file(path):
    base = os.path.basename(path)
    stem = os.path.splitext(base)[0]
    return (layer(path) in ("kernels", "gpu") or path.startswith(("tests/cuda/", "bench/"))
            or stem.endswith("_cuda"))


def project_files(root):
    out = []
    for tree in TREES:
        for d, _, files in os.walk(os.path.join(root, tree)):
            for f in files:
                if f.endswith(SOURCES):
                    out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def resolve(root, src, name, known):
    here = os.path.normpath(os.path.join(os.path.dirname(src), name))
    if here in known:
        return here
    for d in PUBLIC_INCLUDE_DIRS + PRIVATE_INCLUDE_DIRS:
        p = os.path.normpath(os.path.join(d, name))
        if p in known:
            return p
    return None  # generated (family_list.inc) or a system header in quotes


def graph(root):
    files = project_files(root)
    known = set(files)
    edges = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            text = fh.read()
        edges[f] = sorted({r for n in INCLUDE.findall(text) if (r := resolve(root, f, n, known))})
    return edges


def header_cycles(edges):
    """Cycles among headers (each reported once, from its smallest file)."""
    headers = {f for f in edges if f.endswith((".hpp", ".cuh", ".h"))}
    cycles, state = [], {}

    def visit(f, stack):
        state[f] = 1
        stack.append(f)
        for g in edges[f]:
            if g not in headers:
                continue
            if state.get(g) == 1:
                cycles.append(stack[stack.index(g):] + [g])
            elif g not in state:
                visit(g, stack)
        stack.pop()
        state[f] = 2

    for f in sorted(headers):
        if f not in state:
            visit(f, [])
    return cycles


def reaches(edges, start, target):
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f == target:
            return True
        if f in seen:
            continue
        seen.add(f)
        todo.extend(edges.get(f, []))
    return False


def problems_of(root):
    edges = graph(root)
    problems = []
    for cycle in header_cycles(edges):
        problems.append("include cycle: " + " -> ".join(cycle))
    for f, targets in edges.items():
        for g in targets:
            if not may_include(layer(f), layer(g)):
                problems.append(f"{f} ({layer(f)}) includes {g} ({layer(g)})")
            if g.endswith(".cuh") and not is_gpu_file(f):
                problems.append(f"{f} is CPU code but includes the kernel header {g}")
    engine = [f for f in edges if re.fullmatch(r"lib/(src|include/attnscope)/attention(_heads)?\.(c|h)pp", f)]
    for f in engine:
        if reaches(edges, f, "lib/include/attnscope/softmax.hpp"):
            problems.append(f"the engine's {f} reaches softmax.hpp (a family's own header)")
    for h in ("lib/include/attnscope/variant.hpp", "lib/include/attnscope/family.hpp"):
        if reaches(edges, "lib/include/attnscope/dump.hpp", h):
            problems.append(f"dump.hpp reaches {h}")
    if len(engine) < 4 or "lib/include/attnscope/dump.hpp" not in edges:
        problems.append("the engine's files or dump.hpp were not found: is the root right?")
    return edges, problems


# The negative control: each file's includes, and a fragment of the problem each must cause.
BAD_TREE = {
    "lib/include/attnscope/attention.hpp": ['attnscope/softmax.hpp'],
    "lib/include/attnscope/attention_heads.hpp": [],
    "lib/src/attention.cpp": [],
    "lib/src/attention_heads.cpp": [],
    "lib/include/attnscope/softmax.hpp": [],
    "lib/include/attnscope/dump.hpp": ['attnscope/geometry.hpp'],
    "lib/include/attnscope/geometry.hpp": ['attnscope/variant.hpp'],
    "lib/include/attnscope/variant.hpp": ['attnscope/family.hpp'],
    "lib/include/attnscope/family.hpp": ['attnscope/variant.hpp'],
    "lib/include/attnscope/gpu/attention.hpp": ['attnscope/analyses/masking.hpp'],
    "lib/cuda/weights.cuh": [],
    "analyses/include/attnscope/analyses/masking.hpp": [],
    "analyses/src/masking.cpp": ['weights.cuh'],
    "analyses/src/masking_cuda.cpp": ['weights.cuh', 'attnscope/analyses/masking.hpp'],
}
BAD_EXPECTED = ("include cycle:", "gpu/attention.hpp (gpu) includes", "masking.cpp is CPU code",
                "attention.hpp reaches softmax.hpp", "dump.hpp reaches lib/include/attnscope/variant.hpp")


def negative_control():
    with tempfile.TemporaryDirectory() as root:
        for f, includes in BAD_TREE.items():
            os.makedirs(os.path.join(root, os.path.dirname(f)), exist_ok=True)
            with open(os.path.join(root, f), "w", encoding="utf-8") as fh:
                fh.write("".join(f'#include "{i}"\n' for i in includes))
        _, problems = problems_of(root)
    missed = [e for e in BAD_EXPECTED if not any(e in p for p in problems)]
    extra = [p for p in problems if "masking_cuda.cpp" in p]
    for e in missed:
        print(f"negative control: the planted problem '{e}' was not found")
    for p in extra:
        print(f"negative control: an allowed include was refused: {p}")
    return not missed and not extra


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    if not negative_control():
        return 1
    edges, problems = problems_of(root)
    for p in problems:
        print(p)
    n_edges = sum(len(t) for t in edges.values())
    print(f"check_includes: {len(edges)} files, {n_edges} includes, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
