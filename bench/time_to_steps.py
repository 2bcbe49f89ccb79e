"""Time to N training steps, compile included, each mode in a fresh process (issue 50).

``python bench/time_to_steps.py [--model transformer] [--modes ...] [--steps 1,10,100,1000]
[--rounds 2] [--warm] [--nproc 2] [--json FILE]``

What a user waits for: the wall time from building the trainer (the program, the
executor, and for the blocking modes the compile) to the end of step N, for each N in
``--steps``, in one run of ``max(N)`` steps. Measured so that no mode inherits another's
work (``build_s``, the part spent building the trainer before its first step: for the
ssaexec modes the program's import with ``from_torch``, is reported apart too). Every
measurement is a **fresh process** with its **own empty Inductor cache**
(``TORCHINDUCTOR_CACHE_DIR``), and the modes alternate in order from round to round. The
imports (torch, ssaexec) are timed apart (``import_s``) and not included: every mode pays
them alike.

Modes: ``ssaexec`` (``ExecutionStrategy``'s default, ``compiler="auto"``: tiered,
``runtime.tiered``; the step it switched at is reported), ``ssaexec-none``
(``compiler=None``: the straight-line path), ``ssaexec-inductor`` (``compiler="inductor"``:
its first two steps record and compile, blocking), ``torch-compile`` (its first step
compiles) and ``torch-eager``. The models are ``ssaexec bench``'s presets
(``ssaexec.harness.workloads``), one CPU place.

``--nproc P``: each measurement is ``P`` gloo processes started together by torchrun, one
CPU place each (the cores divided among them), with the same fresh empty cache: the
ssaexec modes are ``ParallelExecutor`` ranks (``se.distributed``), ``torch-eager`` is
``DistributedDataParallel`` and ``torch-compile`` is ``torch.compile`` over it (the
harness's ``torch-ddp`` and ``torch-compile-ddp`` ranks, whose first step, the compile,
runs while the trainer is built). Times are rank 0's, from its trainer's build (after the
process group is up) to the end of step N; the ranks meet in every step's all-reduce.

The measurement is ``ssaexec.harness.time_to_steps`` (``run_fresh``, ``tier_report``),
the same definitions as ``ssaexec bench``'s time-to-N columns; here every step is run.

Figures: for each mode and N the median over rounds, and the ratio against
``torch-compile`` and ``ssaexec-none``; ``ssaexec``'s switch step and its time per step
before and after the switch.
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
MODES = ("ssaexec", "ssaexec-none", "ssaexec-inductor", "torch-compile", "torch-eager")
MODELS = ("transformer", "hf-llama", "hf-bert", "quick")
# the ssaexec modes' compilers (the harness's trainers otherwise)
# ("none", not None: SSAEXEC_COMPILER, where set, replaces None and "default" alike)
COMPILERS = {"ssaexec": "default", "ssaexec-none": "none", "ssaexec-inductor": "inductor"}


def trainer(model, mode, nproc=1):
    """``mode``'s trainer (bench/time_to_steps.py's names) for ``model``'s preset of
    ``ssaexec bench``, one CPU place, not yet stepped (torch.compile compiles at its first
    step, which counts as one of the steps). ``nproc`` > 1: this process's rank of a
    group already joined (``run_fresh``); a DDP rank has run its first step if compiled."""
    import torch
    from ssaexec.harness import cli, runners
    ap = cli.add_arguments(argparse.ArgumentParser())
    s = cli.settings(ap.parse_args(["--quick"] if model == "quick" else ["--model", model]))
    cores = os.cpu_count()
    torch.set_num_threads(min(s.get("torch_threads") or cores, max(1, cores // nproc)))
    cfg = {"mode": mode, "places": nproc, "device": "cpu", "settings": s}
    if nproc > 1:
        import torch.distributed as dist
        rank = dist.get_rank()
        if mode.startswith("torch-"):
            from ssaexec.harness.ddp import DDPRank
            cfg["mode"] = "torch-compile-ddp" if mode == "torch-compile" else "torch-ddp"
            return DDPRank(rank, cfg, port=None)  # the group is joined: run_fresh

        class Rank(runners.ParallelTrainer):
            compiler = COMPILERS[mode]
        import ssaexec as se
        return Rank(cfg, se.cpu_places(1), first_place=rank)
    if mode == "torch-eager":
        return runners.EagerTrainer(cfg)
    if mode == "torch-compile":
        # the class's own __init__ would run (and time apart) the compiling first step
        t = runners.EagerTrainer.__new__(runners.CompileTrainer)
        runners.EagerTrainer.__init__(t, cfg)
        return t

    class Trainer(runners.ParallelTrainer):
        # every ssaexec mode on the program of ssaexec bench's "ssaexec" mode (a torch-only
        # model imported with from_torch, the others built), its compiler apart
        compiler = COMPILERS[mode]
    return Trainer(cfg)


def run_fresh(model, mode, steps, nproc=1):
    """In this process (fresh, by its caller's design): build ``mode``'s trainer and run
    ``max(steps)`` steps; the result dict (``import_s``, ``build_s``, ``to_step`` for each
    of ``steps``, and for a tiered run what ``tier_report`` says). ``nproc`` > 1: this is
    one rank of a torchrun group; the process group is joined first (not timed)."""
    t_import = time.perf_counter()
    import torch  # noqa: F401
    import ssaexec  # noqa: F401
    import_s = time.perf_counter() - t_import
    from ssaexec.harness.time_to_steps import tier_report, to_step
    if nproc > 1:
        from ssaexec.dist import world
        world.init(backend="gloo")
    marks = sorted(steps)
    t0 = time.perf_counter()
    t = trainer(model, mode, nproc)
    build_s = time.perf_counter() - t0
    times, ends = [], []
    if getattr(t, "compile_s", None) is not None:  # a DDP rank ran its compiling step
        ends.append(t0 + build_s)
        times.append(t.compile_s)
    for _ in range(marks[-1] - len(ends)):
        ts = time.perf_counter()
        t.step()  # returns the loss as a float: the step is complete
        ends.append(time.perf_counter())
        times.append(ends[-1] - ts)
    result = {"import_s": import_s, "build_s": build_s,
              "to_step": to_step(ends, t0, marks)["to_step"]}
    pe = getattr(t, "pe", None)
    if pe is not None and pe.exec_strategy.compiler == "auto":
        result.update(tier_report(pe, times) or {})
    if nproc > 1:
        # no teardown: the caller ends the process (a DDP rank's gloo group, freed with its
        # Reducer, deadlocked here: its worker thread waits for the interpreter lock that
        # the freeing thread holds, torch 2.13)
        result["processes"] = nproc
        return result
    t.close()
    return result


def worker(model, mode, steps, nproc=1):
    """In this process: time ``mode`` to each of ``steps`` and print one JSON line (the
    counts are ``ssaexec.harness.time_to_steps``'s, as in ``ssaexec bench``); of a torchrun
    group, rank 0 alone prints."""
    result = run_fresh(model, mode, steps, nproc)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result))
    if nproc > 1:  # every rank has run its last all-reduce; see run_fresh
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def measure(model, mode, steps, warm=False, nproc=1):
    """One fresh process (``nproc`` > 1: a torchrun group of them) with an empty Inductor
    cache: its JSON result. ``warm``: then a second fresh run on the cache the first one
    left (what a second run of the same program meets), whose result is the value of the
    key ``"warm"``."""
    with tempfile.TemporaryDirectory(prefix="ssaexec-time-to-steps-") as cache:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", model, mode,
               "--steps", ",".join(map(str, steps))]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(nproc)] + cmd[1:]  # the ranks read WORLD_SIZE
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                   OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // nproc)))
        runs = [subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=7200,
                               env=env) for _ in range(2 if warm else 1)]
    for proc in runs:
        if proc.returncode != 0:
            raise SystemExit(f"{model} {mode} failed:\n{proc.stdout}{proc.stderr}")
    cold, *second = [json.loads(p.stdout.strip().splitlines()[-1]) for p in runs]
    if second:
        cold["warm"] = second[0]
    return cold


def parse(argv):
    """The parsed arguments; a bad one exits with status 2 and says which."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer", choices=MODELS,
                    help="a preset of ssaexec bench (quick: ResNet-18)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--steps", default="1,10,100,1000",
                    help="comma list of step counts N (time to each, compile included)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the raw figures here")
    ap.add_argument("--warm", action="store_true",
                    help="after each cold run of a mode, a second process on the cache it "
                         "left (a second run of the same program): its times and, for "
                         "ssaexec, the step it switched at")
    ap.add_argument("--nproc", type=int, default=1,
                    help="processes of a gloo group, one CPU place each, started together "
                         "by torchrun (DDP for the torch modes); default 1")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        ap.error(f"unknown mode(s) {', '.join(bad) or '(none given)'}: choose from "
                 f"{', '.join(MODES)}")
    try:
        args.steps = sorted({int(n) for n in args.steps.split(",") if n.strip()})
    except ValueError:
        ap.error(f"--steps must be a comma list of integers, got {args.steps!r}")
    if not args.steps or args.steps[0] < 1:
        ap.error("--steps must name step counts of at least 1")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.nproc < 1:
        ap.error("--nproc must be at least 1")
    return args


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.steps,
                      int(os.environ.get("WORLD_SIZE", "1")))  # torchrun's, where it started us
    raw = {mode: [] for mode in args.modes}
    for r in range(args.rounds):
        for mode in (args.modes if r % 2 == 0 else args.modes[::-1]):
            res = measure(args.model, mode, args.steps, warm=args.warm, nproc=args.nproc)
            raw[mode].append(res)
            extra = f"  switched at step {res['switch_step']}" if "switch_step" in res else ""
            if "warm" in res:
                w = res["warm"]
                extra += ("  | warm cache: " + "  ".join(
                    f"N={n}: {w['to_step'][str(n)]:.2f} s" for n in args.steps) +
                    (f"  switched at step {w['switch_step']}" if "switch_step" in w else ""))
            print(f"round {r + 1}: {mode:17s} " + "  ".join(
                f"N={n}: {res['to_step'][str(n)]:7.2f} s" for n in args.steps) +
                f"  (build {res['build_s']:.2f} s)" + extra,
                flush=True)
    med = {mode: {n: statistics.median(x["to_step"][str(n)] for x in runs)
                  for n in args.steps} for mode, runs in raw.items()}
    where = "one CPU place, a fresh process" if args.nproc == 1 else \
        f"{args.nproc} gloo processes of one CPU place each, fresh"
    print(f"\n{args.model}, {where} with an empty cache each, "
          f"medians of {args.rounds} rounds ({os.cpu_count()} cores); seconds to step N, "
          "compile included, imports not")
    print(f"{'mode':17s} " + " ".join(f"{'N=' + str(n):>10s}" for n in args.steps))
    for mode in args.modes:
        print(f"{mode:17s} " + " ".join(f"{med[mode][n]:9.2f}s" for n in args.steps))
    for ref in ("torch-compile", "ssaexec-none"):
        if ref in med:
            for mode in args.modes:
                if mode != ref:
                    print(f"{mode:17s} / {ref:13s} " + " ".join(
                        f"{med[mode][n] / med[ref][n]:9.2f}x" for n in args.steps))
    for res in raw.get("ssaexec", []):
        if "switch_step" in res:
            print(f"ssaexec switched at step {res['switch_step']} (compile "
                  f"{res['compile_s']:.1f} s in the background): "
                  f"{res['before_ms'] or float('nan'):.2f} ms a step before, "
                  f"{res['after_ms'] or float('nan'):.2f} ms after")
        else:
            print("ssaexec did not switch within the steps run")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "nproc": args.nproc, "raw": raw, "medians": med,
                       "cores": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
