"""Dispatch overhead: the host time ssaexec adds per op above a bare loop over the same kernels.

Issue 13 asks for a per-op path as lean as a hand-written loop. This script
measures how far the executors are from that, through the public API only, so
it measures whatever the executors do when it runs. Three measurements, each
against its own floor:

(a) **Scheduler alone.** ``ssaexec.runtime.scheduler.Scheduler(k).run(plan, fns)``
    on ``--sched-ops`` (10,000) no-op functions, as a chain and as 4 chains side
    by side, for ``k`` = 1, 2, 4 threads; the floor is a Python loop calling the
    same no-op over a topological order. Driven by ``bench/scheduler_overhead.py``
    (``measure``). Target: at most 2 us/op on the chain.
(b) **Whole dispatch on real tiny kernels.** Programs whose kernels take about a
    microsecond, so what is left is dispatch:

    * a builder program of ``--ops`` (2,000) ops, a chain of ``scale`` /
      ``elementwise_add`` / ``relu`` on a ``[4, 4]`` tensor, run by ``se.Executor``
      and by ``se.ParallelExecutor`` on one place; the floor is a Python loop that
      makes the same torch calls on the same tensors (``x * s + b``,
      ``torch.add``, ``torch.relu``, the kernels of those ops);
    * a tiny MLP (7 ``Linear(4, 4)`` layers, batch 4) imported with
      ``se.from_torch`` with SGD; the floor is the same joint forward+backward ATen
      graph (``aot_export_module(..., trace_joint=True)``) run as a plain
      ``torch.fx`` GraphModule, plus one ``torch._foreach_add_`` SGD update.

    Reported: microseconds per op above the floor. Target: at most 3 us/op on CPU.
(c) **The small imported transformer** (``bench/torch_models.py``'s
    ``Transformer``: 2 post-norm encoder layers, d_model 32, 2 heads, batch 4 x
    seq 16, SGD): time per training step of torch eager (forward, backward,
    ``torch.optim.SGD(foreach=True)``), the fx floor as in (b), and ssaexec
    (``Executor``, and ``ParallelExecutor`` on one place with the default
    strategy, and with ``num_threads=1``) on the program ``se.from_torch`` makes.
    Target: ssaexec ``ParallelExecutor`` at least 0.85x eager.

Policy. torch runs ``--torch-threads`` (1) intra-op threads everywhere: the
kernels are tiny, and the issue's figures are for one thread. In (b) and (c) the
modes are timed side by side: each round times a window of every mode, the order
rotating from round to round, so a burst of load from another process hits all
modes alike; figures are medians over rounds, and "paired" ratios are medians of
the ratios within a round. Warm-up runs (which build the executors' plans and
graphs) are not timed. Each mode trains its own copy of the weights.
Nothing here asserts on speed: the targets are printed as met or missed.

``python bench/dispatch_overhead.py [--quick] [--device cuda] [--json out.json]``
prints the tables and writes every raw timing and the machine as JSON.
"""

import argparse
import copy
import gc
import json
import operator
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import scheduler_overhead  # noqa: E402
import ssaexec as se  # noqa: E402
from ssaexec.core import compat  # noqa: E402
from ssaexec.harness import load_twins, machine_description  # noqa: E402

SCHEMA = "ssaexec-dispatch/1"

# (quick, full) settings; the quick ones keep the whole script within ~30 s on 2 cores
SETTINGS = {
    "sched_ops": (2_000, 10_000), "sched_repeats": (3, 7),
    "ops": (300, 2_000), "runs_per_window": (2, 3),
    "steps": (3, 10), "warmup": (2, 5), "repeats": (3, 7),
}

TARGETS = {"scheduler_us_per_op": 2.0, "dispatch_overhead_us_per_op": 3.0,
           "transformer_x_eager": 0.85}


# --- timing -------------------------------------------------------------------------------

