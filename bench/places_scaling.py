"""Several places in one process against one place and DDP (issue 50: places never cost).

``python bench/places_scaling.py [--models transformer,hf-llama,quick]
[--compilers none,straight,inductor,auto] [--rounds 5] [--no-harness] [--json FILE]``

Compilers: ``none`` (``compiler=None``: one all-reduce per gradient in one process),
``straight`` (``compiler=None`` on the graph ``compiler="auto"`` builds, gradients in
buckets: the straight-line tier that ``auto`` runs before its switch), ``inductor`` and
``auto`` (timed after its switch and the probe the switch starts).

Two parts, each paired (the ways alternate window by window, in one run):

1. **In one process** (``ways``): for each model's preset and compiler, trainers of one
   place and of two places built side by side in this process, their timed windows
   alternating round by round: ``1 place``, ``2 places`` as the executor runs them
   (``runtime.places_rule``: threads or turns, picked on its first steps; the pick and its
   reason are printed), and two places kept on the pool's ``threads`` and on ``turns``
   (the rule's choice set after the warm-up, ``_keep``: the pool stays, so turns run the
   compiled graphs that release the interpreter lock beside the caller, as the rule's
   turns do; ``ExecutionStrategy(num_threads=1)`` would run everything in one thread).
   Every trainer gets the torch threads the harness gives it (``ssaexec bench``: the
   preset's, else every core; the executor divides them among its places). Images/sec: median over rounds; ratios against ``1 place``.
2. **Against processes** (``harness``): ``ssaexec bench`` for the same preset with modes
   ``ssaexec``, ``torch-ddp`` and ``ssaexec-nproc`` (one process per place, torchrun) on
   1 and 2 places, interleaved by the harness: 2 places in one process against 1 place,
   against DDP with 2 processes, and ssaexec's own 2 processes.

The acceptance of issue 50: ``2 places / 1 place >= 1.0`` and ``2 places / DDP 2 >= 1.0``.
Each line also gives the process's page faults a step for each way, and whether malloc
kept freed memory (``core.host_allocator``; ``SSAEXEC_HOST_ALLOCATOR=system`` to compare).
Use a quiet machine: on a loaded one, torch's intra-op threads spin against other
processes and every figure with more than one thread collapses.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MODELS = ("transformer", "hf-llama", "quick")
PRESET_ARGS = {"quick": ["--quick"], "tiny": ["--preset", "tiny"]}  # tiny: the tests' MLP
# "straight": compiler=None on the graph compiler="auto" builds (gradients in buckets,
# BuildStrategy.for_compiler): the straight-line code "auto" runs before its switch, kept
# there (with a warm Inductor cache "auto" switches on its second step)
COMPILERS = ("none", "straight", "inductor", "auto")
WAYS = ("1 place", "2 places", "2 threads", "2 turns")


def _settings(model):
    from ssaexec.harness import cli
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    return cli.settings(ap.parse_args(PRESET_ARGS.get(model, ["--model", model])))


def _trainer(s, places, num_threads, compiler):
    """A ``ParallelTrainer`` of the preset ``s`` on ``places`` CPU places."""
    import ssaexec as se
    from ssaexec.harness import runners
    from ssaexec.harness.workloads import IMPORTED

    buckets = compiler == "straight"
    compiler = None if buckets else compiler
    base = runners.FromTorchTrainer if compiler and s["model"] not in IMPORTED \
        else runners.ParallelTrainer

    class Trainer(base):
        def __init__(self, cfg):
            self.compiler = compiler
            strategy, executor = se.ExecutionStrategy, se.ParallelExecutor
            # the way forced (num_threads), or the executor's rule (None)
            se.ExecutionStrategy = lambda **kw: strategy(num_threads=num_threads, **kw)
            if buckets:
                se.ParallelExecutor = lambda *a, **kw: executor(
                    *a, build_strategy=se.BuildStrategy().for_compiler("auto"), **kw)
            try:
                super().__init__(cfg)
            finally:
                se.ExecutionStrategy, se.ParallelExecutor = strategy, executor

    return Trainer({"mode": "ssaexec", "places": places, "device": "cpu", "settings": s})


def _keep(trainer, way):
    """From now on ``trainer``'s runner runs its places ``way`` ("threads" or "turns"), as
    if the rule (``runtime.places_rule``) had picked it, and is not probed again."""
    from ssaexec.runtime.places_rule import PlacesChoice
    pe = trainer.pe
    runner = pe._runner((trainer.loss,))
    probe = pe._probes._probes[id(runner)]
    probe.done, probe.choice = True, PlacesChoice(way, "kept by bench/places_scaling.py")
    probe.kept = -10 ** 9  # never stale: no probe again
    runner.inline = way == "turns"


def ways(model, compiler, rounds):
    """Part 1: the ways of two places against one place, paired in this process."""
    import torch
    from ssaexec.core import host_allocator
    from ssaexec.core.place import available_cores
    from ssaexec.harness import runners
    from ssaexec.runtime import places_rule
    s = _settings(model)
    threads = s.get("torch_threads") or available_cores()
    spec = {"1 place": (1, None), "2 places": (2, None), "2 threads": (2, None),
            "2 turns": (2, None)}
    trainers = {}
    for way, (places, nt) in spec.items():
        torch.set_num_threads(threads)  # as the harness's worker does
        t = trainers[way] = _trainer(s, places, nt, compiler)
        # untimed: the warm-up, the probe's steps (runtime.places_rule) and a compile
        for _ in range(max(s["warmup"], len(places_rule.PROBE)) + (2 if compiler else 0)):
            t.step()
        if compiler == "auto":  # timed after the switch, and after the probe it starts
            start = time.perf_counter()
            while (runners.tier_report(t.pe) or {}).get("switch_step") is None and \
                    time.perf_counter() - start < 300:
                t.step()
            for _ in range(len(places_rule.PROBE)):
                t.step()
        if way in ("2 threads", "2 turns"):
            _keep(t, way.split()[1])
    ips = {w: [] for w in WAYS}
    faults = {w: [] for w in WAYS}  # page faults of the process a step (core.host_allocator)
    for r in range(rounds):
        order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
        for way in order:
            t = trainers[way]
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            for _ in range(s["steps"]):
                t.step()
            ips[way].append(spec[way][0] * s["batch_per_place"] * s["steps"]
                            / (time.perf_counter() - t0))
            faults[way].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                               / s["steps"])
    pe = trainers["2 places"].pe
    choice = pe._probes.choice(pe._runner((trainers["2 places"].loss,)))
    out = {"model": model, "compiler": compiler, "torch_threads": threads,
           "images_per_sec": ips,
           "median": {w: statistics.median(v) for w, v in ips.items()},
           "faults_per_step": {w: statistics.median(v) for w, v in faults.items()},
           "host_allocator": host_allocator.state(),
           "choice": None if choice is None else {"mode": choice.mode,
                                                  "reason": choice.reason}}
    one = out["median"]["1 place"]
    out["vs_1_place"] = {w: m / one for w, m in out["median"].items()}
    out["paired_vs_1_place"] = {w: statistics.median(a / b for a, b in
                                                     zip(ips[w], ips["1 place"]))
                                for w in WAYS}
    for t in trainers.values():
        t.close()
    return out


def harness(model):
    """Part 2: ``ssaexec bench`` with DDP and ssaexec's own processes, on 1 and 2 places."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        args = [sys.executable, "-m", "ssaexec", "bench",
                *PRESET_ARGS.get(model, ["--model", model]),
                "--modes", "ssaexec,torch-ddp,ssaexec-nproc", "--place-counts", "1,2",
                "--places", "cpu:2", "--nproc", "2", "--out-dir", tmp, "--json", path]
        res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if res.returncode != 0:
            return {"model": model, "error": res.stderr[-2000:]}
        with open(path) as f:
            data = json.load(f)
    by = {(r["mode"], r["places"]): r.get("images_per_sec_median")
          for r in data["runs"] if r.get("error") is None}
    one = by.get(("ssaexec", 1))

    def ratio(a, b):
        return by[a] / by[b] if by.get(a) and by.get(b) else None
    return {"model": model, "images_per_sec": {f"{m}@{p}": v for (m, p), v in by.items()},
            "ssaexec 2 / 1": ratio(("ssaexec", 2), ("ssaexec", 1)),
            "ssaexec 2 / torch-ddp 2": ratio(("ssaexec", 2), ("torch-ddp", 2)),
            "ssaexec-nproc 2 / ssaexec 1": (by.get(("ssaexec-nproc", 2)) or 0) / one
            if one else None,
            "machine": data.get("machine")}


