"""``ssaexec dump``: the SSA graph of a program as text, JSON or DOT.

Every op handle is listed in id order, collectives and fetches among the compute
handles, with the var handles it reads and writes as ``name@vN`` and its dummy
edges. The text form is for reading; the JSON form (``dump_json``) is for
scripts: the same fields for every handle plus what its kind adds
(``OpHandle.details()``: op type and role, collective vars and order, loss-grad
coefficient, fetched var); DOT is the picture ``viz`` draws, as source.

``--passes`` shows the graph after each graph-building pass (``graph.passes``) in
the same forms: text and JSON one section per pass, DOT to a file one file per
pass, named as ``BuildStrategy(debug_graphviz_path=...)`` names them. Only the
final graph is linted: before ``insert_collectives`` a gradient is not reduced yet.
"""

from .common import (DEFAULT_STATIC_PLACES, EXIT_OK, UsageError, build_strategy, fetch_list,
                     graph_of, graph_options, load_program_file, places_from, select_options,
                     selected, split_names, write_output)

__all__ = ["format_dump", "dump_json", "register", "pass_selection"]

EPILOG = """\
Prints every op handle: its id, kind, name, place(s), the var handles it reads
and writes as name@vN (version N; v0 is the value before the step), and its
dummy edges as ~dummy_K(reason <- #producer) / ~dummy_K(reason -> #consumer).
All-reduce, reduce, broadcast, loss-grad scale and fetch handles are listed
with the compute handles, in id order.

examples:
  ssaexec dump examples/seed_mlp.json
  ssaexec dump examples/seed_mlp.json --places cuda:0,1 --reduce-strategy reduce
  ssaexec dump examples/small_resnet.json --collapse --block backward,comm
  ssaexec dump examples/uci_housing.ssa --format json -o graph.json
  ssaexec dump examples/seed_mlp.json --passes                  # the graph after each pass
  ssaexec dump examples/seed_mlp.json --passes insert_collectives,fuse_buckets
  ssaexec dump examples/seed_mlp.json --passes -f dot -o g.dot  # g.dot.01_replicate.dot ...
  ssaexec dump examples/seed_mlp.json --places cpu:4 --zero 3   # all-gathers, reduce-scatters, frees
"""