def interleaved(fns, warmup, repeats, calls, sync):
    """Seconds per call of each callable in ``fns``, timed side by side.

    Parameters
    ----------
    fns : dict of str -> callable
        The modes to compare; each call is one unit of work (a run, a step).
    warmup : int
        Untimed calls of each mode first.
    repeats : int
        Rounds; each round times one window of ``calls`` calls of every mode,
        starting one mode later than the round before.
    calls : int
        Calls per window.
    sync : callable
        Waits for the device (``torch.cuda.synchronize`` on GPUs).

    Returns
    -------
    dict of str -> list of float
        Per mode, the mean seconds per call of each window, in round order.
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    sync()
    out = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = fns[name]
            # a collection of the previous window's garbage must not land in this one
            gc.collect()
            sync()
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            out[name].append((time.perf_counter() - t) / calls)
    return out


def _paired(num, den):
    """Median over rounds of ``den[r] / num[r]``: a speed ratio within each round."""
    return statistics.median(d / n for n, d in zip(num, den, strict=True))


# --- (a) scheduler alone ------------------------------------------------------------------

def scheduler_alone(n_ops, repeats):
    """Rows of ``scheduler_overhead.measure`` for a chain and 4 chains, 1/2/4 threads."""
    rows, builds = [], {}
    for name, producers in (("chain", scheduler_overhead.chain_graph(n_ops)),
                            ("4 chains", scheduler_overhead.wide_graph(n_ops, 4))):
        r, builds[name] = scheduler_overhead.measure(name, producers, repeats, dask_workers=(),
                                                     threads=(1, 2, 4))
        rows += r
    return {"ops": n_ops, "repeats": repeats, "rows": rows, "plan_build_seconds": builds}


# --- (b) whole dispatch on tiny kernels ---------------------------------------------------

# the chain's op kinds, in turn: scale by 0.5 plus 0.25, add the input, relu (bounded values)
_CHAIN = ("scale", "elementwise_add", "relu")


def builder_chain(n_ops):
    """A builder program: ``n_ops`` tiny elementwise ops in a chain on a ``[-1, 4]`` feed."""
    L = se.layers
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        x = L.data("x", [-1, 4])
        h = x
        for i in range(n_ops):
            kind = _CHAIN[i % 3]
            if kind == "scale":
                h = L.scale(h, 0.5, 0.25)
            elif kind == "elementwise_add":
                h = L.elementwise_add(h, x)
            else:
                h = L.relu(h)
    return main, h.name


def chain_floor(x, n_ops):
    """The chain's kernels in a bare loop: what ``scale``, ``elementwise_add`` and
    ``relu`` call (``x * s + b``, ``torch.add``, ``torch.relu``), then the fetch's copy."""
    kinds = [i % 3 for i in range(n_ops)]

    def run():
        h = x
        for k in kinds:
            if k == 0:
                h = h * 0.5 + 0.25
            elif k == 1:
                h = torch.add(h, x)
            else:
                h = torch.relu(h)
        return h.to("cpu", copy=True)
    return run


def fx_floor(module, feeds, lr):
    """One SGD training step of ``module`` (whose forward returns the loss) as a bare fx loop.

    ``aot_export_module(..., trace_joint=True)`` gives the joint forward+backward
    ATen graph (what ``se.from_torch`` imports, traced here on real tensors); the
    step runs its GraphModule (torch.fx's generated straight-line Python) and one
    ``torch._foreach_add_`` update, as ``torch.optim.SGD(foreach=True)`` does.

    Returns
    -------
    (callable, int)
        The step (returns the loss as a float) and the number of ATen calls in
        the graph.
    """
    from ssaexec.core.compat import aot_export_module

    class Tuple(torch.nn.Module):
        # the export wants the outputs as a tuple, the loss at output_loss_index
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return (self.m(*args),)

    root = Tuple(copy.deepcopy(module))
    inputs = list(feeds.values())
    gm, sig = aot_export_module(root, inputs, trace_joint=True, output_loss_index=0)
    named = dict(root.named_parameters())
    named.update(root.named_buffers())
    params = [named[n].detach() for n in sig.parameters]
    buffers = [named[n].detach() for n in sig.buffers]
    args = [*params, *buffers, *inputs]
    out_names = [a.name for a in next(n for n in reversed(gm.graph.nodes)
                                      if n.op == "output").args[0]]
    loss_at = out_names.index(sig.user_outputs[0])
    grads = sig.backward_signature.gradients_to_parameters
    grad_at = [out_names.index(g) for g in grads]
    updated = [named[p].detach() for p in grads.values()]
    mutated = [(out_names.index(o), named[b].detach()) for o, b in sig.buffers_to_mutate.items()]
    aten_calls = sum(1 for n in gm.graph.nodes
                     if n.op == "call_function" and n.target is not operator.getitem)

    def step():
        with torch.no_grad():
            outs = gm(*args)
            compat.foreach("add_")(updated, [outs[i] for i in grad_at], alpha=-lr)
            for i, buf in mutated:
                buf.copy_(outs[i])
        return float(outs[loss_at])
    return step, aten_calls


