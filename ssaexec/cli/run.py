"""``ssaexec run``: train a program for some steps and report loss and images/sec.

Setup (loss, initial values, feeds, executor) is ``ssaexec.cli.execute``. Each
step prints its loss and time; the throughput excludes step 1, which builds the
graph and warms the kernels, whenever there is more than one step.

``--save`` is checked before the first step, so training is never lost to a save
that was bound to fail at the end: the folder must exist and take a new file (one is
made and removed: a read-only folder or ``/proc`` is refused), and the path must not be
a folder, a FIFO, a socket or a device (the save's rename would replace it); a ``.pdiparams`` file must hold every persistable var of the Paddle program
(Paddle loads it record by record, so a file missing one would not load), so when
ssaexec has no value for one of them (a persistable of a sub-block, which ssaexec
does not run) the run is refused before training, naming the vars, with a checkpoint
(``--save X.safetensors``) as the way to keep the trained values. The file itself
is written atomically (``safe_files``): a failed save leaves the old file as it was,
and is one clean error line naming ``--save`` (exit 2), never an internal error.
Under ``--zero`` the checkpoint is sharded: PATH is rank 0's file and every other
rank's is written beside it (``state.sharded``); ``--resume`` reads either kind.

``--export-dcp DIR`` writes the trained model's state as a ``torch.distributed.checkpoint``
folder after the last step (``state.dcp``: the var names are the keys), checked before
the first step too: DIR must be absent, empty, or an earlier export (it is replaced).
"""

import os
import tempfile
import time

from ..core.safe_files import replace_problem
from .common import EXIT_OK, ProgressBar, UsageError
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
  ssaexec run examples/mnist_mlp.json --steps 5 --export-dcp run.dcp
"""


def register(add):
    """Add the ``run`` subcommand through ``add(name, help, epilog, parents)``."""
    p = add("run", "train a program on synthetic (or file) feeds", EPILOG)
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    execution_options(p, steps_default=10)
    p.add_argument("--save", metavar="PATH", default=None,
                   help="write a checkpoint (safetensors) after the last step; a PATH "
                        "ending in .pdiparams writes a Paddle program's parameters in "
                        "Paddle's format instead (Paddle loads it with the program file). "
                        "Checked before the first step: a save that cannot be written "
                        "(no such folder, a .pdiparams with vars ssaexec has no value "
                        "for) is refused before any training")
    p.add_argument("--resume", metavar="PATH", default=None,
                   help="start from a checkpoint written by --save (or se.save_checkpoint)")
    p.add_argument("--export-dcp", metavar="DIR", default=None,
                   help="write the trained model's state (parameters and buffers, by var "
                        "name) as a torch.distributed.checkpoint folder after the last step; "
                        "DIR must be absent, empty or an earlier export (checked before "
                        "training)")
    p.set_defaults(func=cmd_run)


def _export_plan(args, s):
    """Check ``--export-dcp`` before the first step; the export to run after the last."""
    if not args.export_dcp:
        return None
    from ..core.errors import SSAExecError
    from ..state.dcp import check_directory, export_dcp
    try:
        check_directory(args.export_dcp)
    except SSAExecError as e:
        raise UsageError(f"--export-dcp {e} (nothing was trained)") from None
    return lambda: export_dcp(s.pe, args.export_dcp)


def _save_plan(args, s):
    """Check ``--save`` before the first step (the module docstring); return the
    function that writes it after the last step, or None without ``--save``."""
    if not args.save:
        return None
    path = str(args.save)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--save {path}: the folder {folder} does not exist (nothing was "
                         "trained)")
    if os.path.isdir(path) and not os.path.islink(path):
        raise UsageError(f"--save {path}: is a folder, not a file (nothing was trained)")
    kind = replace_problem(path)
    if kind is not None:  # the save's rename would replace it (safe_files.replace_problem)
        raise UsageError(f"--save {path}: is {kind}, not a file (nothing was trained)")
    try:  # the save writes a temporary file there first: make one now, as it will
        fd, tmp = tempfile.mkstemp(prefix=".ssaexec-save-check-", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:  # read-only, no permission, /proc ...
        raise UsageError(f"--save {path}: cannot write a file in {folder} "
                         f"({e.strerror or e}; nothing was trained)") from None
    scope = s.pe.local_scopes[0]
    written = {n for op in s.pe.run_program.global_block().ops for n in op.output_names()}

    def lacking(names):  # no value now, and no op of the step will write one
        return [n for n in names if scope.find_var(n) is None and n not in written]
    if path.lower().endswith(".pdiparams"):
        from ..frontends.paddle import read_program, save_params
        pp = read_program(args.program)
        names = pp.persistable_names()
        missing = lacking(names)
        if missing:
            block = {}
            for b in reversed(pp.blocks):
                block.update((n, b.idx) for n in b.vars)
            shown = ", ".join(f"{n!r} (block {block.get(n, '?')})" for n in missing[:8])
            raise UsageError(
                f"--save {path}: Paddle's parameter file holds every persistable var of "
                f"{args.program}, and ssaexec has no value for {len(missing)} of them: "
                f"{shown}{' ...' if len(missing) > 8 else ''} (the import keeps the values of "
                "block 0's persistables only), so it cannot write a file Paddle would load. "
                "Nothing was trained; save a checkpoint instead (--save RUN.safetensors "
                "keeps every value the run trains)")
        return lambda: save_params(path, s.pe, names)
    from ..state.checkpoint import save_checkpoint
    params = [v.name for v in s.pe.run_program.global_block().vars.values()
              if v.persistable and v.is_parameter]
    missing = lacking(params)
    if missing:
        raise UsageError(f"--save {path}: parameters {', '.join(map(repr, missing[:8]))} have "
                         "no value and no op writes one: nothing to save (nothing was trained)")
    return lambda: save_checkpoint(path, s.pe)


def cmd_run(args):
    s = setup(args)
    try:
        save = _save_plan(args, s)
        export = _export_plan(args, s)
    except BaseException:
        s.pe.close()
        raise
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
        if save is not None:
            try:
                save()
            except OSError as e:  # the disk filled, the folder went away: say which save
                raise UsageError(f"--save {args.save}: cannot be written after "
                                 f"{args.steps} steps ({e.strerror or e}); nothing was "
                                 "saved") from e
        if export is not None:
            try:
                export()
            except OSError as e:
                raise UsageError(f"--export-dcp {args.export_dcp}: cannot be written after "
                                 f"{args.steps} steps ({e.strerror or e})") from e
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
    if args.export_dcp:
        print(f"torch.distributed.checkpoint export: {args.export_dcp}")
    return EXIT_OK
