"""Step time of 2 places in one process, each way, on one model's compiled step (issue 50).

``python bench/places_turns.py [--model transformer] [--compiler inductor] [--steps 300]
[--rounds 3]``

Four trainers of ``ssaexec bench``'s preset, built side by side and timed in turn, round by
round (medians of each way's windows, milliseconds a step): one place; 2 places kept on
turns with the pool (``bench/places_scaling.py``'s ``_keep``: compiled graphs that release
the interpreter lock run beside the caller, ``Scheduler._run_sync``); 2 places kept on
the pool's threads; 2 places with ``ExecutionStrategy(num_threads=1)`` (plain turns: one
thread runs everything). Also each compiled graph's call alone and beside another (two
threads calling two places' graphs at once): how much of a call the overlap keeps.
"""

import argparse
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def _graph_calls(trainer):
    """(function, inputs) of each place's first compiled segment, its inputs caught in
    one more step (kept alive here, so the step's frees leave them be)."""
    from ssaexec.runtime import inductor
    runner = trainer.pe._runner((trainer.loss,))
    segs = {}
    for b in runner.bodies:
        seg = getattr(b, "__self__", None)
        if isinstance(seg, inductor._CompiledSegment) and seg.graphs:
            segs.setdefault(seg.seg.place_idx, seg)
    caught = {}
    for place, seg in segs.items():
        key, fn = next(iter(seg.graphs.items()))

        def catch(*inputs, fn=fn, place=place):
            caught[place] = (fn, inputs)
            return fn(*inputs)
        seg.graphs[key] = catch
    trainer.step()
    for place, seg in segs.items():
        key = next(iter(seg.graphs))
        seg.graphs[key] = caught[place][0]
    return [caught[p] for p in sorted(caught)]


def _calls_ms(calls, n):
    def loop(fn, inputs, box):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*inputs)
        box.append(time.perf_counter() - t0)
    one = []
    loop(*calls[0], one)
    both = []
    threads = [threading.Thread(target=loop, args=(*c, both)) for c in calls[:2]]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pair = time.perf_counter() - t0
    return one[0] / n * 1e3, pair / n * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--compiler", default="inductor", choices=("inductor",))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be at least 1")
    import torch
    import places_scaling as ps
    from ssaexec.core.place import available_cores
    s = ps._settings(args.model)
    ways = {"1 place": (1, None, None), "2 places, turns (graphs beside)": (2, None, "turns"),
            "2 places, threads": (2, None, "threads"),
            "2 places, one thread (num_threads=1)": (2, 1, None)}
    trainers = {}
    for way, (places, nt, keep) in ways.items():
        torch.set_num_threads(s.get("torch_threads") or available_cores())
        t = trainers[way] = ps._trainer(s, places, nt, args.compiler)
        for _ in range(20):  # record, compile, the probe
            t.step()
        if keep is not None:
            ps._keep(t, keep)
    ms = {w: [] for w in ways}
    for r in range(args.rounds):
        for way in ways:
            t = trainers[way]
            t0 = time.perf_counter()
            for _ in range(args.steps):
                t.step()
            ms[way].append((time.perf_counter() - t0) / args.steps * 1e3)
    one = statistics.median(ms["1 place"])
    print(f"{args.model}, compiler={args.compiler!r}, {available_cores()} cores; medians of "
          f"{args.rounds} windows of {args.steps} steps")
    for way, v in ms.items():
        places = ways[way][0]
        print(f"  {way:40s} {statistics.median(v):6.3f} ms a step  "
              f"({places * one / statistics.median(v):.2f}x one place's images/sec)")
    calls = _graph_calls(trainers["2 places, turns (graphs beside)"])
    if len(calls) >= 2:
        alone, pair = _calls_ms(calls, 2000)
        print(f"  a place's compiled graph: {alone:.3f} ms a call alone, two at once "
              f"{pair:.3f} ms a pair ({2 * alone / pair:.2f}x one thread's calls)")
    for t in trainers.values():
        t.close()


if __name__ == "__main__":
    main()