def eager_step(module, feeds, lr):
    """torch eager: zero_grad, forward (returns the loss), backward, SGD(foreach=True)."""
    model = copy.deepcopy(module)
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=True)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(**feeds)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def ssaexec_steps(main, startup, fetch, loss_name, feeds, place):
    """``se.Executor`` and ``se.ParallelExecutor`` (1 place, ``compiler=None``; default
    threads and ``num_threads=1``) running ``main`` and fetching ``fetch``, each in its own
    scope.

    Returns
    -------
    (dict of str -> callable, list of callable)
        The steps by label, and the executors' ``close`` methods.
    """
    steps, closers = {}, []
    exe, scope = se.Executor(place), se.Scope()
    if startup is not None:
        exe.run(startup, scope=scope)
    steps["ssaexec Executor"] = lambda: exe.run(main, feed=feeds, fetch_list=[fetch],
                                                scope=scope)[0]
    # the straight-line path (compiler=None) whose host cost per op this script measures:
    # the default, compiler="auto", runs the same code until its background compile ends,
    # beside a burst of the trace's Python in its first steps (bench/time_to_steps.py
    # measures the tiers)
    for label, strategy in (("ssaexec ParallelExecutor", se.ExecutionStrategy(compiler="none")),
                            ("ssaexec ParallelExecutor num_threads=1",
                             se.ExecutionStrategy(num_threads=1, compiler="none"))):
        pe = se.ParallelExecutor([place], main, startup, loss_name, exec_strategy=strategy,
                                 scope=se.Scope())
        closers.append(pe.close)
        steps[label] = (lambda pe: lambda: pe.run([fetch], feed=feeds)[0])(pe)
    return steps, closers


def _rows(times, per_call_ops, floor_name):
    """Table rows from ``interleaved``'s times: per op, and per op above ``floor_name``'s."""
    floor = statistics.median(times[floor_name]) / per_call_ops
    rows = []
    for name, ts in times.items():
        per_op = statistics.median(ts) / per_call_ops
        rows.append({"executor": name, "seconds": ts, "ms_per_run": statistics.median(ts) * 1e3,
                     "us_per_op": per_op * 1e6, "overhead_us_per_op": (per_op - floor) * 1e6})
    return rows


def whole_dispatch(cfg, place, sync):
    """(b): the builder chain and the imported tiny MLP, each against its floor."""
    dev = place.device
    out = []
    n = cfg["ops"]
    main, fetch = builder_chain(n)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).to(dev)
    steps = {"python loop (floor)": chain_floor(x, n)}
    se_steps, closers = ssaexec_steps(main, None, fetch, None, {"x": x}, place)
    steps.update(se_steps)
    try:
        times = interleaved(steps, 2, cfg["repeats"], cfg["runs_per_window"], sync)
    finally:
        for c in closers:
            c()
    out.append({"program": f"builder chain: scale/elementwise_add/relu on [4, 4], {n} ops",
                "ops": n, "floor": "python loop (floor)",
                "rows": _rows(times, n, "python loop (floor)")})

    twins = load_twins()
    torch.manual_seed(0)
    mlp = twins.WithLoss(twins.MLP(4, (4,) * 6, 4))
    g = torch.Generator().manual_seed(1)
    feeds = {"img": torch.randn(4, 4, generator=g),
             "label": torch.randint(0, 4, (4, 1), generator=g)}
    out.append(imported_case("imported MLP: 7 x Linear(4, 4) + ReLU, batch 4, SGD", mlp, feeds,
                             place, cfg, sync, cfg["repeats"], cfg["runs_per_window"] * 3))
    return out