def _allocator(state):
    if not state:
        return "not set"
    return "keeps freed memory" if state["kept"] else state["reason"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--compilers", default="none",
                    help="comma list of none, straight, inductor, auto "
                         "(ExecutionStrategy(compiler=); straight: None on auto's graph)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-harness", action="store_true", help="part 1 only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS + ("tiny",)] or ([] if models else ["(none)"])
    if bad:
        ap.error(f"unknown model {bad[0]!r}; choose from {', '.join(MODELS)}")
    names = [c for c in args.compilers.split(",") if c]
    bad = [c for c in names if c not in COMPILERS] or ([] if names else ["(none)"])
    if bad:
        ap.error(f"unknown compiler {bad[0]!r}; choose from {', '.join(COMPILERS)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    compilers = [None if c == "none" else c for c in names]
    result = {"ways": [], "harness": []}
    for model in models:
        for compiler in compilers:
            r = ways(model, compiler, args.rounds)
            result["ways"].append(r)
            print(f"{model} compiler={compiler} torch_threads={r['torch_threads']}: "
                  + ", ".join(f"{w} {r['median'][w]:.1f} img/s "
                              f"({r['paired_vs_1_place'][w]:.2f}x)" for w in WAYS), flush=True)
            print("  page faults a step: " + ", ".join(
                f"{w} {r['faults_per_step'][w]:.0f}" for w in WAYS)
                + f" (malloc: {_allocator(r['host_allocator'])})", flush=True)
            if r["choice"]:
                print(f"  the rule kept {r['choice']['mode']}: {r['choice']['reason']}",
                      flush=True)
        if not args.no_harness:
            h = harness(model)
            result["harness"].append(h)
            print(f"{model} harness: " + json.dumps({k: v for k, v in h.items()
                                                      if k != "machine"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
