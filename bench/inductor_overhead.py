"""Where a compiled step's time goes (issue 32): ssaexec-inductor against its floor.

``python bench/inductor_overhead.py [--model transformer] [--rounds 9] [--steps 300]``

One process, one CPU place, the benchmark's preset for the model (``ssaexec bench``),
timed side by side (each round times a window of every mode, the order fixed; medians):

* ``eager``: the ``torch.nn`` twin, forward, backward, ``torch.optim``;
* ``floor``: the same step as the issue's measurement: the joint forward+backward ATen
  graph (``aot_export_module(..., trace_joint=True)``) compiled whole by Inductor, plus
  one ``torch._foreach_add_`` SGD update: no executor at all;
* ``ssaexec-inductor``: ``ParallelExecutor`` with ``compiler="inductor"``, split into
  the **compiled graphs** (the calls of the compiled functions, Inductor's runtime
  wrappers included), the **segment host work** (reading the inputs from the scope,
  the signature that picks the graph, the step's seeds, storing the outputs) and the
  **executor** (feeds, scheduler, memory plan, fetch: the rest of ``pe.run``).

The split wraps the compiled segments' functions with a clock (``time.perf_counter``),
which adds about a microsecond a call. SGD only (the floor's update is SGD).
"""

import argparse
import copy
import statistics
import time

import torch

from ssaexec.core import compat
from ssaexec.harness import cli, runners
from ssaexec.runtime import inductor


class _Clocked:
    """Every ``_CompiledSegment`` made while installed: its ``run`` and its compiled
    functions timed into ``acc``."""

    def __init__(self):
        self.acc = {"run": 0.0, "fn": 0.0}
        self.segments = []
        cls = inductor._CompiledSegment
        self._init, self._run = cls.__init__, cls.run
        clocked = self

        def init(seg, *a):
            clocked._init(seg, *a)
            clocked.segments.append(seg)

        def run(seg):
            t0 = time.perf_counter()
            try:
                return clocked._run(seg)
            finally:
                clocked.acc["run"] += time.perf_counter() - t0
        cls.__init__, cls.run = init, run

    def clock_graphs(self):
        acc = self.acc
        for seg in self.segments:
            for key, fn in list(seg.graphs.items()):
                def timed(*args, _fn=fn):
                    t0 = time.perf_counter()
                    try:
                        return _fn(*args)
                    finally:
                        acc["fn"] += time.perf_counter() - t0
                seg.graphs[key] = timed

    def restore(self):
        inductor._CompiledSegment.__init__ = self._init
        inductor._CompiledSegment.run = self._run


def floor_step(eager, lr):
    """The joint graph of ``eager``'s twin compiled whole by Inductor, plus a foreach SGD."""
    from ssaexec.core.compat import aot_export_module
    from ssaexec.core.compat import compile_fx
    loss_fn = runners.load_twins().loss_fn

    class Joint(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, y):  # the export wants a tuple, the loss first
            return (loss_fn(self.m(x), y),)

    root = Joint(copy.deepcopy(eager.model))
    gm, sig = aot_export_module(root, [eager.x, eager.y], trace_joint=True,
                                output_loss_index=0)
    named = dict(root.named_parameters())
    named.update(root.named_buffers())
    args = [named[n].detach() for n in sig.parameters] + \
        [named[n].detach() for n in sig.buffers] + [eager.x, eager.y]
    fn = compile_fx(gm, args)
    outs = [a.name for a in next(n for n in reversed(gm.graph.nodes)
                                 if n.op == "output").args[0]]
    grads = sig.backward_signature.gradients_to_parameters
    grad_at = [outs.index(g) for g in grads]
    updated = [named[p].detach() for p in grads.values()]
    loss_at = outs.index(sig.user_outputs[0])

    def step():
        with torch.no_grad():
            out = fn(*args)
            compat.foreach("add_")(updated, [out[i] for i in grad_at], alpha=-lr)
        return float(out[loss_at])
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer", help="a preset: transformer, hf-llama, "
                                                           "hf-bert, or quick (ResNet-18)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=300, help="steps per timed window")
    args = ap.parse_args(argv)
    bap = argparse.ArgumentParser()
    cli.add_arguments(bap)
    s = cli.settings(bap.parse_args(["--quick"] if args.model == "quick"
                                    else ["--model", args.model]))
    if s["optimizer"] != "sgd":
        s["optimizer"] = "sgd"  # the floor's update
    torch.set_num_threads(s.get("torch_threads") or torch.get_num_threads())

    def cfg(mode):
        return {"mode": mode, "places": 1, "device": "cpu", "settings": s}

    eager = runners.EagerTrainer(cfg("torch-eager"))
    floor = floor_step(eager, s["lr"])
    clocked = _Clocked()
    try:
        ours = runners.InductorTrainer(cfg("ssaexec-inductor"))
    finally:
        clocked.restore()
    clocked.clock_graphs()
    steps = {"eager": eager.step, "floor": floor, "ssaexec-inductor": ours.step}
    for fn in steps.values():
        for _ in range(max(5, args.steps // 10)):
            fn()
    times = {k: [] for k in steps}
    split = {"compiled graphs": [], "segment host work": [], "executor": []}
    n = args.steps
    for _ in range(args.rounds):
        for name, fn in steps.items():
            clocked.acc.update(run=0.0, fn=0.0)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            ms = (time.perf_counter() - t0) / n * 1e3
            times[name].append(ms)
            if name == "ssaexec-inductor":
                run, graphs = clocked.acc["run"] / n * 1e3, clocked.acc["fn"] / n * 1e3
                split["compiled graphs"].append(graphs)
                split["segment host work"].append(run - graphs)
                split["executor"].append(ms - run)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.model}: one CPU place, {torch.get_num_threads()} torch thread(s), "
          f"medians of {args.rounds} windows of {n} steps")
    for name, ms in med.items():
        print(f"  {name:18s} {ms:7.3f} ms/step  {med['eager'] / ms:5.2f}x eager")
    for name, v in split.items():
        print(f"    {name:20s} {statistics.median(v):7.3f} ms")
    print(f"  ssaexec-inductor / floor: {med['floor'] / med['ssaexec-inductor']:.2f} of the "
          "floor's speed")
    ours.close()


if __name__ == "__main__":
    main()
