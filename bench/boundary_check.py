"""The run-time boundary: what checking entering values against declarations costs.

``ssaexec.runtime.boundary`` checks every value that enters a step against the
``VarDesc`` of the program being run, once per load: when a startup program's values
are handed over, a checkpoint or parameter file is read, ``set_var`` is called, or a
scope was written since the executor's last step. This script measures, for each model,
in one run and side by side (``dispatch_overhead.interleaved``: rotating rounds, medians):

* **step**: one ``ParallelExecutor.run`` (the default compiled path), which includes
  the steady-state cost of the boundary: comparing the scopes' stamps and renewing them;
* **load check**: the check a load triggers, forced by renewing the stamps first (every
  entering var of every place: a dtype, rank and size comparison and a device check);
* **idle check**: what every step pays when nothing was written: the stamps compared
  (equal: no check), then renewed and recorded at the step's end.

Models: the example program files (``small_resnet``, ``mnist_mlp``; read from a file, so
untrusted) and a program ``se.from_torch`` builds in this process (``trusted``: the
boundary could skip it; this says whether that would save anything).

``python bench/boundary_check.py [--quick] [--places N] [--json out.json]``
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ssaexec as se  # noqa: E402
from dispatch_overhead import interleaved  # noqa: E402
from ssaexec.harness import machine_description  # noqa: E402
from ssaexec.program.defaults import loss_var  # noqa: E402
from ssaexec.runtime.boundary import entering_vars  # noqa: E402
from ssaexec.data.synthetic import synthetic_feed  # noqa: E402

SCHEMA = "ssaexec-boundary-check/1"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _file_model(name, batch):
    main = se.load_program(EXAMPLES / f"{name}.json")
    startup = se.load_program(EXAMPLES / f"{name}.startup.json")
    return main, startup, loss_var(main), synthetic_feed(main, batch)


def _torch_model(batch):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), *[m for _ in range(8) for m in (nn.Linear(64, 64),
                                                                       nn.LayerNorm(64),
                                                                       nn.ReLU())],
                        nn.Linear(64, 10))
    feed = {"input": torch.randn(batch, 1, 8, 8), "target": torch.randint(0, 10, (batch,))}
    main, startup, loss = se.from_torch(net, feed, loss_fn=nn.functional.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.01))
    return main, startup, getattr(loss, "name", loss), feed


def measure(name, model, places, quick):
    main, startup, loss, feed = model
    pe = se.ParallelExecutor(se.cpu_places(places), main, startup, loss, scope=se.Scope(),
                             exec_strategy=se.ExecutionStrategy(compiler="none"))
    programs = pe._step_programs()  # what the executor's boundary check reads

    def step():
        pe.run([loss], feed=feed)

    def load_check():
        for s in pe.local_scopes:
            s.touch()
        pe._entry.before(programs, pe.local_scopes, pe.places)

    def idle_check():  # what every step pays: compare the stamps, renew and record them
        pe._entry.before(programs, pe.local_scopes, pe.places)
        pe._entry.after(pe.local_scopes, True)

    def settle():  # leave the stamps recorded, as after a step
        pe._entry.after(pe.local_scopes, True)

    def timed_load():
        load_check()
        settle()

    try:
        step()
        settle()
        rounds = 3 if quick else 7
        calls = {"step": 3 if quick else 10, "load": 20 if quick else 200,
                 "idle": 200 if quick else 2000}
        times = {}
        for r in range(rounds):  # one mode per window, rotating: paired in one run
            got = interleaved({"step": step}, 1 if r == 0 else 0, 1, calls["step"], lambda: None)
            times.setdefault("step", []).extend(got["step"])
            got = interleaved({"load": timed_load}, 2 if r == 0 else 0, 1, calls["load"],
                              lambda: None)
            times.setdefault("load", []).extend(got["load"])
            got = interleaved({"idle": idle_check}, 2 if r == 0 else 0, 1, calls["idle"],
                              lambda: None)
            times.setdefault("idle", []).extend(got["idle"])
        med = {k: statistics.median(v) for k, v in times.items()}
        entering = {v.name for p in programs for v in entering_vars(p)}
        return {"model": name, "trusted": bool(main.trusted), "places": places,
                "entering_vars": len(entering),
                "step_ms": med["step"] * 1e3, "load_check_us": med["load"] * 1e6,
                "idle_check_us": med["idle"] * 1e6,
                "load_over_step_pct": 100 * med["load"] / med["step"]}
    finally:
        pe.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--places", type=int, default=2, help="CPU places (default: 2)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", metavar="PATH", help="also write the results here")
    args = ap.parse_args(argv)
    models = {"small_resnet (file)": lambda: _file_model("small_resnet", args.batch),
              "mnist_mlp (file)": lambda: _file_model("mnist_mlp", args.batch),
              "from_torch MLP+LayerNorm (trusted)": lambda: _torch_model(args.batch)}
    rows = [measure(name, make(), args.places, args.quick) for name, make in models.items()]
    print(f"# {machine_description()}")
    print(f"{'model':38} {'vars':>5} {'step ms':>9} {'load check us':>14} "
          f"{'idle check us':>14} {'load/step':>10}")
    for r in rows:
        print(f"{r['model']:38} {r['entering_vars']:>5} {r['step_ms']:>9.2f} "
              f"{r['load_check_us']:>14.1f} {r['idle_check_us']:>14.2f} "
              f"{r['load_over_step_pct']:>9.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": SCHEMA, "machine": machine_description(),
                                               "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
