"""What tiered compilation's background work costs the running steps (issue 50).

A small Adam MLP (6-16-1, batch 8, float32, one CPU place, one torch thread), each run in
a fresh process with an empty Inductor cache (a new ``TORCHINDUCTOR_CACHE_DIR``): ms a
step (mean) in windows of 500 steps, with ``compiler=None`` or ``"auto"``; for "auto" the
switch step (if the background compile ended in time) and the background phases' seconds.
Run the modes alternately and repeat: on a shared machine single runs are noise.

    python bench/tiered_overhead.py none 5000
    python bench/tiered_overhead.py auto 5000
    python bench/tiered_overhead.py auto 5000 --worker-imports-first  # the worker as it
        # was before its priority was lowered ahead of its imports (for comparison)
"""

import argparse
import os
import statistics
import tempfile
import time

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("mode", choices=["none", "auto"])
p.add_argument("steps", type=int, nargs="?", default=5000)
p.add_argument("--window", type=int, default=500)
p.add_argument("--worker-imports-first", action="store_true")
args = p.parse_args()
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tiered_overhead_"))

import torch  # noqa: E402

import ssaexec as se  # noqa: E402

if args.worker_imports_first:
    import ssaexec.runtime.compile_worker as cw
    cw._ENTRY = "import os\nfrom ssaexec.runtime.compile_worker import main\nos.nice(19)\nmain()"

torch.set_num_threads(1)
main, startup = se.Program(), se.Program()
with se.program_guard(main, startup):
    x = se.layers.data("x", shape=[-1, 6], dtype="float32")
    y = se.layers.data("y", shape=[-1, 1], dtype="float32")
    h = se.layers.fc(x, size=16, act="relu")
    loss = se.layers.mean(se.layers.square_error_cost(se.layers.fc(h, size=1), y))
    se.optimizer.Adam(0.01).minimize(loss)
scope = se.Scope()
se.Executor(se.CPUPlace(0)).run(startup, scope=scope)
gen = torch.Generator().manual_seed(0)
feeds = [{"x": torch.randn(8, 6, generator=gen), "y": torch.randn(8, 1, generator=gen)}
         for _ in range(64)]
times = []
run = se.ExecutionStrategy(compiler=None if args.mode == "none" else "auto")
with se.ParallelExecutor(se.cpu_places(1), main, startup, loss.name, scope=scope,
                         exec_strategy=run) as pe:
    for i in range(args.steps):
        t0 = time.perf_counter()
        pe.run([loss], feed=feeds[i % len(feeds)])
        times.append(time.perf_counter() - t0)
    low = pe._runner((loss.name,)).lowering
switch = low.switches[0][0] if getattr(low, "switches", None) else None
w = args.window
print(f"{args.mode}{' (worker imports first)' if args.worker_imports_first else ''}: "
      f"{args.steps} steps in {sum(times):.2f} s, switch at step {switch}, "
      f"background phases {getattr(low, 'times', None)}")
print("  ms a step by window:", " ".join(f"{statistics.mean(times[k:k + w]) * 1e3:.2f}"
                                          for k in range(0, len(times), w)))
