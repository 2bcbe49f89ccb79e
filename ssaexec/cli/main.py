"""The ``ssaexec`` command: its parser, and the mapping of errors to exit statuses.

Each subcommand lives in its own module (``dump``, ``viz``, ``stats``, ``run``,
``trace``, ``convert``, ``bench``, ``simulate``; ``distribute`` adds ``transpile`` and
``launch``) and adds itself to the parser with
``register(add)``; ``main`` parses, calls the subcommand's function and turns
what it raises into an exit status:

* 0 on success (also when the reader of stdout goes away: ``ssaexec dump | head``);
* 2 for a usage error, a missing or unreadable file, a syntax error, an invalid
  program or bad feeds/places, with one line ``ssaexec: error: ...`` naming the
  file and location;
* 1 when an op fails while running, or for a bug (``--debug`` shows tracebacks);
* 130 on Ctrl-C.
"""

import argparse
import os
import sys

from . import bench, convert, distribute, dump, run, simulate, stats, trace, viz
from .common import (EXIT_FAILURE, EXIT_INTERRUPT, EXIT_OK, EXIT_USAGE, Formatter, UsageError,
                     common_options)

__all__ = ["main", "build_parser"]

# in the order --help lists them
COMMANDS = (dump, viz, stats, run, trace, convert, bench, simulate, distribute)

EPILOG = """\
examples:
  ssaexec dump examples/seed_mlp.json --places cpu:2
  ssaexec viz examples/seed_mlp.json -o seed_mlp.svg --places cpu:2
  ssaexec stats examples/small_resnet.json --places 4
  ssaexec run examples/mnist_mlp.json --places cpu:2 --steps 20 --batch 64
  ssaexec trace examples/small_resnet.json -o trace.json --steps 3
  ssaexec convert examples/seed_mlp.json seed_mlp.ssa
  ssaexec simulate examples/small_resnet.json --gpus 1,8,64 --cluster dgx-h100
  ssaexec transpile examples/uci_housing_pserver.json --trainers 2 --pservers 2 -o dist
  ssaexec launch --trainers 2 --pservers 2 examples/uci_housing_pserver.json --steps 5

Program files: .json (JSON form) or .ssa/.txt/.prog (text form). run and trace
take initial values from STEM.startup.EXT next to the program when it exists.
Exit status: 0 ok, 1 an op failed at run time, 2 bad usage, file or program.
"""


def build_parser():
    """The ``argparse`` parser of ``ssaexec``."""
    from .. import __version__
    parser = argparse.ArgumentParser(
        prog="ssaexec", formatter_class=Formatter, parents=[common_options(False)],
        description="Inspect, draw, run and trace ssaexec programs as multi-place SSA graphs.",
        epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"ssaexec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common = common_options(argparse.SUPPRESS)

    def add(name, help, epilog, parents=()):
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              epilog=epilog, formatter_class=Formatter,
                              parents=[common, *parents])

    for command in COMMANDS:
        command.register(add)
    return parser


def _one_line(exc):
    # One line per error, whatever it quotes (a torch message, a crafted file's text):
    # scripts read the last line of stderr, and a file must not forge extra lines.
    parts = [p.strip() for p in str(exc).splitlines() if p.strip()]
    return "; ".join(parts).encode("utf-8", "backslashreplace").decode("utf-8")


def _traceback(debug):
    if debug:
        import traceback
        traceback.print_exc()


def main(argv=None):
    """Run the ``ssaexec`` command line; return the exit status."""
    from ..core.errors import OpError, SSAExecError
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        _traceback(debug)
        print("ssaexec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPT
    except BrokenPipeError:
        # the reader went away (ssaexec dump ... | head): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (UsageError, OpError, SSAExecError) as e:
        _traceback(debug)
        status = EXIT_FAILURE if isinstance(e, OpError) else EXIT_USAGE
        print(f"ssaexec: error: {_one_line(e)}", file=sys.stderr)
        return status
    except Exception as e:  # a bug in ssaexec: say so, traceback only on request
        _traceback(debug)
        print(f"ssaexec: internal error: {type(e).__name__}: {e} (run with --debug for the "
              "traceback, and please report it)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
