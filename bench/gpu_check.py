"""Everything GPU-only in one command: ``python bench/gpu_check.py`` (``make gpu-check``).

Runs each part as its own subprocess (a crash or a hang ends that part, not the report),
with a per-part timeout and an overall budget (default 570 s, so the whole check fits in
10 minutes on one H100), prints progress lines on stderr and writes
``out/gpu_check/report.md`` and ``report.json``: per part the command, exit status,
seconds, the key figures parsed from the benchmark's JSON where it writes one, and the
tail of its output when it failed. Full logs go to ``out/gpu_check/logs/<part>.log``.

Parts (``--list`` prints them with their commands): the ``cuda``-marked tests; the
stream tests (tests/runtime/test_cuda.py) again under ``TORCH_CUDA_SANITIZER=1``; the harness
(bench/images_per_sec.py) paired against torch eager, with peak GPU memory, for ResNet-50
b32 fp32 (program and from_torch), bf16, fp16 and with CUDA graphs, the transformer at
b32x128 and b4x128, and 1 vs 2 places on one GPU; the host-sync detector
(``ssaexec.runtime.host_sync``) in warn mode over one step of every case of
tests/runtime/test_host_sync.py on a CUDA place, both paths, each finding listed (the part
fails only if a case cannot run); bench/dispatch_overhead.py --device cuda; a
torch.profiler trace of one compiled step of a small from_torch model with the
idle GPU time between kernels counted; bench/validate_sim.py --device cuda (the
simulator's prediction of 1 place against 2 places on one GPU, against the measurement).

Without a GPU visible to torch it says so on one line, writes a small report and exits 0.

It runs on whatever interpreter started it: ``make gpu-check`` picks the project's
``.venv`` or, on a GPU machine as it comes (a CUDA torch, no network), that machine's
own python (bench/gpu_env.py; ``NO_VENV=1`` says so). The report names the torch, whether
it is in ssaexec's supported range, and the private APIs it lacks (``ssaexec.core.compat``:
their fallbacks run). A part that fails because of the torch version (a
``TorchFeatureError``, a private torch name missing) is reported as
``failed (torch version)`` with the cause, apart from failures of ssaexec's GPU code.
"""

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET = 570.0

# --- the idle time between GPU kernels (pure; tested on CPU) ----------------------------------

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def merge_intervals(intervals):
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals."""
    merged = []
    for start, end in sorted((float(s), float(e)) for s, e in intervals):
        if end < start:
            raise ValueError(f"interval ends before it starts: ({start}, {end})")
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def gpu_gaps(intervals):
    """Busy and idle time of a device from its kernels' ``(start, end)`` intervals.

    Kernels on several streams may overlap or nest, so the busy time is the length of
    their union, and the idle time the sum of the holes between the union's pieces
    (from the first kernel's start to the last one's end). Units are those of the input.
    """
    intervals = list(intervals)
    merged = merge_intervals(intervals)
    if not merged:
        return {"kernels": 0, "busy": 0.0, "gaps": 0.0, "span": 0.0, "idle_fraction": None,
                "max_gap": 0.0, "n_gaps": 0}
    holes = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    busy = sum(e - s for s, e in merged)
    span = merged[-1][1] - merged[0][0]
    return {"kernels": len(intervals), "busy": busy, "gaps": sum(holes), "span": span,
            "idle_fraction": (sum(holes) / span) if span > 0 else 0.0,
            "max_gap": max(holes, default=0.0), "n_gaps": len(holes)}


def kernel_intervals(trace):
    """``(start, end)`` in microseconds of the GPU work (kernels, memcpy, memset) in a
    Chrome trace as ``torch.profiler``'s ``export_chrome_trace`` writes it."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    out = []
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X" or "dur" not in ev:
            continue
        if str(ev.get("cat", "")).lower() in GPU_CATEGORIES:
            ts, dur = float(ev["ts"]), float(ev["dur"])
            out.append((ts, ts + dur))
    return out


# --- the profiler part (run as: bench/gpu_check.py --profile-step) ---------------------------