def imported_case(label, module, feeds, place, cfg, sync, repeats, calls):
    """eager, the fx floor and ssaexec on ``se.from_torch(module)``: one training step each.

    ``module`` (whose forward returns the loss) and ``feeds`` are on the CPU: the
    capture happens there (the program is place-relative), then every mode runs
    on ``place`` with the feeds already on its device.
    """
    lr = 0.01
    main, startup, loss = se.from_torch(module, feeds, optimizer=se.optimizer.SGD(lr))
    module = copy.deepcopy(module).to(place.device)
    feeds = {k: v.to(place.device) for k, v in feeds.items()}
    n_ops = len(main.global_block().ops)
    floor, aten_calls = fx_floor(module, feeds, lr)
    steps = {"torch eager": eager_step(module, feeds, lr), "fx joint graph (floor)": floor}
    se_steps, closers = ssaexec_steps(main, startup, loss, loss, feeds, place)
    steps.update(se_steps)
    try:
        times = interleaved(steps, cfg["warmup"], repeats, calls, sync)
    finally:
        for c in closers:
            c()
    rows = _rows(times, n_ops, "fx joint graph (floor)")
    eager = times["torch eager"]
    for r in rows:
        r["x_eager"] = statistics.median(eager) / statistics.median(r["seconds"])
        r["paired_x_eager"] = _paired(r["seconds"], eager)
    return {"program": label, "ops": n_ops, "fx_aten_calls": aten_calls,
            "floor": "fx joint graph (floor)", "rows": rows}


# --- (c) the small imported transformer ---------------------------------------------------

def transformer(cfg, place, sync):
    """(c): the transformer of ``bench/torch_models.py``, one SGD training step a call."""
    twins = load_twins()
    torch.manual_seed(0)
    model = twins.WithLoss(twins.Transformer(cfg["d_model"], cfg["heads"], cfg["layers"]))
    model.train()
    g = torch.Generator().manual_seed(1)
    b, s, d = cfg["batch"], cfg["seq"], cfg["d_model"]
    feeds = {"img": torch.randn(b, s, d, generator=g),
             "label": torch.randint(0, 10, (b, 1), generator=g)}
    res = imported_case(f"transformer: {cfg['layers']} layers, d_model {d}, {cfg['heads']} "
                        f"heads, batch {b} x seq {s}, SGD", model, feeds, place, cfg, sync,
                        cfg["repeats"], cfg["steps"])
    res["config"] = {k: cfg[k] for k in ("layers", "d_model", "heads", "batch", "seq")}
    return res


# --- report -------------------------------------------------------------------------------

def _print_imported(case):
    """Print the table of an imported program (eager, fx floor, ssaexec)."""
    print(f"  {case['program']}: {case['ops']} ssaexec ops a step, {case['fx_aten_calls']} "
          "ATen calls in the fx graph")
    head = (f"  {'mode':<40} {'ms/step':>8} {'(min-max)':>15} {'x eager':>8} {'paired':>7} "
            f"{'us/op':>7} {'above floor us/op':>18}")
    print(head)
    print("  " + "-" * (len(head) - 2))
    for r in case["rows"]:
        ts = r["seconds"]
        print(f"  {r['executor']:<40} {r['ms_per_run']:>8.3f} "
              f"{f'({min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f})':>15} {r['x_eager']:>7.2f}x "
              f"{r['paired_x_eager']:>6.2f}x {r['us_per_op']:>7.2f} "
              f"{r['overhead_us_per_op']:>18.2f}")


