"""The ``ssaexec`` command line (also ``python -m ssaexec``).

Subcommands: ``dump`` (the SSA graph as text, JSON or DOT), ``viz`` (a
picture), ``stats`` (sizes, critical path, width, traffic, memory), ``run``
(train with synthetic or file feeds), ``trace`` (a Perfetto timeline) and
``convert`` (JSON <-> text form). ``docs/cli.md`` is the manual.

Program files hold one program. ``run`` and ``trace`` also need initial values
for the persistable vars; they come from a *startup program*: ``--startup
FILE``, else ``STEM.startup.EXT`` next to ``STEM.EXT`` (same suffix first,
then the other forms). Persistable vars the startup program does not write
get documented defaults (``default_startup``), so any program file runs.

Exit status: 0 on success; 2 for a usage error, a missing or unreadable file,
a syntax error, an invalid program or bad feeds/places, with one line
``ssaexec: error: ...`` naming the file and location; 1 when an op fails while
running, or for a bug (``--debug`` shows Python tracebacks); 130 on Ctrl-C.
"""

import argparse
import copy
import math
import os
import sys
import time
from pathlib import Path

from .synthetic import infer_classes, synthetic_feed  # re-exported: the CLI's feeds

__all__ = ["main", "build_parser", "default_startup", "find_startup", "loss_var",
           "synthetic_feed", "infer_classes", "format_dump", "dump_json", "ProgressBar"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPT = 0, 1, 2, 130
DEFAULT_STATIC_PLACES = "2"
SECTIONS_HELP = "forward, backward, optimize, comm, fetch (comma-separated)"


class UsageError(Exception):
    """A bad argument value found after parsing (exit status 2)."""


# --- argument parsing ----------------------------------------------------------------------

class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


def _common(debug_default):
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--debug", action="store_true", default=debug_default,
                   help="show Python tracebacks on errors")
    return p


def _graph_opts(places_default):
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("graph")
    g.add_argument("--places", "-p", default=places_default, metavar="SPEC",
                   help="cpu:N, cuda:0,1 (device ids), cuda (every GPU) or N (N GPUs, or N "
                        "CPU places without CUDA); default: %(default)s")
    g.add_argument("--reduce-strategy", choices=("all_reduce", "reduce"), default="all_reduce",
                   help="all_reduce every gradient, or reduce it to one owner place and "
                        "broadcast the parameter (default: %(default)s)")
    g.add_argument("--gradient-scale", choices=("coeff_num_device", "one", "customized"),
                   default="coeff_num_device",
                   help="seed of loss@GRAD: 1/places, 1, or fed by the user "
                        "(default: %(default)s)")
    g.add_argument("--fetch", metavar="VARS", default=None,
                   help="comma-separated vars to fetch (one fetch handle each); default: the "
                        "loss, when the program has one; '' for none")
    return p


def _select_opts(parser, collapse=True):
    g = parser.add_argument_group("selection")
    if collapse:
        g.add_argument("--collapse", action="store_true",
                       help="show place 0's replica only (the others are copies)")
    g.add_argument("--block", "--section", dest="sections", metavar="PARTS", default=None,
                   help=f"only these parts of the step: {SECTIONS_HELP}")
    g.add_argument("--filter", dest="pattern", metavar="REGEX", default=None,
                   help="only op handles whose name, op type or var names match REGEX")


