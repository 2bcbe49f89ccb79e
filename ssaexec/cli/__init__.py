"""The ``ssaexec`` command line (also ``python -m ssaexec``); ``docs/cli.md`` is the manual.

Subcommands: ``dump`` (the SSA graph as text, JSON or DOT), ``viz`` (a picture),
``stats`` (sizes, critical path, width, traffic, memory), ``run`` (train with
synthetic or file feeds), ``trace`` (a Perfetto timeline), ``convert`` (JSON <->
text form) and ``bench`` (the benchmark harness).

Modules: ``main`` (the parser and the exit statuses), one per subcommand,
``common`` (options, loading, places, output shared by them) and ``execute``
(what run and trace share: initial values, feeds, the executor). Policies that
are not about the command line live below it: which var is the loss and how
persistables are initialised in ``ssaexec.program.defaults``, synthetic feeds in
``ssaexec.data.synthetic``, the progress bar in ``ssaexec.core.progress``.

Program files hold one program. ``run`` and ``trace`` also need initial values
for the persistable vars; they come from a *startup program*: ``--startup
FILE``, else ``STEM.startup.EXT`` next to ``STEM.EXT`` (same suffix first,
then the other forms). Persistable vars the startup program does not write
get documented defaults (``default_startup``), so any program file runs.
"""

from ..program.defaults import default_startup, find_startup, loss_var
from ..data.synthetic import infer_classes, synthetic_feed
from .common import ProgressBar, UsageError
from .dump import dump_json, format_dump
from .main import build_parser, main

__all__ = ["main", "build_parser", "default_startup", "find_startup", "loss_var",
           "synthetic_feed", "infer_classes", "format_dump", "dump_json", "ProgressBar",
           "UsageError"]