def targets(result):
    """The issue's targets against the figures (reported, never asserted)."""
    out = []
    chain = [r for r in result["scheduler"]["rows"]
             if r["graph"] == "chain" and r["executor"].startswith("ssaexec")]
    for r in chain:
        out.append({"name": f"scheduler alone, no-op chain, {r['executor']} us/op",
                    "value": r["us_per_op"], "target": f"<= {TARGETS['scheduler_us_per_op']}",
                    "met": r["us_per_op"] <= TARGETS["scheduler_us_per_op"]})
    limit = TARGETS["dispatch_overhead_us_per_op"]
    for case in result["dispatch"] + [result["transformer"]]:
        for r in case["rows"]:
            if r["executor"].startswith("ssaexec"):
                out.append({"name": f"{case['program'].split(':')[0]}, {r['executor']}, us/op "
                                    f"above the floor", "value": r["overhead_us_per_op"],
                            "target": f"<= {limit}" + (" (CPU)" if result["settings"]["device"]
                                                       == "cpu" else " (CPU target; GPU run)"),
                            "met": r["overhead_us_per_op"] <= limit})
    pe = next(r for r in result["transformer"]["rows"]
              if r["executor"] == "ssaexec ParallelExecutor")
    out.append({"name": "transformer, ssaexec ParallelExecutor x eager (paired)",
                "value": pe["paired_x_eager"], "target": f">= {TARGETS['transformer_x_eager']}",
                "met": pe["paired_x_eager"] >= TARGETS["transformer_x_eager"]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer ops, steps and repeats (~30 s on 2 cores; for tests)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch intra-op threads (the issue's figures use 1)")
    ap.add_argument("--ops", type=int, help="ops in the builder chain of (b)")
    ap.add_argument("--sched-ops", type=int, help="no-op ops of (a)")
    ap.add_argument("--repeats", type=int, help="rounds of (b) and (c)")
    ap.add_argument("--steps", type=int, help="training steps per window in (c)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--json", default="out/bench/dispatch_overhead.json")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU is available")
    cfg = {k: v[0 if args.quick else 1] for k, v in SETTINGS.items()}
    for k in ("ops", "sched_ops", "repeats", "steps"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    cfg.update(layers=args.layers, d_model=args.d_model, heads=args.heads, batch=args.batch,
               seq=args.seq, device=args.device, torch_threads=args.torch_threads,
               quick=args.quick)
    torch.set_num_threads(args.torch_threads)
    place = se.CUDAPlace(0) if args.device == "cuda" else se.CPUPlace()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    machine = machine_description()
    print(f"dispatch overhead on {machine['cores']}-core {machine['cpu']}"
          + (f", GPU {machine['gpus'][0]}" if args.device == "cuda" else "")
          + f"; torch {machine['torch']} ({args.torch_threads} thread(s)), Python "
          f"{machine['python']}, commit {machine['git_commit']}", flush=True)
    t_start = time.perf_counter()
    result = {"schema": SCHEMA, "machine": machine, "settings": cfg}

    print(f"\n(a) scheduler alone: {cfg['sched_ops']} no-op ops, median of "
          f"{cfg['sched_repeats']} runs", flush=True)
    result["scheduler"] = scheduler_alone(cfg["sched_ops"], cfg["sched_repeats"])
    head = f"  {'graph':<9} {'executor':<24} {'total ms':>9} {'us/op':>7} {'overhead us/op':>15}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    for r in result["scheduler"]["rows"]:
        print(f"  {r['graph']:<9} {r['executor']:<24} "
              f"{statistics.median(r['seconds']) * 1e3:>9.1f} {r['us_per_op']:>7.2f} "
              f"{r['overhead_us_per_op']:>15.2f}")

    print(f"\n(b) whole dispatch on tiny kernels ({args.device}), medians of {cfg['repeats']} "
          "interleaved rounds", flush=True)
    result["dispatch"] = whole_dispatch(cfg, place, sync)
    chain = result["dispatch"][0]
    print(f"  {chain['program']}")
    head = f"  {'executor':<40} {'ms/run':>8} {'us/op':>7} {'above floor us/op':>18}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    for r in chain["rows"]:
        print(f"  {r['executor']:<40} {r['ms_per_run']:>8.2f} {r['us_per_op']:>7.2f} "
              f"{r['overhead_us_per_op']:>18.2f}")
    print()
    _print_imported(result["dispatch"][1])

    print(f"\n(c) the small imported transformer ({args.device}), one training step, medians "
          f"of {cfg['repeats']} interleaved rounds of {cfg['steps']} steps", flush=True)
    result["transformer"] = transformer(cfg, place, sync)
    _print_imported(result["transformer"])

    result["targets"] = targets(result)
    print("\ntargets (issue 13; reported, not asserted):")
    for t in result["targets"]:
        print(f"  {t['name']:<78} {t['value']:>7.2f}  {t['target']}: "
              f"{'met' if t['met'] else 'MISSED'}")
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    result["wall_seconds"] = time.perf_counter() - t_start
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        print(f"\nraw timings: {path}")
    print(f"load average {machine['loadavg_start']} -> {machine['loadavg_end']}; "
          f"{result['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