def register(add):
    """Add the ``dump`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("dump", "print the SSA graph of a program", EPILOG,
            [graph_options(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("--format", "-f", choices=("text", "json", "dot"), default="text",
                   help="output form (default: %(default)s)")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="write here instead of stdout")
    # checked while parsing: ``dump --passes prog.json`` (the program taken as NAMES) then
    # says "unknown pass 'prog.json'" rather than that PROGRAM is missing
    p.add_argument("--passes", nargs="?", const="all", default=None, metavar="NAMES",
                   type=_passes_arg,
                   help="show the graph after each graph-building pass, or after the passes "
                        "NAMES (comma-separated) only: " + ", ".join(_pass_names()))
    select_options(p)
    p.set_defaults(func=cmd_dump)


def _pass_names():
    from ..graph.passes import PASS_NAMES
    return PASS_NAMES


def _passes_arg(text):
    import argparse
    try:
        return pass_selection(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--passes: ")) from None


def pass_selection(text):
    """The pass names ``--passes`` picks (``all``: every one), in pipeline order."""
    names = _pass_names()
    if text == "all":
        return list(names)
    wanted = split_names(text)
    unknown = [n for n in wanted if n not in names]
    if unknown or not wanted:
        what = f"unknown pass {unknown[0]!r}" if unknown else "no pass named"
        raise UsageError(f"--passes: {what}; the passes are {', '.join(names)} (or 'all')")
    return [n for n in names if n in wanted]


def _places_of(op):
    if op.on_one_place:
        return str(op.place)
    return ",".join(str(p) for p in sorted(op.places, key=lambda p: (p.kind, p.index)))


def _var_text(v, multi, inbound):
    if v.is_dummy:
        if inbound:
            src = v.generated_op
            return f"~{v.name}({v.reason} <- #{src.id if src is not None else '?'})"
        return f"~{v.name}({v.reason} -> " + ",".join(f"#{o.id}" for o in v.pending_ops) + ")"
    return f"{v.name}@v{v.version}" + (f"[{v.place}]" if multi else "")


def format_dump(graph, ops=None, source=None):
    """The text form of ``ssaexec dump``: a header, then one line per op handle."""
    from ..graph.analysis import op_counts
    ops = list(graph.ops) if ops is None else list(ops)
    counts = op_counts(graph)
    st = graph.strategy
    fetch = ", ".join(op.var_name for op in graph.fetches) or "none"
    lines = [f"# ssaexec dump{': ' + str(source) if source else ''}",
             f"# places: {', '.join(str(p) for p in graph.places)} | reduce_strategy="
             f"{st.reduce_strategy} gradient_scale={st.gradient_scale_strategy} | fetch: {fetch}",
             f"# {counts['total']} op handles ("
             + ", ".join(f"{k} {v}" for k, v in counts["by_kind"].items())
             + f"), {len(graph.dummies)} dummy vars"
             + (f"; showing {len(ops)}" if len(ops) != len(graph.ops) else ""),
             "# name@vN = version N of var `name` on the op's place (each write makes the next "
             "version); [place] on handles spanning places;",
             "# ~dummy_K(reason <- #I) = dummy edge (no data): runs after op #I; "
             "(reason -> #J) = op #J runs after this one", ""]
    width = max((len(op.name) for op in ops), default=10)
    for op in ops:
        multi = not op.on_one_place
        ins = ", ".join(_var_text(v, multi, True) for v in op.inputs) or "-"
        outs = ", ".join(_var_text(v, multi, False) for v in op.outputs) or "-"
        lines.append(f"#{op.id:<5} {op.kind:<15} {op.name:<{width}}  on {_places_of(op)}  "
                     f"in: {ins}  out: {outs}")
    return "\n".join(lines) + "\n"


def _var_json(v, inbound):
    if v.is_dummy:
        d = {"dummy": v.name, "reason": v.reason}
        if inbound:
            d["from"] = v.generated_op.id if v.generated_op is not None else None
        else:
            d["to"] = [o.id for o in v.pending_ops]
        return d
    return {"name": v.name, "version": v.version, "place": str(v.place)}


def dump_json(graph, ops=None, source=None):
    """The JSON-ready dict of ``ssaexec dump --format json``."""
    ops = list(graph.ops) if ops is None else list(ops)
    out = []
    for op in ops:
        d = {"id": op.id, "kind": op.kind, "name": op.name,
             "place": str(op.place) if op.on_one_place else None,
             "places": [str(p) for p in op.places],
             "inputs": [_var_json(v, True) for v in op.inputs],
             "outputs": [_var_json(v, False) for v in op.outputs]}
        d.update(op.details())
        out.append(d)
    st = graph.strategy
    return {"program": str(source) if source else None,
            "places": [str(p) for p in graph.places],
            "strategy": {"reduce_strategy": st.reduce_strategy,
                         "gradient_scale_strategy": st.gradient_scale_strategy},
            "num_ops": len(graph.ops), "num_dummies": len(graph.dummies),
            "collective_order": [op.id for op in graph.collectives],
            "fetches": [op.id for op in graph.fetches], "ops": out}


def _render(args, graph):
    ops = selected(args, graph)
    if args.format == "text":
        return format_dump(graph, ops, args.program)
    if args.format == "json":
        return dump_json(graph, ops, args.program)
    from ..graph.draw import dot_source
    return dot_source(graph, ops, collapse=args.collapse)


def _json_text(doc):
    import json
    return json.dumps(doc, indent=1) + "\n"


def cmd_dump(args):
    if args.passes is not None:
        return _dump_passes(args)
    out = _render(args, graph_of(args))
    write_output(args.output, _json_text(out) if args.format == "json" else out)
    return EXIT_OK


def _dump_passes(args):
    from ..graph.build import graph_after_each_pass, pass_dump_path
    wanted = args.passes  # the names, checked by the parser (``pass_selection``)
    program = load_program_file(args.program)
    graphs = graph_after_each_pass(program, places_from(args.places, need_devices=False),
                                   build_strategy(args),
                                   fetch_list(args, program))
    graphs[-1][1].lint()
    shown = [(k, p, g) for k, (p, g) in enumerate(graphs, 1) if p.name in wanted]
    total = len(graphs)
    if args.format == "json":
        doc = {"program": str(args.program), "passes": [
            {"index": k, "name": p.name, "doc": p.doc, "graph": _render(args, g)}
            for k, p, g in shown]}
        write_output(args.output, _json_text(doc))
    elif args.format == "dot" and args.output not in (None, "-"):
        for k, p, g in shown:  # a DOT file draws one graph
            write_output(pass_dump_path(args.output, k, p.name), _render(args, g))
    else:
        mark = "//" if args.format == "dot" else "##"
        write_output(args.output, "\n".join(
            f"{mark} pass {k}/{total} {p.name}: {p.doc}\n" + _render(args, g)
            for k, p, g in shown))
    return EXIT_OK
