"""One program, many sequence lengths: what ``from_torch(..., dynamic=...)`` costs.

    python bench/dynamic_shapes.py                    # Llama-tiny, lengths 32, 64, 128
    python bench/dynamic_shapes.py --lengths 16,32 --json out/dynamic.json

A ``transformers`` Llama (bench/hf_models.py's ``hf-llama`` config unless told
otherwise) is imported twice over: once with the sequence dimension named
(``dynamic={"input_ids": {1: "seq"}, ...}``), and once per length with every size
fixed. The dynamic program stays symbolic: its sizes are size expressions that the
prepared calls evaluate from the inputs' shapes at each call, so the SSA graph and the
prepared calls are built once, when the ``ParallelExecutor`` is made, for every length.
The script times, on one place with the same weights and batches:

* the imports (one dynamic one against one static one per length);
* the steady step time at each length, the lengths interleaved round by round, of the
  dynamic program, the static program of that length and eager PyTorch;
* the first step at each new length of the already-warm dynamic executor (nothing is
  rebuilt: it costs a steady step).

``--compiler inductor``: both programs run with ``ExecutionStrategy(compiler="inductor")``
(a bounded per-shape cache: each new length compiles its own graphs, ``runtime.inductor``),
and ``torch.compile(model)`` is timed beside them (it recompiles the second length with
dynamic shapes); the first step at a new length then includes its compile, on both sides.

Prints a table; ``--json`` writes the raw figures with the machine.
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
from ssaexec.harness import machine_description  # noqa: E402
from ssaexec.harness.workloads import load_twins  # noqa: E402


def feeds(vocab, batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def step_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(lengths, batch, d_model, layers, heads, vocab, rounds, steps, threads, log=print,
        compiler=None):
    torch.set_num_threads(threads)
    model = load_twins("hf_models").build_hf("hf-llama", d_model=d_model, heads=heads,
                                             layers=layers, vocab=vocab,
                                             seq_len=max(lengths)).model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    data = {n: feeds(vocab, batch, n, n) for n in lengths}
    opt = se.optimizer.SGD(1e-4)

    t = time.perf_counter()
    dims = {k: {1: "seq"} for k in data[lengths[0]]}
    dyn = se.from_torch(model, data[lengths[0]], optimizer=opt, dynamic=dims)
    result = {"import_s": {"dynamic": time.perf_counter() - t, "static": {}}, "first_step_s": {},
              "step_s": {}}
    static = {}
    for n in lengths:
        t = time.perf_counter()
        static[n] = se.from_torch(model, data[n], optimizer=opt)
        result["import_s"]["static"][n] = time.perf_counter() - t
    log(f"imports: dynamic {result['import_s']['dynamic']:.1f} s; static "
        + ", ".join(f"{n}: {s:.1f} s" for n, s in result["import_s"]["static"].items()))

    place = se.cpu_places(1)
    strategy = se.ExecutionStrategy(compiler=compiler)
    runners = {}
    dyn_pe = se.ParallelExecutor(place, *dyn, scope=se.Scope(), exec_strategy=strategy)
    runners["dynamic"] = lambda n: dyn_pe.run([dyn[2]], feed=data[n])
    eager_opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def torch_step(fn):
        def step(n):
            eager_opt.zero_grad(set_to_none=True)
            fn(**data[n]).loss.backward()
            eager_opt.step()
        return step
    # with a compiler, torch.compile is the peer: it recompiles the second length with
    # dynamic shapes (automatic dynamic) where we compile one graph per length
    first = {"dynamic": runners["dynamic"]}
    if compiler is not None:
        first["torch.compile"] = torch_step(torch.compile(model))
    # first steps: warm at the first length (the compiler records, then compiles), then
    # each new length once
    for k, fn in first.items():
        fn(lengths[0])
        fn(lengths[0])
        result["first_step_s"].setdefault(k, {})
        for n in lengths:
            t = time.perf_counter()
            fn(n)
            result["first_step_s"][k][n] = time.perf_counter() - t
    static_pe = {n: se.ParallelExecutor(place, *static[n], scope=se.Scope(),
                                        exec_strategy=strategy) for n in lengths}
    runners["static"] = lambda n: static_pe[n].run([static[n][2]], feed=data[n])
    runners["eager"] = torch_step(model)
    if compiler is not None:
        runners["torch.compile"] = first["torch.compile"]
    for n in lengths:
        for fn in runners.values():
            fn(n)  # warm-up (a compiler: record, then compile)
            fn(n)
    samples = {k: {n: [] for n in lengths} for k in runners}
    for r in range(rounds):
        for n in lengths:
            for k, fn in runners.items():
                samples[k][n].append(step_time(lambda: fn(n), steps))
    for k in runners:
        result["step_s"][k] = {n: statistics.median(samples[k][n]) for n in lengths}
    dyn_pe.close()
    for pe in static_pe.values():
        pe.close()
    model.load_state_dict(state)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="32,64,128")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--compiler", choices=("inductor",), default=None,
                    help="both programs compiled by Inductor, and torch.compile timed too")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    res = run(lengths, args.batch, args.d_model, args.layers, args.heads, args.vocab,
              args.rounds, args.steps, args.threads, compiler=args.compiler)
    print(f"\nhf-llama {args.layers}x{args.d_model} h{args.heads} vocab {args.vocab}, batch "
          f"{args.batch}, 1 CPU place, {args.threads} torch threads, compiler "
          f"{args.compiler}")
    tc = args.compiler is not None
    print(f"{'length':>6} {'dynamic ms':>11} {'static ms':>10} {'eager ms':>9} "
          + (f"{'t.compile ms':>12} " if tc else "")
          + f"{'dyn/static':>10} {'eager/dyn':>9} " + (f"{'tc/dyn':>7} " if tc else "")
          + f"{'1st step ms':>11}" + (f" {'tc 1st step ms':>14}" if tc else ""))
    for n in lengths:
        d, s, e = (res["step_s"][k][n] * 1e3 for k in ("dynamic", "static", "eager"))
        c = res["step_s"]["torch.compile"][n] * 1e3 if tc else None
        print(f"{n:>6} {d:>11.1f} {s:>10.1f} {e:>9.1f} " + (f"{c:>12.1f} " if tc else "")
              + f"{d / s:>10.2f} {e / d:>9.2f} " + (f"{c / d:>7.2f} " if tc else "")
              + f"{res['first_step_s']['dynamic'][n] * 1e3:>11.1f}"
              + (f" {res['first_step_s']['torch.compile'][n] * 1e3:>14.1f}" if tc else ""))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(res, settings=vars(args), machine=machine_description()), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
