"""A second process reuses the compiled segments (issue 32): the same program compiled by
two processes in turn, with an empty Inductor cache before the first.

``python bench/inductor_cache.py [--program examples/small_resnet.json] [--steps 3]``

Each process is ``ssaexec run PROGRAM --compiler inductor --places cpu:1``; the table gives
its wall time and the seconds of its compiles (the sum of the "compiled in" lines). The
target: the second process is ready in at most 25 % of the first's compile.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(program, steps, cache):
    cmd = [sys.executable, "-m", "ssaexec", "run", program, "--steps", str(steps),
           "--compiler", "inductor", "--places", "cpu:1"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    compiles = [float(s) for s in re.findall(r"compiled in ([\d.]+) s", proc.stderr)]
    return wall, compiles


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="examples/small_resnet.json")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ssaexec-inductor-cache-") as cache:
        rows = [run(args.program, args.steps, cache) for _ in range(2)]
    print(f"{args.program}, {args.steps} steps, one CPU place, an empty cache before process 1")
    for k, (wall, compiles) in enumerate(rows, start=1):
        print(f"  process {k}: wall {wall:6.1f} s, {len(compiles)} compiles, "
              f"{sum(compiles):6.1f} s compiling")
    first, second = sum(rows[0][1]), sum(rows[1][1])
    print(f"second / first: compiling {second / first:.1%}, wall {rows[1][0] / rows[0][0]:.1%} "
          f"(target: <= 25 % of the first compile)")


if __name__ == "__main__":
    main()
