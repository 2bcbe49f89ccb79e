"""Per-place peak of parameters + gradients + optimizer state under ZeRO stages 0-3.

``python bench/zero_memory.py [--config big] [--stages 0,1,2,3] [--layouts 1x4,2x2]``

Issue 49, acceptance 2. For each layout (``PxL``: P processes of L CPU places each, W =
P*L ranks; ``1x4`` = one process of 4 places, ``2x2`` = 2 gloo processes of 2) and each
stage, the config's model (``ssaexec.harness.zero_peers.CONFIGS``; ``big``: 6 encoder
layers of d_model 512, 18.9 M parameters, 75.7 MB fp32) is imported with ``from_torch``,
trained with AdamW by ``ParallelExecutor`` with ``BuildStrategy(zero_stage=K)``: one
warm-up step, then one observed step.

What is measured: the runtime's own values, the tensors bound in each place's scope,
counted after every op of the observed step (``ssaexec.harness.place_memory``: each
storage once, by kind: params, grads, optimizer, gathered, activations). Per place:
``peak_model``, the peak over the step of params + grads + optimizer + gathered (the
figure ZeRO shrinks), and the kinds at that moment; ``peak_total`` adds the activations.
The table shows the largest place. Beside it, ``pe.scope``: the bytes a process holds
in the executor's own scope (where the startup program ran) that no place shares; they
are not a place's and are not in the check.

Acceptance 2: stage 3's ``peak_model`` <= the plain run's (stage 0) / W + the largest
gathered layer. "Layer" is what one all-gather brings in (``program.shard.layer_of``:
an encoder layer whole); ``--zero-prefetch`` sets how many are gathered ahead. The check
is printed per layout and written in the JSON (``--json``, default
``out/bench/zero_memory.json``).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SCHEMA = "ssaexec-zero-memory/1"
MB = 1e6


def unit(nbytes):
    """``(divisor, name)`` to show sizes around ``nbytes``: MB, or kB below 10 MB."""
    return (MB, "MB") if nbytes >= 10 * MB else (1e3, "kB")


def parse_args(argv=None):
    from ssaexec.harness.zero_peers import CONFIGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="big", choices=sorted(CONFIGS),
                    help="model (default big: 75.7 MB of parameters)")
    ap.add_argument("--stages", default="0,1,2,3", help="ZeRO stages (0 is needed for the "
                                                         "check; default 0,1,2,3)")
    ap.add_argument("--layouts", default="1x4,2x2",
                    help="PROCESSESxPLACES, comma list (default 1x4,2x2)")
    ap.add_argument("--batch-per-place", "-b", type=int, default=None,
                    help="samples a place (config's)")
    ap.add_argument("--zero-prefetch", type=int, default=1, metavar="K",
                    help="stage 3: layers gathered ahead of compute (default 1)")
    ap.add_argument("--json", default=str(REPO / "out" / "bench" / "zero_memory.json"))
    args = ap.parse_args(argv)
    try:
        args.stages = [int(x) for x in args.stages.split(",") if x]
    except ValueError:
        ap.error(f"--stages: integers from 0 to 3, got {args.stages!r}")
    if not args.stages or any(k not in (0, 1, 2, 3) for k in args.stages):
        ap.error(f"--stages: integers from 0 to 3, got {args.stages}")
    layouts = []
    for item in (x for x in args.layouts.split(",") if x):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            ap.error(f"--layouts: PROCESSESxPLACES such as 1x4 or 2x2, got {item!r}")
        layouts.append((int(parts[0]), int(parts[1])))
    if not layouts:
        ap.error("--layouts: name at least one")
    args.layouts = layouts
    if args.batch_per_place is not None and args.batch_per_place < 1:
        ap.error(f"--batch-per-place must be at least 1, got {args.batch_per_place}")
    return args


def measure(s, stage, places, process=0, processes=1):
    """One warm-up step, then one observed step of ``stage`` on ``places`` CPU places of
    process ``process``: ``place_memory`` report (its places in global rank order)."""
    import ssaexec as se
    from ssaexec.harness.place_memory import measure_step
    from ssaexec.harness.workloads import place_samples
    from ssaexec.harness.zero_peers import ssaexec_program
    main, startup, loss = ssaexec_program(s)
    x, y = place_samples(s, processes * places, process * places, places)
    # compiler "none": no compiler, whatever SSAEXEC_COMPILER says (the observed steps run
    # the readable path anyway, and "auto" would compile in the background meanwhile)
    pe = se.ParallelExecutor(se.cpu_places(places), main, startup, loss,
                             build_strategy=se.BuildStrategy(
                                 zero_stage=stage, zero_prefetch=s.get("zero_prefetch", 1)),
                             exec_strategy=se.ExecutionStrategy(compiler="none"),
                             scope=se.Scope())
    try:
        feed = {"img": x, "label": y}
        pe.run([loss], feed=feed)
        report = measure_step(pe, main, [loss], feed=feed)
        layout = pe.shard_layout()
        report["sharded_params"] = len(layout) if layout is not None else 0
        report["executor_scope_bytes"] = executor_scope_bytes(pe)
        return report
    finally:
        pe.close()


def executor_scope_bytes(pe):
    """Bytes of the executor's own scope (``pe.scope``, where the startup program ran)
    that no place's scope shares: held by the process beside the places' figures."""
    def storages(scope):
        return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in scope.vars.values() if hasattr(t, "untyped_storage")}
    placed = set()
    for scope in pe.local_scopes:
        placed.update(storages(scope))
    return sum(n for ptr, n in storages(pe.scope).items() if ptr not in placed)


def _rank(rank, processes, places, port, s, stages, res_q):
    """A spawned process of a multi-process layout: every stage, its places' reports."""
    import datetime
    import traceback

    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", rank=rank, world_size=processes,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=600))
        for stage in stages:
            try:
                res_q.put(("stage", rank, stage, measure(s, stage, places, rank, processes)))
            except Exception:  # noqa: BLE001 - reported per stage; the next stage goes on
                # deterministic (the same program on every rank): every rank fails alike
                res_q.put(("failed", rank, stage, traceback.format_exc()))
        dist.destroy_process_group()
        res_q.put(("done", rank, None, None))
    except BaseException:  # noqa: B036 - the driver must hear about every failure
        res_q.put(("error", rank, None, traceback.format_exc()))
        raise SystemExit(1) from None


