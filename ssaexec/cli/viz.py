"""``ssaexec viz``: a picture of the SSA graph of a program (SVG, PNG, PDF or DOT source),
the interactive explorer page (``.html``) or a Model Explorer graph.

Pictures go through ``ssaexec.graph.draw.render``: Graphviz ``dot`` when installed
(or the binary ``$SSAEXEC_DOT`` names), else matplotlib; a fallback is reported
as a note on stderr, never silently. Drawing nothing is an error. ``.html`` writes
``ssaexec.graph.explorer``'s self-contained page of the whole graph (``--trace`` adds
a timeline); ``--format model-explorer`` writes ``ssaexec.graph.model_explorer``'s JSON.
"""

import sys

from .common import (DEFAULT_STATIC_PLACES, EXIT_OK, UsageError, graph_of, graph_options,
                     positive, select_options, selected)

__all__ = ["register"]

EPILOG = """\
One cluster per place, collectives and fetches between them, colours by handle
kind, dashed dummy edges, var nodes labelled name@vN. Uses Graphviz 'dot'
(or the binary named by $SSAEXEC_DOT) when installed, else matplotlib.
.dot writes the Graphviz source. .html writes the interactive explorer: one
self-contained page (pan/zoom, search, collapsible groups per place and phase,
details of every handle and var; with --trace, durations, the critical path and
a timeline). --format model-explorer writes JSON for Google's Model Explorer
(pip install ai-edge-model-explorer), and with --trace its node data beside it.

examples:
  ssaexec viz examples/seed_mlp.json -o seed_mlp.svg
  ssaexec viz examples/seed_mlp.json -o seed_mlp.png --places cuda:0,1
  ssaexec viz examples/small_resnet.json -o resnet.svg --collapse --filter 'conv2d_1|bn_1'
  ssaexec viz examples/small_resnet.json -o comm.pdf --block comm --no-vars
  ssaexec viz examples/small_resnet.json -p 8 -o graph.html
  ssaexec viz examples/mnist_mlp.json -p cpu:2 -o graph.html --trace trace.json
  ssaexec viz examples/mnist_mlp.json -o graph.json --format model-explorer
"""


def register(add):
    """Add the ``viz`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("viz", "draw the SSA graph of a program", EPILOG,
            [graph_options(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("-o", "--output", metavar="FILE", required=True,
                   help="file to write: a picture (.svg, .png, .pdf), .dot (Graphviz source) "
                        "or .html (the interactive explorer)")
    p.add_argument("--format", choices=("auto", "html", "model-explorer"), default="auto",
                   help="auto: by the suffix of --output (default); html: the explorer page; "
                        "model-explorer: JSON for Google's Model Explorer")
    p.add_argument("--trace", metavar="TRACE.json", default=None,
                   help="a trace of this graph (ssaexec trace, same places and strategy): "
                        "colour by duration, critical path, timeline (html, model-explorer)")
    p.add_argument("--no-vars", action="store_true",
                   help="draw op handles only (edges between ops)")
    p.add_argument("--engine", choices=("auto", "graphviz", "matplotlib"), default="auto",
                   help="renderer (default: Graphviz when installed, else matplotlib)")
    p.add_argument("--dpi", type=positive, default=None,
                   help="PNG resolution (default: 96 with Graphviz, 110 with matplotlib)")
    select_options(p)
    p.set_defaults(func=cmd_viz)


def _interactive(args, graph):
    # the explorer page or the Model Explorer JSON: the whole graph, maybe a trace
    from ..graph.explorer import load_trace, write_explorer
    if args.collapse or args.sections or args.pattern:
        raise UsageError("--collapse/--block/--filter select what a picture draws; the "
                         f"{args.format} output holds the whole graph (search it there)")
    trace = load_trace(args.trace) if args.trace else None
    if args.format == "model-explorer":
        from ..graph.model_explorer import write_model_explorer
        files = write_model_explorer(graph, args.output, trace=trace, source=args.program)
        print(f"wrote {', '.join(str(f) for f in files)} ({len(graph.ops)} op handles, "
              f"{len(graph.places)} places, Model Explorer graph"
              + (" and node data" if trace else "") + ")")
        return EXIT_OK
    size = write_explorer(graph, args.output, trace=trace, source=str(args.program))
    print(f"wrote {args.output} ({len(graph.ops)} op handles, {len(graph.places)} places, "
          f"explorer page{' with trace' if trace else ''}, {size / 1e6:.1f} MB; open it in a "
          "browser)")
    return EXIT_OK


def cmd_viz(args):
    from ..graph.draw import render
    if args.format == "auto" and str(args.output).lower().endswith((".html", ".htm")):
        args.format = "html"
    graph = graph_of(args)
    if args.format != "auto":
        return _interactive(args, graph)
    if args.trace:
        raise UsageError("--trace needs an .html output or --format model-explorer")
    ops = selected(args, graph)
    if not ops:
        raise UsageError("nothing to draw: --block/--filter matched no op handle")
    use_dot = {"auto": None, "graphviz": True, "matplotlib": False}[args.engine]
    engine = render(graph, args.output, ops=ops, collapse=args.collapse,
                    show_vars=not args.no_vars, use_dot=use_dot, dpi=args.dpi,
                    notify=lambda msg: print(f"ssaexec: note: {msg}", file=sys.stderr))
    what = "DOT source" if engine == "dot-text" else f"drawn with {engine}"
    print(f"wrote {args.output} ({len(ops)} op handles, {len(graph.places)} places, {what})")
    return EXIT_OK
