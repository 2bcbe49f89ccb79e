"""Whether compiling the update pays (issue 32): the commit segment compiled by Inductor
against its foreach calls, per preset and optimizer, with what the compile costs.

``python bench/update_compile.py [--models transformer,hf-llama,hf-bert,quick]
[--optimizers sgd,momentum,adam] [--rounds 7] [--steps 0]``

One process per (model, optimizer), one CPU place, the benchmark's preset (``ssaexec
bench``) with its optimizer replaced. Two ``InductorTrainer`` in the process, on one
Inductor cache (the forward+backward graph is compiled once and loaded by the second):

* ``compiled``: every commit segment compiled (``SSAEXEC_INDUCTOR_FOREACH=0``);
* ``foreach``: the default rule (``runtime.inductor.FOREACH_UPDATES``): a commit segment
  of SGD or momentum updates only runs its generated ``torch._foreach_*`` calls.

Each round times a window of steps of one, then the other (medians; the ratio is the
median of the rounds' paired ratios, foreach over compiled: above 1, compiling the
update made the step faster). ``update compile s`` is the compile of the commit segment
alone, from the lowering's progress lines (a fresh cache, so a real compile). Steps
per window default to the preset's own count for a ~0.1 s window.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
WINDOW_STEPS = {"transformer": 200, "hf-llama": 10, "hf-bert": 50, "quick": 10}


def worker(model, optimizer, rounds, steps):
    import torch
    from ssaexec.harness import cli, runners
    bap = argparse.ArgumentParser()
    cli.add_arguments(bap)
    s = cli.settings(bap.parse_args(["--quick"] if model == "quick" else ["--model", model]))
    s["optimizer"] = optimizer
    torch.set_num_threads(s.get("torch_threads") or torch.get_num_threads())
    cfg = {"mode": "ssaexec-inductor", "places": 1, "device": "cpu", "settings": s}
    trainers = {}
    for name, env in (("compiled", "0"), ("foreach", "1")):
        os.environ["SSAEXEC_INDUCTOR_FOREACH"] = env
        trainers[name] = runners.InductorTrainer(cfg)
    for t in trainers.values():
        for _ in range(3):
            t.step()
    times = {k: [] for k in trainers}
    for _ in range(rounds):
        for name, t in trainers.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                t.step()
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
    paired = [f / c for f, c in zip(times["foreach"], times["compiled"])]
    for t in trainers.values():
        t.close()
    print(json.dumps({k: statistics.median(v) for k, v in times.items()} |
                     {"foreach_over_compiled": statistics.median(paired)}))


def measure(model, optimizer, rounds, steps):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", model, optimizer,
           str(rounds), str(steps)]
    with tempfile.TemporaryDirectory() as cache:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600,
                              env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
    if proc.returncode != 0:
        raise SystemExit(f"{model} {optimizer} failed:\n{proc.stdout}{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the first trainer compiles the forward+backward graph (segment 0), then the update
    compiles = re.findall(r"segment (\d+) compiled in ([\d.]+) s", proc.stderr)
    out["update_compile_s"] = sum(float(t) for seg, t in compiles if seg != "0")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer,hf-llama,hf-bert,quick")
    ap.add_argument("--optimizers", default="sgd,momentum,adam")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=0, help="steps per window (0: per model)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        model, optimizer, rounds, steps = args.worker
        return worker(model, optimizer, int(rounds), int(steps))
    rows = []
    print(f"{'model':12s} {'optimizer':9s} {'compiled ms':>12s} {'foreach ms':>11s} "
          f"{'foreach / compiled':>19s} {'update compile s':>17s}")
    for model in args.models.split(","):
        for opt in args.optimizers.split(","):
            r = measure(model, opt, args.rounds, args.steps or WINDOW_STEPS.get(model, 20))
            rows.append({"model": model, "optimizer": opt} | r)
            print(f"{model:12s} {opt:9s} {r['compiled']:12.3f} {r['foreach']:11.3f} "
                  f"{r['foreach_over_compiled']:19.2f}x {r['update_compile_s']:16.1f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