def profile_step(device, warmup, json_path, trace_path):
    """Profile one compiled step of a small from_torch CNN on one place of ``device``."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO))
    import ssaexec as se

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    feed = {"input": x, "target": y}
    main, startup, loss = se.from_torch(model, feed, loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.05))
    places = se.cuda_places()[:1] if device == "cuda" else se.cpu_places(1)
    if not places:
        raise SystemExit(f"gpu-check --profile-step: no {device} place")

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with se.ParallelExecutor(places, main, startup, loss,
                             exec_strategy=se.ExecutionStrategy(compiled=True,
                                                                compiler="none"),
                             scope=se.Scope()) as pe:
        for _ in range(warmup):
            pe.run([loss], feed=feed)
        sync()
        with torch.profiler.profile(activities=acts) as prof:
            t0 = time.perf_counter()
            lv, = pe.run([loss], feed=feed)
            sync()
            step_us = (time.perf_counter() - t0) * 1e6
    trace_path = Path(trace_path)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_path))
    stats = gpu_gaps(kernel_intervals(json.loads(trace_path.read_text())))
    result = {"device": device, "torch": torch.__version__, "warmup_steps": warmup,
              "loss": float(lv), "step_us": step_us, "gpu_kernels": stats["kernels"],
              "gpu_busy_us": stats["busy"], "gpu_idle_between_kernels_us": stats["gaps"],
              "gpu_span_us": stats["span"], "idle_fraction": stats["idle_fraction"],
              "max_gap_us": stats["max_gap"], "trace": str(trace_path)}
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(result, indent=1))
    print(f"profile-step ({device}): {stats['kernels']} GPU kernels, busy "
          f"{stats['busy']:.0f} us, idle between kernels {stats['gaps']:.0f} us of a "
          f"{stats['span']:.0f} us span; step {step_us:.0f} us; trace {trace_path}")
    return 0


# --- the host-sync part (run as: bench/gpu_check.py --host-sync) ------------------------------

def host_sync_sweep(device, json_path, cases=None, paths=("compiled", "readable")):
    """The detector in warn mode over one step (after two) of tests/runtime/test_host_sync.py's
    cases on one place of ``device`` ("cuda", or "cpu"/"meta" to test this on a CPU).

    Writes per case and path the findings not allowed and the allowed ones (with their
    rules' reasons); returns 1 if a case could not run, else 0 (findings are warnings).
    """
    import traceback

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    import tests.runtime.test_host_sync as cases_module

    names = sorted(cases_module.CASES) if not cases else list(cases)
    results, crashed = [], 0
    for name in names:
        for path in paths:
            rec = {"case": name, "path": path}
            try:
                found = cases_module._detect(cases_module._case(name), device, path)
                rec["not_allowed"] = [str(f) for f in found.findings]
                rec["allowed"] = [f"{f} -- {f.reason}" for f in found.allowed_findings]
            except Exception as e:  # a case that cannot run is a finding of its own
                crashed += 1
                rec["error"] = "".join(traceback.format_exception_only(e)).strip()[-2000:]
            results.append(rec)
            flag = "ERROR" if "error" in rec else f"{len(rec['not_allowed'])} not allowed"
            print(f"host-sync {name} [{path}] on {device}: {flag}, "
                  f"{len(rec.get('allowed', []))} allowed", flush=True)
    not_allowed = sum(len(r.get("not_allowed", [])) for r in results)
    out = {"device": device, "mode": "warn", "cases": len(names), "runs": len(results),
           "not_allowed": not_allowed, "errors": crashed, "results": results}
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(out, indent=1))
    print(f"host-sync: {len(results)} runs of {len(names)} cases on {device}: "
          f"{not_allowed} findings not allowed, {crashed} errors")
    return 1 if crashed else 0


# --- the parts ------------------------------------------------------------------------------

class Part:
    def __init__(self, name, what, argv, timeout, env=None, json_path=None, kind=None):
        self.name, self.what, self.argv, self.timeout = name, what, argv, timeout
        self.env = env or {}
        self.json_path, self.kind = json_path, kind

    def command(self):
        py = sys.executable
        words = ["python" if w == py else w for w in self.argv]
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(words)


def parts(out, quick=False):
    """The parts in the order they run (most important first)."""
    py, out = sys.executable, Path(out)
    bench = [py, "bench/images_per_sec.py", "--no-progress", "--plot", "none"]
    # --quick keeps 3 warm-up steps, as the presets do: with --cuda-graph the step graphs
    # warm up 2 steps and capture on the 3rd, and a capture inside the timed window made
    # the first GPU run's resnet50-cuda-graph figure 0.46x eager (replays alone: 0.87x)
    short = ["--warmup", "3", "--steps", "3", "--repeats", "1"] if quick else []
    pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda"]

    def harness(name, what, args, timeout):
        j = out / f"{name}.json"
        return Part(name, what, bench + args + short + ["--json", str(j)], timeout,
                    json_path=j, kind="bench")

    resnet = ["--preset", "imagenet", "--places", "cuda:0"]
    transformer = ["--model", "transformer", "--seq-len", "128", "--places", "cuda:0",
                   "--modes", "ssaexec,torch-eager"]
    dispatch_json = out / "dispatch_overhead.json"
    profile_json = out / "profile_step.json"
    sim_json = out / "validate_sim.json"
    host_sync_json = out / "host_sync.json"
    return [
        Part("cuda-tests", "every test marked cuda", pytest + ["tests"], 240, kind="pytest"),
        Part("stream-sanitizer", "the stream tests (tests/runtime/test_cuda.py) under torch's CUDA "
             "sanitizer", pytest + ["tests/runtime/test_cuda.py"], 200,
             env={"TORCH_CUDA_SANITIZER": "1"}, kind="pytest"),
        Part("host-sync", "the host-sync detector in warn mode over one step of every case "
             "of tests/runtime/test_host_sync.py on a CUDA place, both paths",
             [py, "bench/gpu_check.py", "--host-sync", "--device", "cuda", "--json",
              str(host_sync_json)], 120, json_path=host_sync_json, kind="host-sync"),
        harness("resnet50-fp32", "ResNet-50 224px b32 fp32: program and from_torch vs eager",
                resnet + ["--modes", "ssaexec,ssaexec-from-torch,torch-eager",
                          "--from-torch"], 150),
        Part("profile-step", "torch.profiler trace of one compiled step, idle GPU time "
             "between kernels", [py, "bench/gpu_check.py", "--profile-step", "--device",
                                 "cuda", "--json", str(profile_json), "--trace",
                                 str(out / "profile_step_trace.json")], 90,
             json_path=profile_json, kind="profile"),
        Part("dispatch-overhead", "per-op dispatch cost on a CUDA place",
             [py, "bench/dispatch_overhead.py", "--device", "cuda", "--json",
              str(dispatch_json)] + (["--quick"] if quick else []), 150,
             json_path=dispatch_json, kind="dispatch"),
        harness("transformer-b32x128", "transformer b32 x seq 128 vs eager",
                transformer + ["-b", "32"], 90),
        harness("transformer-b4x128", "transformer b4 x seq 128 vs eager",
                transformer + ["-b", "4"], 90),
        harness("resnet50-bf16", "ResNet-50 b32 bf16 autocast vs eager",
                resnet + ["--amp", "bf16", "--modes", "ssaexec,torch-eager"], 120),
        harness("resnet50-fp16", "ResNet-50 b32 fp16 autocast (GradScaler) vs eager",
                resnet + ["--amp", "fp16", "--modes", "ssaexec,torch-eager"], 120),
        harness("resnet50-cuda-graph", "ResNet-50 b32 fp32 with CUDA graphs on (off: "
                "resnet50-fp32) vs eager",
                resnet + ["--cuda-graph", "--modes", "ssaexec,torch-eager"], 120),
        harness("two-places-one-gpu", "1 vs 2 places on one GPU (ResNet-18 CIFAR, "
                "cuda:0,0) vs eager",
                ["--places", "cuda:0,0", "--place-counts", "1,2", "--modes",
                 "ssaexec,torch-eager"], 90),
        Part("validate-sim", "the simulator's prediction against measured runs: 1 place "
             "and 2 places on one GPU (cuda:0, cuda:0,0)",
             [py, "bench/validate_sim.py", "--device", "cuda", "--rounds", "1", "--json",
              str(sim_json)]
             + (["--steps", "4"] if quick else []), 180, json_path=sim_json, kind="sim"),
    ]


# --- key figures ----------------------------------------------------------------------------

def _pytest_figures(log):
    m = None
    for m in re.finditer(r"^=*\s*(\d+ (?:passed|failed|skipped|error|errors|deselected|"
                         r"xfailed|xpassed|warnings?)\b.*?)\s*=*$", log, re.M):
        pass
    return {"summary": m.group(1)} if m else {}


def _bench_figures(data):
    runs = data.get("runs", [])
    eager = {r["places"]: r for r in runs
             if r.get("mode") == "torch-eager" and r.get("error") is None}
    rows = []
    for r in runs:
        row = {"mode": r.get("mode"), "places": r.get("places")}
        if r.get("error") is not None:
            row["error"] = str(r["error"]).strip().splitlines()[-1][:200]
        else:
            ips = r.get("images_per_sec_median")
            row.update(images_per_sec=ips, peak_cuda_mb=r.get("peak_cuda_mb"))
            e = eager.get(1)
            if e and ips and r.get("mode") != "torch-eager":
                row["x_eager@1"] = ips / e["images_per_sec_median"]
        rows.append(row)
    comps = [{"name": c["name"], "ratio": c["ratio"], "paired_ratio": c.get("paired_ratio"),
              "met": c["met"]} for c in data.get("comparisons", [])]
    return {"runs": rows, "comparisons": comps}


def figures(part, log):
    """The key figures of a finished part (``{}`` where none could be read)."""
    if part.kind == "pytest":
        return _pytest_figures(log)
    if part.json_path is None or not Path(part.json_path).exists():
        return {}
    try:
        data = json.loads(Path(part.json_path).read_text())
    except (OSError, ValueError) as e:
        return {"unreadable_json": str(e)}
    if part.kind == "bench":
        return _bench_figures(data)
    if part.kind == "dispatch":
        return {"targets": [{k: t.get(k) for k in ("name", "value", "target", "met")}
                            for t in data.get("targets", [])],
                "wall_seconds": data.get("wall_seconds")}
    if part.kind == "sim":
        return {"summary": data.get("summary")}
    if part.kind == "host-sync":
        return {k: data.get(k) for k in ("runs", "not_allowed", "errors")} | {
            "findings": [f"{r['case']} [{r['path']}]: {x}" for r in data.get("results", [])
                         for x in r.get("not_allowed", []) + ([r["error"]] if "error" in r
                                                               else [])]}
    return data


# --- running --------------------------------------------------------------------------------

def _say(msg):
    print(f"gpu-check: {msg}", file=sys.stderr, flush=True)


# signs in a part's log that its failure comes from the torch version, not from ssaexec's
# GPU code: compat's refusal, or a private torch name this torch does not have
VERSION_SIGNS = [
    re.compile(r"TorchFeatureError: ([^\n]+)"),
    re.compile(r"AttributeError: (module 'torch[\w.]*' has no attribute '_\w+')"),
    re.compile(r"ImportError: (cannot import name '\w+' from 'torch[\w.]*')"),
    re.compile(r"ModuleNotFoundError: (No module named 'torch\._[\w.]+')"),
]


# a module the interpreter lacks (a GPU machine's own python may have no pytest)
MISSING_MODULE = re.compile(r"No module named '?([\w.]+)'?")


def version_cause(log):
    """The one-line torch-version cause of a failed part's ``log``, or None."""
    for sign in VERSION_SIGNS:
        m = sign.search(log)
        if m:
            return m.group(1).strip()
    return None


def missing_module(log):
    """The module a failed part's ``log`` says is not installed (not torch's), or None."""
    m = MISSING_MODULE.search(log)
    return m.group(1) if m and not m.group(1).startswith("torch") else None


def run_part(part, timeout, logs):
    """Run one part; returns its record for the report."""
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{part.name}.log"
    env = dict(os.environ, **part.env)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    rec = {"name": part.name, "what": part.what, "command": part.command(), "log": str(log_path)}
    t0 = time.perf_counter()
    with open(log_path, "w", encoding="utf-8", errors="replace") as f:
        try:
            proc = subprocess.Popen(part.argv, cwd=REPO, env=env, stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            rec.update(status="failed", exit=None, seconds=0.0, tail=f"could not start: {e}")
            return rec
        try:
            rc = proc.wait(timeout=timeout)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # the part's own process group
            except ProcessLookupError:
                pass
            rc = proc.wait()
            status = "timeout"
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    rec["exit"], rec["status"] = rc, status
    log = log_path.read_text(encoding="utf-8", errors="replace")
    rec["figures"] = figures(part, log)
    if status != "ok":
        rec["tail"] = log[-3000:]
        cause, missing = version_cause(log), missing_module(log)
        if cause:
            rec["status"], rec["version_cause"] = "failed (torch version)", cause
        elif missing:
            rec["status"] = f"failed (no module {missing} in this python)"
    return rec


def machine():
    import torch
    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.is_available(), "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if info["gpu"]:
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    info.update(torch_support())
    return info


def torch_support():
    """Whether the running torch is in ssaexec's supported range, and the private APIs it
    lacks (their fallbacks run): ``{"supported": bool, "fallbacks": [...]}``."""
    try:
        from ssaexec.core import compat
    except Exception as e:  # noqa: BLE001 - the report says why instead
        return {"supported": None, "fallbacks": [], "compat_error": f"{type(e).__name__}: {e}"}
    import torch
    v = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    lo, hi = (tuple(int(x) for x in b.split(".")) for b in compat.SUPPORTED)
    return {"supported": lo <= v < hi, "range": f">={compat.SUPPORTED[0]},<{compat.SUPPORTED[1]}",
            "fallbacks": sorted(n for n, f in compat.FEATURES.items()
                                if f.fallback is not None and not f.native)}


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def _figure_lines(rec):
    f = rec.get("figures") or {}
    lines = []
    if "summary" in f and isinstance(f["summary"], str):
        lines.append(f"- pytest: {f['summary']}")
    runs = f.get("runs")
    for r in runs if isinstance(runs, list) else []:   # host-sync's "runs" is a count
        if "error" in r:
            lines.append(f"- {r['mode']}@{r['places']}: FAILED: {r['error']}")
        else:
            extra = f", {r['x_eager@1']:.2f}x eager@1" if "x_eager@1" in r else ""
            mem = r.get("peak_cuda_mb")
            lines.append(f"- {r['mode']}@{r['places']}: {_fmt(r['images_per_sec'])} images/s"
                         f"{extra}, peak GPU {_fmt(mem) if mem is not None else '-'} MiB")
    for c in f.get("comparisons", []):
        lines.append(f"- {c['name']}: {c['ratio']:.2f} ({'met' if c['met'] else 'not met'})")
    for t in f.get("targets", []):
        lines.append(f"- {t['name']}: {_fmt(t['value'])} (target {t['target']}: "
                     f"{'met' if t['met'] else 'not met'})")
    if rec["name"] == "profile-step" and "gpu_kernels" in f:
        lines.append(f"- {f['gpu_kernels']} GPU kernels; busy {_fmt(f['gpu_busy_us'])} us; "
                     f"idle between kernels {_fmt(f['gpu_idle_between_kernels_us'])} us of "
                     f"{_fmt(f['gpu_span_us'])} us ({_fmt(f['idle_fraction'])}); step "
                     f"{_fmt(f['step_us'])} us; trace `{f['trace']}`")
    if rec["name"] == "host-sync" and "not_allowed" in f:
        lines.append(f"- {f['runs']} runs: {f['not_allowed']} findings not allowed, "
                     f"{f['errors']} cases that did not run")
        lines += [f"- {x}" for x in f.get("findings", [])[:60]]
    if rec["name"] == "validate-sim" and f.get("summary"):
        for s in f["summary"]:
            lines.append("- " + ", ".join(f"{k} {_fmt(v)}" for k, v in s.items()
                                          if not isinstance(v, (list, dict))))
    return lines


def write_report(out, info, records, note=None):
    out.mkdir(parents=True, exist_ok=True)
    report = {"schema": "ssaexec-gpu-check/1", "machine": info, "note": note,
              "parts": records}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    md = ["# ssaexec GPU check", ""]
    where = ", ".join(info.get("gpus", [])) or "no GPU"
    md.append(f"torch {info['torch']} (CUDA {info['cuda']}), {where}, {info['date']}")
    md.append("")
    if info.get("supported") is False:
        md += [f"**torch {info['torch']} is outside ssaexec's supported range "
               f"({info.get('range')}, docs/torch_versions.md)**", ""]
    if info.get("fallbacks"):
        md += ["Private torch APIs this torch lacks (ssaexec.core.compat's fallbacks run): "
               + ", ".join(info["fallbacks"]), ""]
    if info.get("compat_error"):
        md += [f"ssaexec.core.compat does not import: {info['compat_error']}", ""]
    if note:
        md += [note, ""]
    if records:
        md += ["| part | status | exit | seconds |", "|---|---|---|---|"]
        md += [f"| {r['name']} | {r['status']} | {r.get('exit')} | {r.get('seconds', '-')} |"
               for r in records]
        for r in records:
            md += ["", f"## {r['name']}: {r['status']}", "", r["what"], "",
                   f"`{r['command']}`", ""]
            md += _figure_lines(r)
            if r.get("version_cause"):
                md += ["", f"Cause: the torch version ({info['torch']}): {r['version_cause']}"]
            if r.get("tail"):
                md += ["", "Output tail:", "", "```", r["tail"].rstrip(), "```"]
    (out / "report.md").write_text("\n".join(md) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats per part")
    ap.add_argument("--only", action="append", metavar="PART", help="run only this part "
                    "(repeatable; --list names them)")
    ap.add_argument("--out", default="out/gpu_check", help="report directory "
                    "(default out/gpu_check)")
    ap.add_argument("--list", action="store_true", help="print the parts and their commands")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                    help=f"seconds for all parts together (default {DEFAULT_BUDGET:.0f})")
    ap.add_argument("--profile-step", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--host-sync", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)  # --host-sync: a comma list
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda", "meta"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--trace", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()

    if args.host_sync:
        return host_sync_sweep(args.device, args.json or out / "host_sync.json",
                               args.cases.split(",") if args.cases else None)
    if args.profile_step:
        return profile_step(args.device, args.warmup, args.json or out / "profile_step.json",
                            args.trace or out / "profile_step_trace.json")

    todo = parts(out, args.quick)
    names = [p.name for p in todo]
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            ap.error(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(names)}")
        todo = [p for p in todo if p.name in args.only]
    if args.list:
        for p in todo:
            print(f"{p.name:<22} {p.command()}")
            print(f"{'':<22} ({p.what}; timeout {p.timeout} s)")
        return 0

    info = machine()
    if not info["gpu"]:
        msg = (f"gpu-check: no CUDA GPU visible to torch {info['torch']} "
               f"(CUDA build {info['cuda'] or 'none'}, Python {info['python']}; "
               "torch.cuda.is_available() is False); nothing to check")
        print(msg)
        write_report(out, info, [], note=msg)
        print(f"gpu-check: wrote {out / 'report.md'} and report.json")
        return 0

    _say(f"torch {info['torch']} (CUDA {info['cuda']}), {', '.join(info['gpus'])}; "
         f"{len(todo)} parts, budget {args.budget:.0f} s; report in {out}")
    records, start = [], time.perf_counter()
    for k, part in enumerate(todo, 1):
        left = args.budget - (time.perf_counter() - start)
        if left < 15:
            _say(f"[{k}/{len(todo)}] {part.name}: skipped, budget spent")
            records.append({"name": part.name, "what": part.what, "command": part.command(),
                            "status": "skipped (budget)", "exit": None, "seconds": 0.0})
            continue
        timeout = min(part.timeout, left)
        _say(f"[{k}/{len(todo)}] {part.name}: {part.command()} (timeout {timeout:.0f} s)")
        rec = run_part(part, timeout, out / "logs")
        records.append(rec)
        _say(f"[{k}/{len(todo)}] {part.name}: {rec['status']} in {rec['seconds']:.0f} s")
        write_report(out, info, records)         # a partial report survives a kill
    write_report(out, info, records)
    bad = [r["name"] for r in records if r["status"] != "ok"]
    by_version = [r["name"] for r in records if r.get("version_cause")]
    total = time.perf_counter() - start
    _say(f"done in {total:.0f} s; {len(records) - len(bad)}/{len(records)} parts ok"
         + (f"; not ok: {', '.join(bad)}" if bad else "")
         + (f" ({', '.join(by_version)} for the torch version)" if by_version else "")
         + f"; report {out / 'report.md'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
