"""``ssaexec run``: train a program for some steps and report loss and images/sec.

Setup (loss, initial values, feeds, executor) is ``ssaexec.cli.execute``. Each
step prints its loss and time; the throughput excludes step 1, which builds the
graph and warms the kernels, whenever there is more than one step.
"""

import time

from .common import EXIT_OK, ProgressBar
from .execute import execution_options, print_header, print_step, setup, throughput

__all__ = ["register"]

EPILOG = """\
Synthetic feeds (the default) are one fixed batch made from the data vars'
shapes and dtypes, reused every step: floats ~ N(0, 1), integer labels uniform
in [0, classes) with classes read from the loss op. The loss falls as the model
fits the batch; the point is measuring the executor. images/sec excludes step 1
(warm-up) when there is more than one step.

examples:
  ssaexec run examples/mnist_mlp.json --places cpu:2 --steps 20
  ssaexec run examples/small_resnet.json --places cuda:0,1 --batch 128 --steps 50
  ssaexec run examples/uci_housing.json --feed housing.npz --batch 32 --steps 100
  ssaexec run examples/mnist_mlp.json --steps 5 --save run.safetensors
  ssaexec run examples/mnist_mlp.json --steps 5 --resume run.safetensors --amp bf16
"""


def register(add):
    """Add the ``run`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("run", "train a program on synthetic (or file) feeds", EPILOG)
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    execution_options(p, steps_default=10)
    p.add_argument("--save", metavar="PATH", default=None,
                   help="write a checkpoint (safetensors) after the last step; a PATH "
                        "ending in .pdiparams writes a Paddle program's parameters in "
                        "Paddle's format instead (Paddle loads it with the program file)")
    p.add_argument("--resume", metavar="PATH", default=None,
                   help="start from a checkpoint written by --save (or se.save_checkpoint)")
    p.set_defaults(func=cmd_run)


def cmd_run(args):
    s = setup(args)
    print_header(args, s)
    bar = ProgressBar(args.steps, enabled=not args.no_progress)
    times, losses = [], []
    try:
        for k in range(args.steps):
            t0 = time.perf_counter()
            value, = s.pe.run(fetch_list=[s.loss], feed=s.feed_of(k))
            dt = time.perf_counter() - t0
            times.append(dt)
            v = float(value.float().mean())
            losses.append(v)
            print_step(bar, k + 1, args.steps, v, dt,
                       status=f"loss {v:.4f}  {s.batch / dt:,.0f} img/s")
        if args.save and str(args.save).lower().endswith(".pdiparams"):
            # Paddle's parameter file of the program's own parameters (a Paddle import)
            from ..frontends.paddle import persistable_names, save_params
            save_params(args.save, s.pe, persistable_names(args.program))
        elif args.save:
            from ..checkpoint import save_checkpoint
            save_checkpoint(args.save, s.pe)
    finally:
        bar.close()
        s.pe.close()
    rate, total, which = throughput(times, s.batch)
    change = f"; loss {losses[0]:.6f} -> {losses[-1]:.6f}" if len(losses) > 1 else ""
    print(f"throughput: {rate:,.1f} images/sec ({which}, {total:.3f} s, batch {s.batch}){change}")
    if args.save:
        kind = "Paddle parameters" if str(args.save).lower().endswith(".pdiparams") else \
            "checkpoint"
        print(f"{kind}: {args.save}")
    return EXIT_OK
