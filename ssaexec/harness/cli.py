"""The harness's command line and its run: options -> settings -> plan -> workers -> report.

Modes. ``ssaexec`` is ssaexec as users get it: ``ExecutionStrategy``'s default compiler
(``compiler="auto"``, tiered, where Inductor can run; its worker warms up until the switch);
``ssaexec-none`` asks for ``compiler=None`` (the straight-line path), ``ssaexec-inductor``
for ``compiler="inductor"`` (a blocking compile). Every run reports its compile seconds and
the time to 1, 100 and 1000 steps, compile included (``harness.time_to_steps``).

Policy. Presets fill in every setting the command line leaves out (``--preset``,
``--quick``; ``--model transformer``, ``hf-bert`` and ``hf-llama`` pick the preset of
that name, whose ``modes`` replace the default modes). The plan
is one worker config per (mode, places) pair: ``seq`` and ``torch-eager`` on one
place, the other modes on every place count asked for (``ssaexec-nproc`` and
``ssaexec-inductor-nproc`` only on counts their processes divide). Batch per place is
fixed (weak scaling).

Each worker (``ssaexec.harness.worker``) builds its model and warms up, then the
harness asks each in turn for a window of ``steps`` timed steps, ``repeats``
rounds, the order rotating every round. Interleaving the windows means a burst
of load from another process on a shared machine hits every mode alike instead
of one of them (but a worker of ssaexec's tiered default whose background compile
is still running after its warm-up runs its windows at once and ends, so that compile
does not load the others' windows); ``--no-interleave`` runs each worker to the end
before starting the next (the default on GPUs, where idle workers would hold device memory). A
worker that fails is reported in its run (``error``) and the others go on.

Threads (CPU): one-process modes get every core (at most ``--torch-threads``);
``ParallelExecutor`` itself limits torch to ``cores // places`` threads when it
has several CPU places; each DDP process gets ``cores // processes``.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from .time_to_steps import SETTLE_S
from .workloads import model_kwargs, title_size
from .results import compare, load_average, machine_description, report, summarise

__all__ = ["MODES", "DEFAULT_MODES", "SCHEMA", "PRESETS", "add_arguments", "settings", "plan",
           "cuda_devices", "run", "main"]

DESCRIPTION = "Benchmark harness: images/sec of one model trained in several modes, in one run."

MODES = ("seq", "ssaexec", "ssaexec-none", "torch-eager", "torch-compile", "torch-ddp",
         "torch-compile-ddp",
         "ssaexec-from-torch",
         "ssaexec-nproc", "ssaexec-inductor", "ssaexec-inductor-nproc")
# the modes run as processes under torchrun (``--nproc``, default 2), on the place counts
# those processes divide
NPROC_MODES = ("ssaexec-nproc", "ssaexec-inductor-nproc")
DEFAULT_MODES = ("seq", "ssaexec", "torch-eager", "torch-compile", "torch-ddp")
SCHEMA = "ssaexec-bench/1"

# Presets fill in every setting the command line leaves out.
PRESETS = {
    # make bench: ResNet-18 on CIFAR-shaped data, < 5 min on 2 CPU cores.
    # (5 warm-up steps: a ParallelExecutor of several CPU places runs its first 5 steps on
    # its thread pool and in the calling thread in turn to choose one: runtime.places_rule)
    "default": dict(model="resnet18", image_size=32, batch_per_place=32, warmup=5, steps=2,
                    repeats=5),
    # make demo: the same model at a quarter of the width, ~30-60 s on 2 CPU cores.
    "quick": dict(model="resnet18", image_size=32, base=16, batch_per_place=16, warmup=5,
                  steps=3, repeats=2),
    # tests: a tiny MLP, seconds.
    "tiny": dict(model="mlp", in_dim=32, hidden="16", batch_per_place=8, warmup=1, steps=2,
                 repeats=1),
    # GPUs: ResNet-50 on ImageNet-shaped data.
    "imagenet": dict(model="resnet50", image_size=224, batch_per_place=32, warmup=3, steps=10,
                     repeats=3),
    # GPUs: the seed document's ResNeXt152 table (batch 12 per GPU).
    "resnext152": dict(model="resnext152", image_size=224, batch_per_place=12, warmup=3,
                       steps=10, repeats=3),
    # --model transformer: issue 13's small imported transformer, one torch thread
    # (launch-bound: ~300 tiny ops a step, a millisecond in eager), ~1 min on 2 CPU cores.
    "transformer": dict(model="transformer", d_model=32, heads=2, layers=2, seq_len=16,
                        batch_per_place=4, warmup=5, steps=20, repeats=5, optimizer="sgd",
                        lr=0.01, torch_threads=1),
    # --model hf-bert / hf-llama: transformers' models from BERT-tiny / Llama-tiny sized
    # configs (bench/hf_models.py), imported with from_torch, against eager and DDP
    "hf-bert": dict(model="hf-bert", d_model=128, heads=2, layers=2, seq_len=128, vocab=30522,
                    classes=2, batch_per_place=8, warmup=5, steps=5, repeats=3,
                    optimizer="sgd", lr=0.01, modes="ssaexec,torch-eager,torch-ddp"),
    "hf-llama": dict(model="hf-llama", d_model=128, heads=4, layers=2, seq_len=128,
                     vocab=32000, batch_per_place=8, warmup=5, steps=5, repeats=3,
                     optimizer="sgd", lr=0.01, modes="ssaexec,torch-eager,torch-ddp"),
}

_DEFAULTS = dict(model="resnet18", image_size=32, base=64, classes=10, in_dim=784,
                 hidden="128,64", cardinality=32, width=4, d_model=32, heads=2, layers=2,
                 seq_len=16, vocab=1000, batch_per_place=32, warmup=2, steps=3, repeats=3,
                 optimizer="momentum", lr=0.01, seed=0, torch_threads=None, amp=None,
                 cuda_graph=False, settle_s=SETTLE_S)


def add_arguments(ap):
    """Add the benchmark's options to ``ap`` (used by ``ssaexec bench``)."""
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="settings to start from (default: 'default'); options override them")
    ap.add_argument("--quick", action="store_true", help="same as --preset quick (make demo)")
    ap.add_argument("--nproc", type=int, default=None,
                    help="processes of the torchrun modes (ssaexec-nproc, "
                         "ssaexec-inductor-nproc; default 2; places are divided among them); "
                         "adds ssaexec-nproc when neither is asked for")
    ap.add_argument("--model", help="mlp, transformer (imported with from_torch; preset "
                                    "'transformer' unless one is given), resnet18/34/50/101/152, "
                                    "resnext50/101/152, or hf-bert / hf-llama (transformers' "
                                    "models, imported with from_torch; presets of those names)")
    ap.add_argument("--image-size", type=int, help="32 (CIFAR stem) or e.g. 224 (ImageNet stem)")
    ap.add_argument("--base", type=int, help="ResNet width of the first stage (64 standard)")
    ap.add_argument("--cardinality", type=int, help="ResNeXt groups (default 32)")
    ap.add_argument("--width", type=int, help="ResNeXt group width (default 4)")
    ap.add_argument("--classes", type=int)
    ap.add_argument("--in-dim", type=int, help="MLP input features")
    ap.add_argument("--hidden", help="MLP hidden sizes, e.g. 128,64")
    ap.add_argument("--d-model", type=int, help="transformer width (default 32)")
    ap.add_argument("--heads", type=int, help="transformer attention heads (default 2)")
    ap.add_argument("--layers", type=int, help="transformer encoder layers (default 2)")
    ap.add_argument("--seq-len", type=int, help="transformer sequence length (default 16)")
    ap.add_argument("--vocab", type=int, help="hf-bert / hf-llama vocabulary size")
    ap.add_argument("--batch-per-place", "-b", type=int)
    ap.add_argument("--warmup", type=int, help="untimed steps per worker")
    ap.add_argument("--steps", type=int, help="timed steps per window")
    ap.add_argument("--repeats", type=int, help="timed windows per (mode, places)")
    ap.add_argument("--optimizer", choices=["sgd", "momentum", "nesterov", "adam", "adamw"])
    ap.add_argument("--lr", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--torch-threads", type=int,
                    help="torch threads of a one-process mode, at most (default: every core; "
                         "1 with the transformer preset); several places or DDP processes "
                         "share the cores")
    ap.add_argument("--settle-s", type=float, default=None,
                    help="ssaexec's default compiler (tiered): seconds its worker steps on, "
                         "at most, waiting for the switch to the compiled segments before "
                         f"the timed windows (default {SETTLE_S:g}; make demo: less)")
    ap.add_argument("--amp", choices=["bf16", "fp16"], default=None,
                    help="mixed precision: ExecutionStrategy(amp=...) for ssaexec, "
                         "torch.autocast (and a GradScaler for fp16) for the torch modes")
    ap.add_argument("--cuda-graph", action="store_true", default=None,
                    help="ssaexec modes: ExecutionStrategy(cuda_graph=True) (CUDA places)")
    ap.add_argument("--places", default=None,
                    help="cpu:N, cuda, cuda:0,1 or N (default: every GPU, else cpu:<cores>)")
    ap.add_argument("--place-counts", default=None,
                    help="comma list of place counts to measure (default 1..N)")
    ap.add_argument("--modes", default=None,
                    help=f"comma list from {', '.join(MODES)} (default: "
                         f"{','.join(DEFAULT_MODES)})")
    ap.add_argument("--from-torch", action="store_true",
                    help="also build the program with se.from_torch from the torch twin "
                         "(mode ssaexec-from-torch)")
    ap.add_argument("--out-dir", default=None, help="where the JSON and PNG go (default out/bench)")
    ap.add_argument("--json", default=None, help="JSON path (default <out-dir>/<tag>.json)")
    ap.add_argument("--plot", default=None, help="PNG path (default <out-dir>/<tag>.png); "
                                                 "'none' skips the plot")
    ap.add_argument("--tag", default=None, help="file name stem (default from model and size)")
    ap.add_argument("--interleave", dest="interleave", action="store_true", default=None,
                    help="alternate timed windows between modes (default on CPU)")
    ap.add_argument("--no-interleave", dest="interleave", action="store_false",
                    help="run each mode to the end before the next (default on GPUs)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def settings(args):
    """The settings dict for parsed ``args``: the preset's, overridden by the options."""
    preset = args.preset or ("quick" if args.quick else
                             args.model if args.model in ("transformer", "hf-bert", "hf-llama")
                             else "default")
    s = dict(_DEFAULTS)
    s.update(PRESETS[preset])
    for k in _DEFAULTS:
        v = getattr(args, k, None)
        if v is not None:
            s[k] = v
    s["preset"] = preset
    for k in ("batch_per_place", "warmup", "steps", "repeats"):
        if s[k] < (0 if k == "warmup" else 1):
            raise SystemExit(f"--{k.replace('_', '-')} must be positive, got {s[k]}")
    model_kwargs(s)  # validates the model name
    return s


# the modes that run one process a place: each needs a GPU of its own
_PROCESS_A_PLACE = ("torch-ddp", "torch-compile-ddp") + NPROC_MODES


def cuda_devices(ids, counts, modes):
    """The CUDA device of each place of ``--places cuda:<ids>``, checked.

    The benchmark numbers GPUs 0..N-1 in order (``CUDA_VISIBLE_DEVICES`` picks which);
    a device may repeat: ``cuda:0,0`` is two places on one GPU, which ssaexec supports
    in one process, so the modes that run a process a place (DDP, torchrun) refuse it
    when more than one place shares a device. ``SystemExit`` with the reason otherwise.
    """
    distinct = sorted(set(ids))
    if distinct != list(range(len(distinct))) or ids != sorted(ids):
        raise SystemExit("the benchmark uses CUDA devices 0..N-1 in order (a device may "
                         "repeat: cuda:0,0 is two places on one GPU); restrict them with "
                         "CUDA_VISIBLE_DEVICES instead of --places cuda:<ids>")
    shared = [p for p in counts if p > 1 and len(set(ids[:p])) < p]
    bad = [m for m in modes if m in _PROCESS_A_PLACE]
    if shared and bad:
        raise SystemExit(f"mode {bad[0]} runs a process a place and needs a GPU each, but "
                         f"{shared[0]} places share {len(set(ids[:shared[0]]))} GPU(s) "
                         f"(--places cuda:{','.join(map(str, ids))}); leave it out or "
                         "give each place its own GPU")
    return list(ids)


def plan(args, s):
    """``(worker configs, device, place counts)`` for parsed ``args`` and settings ``s``."""
    import torch
    import ssaexec as se
    if args.places is None:
        places = se.cuda_places() or se.cpu_places()
    else:
        places = se.parse_places(args.places)
    device = "cuda" if places[0].is_cuda else "cpu"
    if s.get("cuda_graph") and device != "cuda":
        raise SystemExit("--cuda-graph needs CUDA places: CUDA graphs replay GPU work only")
    n = len(places)
    counts = (sorted({int(c) for c in args.place_counts.split(",")}) if args.place_counts
              else list(range(1, n + 1)))
    if counts[0] < 1 or counts[-1] > max(n, 1):
        raise SystemExit(f"--place-counts must lie in 1..{n}")
    modes = [m.strip() for m in (args.modes or s.get("modes") or ",".join(DEFAULT_MODES))
             .split(",") if m.strip()]
    devices = (cuda_devices([p.device_index for p in places], counts, modes)
               if device == "cuda" else None)
    if args.from_torch and "ssaexec-from-torch" not in modes:
        modes.append("ssaexec-from-torch")
    if args.nproc and not set(NPROC_MODES) & set(modes):
        modes.append("ssaexec-nproc")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}")
    if {"ssaexec-from-torch", "ssaexec-inductor", "ssaexec-inductor-nproc"} & set(modes):
        try:
            from ..frontends.torch import from_torch  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"--from-torch needs ssaexec.frontends.torch.from_torch, which "
                             f"could not be imported ({e})") from None
    gpus = len(set(devices[:counts[-1]])) if devices else 0
    if device == "cuda" and torch.cuda.device_count() < gpus:
        raise SystemExit(f"{counts[-1]} places need {gpus} GPUs")
    configs = []
    for mode in modes:
        for p in ([1] if mode in ("seq", "torch-eager", "torch-compile") else counts):
            cfg = {"mode": mode, "places": p, "device": device, "settings": s,
                   "warmup": s["warmup"], "steps": s["steps"]}
            if devices is not None and devices != list(range(len(devices))):
                cfg["cuda_devices"] = devices[:p]  # several places share a GPU
            if mode in NPROC_MODES:
                nproc = args.nproc or 2
                if p % nproc:
                    continue  # the places are divided among the processes
                cfg["nproc"] = nproc
            configs.append(cfg)
    return configs, device, counts


