"""What ``ssaexec run`` and ``ssaexec trace`` share: options, feeds, initial values, the executor.

Policy:

* the loss is ``--loss``, else the var whose gradient the program seeds;
* initial values come from the startup program (``--startup``, else the one stored
  next to the program file) plus documented defaults for whatever it leaves unset
  (``ssaexec.program.defaults``), so any program file runs;
* feeds are one fixed synthetic batch (``ssaexec.data.synthetic.synthetic_feed``, seeded),
  or consecutive slices of the arrays of an ``--feed`` ``.npz`` file, each checked
  against its data var (name, dtype, shape, limits) before it is decompressed
  (``ssaexec.data.feed_file``); every place needs at least one sample;
* a header says where every one of those choices came from, before the first step;
  each step prints one line, with the progress bar erased around it.
"""

import math
import sys
from collections import namedtuple

from ..core.errors import FeedError
from ..data.feed_file import read_feed_file
from ..execution.parallel_executor import ParallelExecutor
from ..program.defaults import loss_var, startup_for
from ..runtime.scope import Scope
from ..core.strategy import DEFAULT_COMPILER, ExecutionStrategy
from ..data.synthetic import synthetic_feed
from .common import (UsageError, build_strategy, load_program_file, load_startup_file,
                     places_from, positive, zero_options)

__all__ = ["COMPILER_CHOICES", "compiler_of", "execution_options", "Setup", "setup",
           "print_header", "print_step", "throughput"]

Setup = namedtuple("Setup", "pe main loss feed_of batch notes")


# --compiler: ExecutionStrategy's compilers ("none": compiler=None); "default" leaves the
# choice to ExecutionStrategy (DEFAULT_COMPILER, or SSAEXEC_COMPILER where set)
COMPILER_CHOICES = ("default", "auto", "inductor", "none")


def compiler_of(args):
    """``ExecutionStrategy``'s ``compiler`` for ``--compiler`` (``"none"``: None)."""
    compiler = getattr(args, "compiler", "default")
    return None if compiler == "none" else compiler


def execution_options(parser, steps_default, compiler_default="default"):
    """Add the options of the commands that run a program (run, trace)."""
    g = parser.add_argument_group("execution")
    g.add_argument("--places", "-p", default=None, metavar="SPEC",
                   help="cpu:N, cuda:0,1, cuda or N; default: every GPU, or cpu:2 without one")
    g.add_argument("--steps", type=positive, default=steps_default,
                   help="steps to run (default: %(default)s)")
    g.add_argument("--batch", "-b", type=positive, default=None,
                   help="global batch size, split over the places (default: 32, or the whole "
                        "--feed file)")
    g.add_argument("--threads", "-t", type=positive, default=None,
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
    g.add_argument("--finetune", metavar="LOSS[:OUTPUT]", default=None,
                   help="train an inference program (an imported Paddle model): attach a "
                        "'label' feed and the loss cross_entropy or mse on OUTPUT (default: "
                        "the one output nothing reads), SGD at --lr")
    g.add_argument("--classes", type=positive, default=None,
                   help="label range for synthetic int labels (default: from the program)")
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: 0)")
    g.add_argument("--reduce-strategy", choices=("all_reduce", "reduce"), default="all_reduce",
                   help="all_reduce or reduce + broadcast (default: %(default)s)")
    g.add_argument("--gradient-scale", choices=("coeff_num_device", "one", "customized"),
                   default="coeff_num_device", help="seed of loss@GRAD (default: %(default)s)")
    g.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="mixed precision (docs/strategies.md); works on CPU places too")
    g.add_argument("--cuda-graph", action="store_true",
                   help="capture the step as a CUDA graph after 2 warm-up steps (CUDA places "
                        "on one GPU)")
    default_says = (f"ExecutionStrategy's, {DEFAULT_COMPILER or 'none'}"
                    if compiler_default == "default" else compiler_default)
    g.add_argument("--compiler", choices=COMPILER_CHOICES, default=compiler_default,
                   help="auto: run at once, compile each segment with Inductor in the "
                        "background, switch at a step boundary; inductor: compile first "
                        "(blocking); none: the straight-line path only; default: "
                        "ExecutionStrategy's. A segment Inductor cannot compile runs as "
                        f"usual, with one line saying why (default: {default_says}; "
                        "docs/strategies.md)")
    g.add_argument("--accumulate", type=positive, default=1, metavar="K",
                   help="gradient accumulation: update every K steps (default: 1)")
    g.add_argument("--allreduce-dtype", choices=("bf16", "fp16"), default=None,
                   help="compress gradients to this type for the all-reduce")
    zero_options(g)
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _startup(args, main):
    """(startup program, a note saying where the initial values come from)."""
    if args.startup and args.no_startup:
        raise UsageError("--startup and --no-startup contradict each other")
    prog, path, added = startup_for(main, args.program, args.startup or None,
                                    search=not args.no_startup, learning_rate=args.lr,
                                    load=lambda p: load_startup_file(p, args.program))
    if path is None:
        how = f"defaults for {len(added)} persistable vars (no startup program; see docs/cli.md)"
    else:
        how = str(path) + (f" (+ defaults for {len(added)} vars it leaves unset)" if added
                           else "")
    return prog, how


class _Finetuned:
    __slots__ = ("main", "startup", "fetch", "note")

    def __init__(self, main, startup, fetch, note):
        self.main, self.startup, self.fetch, self.note = main, startup, fetch, note


