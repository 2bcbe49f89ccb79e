"""One process of ``ssaexec launch``: ``python -m ssaexec.cli.launch_worker PROGRAM ...``.

It reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), transpiles PROGRAM exactly as every other process does, joins
the gloo process group and runs its role (``ssaexec.execution.pserver``): a trainer trains on
its share of one fixed synthetic batch and prints each step's loss; a server serves
until every trainer is done. Exit status 0, or 1 with one ``error:`` line.
"""

import argparse
import sys

from ..core.errors import SSAExecError
from ..ops.parallel_do import split_sizes
from .common import UsageError, positive
from .distribute import check_world, load_and_transpile, transpile_args

__all__ = ["main"]


def _share(feed, trainer, trainers):
    """Trainer ``trainer``'s rows of every batched feed (the places' split)."""
    out = {}
    for name, t in feed.items():
        if t.dim() == 0:
            out[name] = t
            continue
        sizes = split_sizes(t.shape[0], trainers)
        start = sum(sizes[:trainer])
        out[name] = t[start:start + sizes[trainer]]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ssaexec.cli.launch_worker",
                                description=__doc__.splitlines()[0])
    p.add_argument("program")
    transpile_args(p)
    p.add_argument("--steps", type=positive, default=10)
    p.add_argument("--batch", type=positive, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    from ..dist import world as distributed
    from ..program.defaults import loss_var
    from ..execution.pserver import run_role
    from ..data.synthetic import synthetic_feed
    try:
        program, programs = load_and_transpile(args)
        check_world(programs)
        distributed.init(backend="gloo", timeout=args.timeout)
        rank = distributed.rank()
        role, i = programs.role(rank)
        if role == "trainer":
            loss = loss_var(program)
            batch = synthetic_feed(program, args.batch, seed=args.seed)
            feed = _share(batch, i, programs.trainers)

            def on_step(k, values):
                print(f"step {k + 1}: loss {float(values[0].float().mean()):.6f}", flush=True)

            run_role(programs, rank, [feed] * args.steps, [loss] if loss else [],
                     on_step=on_step if loss else None)
            print(f"trainer {i}: {args.steps} steps done", flush=True)
        else:
            run_role(programs, rank)
            held = ", ".join(n for n, _ in programs.placement[i]) or "nothing"
            print(f"pserver {i}: every trainer is done; held {held}", flush=True)
    except (SSAExecError, UsageError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