def _exec_opts(parser, steps_default):
    g = parser.add_argument_group("execution")
    g.add_argument("--places", "-p", default=None, metavar="SPEC",
                   help="cpu:N, cuda:0,1, cuda or N; default: every GPU, or cpu:2 without one")
    g.add_argument("--steps", type=_positive, default=steps_default,
                   help="steps to run (default: %(default)s)")
    g.add_argument("--batch", "-b", type=_positive, default=None,
                   help="global batch size, split over the places (default: 32, or the whole "
                        "--feed file)")
    g.add_argument("--threads", "-t", type=_positive, default=None,
                   help="scheduler threads (default: places + 1, at most 8; 1 = synchronous)")
    g.add_argument("--feed", metavar="FILE.npz", default=None,
                   help="feed arrays from an .npz file (one array per data var) instead of "
                        "synthetic data; with --batch, consecutive slices of it")
    g.add_argument("--startup", metavar="FILE", default=None,
                   help="startup program (default: STEM.startup.EXT next to the program)")
    g.add_argument("--no-startup", action="store_true",
                   help="ignore any startup file: initialise persistables with the defaults")
    g.add_argument("--lr", type=float, default=0.01,
                   help="learning rate used when no startup program sets one "
                        "(default: %(default)s)")
    g.add_argument("--loss", metavar="VAR", default=None,
                   help="loss var to fetch (default: the var whose gradient the program seeds)")
    g.add_argument("--classes", type=_positive, default=None,
                   help="label range for synthetic int labels (default: from the program)")
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: 0)")
    g.add_argument("--reduce-strategy", choices=("all_reduce", "reduce"), default="all_reduce",
                   help="all_reduce or reduce + broadcast (default: %(default)s)")
    g.add_argument("--gradient-scale", choices=("coeff_num_device", "one", "customized"),
                   default="coeff_num_device", help="seed of loss@GRAD (default: %(default)s)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


_MAIN_EPILOG = """\
examples:
  ssaexec dump examples/seed_mlp.json --places cpu:2
  ssaexec viz examples/seed_mlp.json -o seed_mlp.svg --places cpu:2
  ssaexec stats examples/small_resnet.json --places 4
  ssaexec run examples/mnist_mlp.json --places cpu:2 --steps 20 --batch 64
  ssaexec trace examples/small_resnet.json -o trace.json --steps 3
  ssaexec convert examples/seed_mlp.json seed_mlp.ssa

Program files: .json (JSON form) or .ssa/.txt/.prog (text form). run and trace
take initial values from STEM.startup.EXT next to the program when it exists.
Exit status: 0 ok, 1 an op failed at run time, 2 bad usage, file or program.
"""

_EPILOGS = {
    "dump": """\
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
""",
    "viz": """\
One cluster per place, collectives and fetches between them, colours by handle
kind, dashed dummy edges, var nodes labelled name@vN. Uses Graphviz 'dot'
(or the binary named by $SSAEXEC_DOT) when installed, else matplotlib.
.dot writes the Graphviz source.

examples:
  ssaexec viz examples/seed_mlp.json -o seed_mlp.svg
  ssaexec viz examples/seed_mlp.json -o seed_mlp.png --places cuda:0,1
  ssaexec viz examples/small_resnet.json -o resnet.svg --collapse --filter 'conv2d_1|bn_1'
  ssaexec viz examples/small_resnet.json -o comm.pdf --block comm --no-vars
""",
    "stats": """\
critical path: the longest chain of dependent op handles, in ops.
max width: the most handles at one level of the as-soon-as-possible schedule,
and the largest set of mutually independent handles (how many could run at
once; exact, by Dilworth's theorem). Traffic: bytes each place sends per step
with ring algorithms: all-reduce 2(n-1)/n x payload, reduce and broadcast
(n-1)/n x payload. Memory: parameters, gradients, other persistables.

examples:
  ssaexec stats examples/small_resnet.json --places 4
  ssaexec stats examples/seed_mlp.json --reduce-strategy reduce --format json
""",
    "run": """\
Synthetic feeds (the default) are one fixed batch made from the data vars'
shapes and dtypes, reused every step: floats ~ N(0, 1), integer labels uniform
in [0, classes) with classes read from the loss op. The loss falls as the model
fits the batch; the point is measuring the executor. images/sec excludes step 1
(warm-up) when there is more than one step.

examples:
  ssaexec run examples/mnist_mlp.json --places cpu:2 --steps 20
  ssaexec run examples/small_resnet.json --places cuda:0,1 --batch 128 --steps 50
  ssaexec run examples/uci_housing.json --feed housing.npz --batch 32 --steps 100
""",
    "trace": """\
Writes a Chrome-trace JSON timeline: one lane per place (plus lanes for the
collectives, fetches and steps), one row per thread, one slice per op handle
per step. Open it at https://ui.perfetto.dev or chrome://tracing.

examples:
  ssaexec trace examples/seed_mlp.json -o trace.json
  ssaexec trace examples/small_resnet.json -o trace.json --places cpu:4 --steps 5
  ssaexec trace examples/small_resnet.json -o trace.json --places cuda:0,1 --cuda-sync
""",
    "convert": """\
The output form follows OUT's suffix: .json, or .ssa/.txt/.prog (text). When
IN has a startup program next to it (STEM.startup.EXT), it is converted too.

examples:
  ssaexec convert examples/seed_mlp.json seed_mlp.ssa
  ssaexec convert seed_mlp.ssa seed_mlp.json
""",
    "bench": """\
Trains a model on synthetic images in every mode (seq, ssaexec on 1..N places,
torch-eager, torch-ddp) with the same weights and data, and reports images/sec,
speedup, scaling efficiency and peak memory; writes JSON and a PNG plot.

examples:
  ssaexec bench --quick
  ssaexec bench --model resnet18 --places cpu:2
  ssaexec bench --model resnet50 --image-size 224 --places cuda
  ssaexec bench --model transformer     # imported with from_torch, 1 torch thread
""",
}


def build_parser():
    """The ``argparse`` parser of ``ssaexec``."""
    parser = argparse.ArgumentParser(
        prog="ssaexec", formatter_class=_Formatter, parents=[_common(False)],
        description="Inspect, draw, run and trace ssaexec programs as multi-place SSA graphs.",
        epilog=_MAIN_EPILOG)
    from . import __version__
    parser.add_argument("--version", action="version", version=f"ssaexec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common = _common(argparse.SUPPRESS)

    def add(name, help, parents=()):
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              epilog=_EPILOGS[name], formatter_class=_Formatter,
                              parents=[common, *parents])

    p = add("dump", "print the SSA graph of a program", [_graph_opts(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("--format", "-f", choices=("text", "json", "dot"), default="text",
                   help="output form (default: %(default)s)")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="write here instead of stdout")
    _select_opts(p)
    p.set_defaults(func=cmd_dump)

    p = add("viz", "draw the SSA graph of a program", [_graph_opts(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("-o", "--output", metavar="FILE", required=True,
                   help="picture to write: .svg, .png, .pdf, or .dot (Graphviz source)")
    p.add_argument("--no-vars", action="store_true",
                   help="draw op handles only (edges between ops)")
    p.add_argument("--engine", choices=("auto", "graphviz", "matplotlib"), default="auto",
                   help="renderer (default: Graphviz when installed, else matplotlib)")
    p.add_argument("--dpi", type=_positive, default=None,
                   help="PNG resolution (default: 96 with Graphviz, 110 with matplotlib)")
    _select_opts(p)
    p.set_defaults(func=cmd_viz)

    p = add("stats", "print statistics of the SSA graph of a program",
            [_graph_opts(DEFAULT_STATIC_PLACES)])
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text",
                   help="output form (default: %(default)s)")
    p.set_defaults(func=cmd_stats)

    p = add("run", "train a program on synthetic (or file) feeds")
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    _exec_opts(p, steps_default=10)
    p.set_defaults(func=cmd_run)

    p = add("trace", "run a few steps and write a Chrome-trace/Perfetto timeline")
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("-o", "--output", metavar="FILE.json", required=True,
                   help="trace file to write")
    _exec_opts(p, steps_default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="untraced steps first (default: %(default)s)")
    p.add_argument("--cuda-sync", action="store_true",
                   help="synchronise the device after every op on CUDA places so slices show "
                        "device time (serialises; default: host launch time)")
    p.set_defaults(func=cmd_trace)

    p = add("convert", "convert a program between the JSON and text forms")
    p.add_argument("input", metavar="IN", help="program to read (.json or .ssa/.txt/.prog)")
    p.add_argument("output", metavar="OUT", help="program to write; its suffix picks the form")
    p.add_argument("--no-startup", action="store_true",
                   help="do not convert IN's startup program along with it")
    p.set_defaults(func=cmd_convert)

    p = add("bench", "measure images/sec and scaling against PyTorch eager and DDP")
    from . import benchmark
    benchmark.add_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser


def cmd_bench(args):
    """``ssaexec bench``: the benchmark harness (``ssaexec.benchmark``)."""
    from . import benchmark
    result = benchmark.run(args)
    return EXIT_FAILURE if any(r["error"] is not None for r in result["runs"]) else EXIT_OK


# --- shared helpers ------------------------------------------------------------------------

def _load(path, validate=True):
    """Load and validate a program; every ProgramError names the file."""
    from .errors import ProgramError
    from .program.io import load_program
    program = load_program(path)
    if validate:
        try:
            program.validate()
        except ProgramError as e:
            msg = str(e)
            if not msg.startswith(str(path)):
                raise ProgramError(f"{path}: invalid program: {msg}") from None
            raise
    return program


def loss_var(program):
    """The loss var: the one whose gradient the ``loss``-role op seeds, or None."""
    from .program.desc import GRAD_SUFFIX
    for op in program.global_block().ops:
        if op.role == "loss":
            for name in op.output_names():
                if name.endswith(GRAD_SUFFIX):
                    return name[: -len(GRAD_SUFFIX)]
    return None


def _split_names(text):
    return [n.strip() for n in text.split(",") if n.strip()]


def _fetch_list(args, program):
    if args.fetch is None:
        loss = loss_var(program)
        return [loss] if loss else []
    names = _split_names(args.fetch)
    block = program.global_block()
    for n in names:
        if block.find_var(n) is None:
            raise UsageError(f"--fetch {n!r}: no such var in {args.program}")
    return names


def _places(spec, need_devices):
    """Parse ``--places``; static commands accept CUDA places without a GPU (labels only)."""
    import torch

    from .place import CUDAPlace, cpu_places, cuda_places, parse_places
    spec = (spec or "").strip()
    if not spec:
        if need_devices:
            return cuda_places() or cpu_places(2)
        spec = DEFAULT_STATIC_PLACES
    cuda = torch.cuda.is_available()
    if spec.isdigit():
        n = int(spec)
        if n < 1:
            raise UsageError(f"--places {spec}: need at least one place")
        if not cuda:
            return cpu_places(n)
        if need_devices and n > torch.cuda.device_count():
            raise UsageError(f"--places {spec}: torch sees {torch.cuda.device_count()} GPU(s); "
                             f"use cpu:{n}, or cuda:0,0 to put two places on one GPU")
        return [CUDAPlace(i) for i in range(n)]
    kind, _, rest = spec.partition(":")
    if kind == "cuda" and rest and not cuda and not need_devices:
        try:
            return [CUDAPlace(i, int(d)) for i, d in enumerate(rest.split(","))]
        except ValueError:
            raise UsageError(f"bad --places {spec!r}: use cuda:0,1 (device ids)") from None
    if kind == "cpu" and rest == "0":
        raise UsageError("--places cpu:0: need at least one place (cpu:N is N places)")
    places = parse_places(spec)
    if need_devices and cuda:
        count = torch.cuda.device_count()
        for p in places:
            if p.is_cuda and p.device_index >= count:
                raise UsageError(f"--places {spec}: no CUDA device {p.device_index} (torch sees "
                                 f"{count})")
    return places


def _build_strategy(args):
    from .strategy import BuildStrategy
    return BuildStrategy(reduce_strategy=args.reduce_strategy,
                         gradient_scale_strategy=args.gradient_scale)


def _graph(args):
    from .graph.build import build_ssa_graph
    program = _load(args.program)
    places = _places(args.places, need_devices=False)
    graph = build_ssa_graph(program, places, _build_strategy(args), _fetch_list(args, program))
    graph.lint()
    return graph


def _selected(args, graph):
    from .graph.draw import select_ops
    sections = _split_names(args.sections) if args.sections else None
    return select_ops(graph, collapse=getattr(args, "collapse", False), sections=sections,
                      pattern=args.pattern)


def _write_output(path, text):
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot write: {e.strerror or e}") from None


# --- dump ----------------------------------------------------------------------------------

def _places_of(op):
    if hasattr(op, "place_idx"):
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
    from .graph.analysis import op_counts
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
        multi = not hasattr(op, "place_idx")
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
             "place": str(op.place) if hasattr(op, "place_idx") else None,
             "places": [str(p) for p in op.places],
             "inputs": [_var_json(v, True) for v in op.inputs],
             "outputs": [_var_json(v, False) for v in op.outputs]}
        if op.kind == "compute":
            d.update(op_type=op.op.type, op_index=op.op_index, role=op.op.role)
        elif op.is_collective:
            d.update(vars=list(op.var_names), seq=op.seq)
        elif op.kind == "scale_loss_grad":
            d.update(var=op.var_name, coeff=op.coeff)
        elif op.kind == "fetch":
            d.update(var=op.var_name)
        out.append(d)
    st = graph.strategy
    return {"program": str(source) if source else None,
            "places": [str(p) for p in graph.places],
            "strategy": {"reduce_strategy": st.reduce_strategy,
                         "gradient_scale_strategy": st.gradient_scale_strategy},
            "num_ops": len(graph.ops), "num_dummies": len(graph.dummies),
            "collective_order": [op.id for op in graph.collectives],
            "fetches": [op.id for op in graph.fetches], "ops": out}


def cmd_dump(args):
    graph = _graph(args)
    ops = _selected(args, graph)
    if args.format == "text":
        text = format_dump(graph, ops, args.program)
    elif args.format == "json":
        import json
        text = json.dumps(dump_json(graph, ops, args.program), indent=1) + "\n"
    else:
        from .graph.draw import dot_source
        text = dot_source(graph, ops, collapse=args.collapse)
    _write_output(args.output, text)
    return EXIT_OK


# --- viz -----------------------------------------------------------------------------------

def cmd_viz(args):
    from .graph.draw import render
    graph = _graph(args)
    ops = _selected(args, graph)
    if not ops:
        raise UsageError("nothing to draw: --block/--filter matched no op handle")
    use_dot = {"auto": None, "graphviz": True, "matplotlib": False}[args.engine]
    engine = render(graph, args.output, ops=ops, collapse=args.collapse,
                    show_vars=not args.no_vars, use_dot=use_dot, dpi=args.dpi,
                    notify=lambda msg: print(f"ssaexec: note: {msg}", file=sys.stderr))
    what = "DOT source" if engine == "dot-text" else f"drawn with {engine}"
    print(f"wrote {args.output} ({len(ops)} op handles, {len(graph.places)} places, {what})")
    return EXIT_OK


# --- stats ---------------------------------------------------------------------------------

def cmd_stats(args):
    from .graph.analysis import format_stats, graph_stats
    from .runtime.compiled import compile_summary
    graph = _graph(args)
    stats = graph_stats(graph)
    stats["compiled"] = compile_summary(graph)  # last: it adds the alias edges
    if args.format == "json":
        import json
        stats = dict(stats, program=args.program)
        sys.stdout.write(json.dumps(stats, indent=1) + "\n")
    else:
        sys.stdout.write(format_stats(stats, args.program))
    return EXIT_OK


# --- startup programs ----------------------------------------------------------------------

def find_startup(program_path):
    """``STEM.startup.EXT`` next to ``program_path`` (same suffix first), or None."""
    from .program.io import FORMATS
    path = Path(program_path)
    if path.stem.endswith(".startup"):
        return None
    suffixes = [path.suffix.lower()] + [s for s in FORMATS if s != path.suffix.lower()]
    for suffix in suffixes:
        cand = path.with_name(path.stem + ".startup" + suffix)
        if cand.is_file():
            return cand
    return None


def _readers(program):
    """name -> [(op, slot)] for every input slot of block 0 that reads it."""
    out = {}
    for op in program.global_block().ops:
        for slot, names in op.inputs.items():
            for n in names:
                out.setdefault(n, []).append((op, slot))
    return out


def default_startup(main, startup=None, learning_rate=0.01):
    """A startup program that also initialises what ``startup`` leaves unset.

    Every persistable var of ``main`` with a known shape that ``startup`` (if
    given) does not write gets one op, by the first rule that applies:

    * read as ``LearningRate`` by an op: the constant ``learning_rate``;
    * read as ``Beta1Pow``/``Beta2Pow`` (Adam): that op's ``beta1``/``beta2``;
    * read as ``Scale`` or ``Variance`` by ``batch_norm``: ones;
    * a parameter with two or more dims: Xavier uniform (fan-in/out as in
      ``se.initializer.Xavier``: [in, out] for fc weights, OIHW for conv);
    * anything else (biases, momenta, running means): zeros.

    Returns ``(program, names)``: a copy of ``startup`` (or a new program) with
    the added ops, and the names it added.
    """
    from .program.desc import Program
    from .program.initializer import Constant, Xavier
    prog = startup.clone() if startup is not None else Program(main.random_seed)
    written = {n for op in prog.global_block().ops for n in op.output_names()}
    readers = _readers(main)
    block = prog.global_block()
    added = []
    for var in main.global_block().vars.values():
        if not var.persistable or var.is_data or var.name in written or var.shape is None:
            continue
        if any(d < 0 for d in var.shape):
            continue
        if block.find_var(var.name) is None:
            block.add_var(copy.copy(var))
        init = None
        for op, slot in readers.get(var.name, ()):
            if slot == "LearningRate":
                init = Constant(learning_rate)
            elif slot in ("Beta1Pow", "Beta2Pow"):
                key = "beta1" if slot == "Beta1Pow" else "beta2"
                init = Constant(op.attrs.get(key, 0.9 if key == "beta1" else 0.999))
            elif op.type == "batch_norm" and slot in ("Scale", "Variance"):
                init = Constant(1.0)
            if init is not None:
                break
        if init is None:
            init = Xavier() if var.is_parameter and len(var.shape) >= 2 else Constant(0.0)
        init.init(block.var(var.name), prog)
        added.append(var.name)
    return prog, added


def _startup_for(args, main):
    path = None
    if args.startup and args.no_startup:
        raise UsageError("--startup and --no-startup contradict each other")
    if args.startup:
        path = args.startup
    elif not args.no_startup:
        path = find_startup(args.program)
    startup = _load(path) if path is not None else None
    prog, added = default_startup(main, startup, args.lr)
    if path is None:
        how = f"defaults for {len(added)} persistable vars (no startup program; see docs/cli.md)"
    else:
        how = str(path) + (f" (+ defaults for {len(added)} vars it leaves unset)" if added
                           else "")
    return prog, how


def _file_feeds(path, batch):
    """(feed_of(step), rows per step, description) from an .npz file."""
    import numpy as np

    from .errors import FeedError
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise FeedError(f"{path}: no such feed file") from None
    except (OSError, ValueError) as e:
        raise FeedError(f"{path}: not a readable .npz feed file ({e})") from None
    if not arrays:
        raise FeedError(f"{path}: the .npz file holds no arrays")
    rows = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    sizes = {r for r in rows.values() if r is not None}
    if len(sizes) > 1:
        raise FeedError(f"{path}: arrays disagree on the batch dimension: "
                        + ", ".join(f"{k} {r}" for k, r in rows.items()))
    n = sizes.pop() if sizes else 1
    if batch is None or batch >= n:
        return (lambda k: arrays), n, f"{path} (all {n} rows every step)"
    starts = max(1, n // batch)

    def feed_of(k):
        i = (k % starts) * batch
        return {name: (a[i:i + batch] if rows[name] is not None else a)
                for name, a in arrays.items()}
    return feed_of, batch, f"{path} ({batch} of {n} rows per step)"


# --- progress bar --------------------------------------------------------------------------

class ProgressBar:
    """A one-line progress bar on a terminal (``stream``, default stderr).

    Disabled (every method a no-op) when the stream is not a TTY, when
    ``enabled=False`` or when ``TERM=dumb``.
    """

    def __init__(self, total, stream=None, enabled=True, width=28):
        self.stream = stream if stream is not None else sys.stderr
        self.total = max(1, int(total))
        self.width = width
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(enabled) and isatty() and os.environ.get("TERM") != "dumb"
        self._shown = False

    def update(self, done, suffix=""):
        if not self.enabled:
            return
        filled = int(self.width * min(done, self.total) / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} {suffix}\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self):
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    close = clear


# --- run and trace -------------------------------------------------------------------------

def _executor_setup(args):
    """(pe, main, loss, feed_of, batch, notes) shared by run and trace."""
    from .errors import FeedError
    from .parallel_executor import ParallelExecutor
    from .runtime.scope import Scope
    from .strategy import ExecutionStrategy
    main = _load(args.program)
    loss = args.loss or loss_var(main)
    if loss is None:
        raise UsageError(f"{args.program}: cannot tell the loss var (no op has role 'loss'; "
                         "was the program built with optimizer.minimize?); pass --loss VAR")
    if main.global_block().find_var(loss) is None:
        raise UsageError(f"--loss {loss!r}: no such var in {args.program}")
    places = _places(args.places, need_devices=True)
    startup, init_note = _startup_for(args, main)
    if args.feed:
        feed_of, batch, feed_note = _file_feeds(args.feed, args.batch)
    else:
        batch = args.batch or 32
        feed = synthetic_feed(main, batch, args.seed, args.classes)
        feed_of = lambda k: feed  # noqa: E731 - one fixed batch, see the run epilog
        feed_note = f"synthetic, one fixed batch (seed {args.seed})"
    if batch < len(places):
        raise FeedError(f"batch {batch} is smaller than the {len(places)} places: every place "
                        "needs at least one sample (raise --batch)")
    pe = ParallelExecutor(places=places, main_program=main, startup_program=startup,
                          loss_name=loss, build_strategy=_build_strategy(args),
                          exec_strategy=ExecutionStrategy(num_threads=args.threads),
                          scope=Scope())
    threads = pe.num_threads
    notes = {"places": ", ".join(str(p) for p in places), "threads": threads,
             "init": init_note, "feed": feed_note}
    return pe, main, loss, feed_of, batch, notes


def _print_header(args, loss, batch, notes):
    print(f"ssaexec {args.command}: {args.program}")
    print(f"  places {notes['places']} | {notes['threads']} threads | batch {batch} | "
          f"{args.steps} steps | loss {loss}")
    print(f"  parameters: {notes['init']}")
    print(f"  feed: {notes['feed']}")
    sys.stdout.flush()


def _throughput(times, batch):
    timed = times[1:] if len(times) > 1 else times
    total = sum(timed)
    rate = batch * len(timed) / total if total > 0 else math.inf
    which = f"steps 2-{len(times)}" if len(times) > 1 else "step 1"
    return rate, total, which


def cmd_run(args):
    pe, main, loss, feed_of, batch, notes = _executor_setup(args)
    _print_header(args, loss, batch, notes)
    bar = ProgressBar(args.steps, enabled=not args.no_progress)
    times, losses = [], []
    try:
        for k in range(args.steps):
            t0 = time.perf_counter()
            value, = pe.run(fetch_list=[loss], feed=feed_of(k))
            dt = time.perf_counter() - t0
            times.append(dt)
            v = float(value.float().mean())
            losses.append(v)
            bar.clear()
            print(f"step {k + 1:>4}/{args.steps}  loss {v:.6f}  {dt * 1e3:8.1f} ms", flush=True)
            bar.update(k + 1, f"loss {v:.4f}  {batch / dt:,.0f} img/s")
    finally:
        bar.close()
        pe.close()
    rate, total, which = _throughput(times, batch)
    change = f"; loss {losses[0]:.6f} -> {losses[-1]:.6f}" if len(losses) > 1 else ""
    print(f"throughput: {rate:,.1f} images/sec ({which}, {total:.3f} s, batch {batch}){change}")
    return EXIT_OK


def cmd_trace(args):
    from . import trace
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    pe, main, loss, feed_of, batch, notes = _executor_setup(args)
    _print_header(args, loss, batch, notes)
    bar = ProgressBar(args.steps, enabled=not args.no_progress)

    def on_step(k, values, seconds):
        v = float(values[0].float().mean())
        bar.clear()
        print(f"step {k:>4}/{args.steps}  loss {v:.6f}  {seconds * 1e3:8.1f} ms (traced)",
              flush=True)
        bar.update(k, f"loss {v:.4f}")
    try:
        result = trace.trace_steps(pe, feed_of, [loss], args.steps, warmup=args.warmup,
                                   cuda_sync=args.cuda_sync, on_step=on_step)
    finally:
        bar.close()
        pe.close()
    doc = result.to_chrome({"program": str(args.program), "batch": batch,
                            "warmup": args.warmup, "cuda_sync": bool(args.cuda_sync)})
    trace.write_chrome_trace(args.output, doc)
    print(f"wrote {args.output}: {len(result.records)} op slices ({len(result.graph.ops)} op "
          f"handles x {args.steps} steps) on {len(result.threads)} threads; open it at "
          "https://ui.perfetto.dev")
    return EXIT_OK


# --- convert -------------------------------------------------------------------------------

def cmd_convert(args):
    from .errors import ProgramError
    from .program.io import FORMATS, save_program
    if Path(args.output).suffix.lower() not in FORMATS:  # fail before reading anything
        raise ProgramError(f"{args.output}: unknown program file suffix "
                           f"{Path(args.output).suffix!r}; use one of {', '.join(FORMATS)}")
    program = _load(args.input)
    save_program(program, args.output)
    form = "JSON" if Path(args.output).suffix.lower() == ".json" else "text"
    print(f"wrote {args.output} ({form} form)")
    if not args.no_startup:
        startup = find_startup(args.input)
        if startup is not None:
            out = Path(args.output)
            target = out.with_name(out.stem + ".startup" + out.suffix)
            save_program(_load(startup), target)
            print(f"wrote {target} (its startup program, from {startup})")
    return EXIT_OK


# --- entry point ---------------------------------------------------------------------------

def _one_line(exc):
    # One line per error, whatever it quotes (a torch message, a crafted file's text):
    # scripts read the last line of stderr, and a file must not forge extra lines.
    parts = [p.strip() for p in str(exc).splitlines() if p.strip()]
    return "; ".join(parts).encode("utf-8", "backslashreplace").decode("utf-8")


def main(argv=None):
    """Run the ``ssaexec`` command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    from .errors import OpError, SSAExecError
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if debug:
            import traceback
            traceback.print_exc()
        print("ssaexec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPT
    except BrokenPipeError:
        # the reader went away (ssaexec dump ... | head): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (UsageError, OpError, SSAExecError) as e:
        if debug:
            import traceback
            traceback.print_exc()
        status = EXIT_FAILURE if isinstance(e, OpError) else EXIT_USAGE
        print(f"ssaexec: error: {_one_line(e)}", file=sys.stderr)
        return status
    except Exception as e:  # a bug in ssaexec: say so, traceback only on request
        if debug:
            import traceback
            traceback.print_exc()
        print(f"ssaexec: internal error: {type(e).__name__}: {e} (run with --debug for the "
              "traceback, and please report it)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
