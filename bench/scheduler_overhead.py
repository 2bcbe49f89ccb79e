"""Scheduler overhead: microseconds per op on graphs of no-op ops, ssaexec vs a loop vs dask.

Graphs (``--ops`` ops in all, default 10,000): ``chain`` (op i waits for op
i-1) and ``4 chains`` (four independent chains side by side, ops interleaved
by index). Every executor calls the same no-op function once per op:

* ``python loop``: a plain ``for`` over a topological order (the floor: the
  cost of calling the functions and nothing else);
* ``ssaexec Scheduler(k)``: ``Scheduler(k).run(DependencyPlan(n, producers, is_comm), fns)``;
  the plan is built once per graph, as the ``GraphRunner`` does (its build time is
  reported apart); ``k = 1`` is the synchronous mode, ``k = 4`` the thread pool;
* ``dask threaded``: ``dask.threaded.get(dsk, keys)`` with one task per op
  depending on its predecessor (``num_workers`` = 4, and dask's default = cores).

Each figure is the median over ``--repeats`` runs. Overhead per op = time per
op minus the floor's. Prints a table and writes JSON (``--json``).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ssaexec.runtime.scheduler import DependencyPlan, Scheduler  # noqa: E402


def noop(*args):
    return None


def chain_graph(n):
    return [[i - 1] if i else [] for i in range(n)]


def wide_graph(n, width=4):
    # op i belongs to chain i % width and waits for the previous op of its chain
    return [[i - width] if i >= width else [] for i in range(n)]


def topo_order(producers):
    n = len(producers)
    pending = [len(p) for p in producers]
    succ = [[] for _ in range(n)]
    for i, ps in enumerate(producers):
        for p in ps:
            succ[p].append(i)
    order, stack = [], [i for i in range(n) if pending[i] == 0]
    while stack:
        i = stack.pop()
        order.append(i)
        for j in succ[i]:
            pending[j] -= 1
            if pending[j] == 0:
                stack.append(j)
    return order


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def measure(name, producers, repeats, dask_workers, threads=(1, 4)):
    """Rows of the table for one graph, and the ``DependencyPlan`` build time (s).

    ``threads``: the ``Scheduler`` sizes to time; ``dask_workers``: dask's
    ``num_workers`` values (``None`` = its default), empty to leave dask out.
    ``bench/dispatch_overhead.py`` calls this too.
    """
    n = len(producers)
    fns = [noop] * n
    order = topo_order(producers)
    rows = []

    def loop():
        for i in order:
            fns[i]()

    rows.append(("python loop (floor)", timed(loop, repeats)))
    t = time.perf_counter()
    plan = DependencyPlan(n, producers, [False] * n)
    plan_build = time.perf_counter() - t
    for k in threads:
        sched = Scheduler(k, name=f"bench{k}")
        try:
            sched.run(plan, fns)  # starts the pool threads outside the timing
            rows.append((f"ssaexec Scheduler({k})", timed(lambda: sched.run(plan, fns),
                                                          repeats)))
        finally:
            sched.close()
    dask = None
    if dask_workers:
        try:
            import dask
            import dask.threaded
        except ImportError:
            dask = None
    if dask is not None:
        keys = [f"t{i}" for i in range(n)]
        dsk = {keys[i]: (noop, *[keys[p] for p in producers[i]]) for i in range(n)}
        succ_count = [0] * n
        for ps in producers:
            for p in ps:
                succ_count[p] += 1
        sinks = [keys[i] for i in range(n) if succ_count[i] == 0]
        for w in dask_workers:
            label = f"dask threaded ({w or 'default'} workers)"
            kw = {"num_workers": w} if w else {}
            dask.threaded.get(dsk, sinks, **kw)  # warm its thread pool
            rows.append((label, timed(lambda: dask.threaded.get(dsk, sinks, **kw), repeats)))
    floor = statistics.median(rows[0][1]) / n
    out = []
    for label, ts in rows:
        per_op = statistics.median(ts) / n
        out.append({"graph": name, "executor": label, "ops": n, "seconds": ts,
                    "us_per_op": per_op * 1e6, "overhead_us_per_op": (per_op - floor) * 1e6})
    return out, plan_build


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="out/bench/scheduler_overhead.json")
    args = ap.parse_args(argv)
    from ssaexec.core.place import available_cores
    cores = available_cores()
    machine = {"cpu": cpu_model(), "cores": cores, "python": platform.python_version(),
               "loadavg_start": list(os.getloadavg())}
    print(f"scheduler overhead: {args.ops} no-op ops, median of {args.repeats} runs; "
          f"{cores}-core {machine['cpu']}, Python {machine['python']}")
    rows, builds = [], {}
    for name, producers in (("chain", chain_graph(args.ops)),
                            ("4 chains", wide_graph(args.ops, 4))):
        r, builds[name] = measure(name, producers, args.repeats, dask_workers=(4, None))
        rows += r
    head = f"{'graph':<9} {'executor':<30} {'total ms':>9} {'us/op':>8} {'overhead us/op':>15}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['graph']:<9} {r['executor']:<30} {statistics.median(r['seconds']) * 1e3:>9.1f} "
              f"{r['us_per_op']:>8.2f} {r['overhead_us_per_op']:>15.2f}")
    print()
    ratios = []
    for name in builds:
        ours = [r for r in rows if r["graph"] == name and r["executor"].startswith("ssaexec")]
        theirs = [r for r in rows if r["graph"] == name and r["executor"].startswith("dask")]
        worst = max(ours, key=lambda r: r["us_per_op"])
        print(f"{name}: DependencyPlan built in {builds[name] * 1e3:.1f} ms "
              f"({builds[name] / args.ops * 1e6:.2f} us/op, once per graph)")
        for d in theirs:
            for o in ours:
                ratio = d["overhead_us_per_op"] / max(o["overhead_us_per_op"], 1e-9)
                ratios.append({"graph": name, "ssaexec": o["executor"], "dask": d["executor"],
                               "overhead_ratio": ratio})
                print(f"  {d['executor']} / {o['executor']} overhead: {ratio:.1f}x")
        print(f"  target <= 10 us/op: {'met' if worst['us_per_op'] <= 10 else 'MISSED'} "
              f"(worst ssaexec {worst['us_per_op']:.2f} us/op)")
    ok = all(r["overhead_ratio"] >= 20 for r in ratios)
    print(f"target >= 20x less overhead than dask (every pairing): {'met' if ok else 'MISSED'} "
          f"(smallest {min(r['overhead_ratio'] for r in ratios):.1f}x)" if ratios else
          "dask not installed: no comparison")
    machine["loadavg_end"] = list(os.getloadavg())
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": machine, "ops": args.ops, "rows": rows,
                                    "plan_build_seconds": builds, "ratios": ratios}, indent=1))
        print(f"raw timings: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
