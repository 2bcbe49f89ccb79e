"""What the subcommands of ``ssaexec`` share: exit codes, options, loading, places, output.

Policy:

* every error a user can fix is a ``UsageError`` or an ``SSAExecError`` that names
  the file or the option (``main`` turns it into exit status 2 and one line);
* program files are validated when loaded, and a validation error names the file;
* ``--places`` parsing: ``N`` is N GPUs (N CPU places without CUDA), ``cpu:N``,
  ``cuda:0,1``, ``cuda``; the static commands (dump, viz, stats) accept CUDA places
  without a GPU (they are labels only), run and trace check the devices exist;
* the default fetch is the loss (``ssaexec.program.defaults.loss_var``);
* the progress bar is drawn on a terminal only and erased before every printed
  line, so stdout and stderr stay plain text when redirected.
"""

import argparse
import sys
from pathlib import Path

from ..core.errors import ProgramError
from ..graph.build import build_ssa_graph
from ..core.place import CUDAPlace, cpu_places, cuda_places, parse_places
from ..program.defaults import loss_var
from ..program.io import load_program
from ..core.progress import Progress
from ..core.strategy import BuildStrategy

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPT", "DEFAULT_STATIC_PLACES",
           "UsageError", "Formatter", "common_options", "graph_options", "select_options",
           "positive", "load_program_file", "split_names", "fetch_list", "places_from",
           "build_strategy", "graph_of", "selected", "write_output", "ProgressBar"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPT = 0, 1, 2, 130
DEFAULT_STATIC_PLACES = "2"
SECTIONS_HELP = "forward, backward, optimize, comm, fetch (comma-separated)"


class UsageError(Exception):
    """A bad argument value found after parsing (exit status 2)."""


# --- options -------------------------------------------------------------------------------

class Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


def common_options(debug_default):
    """A parent parser with the options of every command (``--debug``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--debug", action="store_true", default=debug_default,
                   help="show Python tracebacks on errors")
    return p


def graph_options(places_default):
    """A parent parser with the options that shape the SSA graph (dump, viz, stats)."""
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
    zero_options(p.add_argument_group("ZeRO"))
    return p


def zero_options(group, stage_help="ZeRO stage: shard the optimizer state (1), the "
                 "gradients too (2), the parameters too (3) over every place of every "
                 "process (BuildStrategy.zero_stage; default: 0)"):
    """Add the ZeRO options to ``group`` (graph commands, run/execute, simulate): one set,
    read back by ``zero_settings``."""
    group.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                       metavar="STAGE", help=stage_help)
    group.add_argument("--zero-prefetch", type=int, default=1, metavar="K",
                       help="stage 3: layers gathered ahead of compute "
                            "(BuildStrategy.zero_prefetch; default: 1)")
    group.add_argument("--zero-gather-dtype", choices=("bf16", "fp16"), default=None,
                       help="stage 3: gather parameters in this type (half the bytes)")
    group.add_argument("--no-reshard-after-forward", "--keep-after-forward", dest="reshard",
                       action="store_false",
                       help="stage 3: keep parameters gathered from forward to backward "
                            "(reshard_after_forward=False)")


def zero_settings(args):
    """The ``BuildStrategy`` settings of ``zero_options`` ({} without ``--zero``); a
    negative ``--zero-prefetch`` is a ``UsageError``."""
    if getattr(args, "zero", None) is None:
        return {}
    if args.zero_prefetch < 0:
        raise UsageError(f"--zero-prefetch must be >= 0, got {args.zero_prefetch}")
    return {"zero_stage": args.zero, "zero_prefetch": args.zero_prefetch,
            "zero_gather_dtype": args.zero_gather_dtype, "reshard_after_forward": args.reshard}


def select_options(parser, collapse=True):
    """Add the options that pick the op handles to show (dump, viz)."""
    g = parser.add_argument_group("selection")
    if collapse:
        g.add_argument("--collapse", action="store_true",
                       help="show place 0's replica only (the others are copies)")
    g.add_argument("--block", "--section", dest="sections", metavar="PARTS", default=None,
                   help=f"only these parts of the step: {SECTIONS_HELP}")
    g.add_argument("--filter", dest="pattern", metavar="REGEX", default=None,
                   help="only op handles whose name, op type or var names match REGEX")


def positive(text):
    """``type=`` of an option that takes a positive integer."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


