"""``ssaexec trace``: run a few steps and write a Chrome-trace/Perfetto timeline.

Setup is ``ssaexec.cli.execute``, as for ``run``; the timing is ``ssaexec.execution.step_trace``
(through ``ParallelExecutor.observe``, the executor's per-op callback seam).
Warm-up steps run untraced first, so that the timeline shows steady-state steps.
With ``--compiler inductor`` the steps run compiled and each segment is one slice
with its op list (``trace_steps(nodes=True)``); the warm-up is then at least the two
steps that record and compile.
``--html`` also writes the explorer page of the traced graph with its timeline
(``ssaexec.graph.explorer``).
"""

from .common import EXIT_OK, ProgressBar, UsageError
from .execute import execution_options, print_header, print_step, setup

__all__ = ["register"]

EPILOG = """\
Writes a Chrome-trace JSON timeline: one lane per place (plus lanes for the
collectives, fetches and steps), one row per thread, one slice per op handle
per step. Open it at https://ui.perfetto.dev or chrome://tracing. --html also
writes the interactive explorer page of the graph with the trace: handles
coloured by measured duration, the critical path, a timeline per place and stream.
With --compiler inductor each compiled segment is one slice, listing its ops.

examples:
  ssaexec trace examples/seed_mlp.json -o trace.json
  ssaexec trace examples/small_resnet.json -o trace.json --places cpu:4 --steps 5
  ssaexec trace examples/small_resnet.json -o trace.json --places cuda:0,1 --cuda-sync
  ssaexec trace examples/mnist_mlp.json -o trace.json --places cpu:2 --html
  ssaexec trace examples/seed_mlp.json -o trace.json --compiler inductor
"""


def register(add):
    """Add the ``trace`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("trace", "run a few steps and write a Chrome-trace/Perfetto timeline", EPILOG)
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("-o", "--output", metavar="FILE.json", required=True,
                   help="trace file to write")
    p.add_argument("--html", metavar="FILE.html", nargs="?", const="", default=None,
                   help="also write the explorer page with this trace (default file: the "
                        "trace's name with .html)")
    # the per-op view unless a compiler is named (a tiered step's segments are one slice
    # each, straight-line or compiled)
    execution_options(p, steps_default=3, compiler_default="none")
    p.add_argument("--warmup", type=int, default=None,
                   help="untraced steps first (default: 1; 2 with --compiler, which records "
                        "and compiles in its first two steps)")
    p.add_argument("--cuda-sync", action="store_true",
                   help="synchronise the device after every op on CUDA places so slices show "
                        "device time (serialises; default: host launch time)")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args):
    from ..execution import step_trace as trace
    nodes = args.compiler not in (None, "none")
    if args.warmup is None:
        args.warmup = 2 if nodes else 1
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    page = None
    if args.html is not None:
        from pathlib import Path
        page = args.html or str(Path(args.output).with_suffix(".html"))
        if Path(page).resolve() == Path(args.output).resolve():
            raise UsageError(f"--html {page}: that is the trace file; name another")
    s = setup(args)
    print_header(args, s)
    bar = ProgressBar(args.steps, enabled=not args.no_progress)

    def on_step(k, values, seconds):
        v = float(values[0].float().mean())
        print_step(bar, k, args.steps, v, seconds, tag=" (traced)", status=f"loss {v:.4f}")
    try:
        result = trace.trace_steps(s.pe, s.feed_of, [s.loss], args.steps, warmup=args.warmup,
                                   cuda_sync=args.cuda_sync, on_step=on_step, nodes=nodes)
    finally:
        bar.close()
        s.pe.close()
    meta = {"program": str(args.program), "batch": s.batch, "warmup": args.warmup,
            "cuda_sync": bool(args.cuda_sync)}
    if nodes:
        meta["compiler"] = args.compiler
    doc = result.to_chrome(meta)
    trace.write_chrome_trace(args.output, doc)
    what = (f"{len(result.nodes.nodes)} nodes, {len(result.nodes.segments)} of them "
            f"compiled segments" if nodes else f"{len(result.graph.ops)} op handles")
    print(f"wrote {args.output}: {len(result.records)} slices ({what} x {args.steps} steps) "
          f"on {len(result.threads)} threads; open it at https://ui.perfetto.dev")
    if page is not None:
        from ..graph.explorer import write_explorer
        size = write_explorer(result.graph, page, trace=doc, source=str(args.program))
        print(f"wrote {page}: explorer page with the trace ({size / 1e6:.1f} MB; open it in a "
              "browser)")
    return EXIT_OK
