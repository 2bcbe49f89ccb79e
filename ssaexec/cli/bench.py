"""``ssaexec bench``: the benchmark harness (``ssaexec.harness``) as a subcommand.

The harness owns its options and its output; this module only plugs them in
and turns a failed run into exit status 1.
"""

from .common import EXIT_FAILURE, EXIT_OK

__all__ = ["register"]

EPILOG = """\
Trains a model on synthetic images in every mode (seq, ssaexec on 1..N places,
torch-eager, torch-ddp) with the same weights and data, and reports images/sec,
speedup, scaling efficiency and peak memory; writes JSON and a PNG plot.

examples:
  ssaexec bench --quick
  ssaexec bench --model resnet18 --places cpu:2
  ssaexec bench --model resnet50 --image-size 224 --places cuda
  ssaexec bench --model transformer     # imported with from_torch, 1 torch thread
"""


def register(add):
    """Add the ``bench`` subcommand through ``add(name, help, epilog, parents)``."""
    from ..harness import add_arguments
    p = add("bench", "measure images/sec and scaling against PyTorch eager and DDP", EPILOG)
    add_arguments(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args):
    from ..harness import run
    result = run(args)
    return EXIT_FAILURE if any(r["error"] is not None for r in result["runs"]) else EXIT_OK
