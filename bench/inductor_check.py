"""Segments compiled by Inductor against the compiled path: exactness, fallbacks, compile
time and step time, model by model (issue 32; ``ExecutionStrategy(compiler="inductor")``).

``python bench/inductor_check.py [--steps 3] [--places 1,2] [--models ...] [--json F]``

For each model, optimizer and place count, the same program is trained twice from the
same initial parameters on the same batches, once on the compiled path (the reference)
and once with ``compiler="inductor"``, and the table reports the largest difference of
any parameter after ``--steps`` + 5 steps (the 5 more are timed), the segments compiled
and the ones that ran
uncompiled (with the first reason), the time of the compiling steps, and the median
step time of both after them. Builder models run in float64 (target: 1e-6); the
imported transformer (``bench/torch_models.py``, through ``se.from_torch``) in float32
(target: 1e-4 after 5 steps); its largest difference is also given outside the key biases
of attention, whose gradient is pure float32 noise (``_signal``).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ssaexec as se  # noqa: E402
from ssaexec.program.example_models import build_model, make_optimizer  # noqa: E402

BUILDER = {  # name -> (build kwargs, feed maker)
    "seed_mlp": (dict(in_dim=64, hidden=32), lambda g, n: {
        "x": torch.randn(n, 64, dtype=torch.float64, generator=g),
        "label": torch.randint(0, 10, (n, 1), generator=g)}),
    "mlp": (dict(in_dim=64, hidden=(32, 16)), lambda g, n: {
        "img": torch.randn(n, 64, dtype=torch.float64, generator=g),
        "label": torch.randint(0, 10, (n, 1), generator=g)}),
    "cnn": (dict(size=12, filters=(4, 8)), lambda g, n: {
        "img": torch.randn(n, 1, 12, 12, dtype=torch.float64, generator=g),
        "label": torch.randint(0, 10, (n, 1), generator=g)}),
}


def _builder(name, optimizer):
    kw, feed = BUILDER[name]
    main, startup, loss = build_model(name, dtype="float64",
                                      optimizer=make_optimizer(optimizer, 0.01), **kw)
    return main, startup, loss, feed


def _transformer(optimizer):
    from ssaexec.harness import cli
    from ssaexec.harness.workloads import from_torch_program, place_samples
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    s = cli.settings(ap.parse_args(["--model", "transformer"]))
    s["optimizer"] = optimizer
    x, y = place_samples(s, 2)  # 8 samples: enough for 2 places
    main, startup, loss, (xn, yn) = from_torch_program(s, x, y)
    return main, startup, loss, lambda g, n: {xn: x[:n], yn: y[:n]}


def _signal(name, diff):
    """``diff`` without the key slice of an attention's ``in_proj_bias``: its gradient is 0
    in exact arithmetic (softmax ignores a constant added to one query's logits), so in
    float32 it is rounding noise (~1e-9), which Adam normalises into whole steps of the
    learning rate, in any order of summation (eager's, torch.compile's, Inductor's)."""
    if not name.endswith("in_proj_bias"):
        return diff
    d = diff.numel() // 3
    return torch.cat([diff[:d], diff[2 * d:]])


def train(model, optimizer, places, compiler, steps, batch):
    main, startup, loss, feed = (_transformer(optimizer) if model == "transformer"
                                 else _builder(model, optimizer))
    torch.manual_seed(0)
    scope = se.Scope()
    notes = []
    pe = se.ParallelExecutor(se.cpu_places(places), main, startup, loss, scope=scope,
                             exec_strategy=se.ExecutionStrategy(compiler=compiler))
    g = torch.Generator().manual_seed(1)
    times = []
    try:
        for _ in range(steps):
            f = feed(g, batch)
            t0 = time.perf_counter()
            pe.run([loss], feed=f)
            times.append(time.perf_counter() - t0)
        lowering = pe._runner((loss if isinstance(loss, str) else loss.name,)).lowering
    finally:
        pe.close()
    params = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    return params, times, lowering, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--places", default="1,2")
    ap.add_argument("--models", default="seed_mlp,mlp,cnn,transformer")
    ap.add_argument("--optimizers", default="sgd,adamw")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for optimizer in args.optimizers.split(","):
            for places in (int(p) for p in args.places.split(",")):
                steps = max(args.steps, 5) if model == "transformer" else args.steps
                batch = 4 * places
                ref, ref_t, _, _ = train(model, optimizer, places, None, steps + 5, batch)
                got, got_t, lowering, _ = train(model, optimizer, places, "inductor",
                                                steps + 5, batch)
                diff = max(float((ref[n] - got[n]).abs().max()) for n in ref)
                signal = max(float(_signal(n, ref[n] - got[n]).abs().max()) for n in ref)
                row = dict(model=model, optimizer=optimizer, places=places, steps=steps + 5,
                           max_param_diff=diff, max_param_diff_signal=signal,
                           compiles=lowering.compiles,
                           fallbacks=lowering.fallbacks,
                           compile_steps_s=sum(got_t[:2]),
                           ref_step_ms=statistics.median(ref_t[2:]) * 1e3,
                           inductor_step_ms=statistics.median(got_t[2:]) * 1e3)
                rows.append(row)
                why = f"; uncompiled: {lowering.fallbacks[0][1][:70]}" if lowering.fallbacks \
                    else ""
                noise = "" if signal == diff else f" ({signal:.2e} outside the key biases)"
                print(f"{model:12s} {optimizer:6s} {places} place(s): max |diff| {diff:.2e}"
                      f"{noise}, "
                      f"{lowering.compiles} compiled, {len(lowering.fallbacks)} uncompiled, "
                      f"compiling steps {row['compile_steps_s']:.1f} s, step "
                      f"{row['ref_step_ms']:.2f} -> {row['inductor_step_ms']:.2f} ms{why}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": os.uname().nodename, "torch": torch.__version__,
                       "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