def run_layout(s, processes, places, stages):
    """``{stage: report or {"error": ...}}`` of one layout."""
    if processes == 1:
        out = {}
        for stage in stages:
            try:
                out[stage] = measure(s, stage, places)
            except Exception as e:  # noqa: BLE001 - a stage not supported yet is reported
                out[stage] = {"error": f"{type(e).__name__}: {e}"}
        return out
    import queue

    import torch.multiprocessing as mp
    from ssaexec.harness.zero_peers import free_port
    ctx = mp.get_context("spawn")
    res_q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, processes, places, port, s, stages, res_q),
                         daemon=True) for r in range(processes)]
    for p in procs:
        p.start()
    got, done, out = {}, set(), {}
    deadline = time.monotonic() + 1800
    try:
        while len(done) < processes:
            try:
                kind, rank, stage, payload = res_q.get(timeout=2.0)
            except queue.Empty:
                if time.monotonic() > deadline or any(
                        not p.is_alive() and r not in done for r, p in enumerate(procs)):
                    raise RuntimeError(f"layout {processes}x{places}: a process died or "
                                       "timed out without a message") from None
                continue
            if kind == "error":
                raise RuntimeError(f"layout {processes}x{places} rank {rank}:\n{payload}")
            if kind == "done":
                done.add(rank)
            elif kind == "failed":
                out[stage] = {"error": payload.strip().splitlines()[-1]}
            else:
                got.setdefault(stage, {})[rank] = payload
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    for stage, by_rank in got.items():
        if stage in out:
            continue
        reports = [by_rank[r] for r in range(processes)]
        out[stage] = {"samples": sum(r["samples"] for r in reports),
                      "sharded_params": reports[0]["sharded_params"],
                      "executor_scope_bytes": max(r["executor_scope_bytes"] for r in reports),
                      "places": [p for r in reports for p in r["places"]]}
    return out


