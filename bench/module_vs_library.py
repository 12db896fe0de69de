#!/usr/bin/env python3
"""The Python module against the C++ library on the same work, and a live analysis against a dump
plus the command line (docs/benchmarks.md, "The Python module").

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/module_vs_library.py --build build

Part 1 (the first call of each side in each round is a warm-up, not timed; weights writes into
an array made once, out=, as the C++ side writes into its buffer): q and k of DeiT-T shape (3 heads, 197 tokens, d = 64; --images stacks of them, seeded
Gaussian, float32) through weights (softmax), confusion (softmax, linear:relu) and local_mass
(inline): bench_module_baseline makes the library calls directly on the same heads, and the module
is called on the numpy arrays, alternating round by round; each side's seconds per call are the
median (min-max) over every repeat of every round, in wall and in CPU time (every thread's), and
the module's CPU time over the library's is also taken round by round (the two calls moments apart,
under the same load) and given as its median and quartiles; the load average is printed at the
start and the end. Both sides' checksums must agree (the same work).

Part 2: a committed model over the first Fashion-MNIST test images (random images when the data
set is missing): attnscope.analyze(locality, census, confusion) against dump_model followed by the
three commands on the dump, alternating, medians over the rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def median_spread(xs):
    return statistics.median(xs), min(xs), max(xs)


def part1(at, build, images, rounds, repeats):
    import numpy as np
    rng = np.random.default_rng(0)
    shape = (images, 3, 197, 64)
    q = rng.standard_normal(shape).astype(np.float32)
    k = rng.standard_normal(shape).astype(np.float32)
    baseline = os.path.join(build, "bench", "bench_module_baseline")
    w = np.empty(shape[:2] + (197, 197), np.float32)  # written into, as the C++ side's buffer
    work = [("weights", "softmax", lambda: at.weights(q, k, "softmax", out=w),
             lambda r: float(r.sum(dtype=np.float64))),
            ("confusion", "softmax", lambda: at.confusion(q, k, "softmax"),
             lambda r: float(r["pairs"].sum())),
            ("confusion", "linear:relu", lambda: at.confusion(q, k, "linear:relu"),
             lambda r: float(r["pairs"].sum())),
            ("local_mass", "inline", lambda: at.local_mass(q, k, "inline", (1, 14, 14)),
             lambda r: float(np.nansum(r)))]
    rows = []
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        qf, kf = os.path.join(d, "q.f32"), os.path.join(d, "k.f32")
        q.tofile(qf)
        k.tofile(kf)
        for name, spec, call, checksum in work:
            lib, mod, lib_cpu, mod_cpu = [], [], [], []
            lib_sum = mod_sum = None
            for _ in range(rounds):
                # one call more than timed on each side: the first (threads started, pages
                # touched) is a warm-up and left out
                out = subprocess.run([baseline, name, spec, qf, kf, str(images * 3), "197", "64",
                                      str(repeats + 1)], check=True, capture_output=True, text=True)
                for line in out.stdout.split("\n")[1:]:
                    if line.strip():
                        s, cpu, c = line.split()
                        lib.append(float(s))
                        lib_cpu.append(float(cpu))
                        lib_sum = float(c)
                call()
                for _ in range(repeats):
                    t, cpu = time.perf_counter(), time.process_time()
                    r = call()
                    mod.append(time.perf_counter() - t)
                    mod_cpu.append(time.process_time() - cpu)
                mod_sum = checksum(r)
            if not abs(lib_sum - mod_sum) <= 1e-6 * max(1.0, abs(lib_sum)):
                raise SystemExit(f"{name} {spec}: checksums differ: library {lib_sum}, "
                                 f"module {mod_sum}")
            lm, ll, lh = median_spread(lib)
            mm, ml, mh = median_spread(mod)
            lc, lcl, lch = median_spread(lib_cpu)
            mc, mcl, mch = median_spread(mod_cpu)
            # the rounds paired: each round's module CPU over the library's (same load, moments apart)
            paired = sorted(m / l for m, l in zip(mod_cpu, lib_cpu))
            pq = statistics.quantiles(paired, n=4)
            rows.append((name, spec, lm, ll, lh, mm, ml, mh, mm / lm, lc, lcl, lch, mc, mcl, mch,
                         mc / lc, statistics.median(paired), pq[0], pq[2]))
    load_end = os.getloadavg()
    print(f"\n{images} images x 3 heads of 197 tokens, d = 64, float32; {rounds} rounds x "
          f"{repeats} repeats each side; seconds per call, wall and CPU (every thread's): median "
          f"(min-max); load average (1, 5, 15 min) at the start {load_start[0]:.2f} "
          f"{load_start[1]:.2f} {load_start[2]:.2f}, at the end {load_end[0]:.2f} "
          f"{load_end[1]:.2f} {load_end[2]:.2f}\n")
    print("| work | variant | C++ library, wall | module, wall | module / library, wall "
          "| C++ library, CPU | module, CPU | module / library, CPU | per round, CPU (quartiles) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, spec, lm, ll, lh, mm, ml, mh, ratio, lc, lcl, lch, mc, mcl, mch,
         cratio, pm, p1, p3) in rows:
        print(f"| {name} | {spec} | {lm:.4f} ({ll:.4f}-{lh:.4f}) | {mm:.4f} ({ml:.4f}-{mh:.4f}) "
              f"| {ratio:.3f} | {lc:.4f} ({lcl:.4f}-{lch:.4f}) | {mc:.4f} ({mcl:.4f}-{mch:.4f}) "
              f"| {cratio:.3f} | {pm:.3f} ({p1:.3f}-{p3:.3f}) |")


def part2(at, build, model_name, images, rounds):
    import torch
    sys.path.insert(0, os.path.join(REPO, "python"))
    from attnscope_dump import data, dump_model
    from attnscope_dump.weights_io import load_weights
    model = load_weights(os.path.join(REPO, "data", "models", model_name + ".h5"))
    if os.path.isdir(data.DEFAULT_ROOT):
        loader = data.loader("test", 64, limit=images)
        source = "Fashion-MNIST test images"
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(images, 1, 28, 28, generator=g)
        loader = [(x[i:i + 64], torch.zeros(len(x[i:i + 64]), dtype=torch.long))
                  for i in range(0, images, 64)]
        source = "random images (Fashion-MNIST is not installed)"
    cli = os.path.join(build, "apps", "attnscope")
    analyses = ["locality", "census", "confusion"]
    live_t, dump_t, cmd_t = [], [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            t = time.perf_counter()
            at.analyze(model, loader, analyses, out=os.path.join(d, f"live{r}"))
            live_t.append(time.perf_counter() - t)
            dump = os.path.join(d, f"d{r}.h5")
            t = time.perf_counter()
            dump_model(model, loader, dump, with_out=False, with_logits=False,
                       with_labels=False)
            dumped = time.perf_counter()
            for a in analyses:
                subprocess.run([cli, a, "--dump", dump, "--out", os.path.join(d, f"cli{r}", a)],
                               check=True, capture_output=True)
            end = time.perf_counter()
            dump_t.append(dumped - t)
            cmd_t.append(end - dumped)
            os.remove(dump)
    lm = statistics.median(live_t)
    dm, cm = statistics.median(dump_t), statistics.median(cmd_t)
    print(f"\n{model_name}, {images} {source}, analyses {', '.join(analyses)}; {rounds} rounds, "
          f"medians (min-max)\n")
    print("| path | seconds |")
    print("|---|---|")
    print(f"| attnscope.analyze (live) | {lm:.2f} ({min(live_t):.2f}-{max(live_t):.2f}) |")
    print(f"| dump_model + 3 commands | {dm + cm:.2f} (dump {dm:.2f} + commands {cm:.2f}) |")
    print(f"| live / (dump + commands) | {lm / (dm + cm):.3f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--images", type=int, default=32, help="part 1: stacks of DeiT-T heads")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--model", default="vit14-softmax-fmnist", help="part 2: a committed model")
    p.add_argument("--model-images", type=int, default=256)
    p.add_argument("--skip-live", action="store_true")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "python"))
    import attnscope as at
    print(f"attnscope {at.__version__} ({at._attnscope.arch}); OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; {os.cpu_count()} CPUs; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    part1(at, args.build, args.images, args.rounds, args.repeats)
    if not args.skip_live:
        part2(at, args.build, args.model, args.model_images, max(1, args.rounds // 2))
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
