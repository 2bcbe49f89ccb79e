"""Two revisions side by side in one run: did a change slow the executor down?

``python bench/compare_revisions.py BASE [HEAD] [--rounds 2]``

Checks out each revision (a commit, tag or branch; HEAD by default for the second) into a
temporary ``git worktree`` and, alternating the revisions round by round so that a drift
of the machine falls on both alike, runs in each:

* ``bench/dispatch_overhead.py --quick``: its target figures (the scheduler alone, µs per
  op above the floor on the builder chain, the imported MLP and the small transformer, the
  transformer's paired ratio to eager);
* ``bench/inductor_overhead.py --model transformer``: ms per step of eager and of
  ``ssaexec-inductor``, and ours against eager.

Each run imports the revision's own package (``PYTHONPATH`` is the worktree, the working
directory too) and the revision's own benchmark scripts. Prints, per figure, the median
of each revision over the rounds, and new / base; writes the rounds to
``out/bench/compare_revisions.json``. Timing figures on a shared machine are noisy: read
a difference against the spread of the rounds, which the table shows.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INDUCTOR_LINE = re.compile(r"^\s*(eager|floor|ssaexec-inductor)\s+([\d.]+) ms/step")


def worktree(rev, root):
    """A detached worktree of ``rev`` under ``root``; its path."""
    path = Path(root) / re.sub(r"[^\w.-]", "_", rev)
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path),
                    rev], check=True)
    return path


def run(tree, argv, timeout):
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    out = subprocess.run([sys.executable] + argv, cwd=tree, env=env, text=True,
                         capture_output=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"compare_revisions: {' '.join(argv)} failed in {tree} "
                         f"(exit {out.returncode}):\n{out.stderr[-2000:]}")
    return out.stdout


def dispatch_figures(tree, scratch):
    path = Path(scratch) / "dispatch.json"
    run(tree, ["bench/dispatch_overhead.py", "--quick", "--json", str(path)], 900)
    result = json.loads(path.read_text())
    return {t["name"]: t["value"] for t in result.get("targets", [])}


def inductor_figures(tree, steps):
    text = run(tree, ["bench/inductor_overhead.py", "--model", "transformer", "--rounds", "3",
                      "--steps", str(steps)], 1200)
    ms = {m.group(1): float(m.group(2)) for m in map(INDUCTOR_LINE.match, text.splitlines())
          if m}
    if "eager" not in ms or "ssaexec-inductor" not in ms:
        raise SystemExit(f"compare_revisions: no ms/step lines in inductor_overhead's "
                         f"output:\n{text[-2000:]}")
    return {"inductor transformer, eager ms/step": ms["eager"],
            "inductor transformer, ssaexec-inductor ms/step": ms["ssaexec-inductor"],
            "inductor transformer, ssaexec-inductor x eager": ms["eager"] /
            ms["ssaexec-inductor"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="the revision to compare against")
    ap.add_argument("new", nargs="?", default="HEAD", help="the revision to measure (HEAD)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per revision (2)")
    ap.add_argument("--steps", type=int, default=100,
                    help="steps per timed window of inductor_overhead (100)")
    ap.add_argument("--json", default="out/bench/compare_revisions.json")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1")
    revs = {}
    for rev in (args.base, args.new):
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "-q",
                              rev + "^{commit}"], capture_output=True, text=True)
        if sha.returncode != 0:
            ap.error(f"no such revision: {rev!r}")
        revs[rev] = sha.stdout.strip()
    root = tempfile.mkdtemp(prefix="ssaexec-compare-")
    trees = {}
    rounds = {rev: [] for rev in revs}
    try:
        for rev in revs:
            trees[rev] = worktree(revs[rev], root)
        for k in range(args.rounds):
            order = list(revs) if k % 2 == 0 else list(revs)[::-1]
            for rev in order:
                print(f"[round {k + 1}/{args.rounds}] {rev} ({revs[rev][:9]})", file=sys.stderr,
                      flush=True)
                figures = dispatch_figures(trees[rev], root)
                figures.update(inductor_figures(trees[rev], args.steps))
                rounds[rev].append(figures)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(tree)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    base, new = (rounds[r] for r in revs)
    names = [n for n in base[0] if all(n in r for r in base + new)]
    print(f"{'figure':<72} {args.base[:10]:>10} {args.new[:10]:>10} {'new/base':>9}  "
          f"spread (base; new)")
    table = []
    for n in names:
        b = statistics.median(r[n] for r in base)
        v = statistics.median(r[n] for r in new)
        spread = (f"{min(r[n] for r in base):.3g}-{max(r[n] for r in base):.3g}; "
                  f"{min(r[n] for r in new):.3g}-{max(r[n] for r in new):.3g}")
        ratio = v / b if b else float("nan")
        print(f"{n:<72} {b:>10.3g} {v:>10.3g} {ratio:>9.2f}  {spread}")
        table.append({"figure": n, "base": b, "new": v, "new_over_base": ratio})
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"base": revs[args.base], "new": revs[args.new],
                               "rounds": rounds, "table": table}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
