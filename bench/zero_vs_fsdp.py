"""ssaexec's ZeRO stage 3 against PyTorch FSDP2, 2 gloo processes, same model and batch.

``python bench/zero_vs_fsdp.py [--configs transformer,big] [--sides ...] [--rounds R]``

Issue 49, acceptance 3. Each *side* (``ssaexec.harness.zero_peers``) is ``--world``
spawned gloo processes training the same seeded model on the same batch (each process
its own ``batch_per_place`` samples) with AdamW:

* the peer, ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every encoder layer, then
  on the root (``reshard_after_forward`` as it comes: the layers reshard, the root keeps
  its parameters from forward to backward), eager;
* ``ssaexec-zero3``: ``BuildStrategy(zero_stage=3)``, ``compiler=None``, one CPU place a
  process; ``ssaexec-zero3-inductor``: the same with ``compiler="inductor"``.

(``--sides`` adds others: ``ddp-zero1`` = DDP + ``ZeroRedundancyOptimizer``, ``ddp``,
``ssaexec-zero0..3[-inductor]``.)

Configs (``zero_peers.CONFIGS``): ``transformer`` is the harness's transformer preset
(d_model 32, 2 layers, seq 16, 4 samples a process, one torch thread); ``big`` is the same
model at 6 layers of d_model 512 (18.9 M parameters, 75.7 MB), for memory; ``tiny`` is
the tests'.

Timing: every side is set up (and warmed up) first, then ``--rounds`` rounds; in each
round every side runs one window of ``--steps`` timed steps, the order rotating round by
round, so a burst of load falls on every side alike. A step's time is the slowest rank's.
Per side: the median step over all windows, and, against the peer, the *paired* ratio:
the median over rounds of (peer's median step / side's median step) in that round; > 1
means the side trains faster (throughput ratio).

Memory (the same measure for every side, ``zero_peers``' docstring): per process, the
peak resident memory from the end of set-up to the end of the run minus the resident
memory before the model (``training_mb``, the figure compared), what the steps added to
the built model (``steps_mb``: the same peak minus the resident memory after set-up),
and the tensor bytes held between steps (``state_mb``); the table shows the largest
process's.

A side that fails (e.g. a ZeRO stage the executor does not support yet) is reported with
its error and the others go on. Writes JSON (``--json``, default
``out/bench/zero_vs_fsdp.json``) and prints a table.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SCHEMA = "ssaexec-zero-vs-fsdp/1"
DEFAULT_SIDES = "fsdp2,ssaexec-zero3,ssaexec-zero3-inductor"


def parse_args(argv=None):
    from ssaexec.harness.zero_peers import CONFIGS, SIDES, parse_side
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="transformer,big",
                    help=f"comma list from {', '.join(CONFIGS)} (default transformer,big)")
    ap.add_argument("--sides", default=DEFAULT_SIDES,
                    help=f"comma list from {', '.join(SIDES)}; the first is the peer "
                         f"(default {DEFAULT_SIDES})")
    ap.add_argument("--world", type=int, default=2, help="processes a side (2)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads a process (default: cores // world, at least 1)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (config's)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps a window (config's)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="windows a side, alternating (config's repeats)")
    ap.add_argument("--batch-per-place", "-b", type=int, default=None,
                    help="samples a process (config's)")
    ap.add_argument("--json", default=str(REPO / "out" / "bench" / "zero_vs_fsdp.json"))
    args = ap.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.sides = [x for x in args.sides.split(",") if x]
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad or not args.configs:
        ap.error(f"--configs: unknown {bad[0]!r}; use {', '.join(CONFIGS)}" if bad else
                 "--configs: name at least one")
    for side in args.sides:
        try:
            parse_side(side)
        except ValueError as e:
            ap.error(f"--sides: {e}")
    if len(args.sides) < 2 or len(set(args.sides)) != len(args.sides):
        ap.error("--sides: name the peer and at least one other side, each once")
    for name in ("world", "threads", "steps", "rounds", "batch_per_place"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    if args.warmup is not None and args.warmup < 0:
        ap.error(f"--warmup must be at least 0, got {args.warmup}")
    return args


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def _memory_summary(ranks):
    """The largest process's figures (MiB), and every rank's raw dict."""
    training = [r["step_peak_rss_mb"] - r["baseline_rss_mb"] for r in ranks]
    steps = [r["step_peak_rss_mb"] - r["after_setup_rss_mb"] for r in ranks]
    out = {"training_mb": max(training), "steps_mb": max(steps),
           "step_peak_rss_mb": max(r["step_peak_rss_mb"]
                                                                 for r in ranks),
           "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
           "state_mb": max(r["state_mb"] for r in ranks), "ranks": ranks}
    for key in ("tensor_peak_model_mb", "tensor_peak_total_mb"):  # ssaexec sides only
        if all(key in r for r in ranks):
            out[key] = max(r[key] for r in ranks)
    return out


def run_config(name, args):
    """Set up every side of config ``name``, alternate their windows, tear them down."""
    from ssaexec.core.place import available_cores
    from ssaexec.harness.zero_peers import SideError, SideGroup, config_settings, param_count
    s = config_settings(name, warmup=args.warmup, steps=args.steps, repeats=args.rounds,
                        batch_per_place=args.batch_per_place)
    threads = args.threads or max(1, available_cores() // args.world)
    n = param_count(s)
    out = {"config": name, "settings": s, "world": args.world, "threads": threads,
           "params": n, "param_mb": n * 4 / 1e6, "peer": args.sides[0], "sides": {}}
    groups = {}
    for side in args.sides:
        _log(f"[{name}] setting up {side} ...")
        t0 = time.perf_counter()
        try:
            g = SideGroup(side, s, args.world, threads)
        except SideError as e:
            msg = str(e)
            out["sides"][side] = {"status": "failed", "error": msg}
            _log(f"[{name}] {side} failed: {msg.strip().splitlines()[-1]}")
            continue
        groups[side] = g
        out["sides"][side] = {"status": "ok", "setup_wall_s": time.perf_counter() - t0,
                              "setup_s": max(r["setup_s"] for r in g.ready),
                              "compile_s": g.ready[0]["compile_s"],
                              "warmup_losses": [r["warmup_losses"] for r in g.ready],
                              "windows": [], "losses": []}
    try:
        for rnd in range(s["repeats"]):
            live = [x for x in args.sides if x in groups]
            k = rnd % max(1, len(live))
            for side in live[k:] + live[:k]:
                try:
                    steps, losses = groups[side].window(s["steps"])
                except SideError as e:
                    groups.pop(side).kill()
                    out["sides"][side].update(status="failed", error=str(e))
                    continue
                out["sides"][side]["windows"].append({"round": rnd, "step_s": steps})
                out["sides"][side]["losses"].extend(losses)
            _log(f"[{name}] round {rnd + 1}/{s['repeats']} done")
    finally:
        for side, g in groups.items():
            try:
                out["sides"][side]["memory"] = _memory_summary(g.finish())
            except SideError as e:
                out["sides"][side].update(status="failed", error=str(e))
    summarise(out)
    return out


def summarise(out):
    """Each side's median step and steps/s; against the peer, the paired throughput
    ratio and the memory ratios."""
    for res in out["sides"].values():
        warm = [w for w in res.get("warmup_losses", ()) if w]
        if warm:  # same weights, same batch: every side's first loss is the same number
            res["first_loss"] = statistics.fmean(w[0] for w in warm)
        if res["status"] == "ok" and res["windows"]:
            steps = [t for w in res["windows"] for t in w["step_s"]]
            res["median_step_s"] = statistics.median(steps)
            res["steps_per_s"] = 1.0 / res["median_step_s"]
    peer = out["sides"].get(out["peer"], {})
    out["ratios"] = {}
    if "median_step_s" not in peer:
        return
    peer_rounds = {w["round"]: statistics.median(w["step_s"]) for w in peer["windows"]}
    for side, res in out["sides"].items():
        if side == out["peer"] or "median_step_s" not in res:
            continue
        paired = [peer_rounds[w["round"]] / statistics.median(w["step_s"])
                  for w in res["windows"] if w["round"] in peer_rounds]
        r = {"throughput_x_peer_paired": statistics.median(paired) if paired else None,
             "throughput_x_peer": peer["median_step_s"] / res["median_step_s"]}
        if "memory" in res and "memory" in peer:
            pm, m = peer["memory"], res["memory"]
            r["training_mb_x_peer"] = (m["training_mb"] / pm["training_mb"]
                                       if pm["training_mb"] > 0 else None)
            r["state_mb_x_peer"] = m["state_mb"] / pm["state_mb"] if pm["state_mb"] else None
        out["ratios"][side] = r


def table(out):
    """The config's table as text."""
    s = out["settings"]
    lines = [f"\n{out['config']}: transformer {s['layers']}x{s['d_model']} h{s['heads']} "
             f"seq {s['seq_len']}, {s['batch_per_place']} samples x {out['world']} processes, "
             f"{out['params'] / 1e6:.2f} M parameters ({out['param_mb']:.1f} MB), "
             f"{s['optimizer']}, {out['threads']} thread(s) a process, "
             f"{s['repeats']} rounds x {s['steps']} steps",
             f"{'side':<26}{'ms/step':>9}{'x peer':>8}{'paired':>8}{'train MiB':>11}"
             f"{'x peer':>8}{'steps MiB':>11}{'state MiB':>11}{'tensors MiB':>12}"
             f"{'setup s':>9}{'1st loss':>10}"]
    for side, res in out["sides"].items():
        if res["status"] != "ok" or "median_step_s" not in res:
            err = (res.get("error") or "no timed window").strip().splitlines()[-1]
            lines.append(f"{side:<26}  {res['status']}: {err[:100]}")
            continue
        r = out["ratios"].get(side, {})
        mem = res.get("memory", {})

        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        lines.append(f"{side:<26}{res['median_step_s'] * 1e3:>9.2f}"
                     f"{f(r.get('throughput_x_peer'), '.2f') if r else 'peer':>8}"
                     f"{f(r.get('throughput_x_peer_paired'), '.2f') if r else '':>8}"
                     f"{f(mem.get('training_mb'), '.1f'):>11}"
                     f"{f(r.get('training_mb_x_peer'), '.2f') if r else '':>8}"
                     f"{f(mem.get('steps_mb'), '.1f'):>11}{f(mem.get('state_mb'), '.1f'):>11}"
                     f"{f(mem.get('tensor_peak_total_mb'), '.1f'):>12}{res['setup_s']:>9.1f}"
                     f"{f(res.get('first_loss'), '.5f'):>10}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    from ssaexec.harness.results import machine_description
    result = {"schema": SCHEMA, "command": "python bench/zero_vs_fsdp.py " +
              " ".join(sys.argv[1:] if argv is None else argv),
              "machine": machine_description(),
              "measures": {
                  "step": "median of the timed steps; a step's time is the slowest rank's",
                  "throughput_x_peer_paired": "median over rounds of peer median step / "
                                              "side median step (> 1: faster than the peer)",
                  "training_mb": "largest process: peak RSS (VmHWM, reset after set-up) "
                                 "minus RSS before the model",
                  "steps_mb": "largest process: peak RSS minus RSS after set-up (what "
                              "the steps added to the built model)",
                  "state_mb": "largest process: bytes of the tensors held between steps",
                  "tensor_peak_total_mb": "ssaexec sides: the place's peak tensor bytes "
                                          "over one observed step (harness.place_memory)"},
              "configs": []}
    t0 = time.perf_counter()
    for name in args.configs:
        out = run_config(name, args)
        result["configs"].append(out)
        print(table(out), flush=True)
    result["wall_s"] = time.perf_counter() - t0
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {path} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
