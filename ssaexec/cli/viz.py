"""``ssaexec viz``: a picture of the SSA graph of a program (SVG, PNG, PDF or DOT source).

It draws through ``ssaexec.graph.draw.render``: Graphviz ``dot`` when installed
(or the binary ``$SSAEXEC_DOT`` names), else matplotlib; a fallback is reported
as a note on stderr, never silently. Drawing nothing is an error.
"""

import sys

from .common import (DEFAULT_STATIC_PLACES, EXIT_OK, UsageError, graph_of, graph_options,
                     positive, select_options, selected)

__all__ = ["register"]

EPILOG = """\
One cluster per place, collectives and fetches between them, colours by handle
kind, dashed dummy edges, var nodes labelled name@vN. Uses Graphviz 'dot'
(or the binary named by $SSAEXEC_DOT) when installed, else matplotlib.
.dot writes the Graphviz source.

examples:
  ssaexec viz examples/seed_mlp.json -o seed_mlp.svg
  ssaexec viz examples/seed_mlp.json -o seed_mlp.png --places cuda:0,1
  ssaexec viz examples/small_resnet.json -o resnet.svg --collapse --filter 'conv2d_1|bn_1'
  ssaexec viz examples/small_resnet.json -o comm.pdf --block comm --no-vars
"""


def register(add):
    """Add the ``viz`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("viz", "draw the SSA graph of a program", EPILOG,
            [graph_options(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("-o", "--output", metavar="FILE", required=True,
                   help="picture to write: .svg, .png, .pdf, or .dot (Graphviz source)")
    p.add_argument("--no-vars", action="store_true",
                   help="draw op handles only (edges between ops)")
    p.add_argument("--engine", choices=("auto", "graphviz", "matplotlib"), default="auto",
                   help="renderer (default: Graphviz when installed, else matplotlib)")
    p.add_argument("--dpi", type=positive, default=None,
                   help="PNG resolution (default: 96 with Graphviz, 110 with matplotlib)")
    select_options(p)
    p.set_defaults(func=cmd_viz)


def cmd_viz(args):
    from ..graph.draw import render
    graph = graph_of(args)
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