def _finetune(args, main):
    """An inference program with a label, a loss and SGD attached (``--finetune``)."""
    from ..core.errors import ProgramError
    from ..frontends.paddle import PaddleModel, finetune
    from ..program.optimizer import SGD
    kind, _, output = args.finetune.partition(":")
    if not output:
        block = main.global_block()
        read = {n for op in block.ops for n in op.input_names()}
        outs = [n for op in block.ops for n in op.output_names()
                if n not in read and not block.var(n).persistable]
        if len(outs) != 1:
            raise UsageError(f"--finetune {args.finetune}: say which output the loss reads "
                             f"(LOSS:OUTPUT); candidates: {', '.join(outs) or 'none'}")
        output = outs[0]
    startup, how = _startup(args, main)
    try:
        ft = finetune(PaddleModel(main, startup, [], [output]), loss=kind,
                      optimizer=SGD(args.lr))
    except ProgramError as e:
        raise UsageError(f"--finetune {args.finetune}: {e}") from None
    return _Finetuned(ft.main, ft.startup, ft.fetch,
                      f"{how}; fine-tuning {output} with {kind} against 'label', SGD {args.lr}")


def _file_feeds(path, batch, program):
    """(feed_of(step), rows per step, description) from an .npz file.

    The file is checked against ``program``'s data vars before any array is
    decompressed (``ssaexec.data.feed_file``).
    """
    arrays = read_feed_file(path, program)
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


def setup(args):
    """The ``Setup`` (executor, program, loss, feeds, batch, notes) of run and trace."""
    main = load_program_file(args.program)
    finetuned = None
    if getattr(args, "finetune", None):
        if args.loss:
            raise UsageError("--finetune makes the loss; leave out --loss")
        finetuned = _finetune(args, main)
        main = finetuned.main
    loss = finetuned.fetch[0] if finetuned else args.loss or loss_var(main)
    if loss is None:
        raise UsageError(f"{args.program}: cannot tell the loss var (no op has role 'loss'; "
                         "was the program built with optimizer.minimize?); pass --loss VAR, "
                         "or --finetune cross_entropy to train an inference program")
    if main.global_block().find_var(loss) is None:
        raise UsageError(f"--loss {loss!r}: no such var in {args.program}")
    places = places_from(args.places, need_devices=True)
    if finetuned:
        startup, init_note = finetuned.startup, finetuned.note
    else:
        startup, init_note = _startup(args, main)
    if args.feed:
        feed_of, batch, feed_note = _file_feeds(args.feed, args.batch, main)
    else:
        batch = args.batch or 32
        feed = synthetic_feed(main, batch, args.seed, args.classes)
        feed_of = lambda k: feed  # noqa: E731 - one fixed batch, see the run epilog
        feed_note = f"synthetic, one fixed batch (seed {args.seed})"
    if batch < len(places):
        raise FeedError(f"batch {batch} is smaller than the {len(places)} places: every place "
                        "needs at least one sample (raise --batch)")
    strategy = build_strategy(args, gradient_accumulation_steps=args.accumulate,
                              allreduce_dtype=args.allreduce_dtype)
    pe = ParallelExecutor(places=places, main_program=main, startup_program=startup,
                          loss_name=loss, build_strategy=strategy,
                          exec_strategy=ExecutionStrategy(num_threads=args.threads,
                                                          amp=args.amp,
                                                          cuda_graph=args.cuda_graph,
                                                          compiler=compiler_of(args)),
                          scope=Scope())
    resume = getattr(args, "resume", None)
    if resume:
        from ..state.checkpoint import load_checkpoint
        try:
            load_checkpoint(resume, pe)
        except BaseException:
            pe.close()
            raise
        init_note = f"{resume} (checkpoint after {pe.runs} runs)"
    notes = {"places": ", ".join(str(p) for p in places), "threads": pe.num_threads,
             "init": init_note, "feed": feed_note, "collective": pe.collective_backend}
    return Setup(pe, main, loss, feed_of, batch, notes)


def print_header(args, s):
    """Where the places, threads, batch, loss, initial values and feeds come from."""
    print(f"ssaexec {args.command}: {args.program}")
    print(f"  places {s.notes['places']} | {s.notes['threads']} threads | batch {s.batch} | "
          f"{args.steps} steps | loss {s.loss}")
    print(f"  parameters: {s.notes['init']}")
    print(f"  feed: {s.notes['feed']}")
    print(f"  {s.notes['collective']}")
    st = s.pe.exec_strategy
    print(f"  compiler: {_COMPILER_SAYS[st.compiler if st.compiled else 'readable']}")
    sys.stdout.flush()


# the header's compiler line: what the steps run on
_COMPILER_SAYS = {
    "auto": "auto (tiered: the straight-line path at once, Inductor's graphs compiled in "
            "the background and switched to between steps)",
    "inductor": "inductor (each segment compiled before its first step)",
    None: "none (the straight-line path)",
    "readable": "none (the readable per-op path)",
}


def print_step(bar, k, steps, loss, seconds, tag="", status=""):
    """One line for step ``k`` (the bar erased first), then the bar one step further."""
    bar.clear()
    print(f"step {k:>4}/{steps}  loss {loss:.6f}  {seconds * 1e3:8.1f} ms{tag}", flush=True)
    bar.update(1, status)


def throughput(times, batch):
    """(images/sec, seconds, which steps): step 1 (warm-up) left out when there are more."""
    timed = times[1:] if len(times) > 1 else times
    total = sum(timed)
    rate = batch * len(timed) / total if total > 0 else math.inf
    which = f"steps 2-{len(times)}" if len(times) > 1 else "step 1"
    return rate, total, which
