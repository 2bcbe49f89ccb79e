"""Validate the scaling simulator against measured runs on this machine (CPU or one GPU).

``python bench/validate_sim.py`` (``make validate-sim``) predicts, then measures, one
program (default ``examples/small_resnet.json``, batch 16 per place) in four
configurations of this machine's CPU places:

* one process with 1, 2 and 4 places (``ParallelExecutor``, default strategies);
* 2 processes of one place each, joined by gloo (``se.distributed``, as torchrun would).

Each round (``--rounds``, default 3) does, in this order and close together so the
machine's load (it is shared) hits predictions and measurements alike:

1. calibrates a CPU cluster (``ssaexec.sim.calibrate``: host constants from a chain of
   tiny ops, the scheduler's hand-off, how fast cores run side by side,
   ``LocalCollective`` all-reduces over 2 and 4 places, and between the 2 worker
   processes blocking gloo all-reduces, bytes vs time, and a burst of asynchronous
   ones); nothing of the program being predicted goes into it;
2. profiles the program on one place (``Profile.measure``: one scheduler thread,
   ``observe``) with 2 torch threads (what one place gets on 2 cores) and with 1
   (what each of several places, or processes, gets);
3. predicts the four configurations (``ssaexec.sim.predict``);
4. measures them with the real executor: ``--steps`` steps after warm-up (which
   includes the executor's threading probe), median step time; the 2-process run in
   two fresh worker processes (this script with ``--worker``).

Reported: per configuration the median over rounds of the predicted and measured step
times and the error of the predicted median; the target is within 15 %. JSON with
every round goes to ``--json`` (default ``out/validate_sim.json``); ``--markdown``
prints the table for docs/simulator.md.

``--device cuda`` validates on one GPU instead, in two configurations of one process:
"1 place" (``cuda:0``) and "2 places on one GPU" (``cuda:0,0``; the simulator makes
them share the device's throughput), batch 1024 per place by default (the example is
narrow: a small batch leaves the GPU waiting on launches). Each round calibrates the
GPU (``calibrate.calibrate_gpu``'s parts: host constants with the chain on the CUDA
place, ``LocalCollective``'s all-reduce on the device, kernel_min, memory bandwidth,
FLOP/s), profiles the program on ``cuda:0`` (``Profile.measure``: launch times, then
device times with ``cuda_sync``), predicts both and measures both. Same table and JSON
(default ``out/validate_sim_gpu.json``).
Without a GPU it says so on one line and exits 0.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import ssaexec as se  # noqa: E402
from ssaexec import sim  # noqa: E402
from ssaexec.sim import calibrate  # noqa: E402

TARGET = 0.15
BURST_BYTES = 1 << 14  # the size of the gloo burst: a small gradient
CONFIGS = [("1 place", 1, "process-per-node", 2), ("2 places", 2, "process-per-node", 1),
           ("4 places", 4, "process-per-node", 1), ("2 processes (gloo)", 2,
                                                   "process-per-gpu", 1)]
# --device cuda: (name, places on cuda:0, layout, torch threads: not the GPU's concern)
GPU_CONFIGS = [("1 place", 1, "process-per-node", None),
               ("2 places on one GPU", 2, "process-per-node", None)]
GPU_BATCH = 1024


def _load(path):
    from ssaexec.program.defaults import loss_var, startup_for
    main = se.load_program(path)
    startup, _, _ = startup_for(main, path)
    return main, startup, loss_var(main)


def _steps(pe, loss, feed, warmup, steps):
    """Step times, and the cores the process kept busy meanwhile (CPU time / wall)."""
    for _ in range(warmup):
        pe.run(fetch_list=[loss], feed=feed)
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        pe.run(fetch_list=[loss], feed=feed)
        times.append(time.perf_counter() - t0)
    return times, (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def measure_places(main, startup, loss, places, batch, warmup, steps, torch_threads=None):
    """Median step seconds of one process with ``places`` (a count of CPU places, or a
    list of places) and default strategies."""
    from ssaexec.data.synthetic import synthetic_feed
    places = se.cpu_places(places) if isinstance(places, int) else places
    pe = se.ParallelExecutor(places=places, main_program=main,
                             startup_program=startup, loss_name=loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(torch_threads=torch_threads,
                                                               compiler="none"),
                             distributed=False)
    try:
        times, busy = _steps(pe, loss, synthetic_feed(main, batch * len(places)), warmup,
                             steps)
    finally:
        pe.close()
    return statistics.median(times), times, busy


# --- the 2-process run ---------------------------------------------------------------------

def worker(args):
    """One rank: gloo all-reduce sweep, then ``--steps`` training steps on one place."""
    from ssaexec.harness.worker import die_with_parent
    from ssaexec.data.synthetic import synthetic_feed
    die_with_parent()
    se.distributed.init(backend="gloo", timeout=120)
    rank = se.distributed.rank()
    sweep = calibrate.gloo_sweep()
    burst = calibrate.gloo_burst(BURST_BYTES)
    main, startup, loss = _load(args.program)
    pe = se.ParallelExecutor(places=[se.CPUPlace(0)], main_program=main,
                             startup_program=startup, loss_name=loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(torch_threads=args.torch_threads,
                                                               compiler="none"))
    try:
        times, busy = _steps(pe, loss, synthetic_feed(main, args.batch, seed=rank),
                             args.warmup, args.steps)
        threads = torch.get_num_threads()
    finally:
        pe.close()
    out = {"rank": rank, "gloo": sweep, "burst": burst, "times": times, "busy": busy,
           "torch_threads": threads}
    Path(args.worker, f"rank{rank}.json").write_text(json.dumps(out))
    se.distributed.shutdown()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(args, world=2, timeout=300):
    """Start ``world`` worker processes; return their JSON results (rank order)."""
    with tempfile.TemporaryDirectory() as out:
        port = _free_port()
        procs = []
        env0 = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        env0["PYTHONPATH"] = str(REPO) + os.pathsep + env0.get("PYTHONPATH", "")
        for r in range(world):
            env = dict(env0, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", out, "--program", args.program,
                 "--batch", str(args.batch), "--steps", str(args.steps),
                 "--warmup", str(args.warmup)] +
                (["--torch-threads", str(args.torch_threads)] if args.torch_threads else []),
                env=env, cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        try:
            logs = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs):
            raise RuntimeError("a worker failed:\n" + "\n".join(logs))
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


# --- one round -----------------------------------------------------------------------------

class Window:
    """How many cores other processes kept busy while the block ran (``foreign``).

    From ``/proc/stat`` (all CPUs' busy time, steal included) less this process's
    CPU time and its reaped children's; None where there is no ``/proc/stat``.
    """

    def __init__(self):
        self.foreign = None

    @staticmethod
    def _snapshot():
        import resource
        try:
            with open("/proc/stat", encoding="utf-8") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return None
        # user nice system idle iowait irq softirq steal ...
        busy = sum(fields[:3]) + sum(fields[5:8])
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (busy / os.sysconf("SC_CLK_TCK"), time.process_time(),
                kids.ru_utime + kids.ru_stime, time.perf_counter())

    def __enter__(self):
        self.start = self._snapshot()
        return self

    def __exit__(self, *exc):
        end = self._snapshot()
        if self.start is not None and end is not None:
            d = [b - a for a, b in zip(self.start, end, strict=True)]
            self.foreign = max(0.0, (d[0] - d[1] - d[2]) / d[3]) if d[3] > 0 else None
        return False


def _worst(*windows):
    vals = [w.foreign for w in windows if w.foreign is not None]
    return max(vals) if vals else None


def one_round(args, main, startup, loss, k):
    """Calibrate, then per torch-thread count profile and measure back to back."""
    load = list(os.getloadavg())
    t0 = time.perf_counter()
    with Window() as calib:
        host = calibrate.calibrate_host()
        local = calibrate.local_sum_sweep()
    want = {name: args.torch_threads or threads for name, _, _, threads in CONFIGS}
    profiles, profiled, measured = {}, {}, {}
    for t in sorted(set(want.values()), reverse=True):
        with Window() as w:
            profiles[t] = sim.Profile.measure(main, startup, batch=args.batch, threads=t,
                                              steps=args.profile_steps,
                                              readable_extra_s=host["readable_extra_s"])
        profiled[t] = w
        for name, n, layout, _ in CONFIGS:
            if want[name] == t and layout == "process-per-node":
                with Window() as w:
                    meas = measure_places(main, startup, loss, n, args.batch, args.warmup,
                                          args.steps, args.torch_threads)
                measured[name] = meas + (w,)
    with Window() as w:
        ranks = run_workers(args)
    # a step of the 2 processes ends when both have it: the slower rank's time per step
    two_proc = [max(ts) for ts in zip(*(r["times"] for r in ranks), strict=True)]
    measured[CONFIGS[3][0]] = (statistics.median(two_proc), two_proc,
                               sum(r["busy"] for r in ranks), w)
    gloo = [(s, max(r["gloo"][i][1] for r in ranks)) for i, (s, _) in
            enumerate(ranks[0]["gloo"])]
    burst = tuple(max(r["burst"][i] for r in ranks) for i in range(2))
    cluster = calibrate.cpu_cluster(host, local, gloo, burst=(BURST_BYTES, burst))
    rows = []
    for name, n, layout, _ in CONFIGS:
        pred = sim.predict(main, profiles[want[name]], cluster, n, layout)
        meas, times, busy, window = measured[name]
        foreign = _worst(calib, profiled[want[name]], window)
        rows.append(_row(k, name, n, layout, want[name], pred, meas, times, busy, foreign))
    return {"round": k + 1, "loadavg": load, "seconds": time.perf_counter() - t0,
            "cluster": cluster.to_dict(), "host": host, "local_sum": local, "gloo": gloo,
            "gloo_burst": burst,
            "profile_device_ms": {t: p.total_device_s() * 1e3 for t, p in profiles.items()},
            "rows": rows}


def _row(k, name, n, layout, threads, pred, meas, times, busy, foreign):
    """One configuration's record of a round; prints its line."""
    print(f"  round {k + 1}: {name:<20} predicted {pred.step_s * 1e3:7.2f} ms  measured "
          f"{meas * 1e3:7.2f} ms  ({pred.step_s / meas - 1:+.1%}), {busy:.2f} cores busy, "
          f"other processes {_cores(foreign)}", flush=True)
    return {"config": name, "ranks": n, "layout": layout,
            "predicted_ms": pred.step_s * 1e3, "measured_ms": meas * 1e3,
            "error": pred.step_s / meas - 1, "measured_steps_ms":
            [t * 1e3 for t in times], "cores_busy": busy,
            "foreign_cores": foreign, "torch_threads": threads,
            "predicted_inline": pred.result.inline,
            "bound_by": pred.bound_by(),
            "critical_path_ms": {c: v * 1e3 for c, v in
                                 pred.result.critical_summary().items()},
            "notes": pred.notes}


def gpu_places(n):
    """``n`` places on cuda:0 (``cuda:0,0`` for 2), as ``parse_places`` makes them."""
    return se.parse_places("cuda:" + ",".join(["0"] * n))


def one_round_gpu(args, main, startup, loss, k):
    """Calibrate this GPU, profile on cuda:0, then predict and measure 1 and 2 places on it."""
    load = list(os.getloadavg())
    t0 = time.perf_counter()
    place = se.CUDAPlace(0)
    with Window() as calib:
        host = calibrate.calibrate_host(place=place)
        local = calibrate.local_sum_sweep(device=place.device)
        device = calibrate.gpu_device(place.device)
    cluster = calibrate.gpu_cluster(host, local, device)
    with Window() as profiled:
        profile = sim.Profile.measure(main, startup, batch=args.batch, place=place,
                                      steps=args.profile_steps,
                                      readable_extra_s=host["readable_extra_s"])
    rows = []
    for name, n, layout, threads in GPU_CONFIGS:
        with Window() as w:
            meas, times, busy = measure_places(main, startup, loss, gpu_places(n), args.batch,
                                               args.warmup, args.steps, args.torch_threads)
        pred = sim.predict(main, profile, cluster, n, layout, places_per_device=n)
        rows.append(_row(k, name, n, layout, threads, pred, meas, times, busy,
                         _worst(calib, profiled, w)))
    return {"round": k + 1, "loadavg": load, "seconds": time.perf_counter() - t0,
            "cluster": cluster.to_dict(), "host": host, "local_sum": local, "device": device,
            "profile_device_ms": {"cuda:0": profile.total_device_s() * 1e3},
            "profile_host_ms": {"cuda:0": sum(c.host_s or 0.0 for c in
                                              profile.costs.values()) * 1e3},
            "rows": rows}


def _cores(x):
    return "?" if x is None else f"{x:.2f} cores"


def summarise(rounds, quiet_cores, configs=CONFIGS):
    """Medians over the rounds in which other processes kept at most ``quiet_cores``
    busy (all rounds, marked, when none was that quiet)."""
    out = []
    for i, (name, n, layout, _) in enumerate(configs):
        rows = [r["rows"][i] for r in rounds]
        quiet = [r for r in rows if r["foreign_cores"] is not None and
                 r["foreign_cores"] <= quiet_cores]
        use = quiet or rows
        pred = statistics.median(r["predicted_ms"] for r in use)
        meas = statistics.median(r["measured_ms"] for r in use)
        out.append({"config": name, "predicted_ms": pred, "measured_ms": meas,
                    "error": pred / meas - 1, "rounds_used": len(use),
                    "rounds": len(rows), "quiet": bool(quiet),
                    "round_errors": [r["error"] for r in rows],
                    "cores_busy": statistics.median(r["cores_busy"] for r in use),
                    "foreign_cores": max((r["foreign_cores"] or 0.0) for r in use),
                    "within_target": abs(pred / meas - 1) <= TARGET,
                    "bound_by": use[-1]["bound_by"]})
    return out


def markdown(summary, machine, args):
    if args.device == "cuda":
        head = (f"Machine: {', '.join(machine['gpus'])} on {machine['cpu']}, "
                f"{machine['cores']} cores, torch {machine['torch']}, {machine['date']} (load "
                f"average at start {machine['loadavg_start']}); program `{args.program}`, "
                f"batch {args.batch} per place, {args.rounds} rounds of {args.steps} steps, "
                "places cuda:0 and cuda:0,0.")
    else:
        head = (f"Machine: {machine['cpu']}, {machine['cores']} cores, torch "
                f"{machine['torch']}, {machine['date']} (load average at start "
                f"{machine['loadavg_start']}); program `{args.program}`, batch {args.batch} "
                f"per place, {args.rounds} rounds of {args.steps} steps, torch threads per "
                f"place: {args.torch_threads or 'the executor default (2 for 1 place, else 1)'}.")
    lines = [head, "",
             "| configuration | predicted ms/step | measured ms/step | error | within 15 % | "
             "rounds (quiet/all) | cores busy | other processes | bound by (prediction) |",
             "|---|---:|---:|---:|---|---|---:|---:|---|"]
    for s in summary:
        used = f"{s['rounds_used']}/{s['rounds']}" + ("" if s["quiet"] else " (none quiet)")
        lines.append(f"| {s['config']} | {s['predicted_ms']:.2f} | {s['measured_ms']:.2f} | "
                     f"{s['error']:+.1%} | {'yes' if s['within_target'] else '**no**'} | "
                     f"{used} | {s['cores_busy']:.2f} | {s['foreign_cores']:.2f} | "
                     f"{s['bound_by']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--program", default="examples/small_resnet.json")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: 1, 2, 4 CPU places and 2 gloo processes (default); cuda: 1 "
                        "and 2 places on one GPU")
    p.add_argument("--batch", type=int, default=None,
                   help=f"samples per place (default 16; {GPU_BATCH} with --device cuda)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=12, help="measured steps per configuration")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=4)
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch threads per place everywhere (default: the executor's choice, "
                        "cores // places; 1 avoids OpenMP's spin-waits on a busy machine)")
    p.add_argument("--quiet-cores", type=float, default=0.2,
                   help="a round counts when other processes kept at most this many cores "
                        "busy during its calibration, profile and measurement (default 0.2)")
    p.add_argument("--json", default=None,
                   help="default out/validate_sim.json (--device cuda: out/validate_sim_gpu.json)")
    p.add_argument("--markdown", action="store_true", help="print the docs table")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if args.batch is None:
        args.batch = GPU_BATCH if cuda else 16
    if args.json is None:
        args.json = "out/validate_sim_gpu.json" if cuda else "out/validate_sim.json"
    if args.worker:
        worker(args)
        return 0
    if cuda and not torch.cuda.is_available():
        # one line, exit 0: a machine without a GPU has nothing to validate here
        print(f"validate-sim --device cuda: skipped, torch {torch.__version__} sees no GPU "
              f"(CUDA build {torch.version.cuda})")
        return 0
    from ssaexec.harness import machine_description
    machine = machine_description()
    main_prog, startup, loss = _load(args.program)
    where = f"{machine['gpus'][0]} (1 and 2 places on cuda:0)" if cuda else \
        f"{machine['cpu']} ({machine['cores']} cores)"
    print(f"validate-sim: {args.program}, batch {args.batch} per place, {args.rounds} rounds "
          f"on {where}, load {machine['loadavg_start']}")
    run_round = one_round_gpu if cuda else one_round
    rounds = [run_round(args, main_prog, startup, loss, k) for k in range(args.rounds)]
    summary = summarise(rounds, args.quiet_cores, GPU_CONFIGS if cuda else CONFIGS)
    print()
    print(markdown(summary, machine, args))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "args": vars(args), "summary": summary,
                               "rounds": rounds}, indent=1))
    print(f"\nwrote {out}")
    missed = [s["config"] for s in summary if not s["within_target"]]
    if missed:
        print(f"outside {TARGET:.0%}: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
