"""Kernel guards: what ``ssaexec.ops.guards`` costs a training step.

Issue 29 binds every allowlisted ATen overload whose kernel trusts its
arguments behind a guard (``ssaexec.ops.guards``): shape and size arithmetic in
Python, and one ``aminmax`` per index tensor for the three index-trusting ops on
the CPU. Guards run for every program, program files and in-process ones alike,
so this script measures them on imported models whose steps call guarded ops:

* the small transformer of ``bench/torch_models.py`` (layer norm and softmax
  backward, flash attention, factories);
* a small CNN with batch norm, max-pooling (whose backward's indices get the
  ``aminmax``) and a convolution;
* an embedding model: ``nn.Embedding`` (whose backward,
  ``embedding_dense_backward``, gets the ``aminmax``), a mean over the sequence,
  layer norm.

Guards run for program files (and anything read from a file); a program
``se.from_torch`` built in this process is ``trusted`` and calls the bare kernels
(``ProgramDesc.trusted``). So each model runs twice on one CPU place: the
program ``from_torch`` returns (**bare**), and the same program written to a
``.json`` file and read back (**file**: guarded). The two are timed side by side
with ``dispatch_overhead``'s ``interleaved`` (rotating rounds, medians, paired
ratios), through ``se.ParallelExecutor`` (default strategy: the compiled path)
and ``se.Executor`` (the readable path). ``guarded calls`` counts the guarded
kernel calls a step makes. Nothing asserts on speed.

``python bench/kernel_guards.py [--quick] [--json out.json]``
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ssaexec as se  # noqa: E402
from dispatch_overhead import _paired, interleaved  # noqa: E402
from ssaexec.harness import load_twins, machine_description  # noqa: E402
from ssaexec.ops.registry import get_op_def  # noqa: E402

SCHEMA = "ssaexec-kernel-guards/1"


class SmallCNN(nn.Module):
    """conv, batch norm, ReLU, 2x2 max-pool, twice; then a linear head."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2))
        self.head = nn.Linear(width * 8 * 8, classes)

    def forward(self, img):
        return self.head(self.body(img).flatten(1))


class EmbedModel(nn.Module):
    """Embedding of token ids, mean over the sequence, layer norm, a linear head."""

    def __init__(self, vocab=1000, dim=32, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        return self.head(self.norm(self.embed(img).mean(1)))


def models(quick):
    """(label, module with loss, feeds) of each model measured."""
    twins = load_twins()
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    b = 8 if quick else 16
    out = [("transformer: 2 layers, d_model 32, 2 heads, batch 4 x seq 16",
            twins.WithLoss(twins.Transformer(32, 2, 2)),
            {"img": torch.randn(4, 16, 32, generator=g),
             "label": torch.randint(0, 10, (4, 1), generator=g)}),
           (f"CNN: 2 x (conv 3x3, batch norm, ReLU, max-pool), 32x32 input, batch {b}",
            twins.WithLoss(SmallCNN()),
            {"img": torch.randn(b, 3, 32, 32, generator=g),
             "label": torch.randint(0, 10, (b, 1), generator=g)}),
           ("Embedding(1000, 32), mean, layer norm: 64 sequences of 16 ids",
            twins.WithLoss(EmbedModel()),
            {"img": torch.randint(0, 1000, (64, 16), generator=g),
             "label": torch.randint(0, 10, (64, 1), generator=g)})]
    for _, m, _ in out:
        m.train()
    return out


def _executors(main, startup, loss, feeds, tag):
    """(steps by label, closers): ParallelExecutor and Executor on ``main``, one CPU place."""
    place = se.CPUPlace()
    pe = se.ParallelExecutor([place], main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(compiler="none"))
    exe, scope = se.Executor(place), se.Scope()
    exe.run(startup, scope=scope)
    steps = {f"ParallelExecutor {tag}": lambda: pe.run([loss], feed=feeds)[0],
             f"Executor {tag}": lambda: exe.run(main, feed=feeds, fetch_list=[loss],
                                                scope=scope)[0]}
    return steps, [pe.close]


def _from_file(program, tmp, name):
    path = os.path.join(tmp, f"{name}.json")
    se.save_program(program, path)
    loaded = se.load_program(path, validate=True)
    assert program.trusted and not loaded.trusted
    return loaded


def measure(label, module, feeds, cfg):
    main, startup, loss = se.from_torch(module, feeds, optimizer=se.optimizer.SGD(0.01))
    with tempfile.TemporaryDirectory() as tmp:
        fmain, fstartup = _from_file(main, tmp, "main"), _from_file(startup, tmp, "startup")
    steps, closers = _executors(main, startup, loss, feeds, "bare")
    file_steps, file_closers = _executors(fmain, fstartup, loss, feeds, "file")
    steps.update(file_steps)
    n_guarded = sum(get_op_def(op.type).bare_overload is not None
                    for op in main.global_block().ops)
    try:
        times = interleaved(steps, 2, cfg["repeats"], cfg["steps"], lambda: None)
    finally:
        for c in closers + file_closers:
            c()
    rows = []
    for path in ("ParallelExecutor", "Executor"):
        g, b = times[f"{path} file"], times[f"{path} bare"]
        rows.append({"executor": path, "file_ms": statistics.median(g) * 1e3,
                     "bare_ms": statistics.median(b) * 1e3,
                     "cost_pct": (statistics.median(g) / statistics.median(b) - 1) * 100,
                     "paired_cost_pct": (_paired(b, g) - 1) * 100,
                     "file_s": g, "bare_s": b})
    return {"model": label, "ops": len(main.global_block().ops), "guarded_calls": n_guarded,
            "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    ap.add_argument("--repeats", type=int, help="rounds (default 5, quick 3)")
    ap.add_argument("--steps", type=int, help="steps per window (default 10, quick 4)")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--json", default="out/bench/kernel_guards.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    cfg = {"repeats": args.repeats or (3 if args.quick else 5),
           "steps": args.steps or (4 if args.quick else 10)}
    machine = machine_description()
    print(f"kernel guards: program file (guarded) vs from_torch (bare), one CPU place, torch threads {args.torch_threads}; "
          f"{machine}")
    results = []
    for label, module, feeds in models(args.quick):
        res = measure(label, module, feeds, cfg)
        results.append(res)
        print(f"\n{label}: {res['ops']} ops, {res['guarded_calls']} guarded calls a step")
        print(f"  {'executor':<18} {'file ms':>9} {'bare ms':>9} {'cost':>7} {'paired':>7}")
        for r in res["rows"]:
            print(f"  {r['executor']:<18} {r['file_ms']:>9.2f} {r['bare_ms']:>9.2f} "
                  f"{r['cost_pct']:>+6.1f}% {r['paired_cost_pct']:>+6.1f}%")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"schema": SCHEMA, "machine": machine, "config": cfg,
                   "torch_threads": args.torch_threads, "results": results}, f, indent=1)
    print(f"\nraw timings: {args.json}")


if __name__ == "__main__":
    main()