def module_layers(groups):
    """``{module prefix: bytes}``: the parameters by the module that holds them, a numbered
    layer whole (``model.encoder.layers.3``), others by their owner (``model.head``)."""
    sizes = {}
    for _, names, size in groups:
        for n in names:
            parts = n.split(".")
            cut = next((i + 1 for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
            key = ".".join(parts[:cut])
            sizes[key] = sizes.get(key, 0) + size / len(names)
    return sizes


def summarise(layout, by_stage, largest_layer):
    """Per stage: the largest place's figures (bytes) and, for stage 3 against stage 0,
    the acceptance check."""
    processes, places = layout
    world = processes * places
    rows = {}
    for stage, rep in sorted(by_stage.items()):
        if "error" in rep:
            rows[stage] = {"error": rep["error"]}
            continue
        worst = max(rep["places"], key=lambda p: p["peak_model"])
        rows[stage] = {"peak_model": worst["peak_model"],
                       "peak_total": max(p["peak_total"] for p in rep["places"]),
                       "at_model_peak": worst["at_model_peak"],
                       "peak_gathered": max(p["peak_kind"]["gathered"] for p in rep["places"]),
                       "sharded_params": rep["sharded_params"], "samples": rep["samples"],
                       "executor_scope_bytes": rep["executor_scope_bytes"]}
    check = None
    if "peak_model" in rows.get(0, {}) and "peak_model" in rows.get(3, {}):
        bound = rows[0]["peak_model"] / world + largest_layer
        check = {"stage3_peak_model": rows[3]["peak_model"], "plain_peak_model":
                 rows[0]["peak_model"], "world": world, "largest_layer": largest_layer,
                 "bound": bound, "met": rows[3]["peak_model"] <= bound}
    return {"layout": f"{processes}x{places}", "world": world, "stages": rows,
            "acceptance_2": check}


def table(res, param_bytes):
    div, name = unit(param_bytes)
    lines = [f"\nlayout {res['layout']} (world {res['world']}), {name} per place (the largest):",
             f"{'stage':>5}{'params':>9}{'grads':>9}{'optim':>9}{'gathered':>9}"
             f"{'model':>9}{'x plain':>8}{'+activ.':>9}{'sharded':>8}{'pe.scope':>9}"]
    plain = res["stages"].get(0, {}).get("peak_model")
    for stage, row in res["stages"].items():
        if "error" in row:
            lines.append(f"{stage:>5}  failed: {row['error'].strip().splitlines()[-1][:100]}")
            continue
        k = row["at_model_peak"]
        lines.append(f"{stage:>5}{k['params'] / div:>9.1f}{k['grads'] / div:>9.1f}"
                     f"{k['optimizer'] / div:>9.1f}{k['gathered'] / div:>9.1f}"
                     f"{row['peak_model'] / div:>9.1f}"
                     f"{(row['peak_model'] / plain if plain else float('nan')):>8.3f}"
                     f"{row['peak_total'] / div:>9.1f}{row['sharded_params']:>8}"
                     f"{row['executor_scope_bytes'] / div:>9.1f}")
    c = res["acceptance_2"]
    if c:
        lines.append(f"acceptance 2: stage 3 {c['stage3_peak_model'] / div:.1f} {name} <= "
                     f"plain {c['plain_peak_model'] / div:.1f} / {c['world']} + largest layer "
                     f"{c['largest_layer'] / div:.1f} = {c['bound'] / div:.1f} {name}: "
                     f"{'met' if c['met'] else 'NOT met'}")
    else:
        lines.append("acceptance 2: not checked (needs stages 0 and 3 both measured)")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    from ssaexec.harness.results import machine_description
    from ssaexec.harness.zero_peers import config_settings, layer_groups, ssaexec_program
    if args.zero_prefetch < 0:
        raise SystemExit(f"--zero-prefetch must be >= 0, got {args.zero_prefetch}")
    s = config_settings(args.config, batch_per_place=args.batch_per_place)
    s["zero_prefetch"] = args.zero_prefetch
    main_program = ssaexec_program(s)[0]
    groups = layer_groups(main_program)
    # the gathered unit: the layer of program.shard.layer_of (what one all-gather moves)
    from ssaexec.program.shard import layer_of
    by_layer = {}
    for _, names, size in groups:
        for n in names:
            by_layer.setdefault(layer_of(n), []).append((n, size / len(names)))
    largest = max(((k, [n for n, _ in v], sum(b for _, b in v)) for k, v in by_layer.items()),
                  key=lambda g: g[2])
    params = sum(g[2] for g in groups)
    result = {"schema": SCHEMA, "command": "python bench/zero_memory.py " +
              " ".join(sys.argv[1:] if argv is None else argv),
              "machine": machine_description(), "config": args.config, "settings": s,
              "param_bytes": params, "largest_layer": {"reader": largest[0],
                                                       "params": largest[1],
                                                       "bytes": largest[2]},
              # for comparison: the bound with a whole module layer instead of a gather group
              "largest_module_layer": dict(zip(("module", "bytes"), max(
                  module_layers(groups).items(), key=lambda kv: kv[1]))),
              "measure": "tensors bound in each place's scope after every op of one "
                         "observed step (ssaexec.harness.place_memory), each storage once",
              "layouts": []}
    div, name = unit(params)
    print(f"{args.config}: {params / div:.1f} {name} of parameters, {s['optimizer']}, "
          f"{s['batch_per_place']} samples a place; largest layer {largest[2] / div:.2f} "
          f"{name} ({largest[0]}: {', '.join(largest[1])})", flush=True)
    t0 = time.perf_counter()
    for processes, places in args.layouts:
        try:
            by_stage = run_layout(s, processes, places, args.stages)
        except RuntimeError as e:
            by_stage = {k: {"error": str(e)} for k in args.stages}
        res = summarise((processes, places), by_stage, largest[2])
        result["layouts"].append(res)
        print(table(res, params), flush=True)
    result["wall_s"] = time.perf_counter() - t0
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {path} ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