def _measure(configs, runs, repeats, interleave, log_dir, bar):
    """Run every worker of ``configs``, filling in ``runs`` (one a config)."""
    # imported here, not at the top: the package does not import the worker module, so
    # that torchrun's ``-m ssaexec.harness.worker`` finds it fresh
    from .worker import WorkerError, WorkerProcess

    def on_step(cfg):
        bar.update(1, mode=f"{cfg['mode']}@{cfg['places']}")

    alive = {}

    def fail(i, w, e):
        runs[i]["error"] = str(e)
        bar.update(0)
        sys.stderr.write(f"\n{configs[i]['mode']} on {configs[i]['places']} place(s) failed:"
                         f"\n{e}\n")
        w.kill()
        w.close()
        alive.pop(i, None)

    def start(i, w=None):
        w = w or WorkerProcess(configs[i], log_dir, on_step)
        try:
            ready = w.wait_for("ready")
        except WorkerError as e:
            fail(i, w, e)
            return None
        # begin_to_ready_s: the harness's own span around the worker's setup_s (which
        # counts from the config it received, so it can never be the longer)
        runs[i].update(setup_s=ready["setup_s"],
                       begin_to_ready_s=time.perf_counter() - w.begun,
                       compile_s=ready.get("compile_s"),
                       compile_blocks=ready.get("compile_blocks", True),
                       tiers=ready.get("tiers"), to_step=ready.get("to_step", {}),
                       steps_run=ready.get("steps_run", 0),
                       steps_run_s=ready.get("steps_run_s"),
                       warmup_losses=ready["warmup_losses"],
                       baseline_rss_mb=ready["baseline_rss_mb"],
                       torch_threads=ready["torch_threads"],
                       host_allocator=ready.get("host_allocator"))
        return w

    def window(i):
        w = alive[i]
        w.send("run")
        try:
            msg = w.wait_for("window")
        except WorkerError as e:
            fail(i, w, e)
            return
        runs[i]["windows"].append({"seconds": msg["seconds"],
                                   "step_seconds": msg["step_seconds"],
                                   "losses": msg["losses"],
                                   "cpu_seconds": msg["cpu_seconds"]})

    def finish(i):
        w = alive.pop(i)
        w.send("exit")
        try:
            res = w.wait_for("result")
        except WorkerError as e:
            alive[i] = w
            fail(i, w, e)
            return
        runs[i].update(peak_rss_mb=res["peak_rss_mb"],
                       peak_rss_mb_per_process=res["peak_rss_mb_per_process"],
                       peak_cuda_mb=res["peak_cuda_mb"])
        w.close()

    try:
        if interleave:
            # the workers import at once, then build and warm up one at a time: a compile's
            # seconds and the time to step N are the mode's own, not shared with another's
            # ssaexec's tiered default still compiling after its warm-up: its windows run at
            # once and it ends, so its background compile does not load the others' windows
            launched = [WorkerProcess(c, log_dir, on_step, begin=False) for c in configs]
            early = set()
            for i, w in enumerate(launched):
                w.begin()
                if start(i, w) is not None:
                    alive[i] = w
                    tiers = runs[i].get("tiers")
                    if tiers is not None and tiers.get("switch_step") is None:
                        early.add(i)
                        for _ in range(repeats):
                            if i in alive:
                                window(i)
                        if i in alive:
                            finish(i)
            for r in range(repeats):
                order = list(range(len(configs)))
                k = r % len(order)
                for i in order[k:] + order[:k]:
                    if i in alive and i not in early:
                        window(i)
            for i in list(alive):
                finish(i)
        else:
            for i in range(len(configs)):
                w = start(i)
                if w is None:
                    continue
                alive[i] = w
                for _ in range(repeats):
                    if i in alive:
                        window(i)
                if i in alive:
                    finish(i)
    finally:
        for w in alive.values():
            w.kill()
            w.close()


