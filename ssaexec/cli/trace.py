"""``ssaexec trace``: run a few steps and write a Chrome-trace/Perfetto timeline.

Setup is ``ssaexec.cli.execute``, as for ``run``; the timing is ``ssaexec.trace``
(through ``ParallelExecutor.observe``, the executor's per-op callback seam).
Warm-up steps run untraced first, so that the timeline shows steady-state steps.
"""

from .common import EXIT_OK, ProgressBar, UsageError
from .execute import execution_options, print_header, print_step, setup

__all__ = ["register"]

EPILOG = """\
Writes a Chrome-trace JSON timeline: one lane per place (plus lanes for the
collectives, fetches and steps), one row per thread, one slice per op handle
per step. Open it at https://ui.perfetto.dev or chrome://tracing.

examples:
  ssaexec trace examples/seed_mlp.json -o trace.json
  ssaexec trace examples/small_resnet.json -o trace.json --places cpu:4 --steps 5
  ssaexec trace examples/small_resnet.json -o trace.json --places cuda:0,1 --cuda-sync
"""


def register(add):
    """Add the ``trace`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("trace", "run a few steps and write a Chrome-trace/Perfetto timeline", EPILOG)
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("-o", "--output", metavar="FILE.json", required=True,
                   help="trace file to write")
    execution_options(p, steps_default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="untraced steps first (default: %(default)s)")
    p.add_argument("--cuda-sync", action="store_true",
                   help="synchronise the device after every op on CUDA places so slices show "
                        "device time (serialises; default: host launch time)")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args):
    from .. import trace
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    s = setup(args)
    print_header(args, s)
    bar = ProgressBar(args.steps, enabled=not args.no_progress)

    def on_step(k, values, seconds):
        v = float(values[0].float().mean())
        print_step(bar, k, args.steps, v, seconds, tag=" (traced)", status=f"loss {v:.4f}")
    try:
        result = trace.trace_steps(s.pe, s.feed_of, [s.loss], args.steps, warmup=args.warmup,
                                   cuda_sync=args.cuda_sync, on_step=on_step)
    finally:
        bar.close()
        s.pe.close()
    doc = result.to_chrome({"program": str(args.program), "batch": s.batch,
                            "warmup": args.warmup, "cuda_sync": bool(args.cuda_sync)})
    trace.write_chrome_trace(args.output, doc)
    print(f"wrote {args.output}: {len(result.records)} op slices ({len(result.graph.ops)} op "
          f"handles x {args.steps} steps) on {len(result.threads)} threads; open it at "
          "https://ui.perfetto.dev")
    return EXIT_OK