# --- programs, places, graphs --------------------------------------------------------------

def load_program_file(path, validate=True):
    """Load and validate a program; every ProgramError names the file."""
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


def split_names(text):
    return [n.strip() for n in text.split(",") if n.strip()]


def fetch_list(args, program):
    """The vars ``--fetch`` names (checked), or the loss by default."""
    if args.fetch is None:
        loss = loss_var(program)
        return [loss] if loss else []
    names = split_names(args.fetch)
    block = program.global_block()
    for n in names:
        if block.find_var(n) is None:
            raise UsageError(f"--fetch {n!r}: no such var in {args.program}")
    return names


def places_from(spec, need_devices):
    """Parse ``--places``; static commands accept CUDA places without a GPU (labels only)."""
    import torch
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
    device_type, _, rest = spec.partition(":")
    if device_type == "cuda" and rest and not cuda and not need_devices:
        try:
            return [CUDAPlace(i, int(d)) for i, d in enumerate(rest.split(","))]
        except ValueError:
            raise UsageError(f"bad --places {spec!r}: use cuda:0,1 (device ids)") from None
    if device_type == "cpu" and rest == "0":
        raise UsageError("--places cpu:0: need at least one place (cpu:N is N places)")
    out = parse_places(spec)
    if need_devices and cuda:
        count = torch.cuda.device_count()
        for p in out:
            if p.is_cuda and p.device_index >= count:
                raise UsageError(f"--places {spec}: no CUDA device {p.device_index} (torch sees "
                                 f"{count})")
    return out


def build_strategy(args, **more):
    """The ``BuildStrategy`` of the graph options (plus ``more`` of a running command)."""
    return BuildStrategy(reduce_strategy=args.reduce_strategy,
                         gradient_scale_strategy=args.gradient_scale,
                         **dict(zero_settings(args), **more))


def graph_of(args, compiler=None, **more):
    """The linted SSA graph of ``args.program`` as the graph options shape it, built as
    a runner under ``ExecutionStrategy(compiler=compiler)`` builds it (the compiler can
    change the bucketing default: ``BuildStrategy.for_compiler``); ``more``: further
    ``BuildStrategy`` settings of the command (``stats --zero``)."""
    program = load_program_file(args.program)
    graph = build_ssa_graph(program, places_from(args.places, need_devices=False),
                            build_strategy(args, **more).for_compiler(compiler),
                            fetch_list(args, program))
    graph.lint()
    return graph


def selected(args, graph):
    """The op handles the selection options pick, in id order."""
    from ..graph.draw import select_ops
    sections = split_names(args.sections) if args.sections else None
    return select_ops(graph, collapse=getattr(args, "collapse", False), sections=sections,
                      pattern=args.pattern)


# --- output --------------------------------------------------------------------------------

def write_output(path, text):
    """Write ``text`` to ``path``, or to stdout for None or ``-``."""
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot write: {e.strerror or e}") from None


def ProgressBar(total, stream=None, enabled=True, width=28):  # noqa: N802 - a class to callers
    """The CLI's progress bar: a ``Progress`` on a terminal only, erased by ``clear()``."""
    return Progress(total, stream=stream, enabled=enabled, plain=False, width=width, fill=".",
                    timer=False)


def load_startup_file(path, program_path):
    """A startup file; a Paddle parameter file is decoded against the program being run
    (``frontends.paddle.params_startup``), never a file of the same stem beside it."""
    from ..frontends.paddle import PARAMS_SUFFIX, params_startup
    if str(path).lower().endswith(PARAMS_SUFFIX):
        return params_startup(path, program_path)
    return load_program_file(path)
