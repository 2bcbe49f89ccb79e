"""What the tiered default's own background work costs the steps before its switch (issue 50).

``python bench/tier_loss.py [--model transformer] [--steps 16000] [--rounds 2] [--json FILE]``

The default (``compiler="auto"``) traces, imports and loads its compiled graphs in a
background thread of the training process, under the interpreter lock the steps need too
(``runtime.tiered``: the order of a cold compile). This measures where that cost lands:
each round runs ``compiler=None`` and then the default, each in a fresh process with its
own empty Inductor cache (``bench/time_to_steps.py``'s trainers, one CPU place), every
step timed. ``compiler=None``'s median step (steps 100 onwards) is the round's base; for
the default it reports the seconds lost against that base over its first 1000 steps and
over all its steps before the switch, the switch's step and time (seconds from its first
step), and its slowest step. Figures: per round, and medians over rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(model, mode, steps):
    """In this process: every step's seconds of ``mode``'s trainer, and its switch step."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import time_to_steps

    from ssaexec.harness.time_to_steps import tier_report
    t = time_to_steps.trainer(model, mode)
    durs = []
    for _ in range(steps):
        a = time.perf_counter()
        t.step()
        durs.append(time.perf_counter() - a)
    pe = getattr(t, "pe", None)
    report = tier_report(pe) if pe is not None else None
    t.close()
    print(json.dumps({"durs": durs, "switch_step": (report or {}).get("switch_step")}))


def run(model, mode, steps):
    with tempfile.TemporaryDirectory(prefix="ssaexec-tier-loss-") as cache:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", model,
                               mode, "--steps", str(steps)], cwd=ROOT, capture_output=True,
                              text=True, timeout=3600,
                              env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
    if proc.returncode != 0:
        raise SystemExit(f"{model} {mode} failed:\n{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(model, steps):
    """One round: the base from ``compiler=None``, then the default's losses."""
    base = statistics.median(run(model, "ssaexec-none", steps)["durs"][100:])
    auto = run(model, "ssaexec", steps)
    durs, switch = auto["durs"], auto["switch_step"]
    before = durs[:switch] if switch else durs
    return {"base_ms": base * 1e3, "switch_step": switch,
            "switch_s": sum(durs[:switch]) if switch else None,
            "loss_first_1000_s": sum(d - base for d in durs[:1000]),
            "loss_before_switch_s": sum(d - base for d in before),
            "slowest_step_ms": max(durs[10:]) * 1e3}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--steps", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1], args.steps)
        return
    rounds = []
    for r in range(args.rounds):
        m = measure(args.model, args.steps)
        rounds.append(m)
        switch = (f"switched after {m['switch_step']} steps ({m['switch_s']:.2f} s)"
                  if m["switch_step"] else f"no switch within {args.steps} steps")
        print(f"round {r + 1}: base {m['base_ms']:.3f} ms a step; lost {m['loss_first_1000_s']:.2f} s "
              f"over the first 1000 steps, {m['loss_before_switch_s']:.2f} s before the switch; "
              f"{switch}; slowest step {m['slowest_step_ms']:.0f} ms", flush=True)
    keys = ("loss_first_1000_s", "loss_before_switch_s", "slowest_step_ms")
    med = {k: statistics.median(m[k] for m in rounds) for k in keys}
    print(f"{args.model}, one CPU place, medians of {args.rounds} rounds ({os.cpu_count()} "
          f"cores): lost {med['loss_first_1000_s']:.2f} s over the first 1000 steps, "
          f"{med['loss_before_switch_s']:.2f} s before the switch")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "steps": args.steps, "rounds": rounds,
                       "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