def run(args):
    """Run the benchmark for parsed ``args``; return the result dict (also written as JSON)."""
    from ..core.progress import Progress
    s = settings(args)
    configs, device, counts = plan(args, s)
    interleave = args.interleave if args.interleave is not None else device == "cpu"
    machine = machine_description()
    tag = args.tag or (s["model"] if s["model"] in ("mlp", "transformer", "hf-bert", "hf-llama")
                       else f"{s['model']}_{s['image_size']}")
    out_dir = Path(args.out_dir or "out/bench")
    json_path = Path(args.json) if args.json else out_dir / f"{tag}.json"
    plot_path = None if args.plot == "none" else (Path(args.plot) if args.plot
                                                  else out_dir / f"{tag}.png")
    modes = sorted({c["mode"] for c in configs}, key=MODES.index)
    print(f"ssaexec bench: {s['model']}"
          + title_size(s)
          + f", batch {s['batch_per_place']}/place, {s['warmup']} warm-up + {s['repeats']} x "
          f"{s['steps']} timed steps, places {counts}, modes {modes}; "
          f"{machine['cores']}-core {machine['cpu']}"
          + (f", GPUs {machine['gpus']}" if machine["gpus"] else ""), flush=True)
    total = len(configs) * (s["warmup"] + s["repeats"] * s["steps"])
    runs = [{"mode": cfg["mode"], "places": cfg["places"], "device": device,
             "batch_per_place": s["batch_per_place"],
             "global_batch": s["batch_per_place"] * cfg["places"],
             "windows": [], "warmup_losses": [], "error": None} for cfg in configs]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ssaexec-bench-") as log_dir, \
            Progress(total, "bench", enabled=not args.no_progress) as bar:
        _measure(configs, runs, s["repeats"], interleave, log_dir, bar)
    summarise(runs, s)
    machine["loadavg_end"] = load_average()
    result = {"schema": SCHEMA, "machine": machine,
              "settings": dict(s, places=counts, device=device, interleave=interleave,
                               modes=modes),
              "runs": runs, "comparisons": compare(runs, counts, s.get("model")),
              "wall_seconds": time.perf_counter() - t_start}
    report(result, json_path, plot_path)
    return result


def main(argv=None):
    """``ssaexec bench`` / ``bench/images_per_sec.py``; returns the exit status."""
    ap = add_arguments(argparse.ArgumentParser(
        prog="ssaexec bench", description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    args = ap.parse_args(argv)
    result = run(args)
    return 1 if any(r["error"] is not None for r in result["runs"]) else 0
