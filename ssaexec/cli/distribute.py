"""``ssaexec transpile`` and ``ssaexec launch``: parameter-server runs of a PlaceableBlock program.

``transpile`` writes the trainer's and every server's programs (``se.transpile``,
docs/blocks.md) next to each other, so ``ssaexec dump`` and ``ssaexec viz`` show each
one. ``launch`` starts ``--trainers`` + ``--pservers`` local processes the way
``torchrun`` would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free
``MASTER_PORT``), each running ``python -m ssaexec.cli.launch_worker``: every
process transpiles the same program the same way and runs its role (``ssaexec.
pserver``); trainers print their losses. Lines are prefixed with the process's role.
The launcher exits 0 when every process did; when one fails, the others get a
grace period (their own timeouts report the failure) and are then killed, and the
exit status is 1.
"""

import os
import socket
import subprocess
import sys
import threading
import time

from ..program.defaults import startup_for
from ..program.distribute import MODES, transpile
from .common import (EXIT_FAILURE, EXIT_OK, UsageError, load_program_file, load_startup_file,
                     positive)

__all__ = ["register", "transpile_args", "load_and_transpile"]

TRANSPILE_EPILOG = """\
PROGRAM must hold one PlaceableBlock (se.layers.PlaceableBlock around its optimizer).
Writes OUT/trainer.json, OUT/trainer.startup.json, OUT/trainer.exit.json,
OUT/pserverK.json, OUT/pserverK.startup.json and OUT/layout.json (ranks, placement,
the block dependency table).

examples:
  ssaexec transpile examples/uci_housing_pserver.json --trainers 2 --pservers 2 -o dist
  ssaexec dump dist/pserver0.json --places cpu:1
  ssaexec viz dist/trainer.json -o trainer.svg --places cpu:1
"""

LAUNCH_EPILOG = """\
Processes: trainers are ranks 0..T-1, servers T..T+P-1, all on 127.0.0.1 over
gloo. Trainers train --steps steps on a fixed synthetic batch (--batch samples,
split between them) and print their loss; sync mode averages the trainers'
gradients on the servers (data parallelism), async applies each as it arrives.

examples:
  ssaexec launch --trainers 2 --pservers 2 examples/uci_housing_pserver.json --steps 5
  ssaexec launch --trainers 2 --pservers 1 --mode async examples/uci_housing_pserver.json
"""


def transpile_args(p):
    """Add the options that decide the transpile (shared with the worker)."""
    g = p.add_argument_group("transpile")
    g.add_argument("--trainers", type=positive, default=2, help="trainer processes "
                   "(default: %(default)s)")
    g.add_argument("--pservers", type=positive, default=2, help="parameter-server processes "
                   "(default: %(default)s)")
    g.add_argument("--mode", choices=MODES, default="sync",
                   help="sync: a barrier per step, gradients averaged (data parallelism); "
                        "async: each trainer's gradient applied as it arrives "
                        "(default: %(default)s)")
    g.add_argument("--split-threshold", type=positive, default=8192, metavar="N",
                   help="split parameters of at least N elements across the servers "
                        "(default: %(default)s)")
    g.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long any exchange may wait for a peer (default: %(default)s)")
    g.add_argument("--startup", metavar="FILE", default=None,
                   help="startup program (default: STEM.startup.EXT next to the program)")


def load_and_transpile(args):
    """(main, DistributedPrograms) of ``args.program`` as the options say."""
    main = load_program_file(args.program)
    # a .pdiparams startup is decoded against this program, never a sibling file
    startup, _, _ = startup_for(main, args.program, args.startup,
                                load=lambda p: load_startup_file(p, args.program))
    return main, transpile(main, args.trainers, args.pservers, startup, mode=args.mode,
                           split_threshold=args.split_threshold, timeout=args.timeout)


def register(add):
    """Add ``transpile`` and ``launch`` through ``add(name, help, epilog, parents)``."""
    p = add("transpile", "split a PlaceableBlock program into trainer and parameter-server "
                         "programs", TRANSPILE_EPILOG)
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    p.add_argument("--output", "-o", metavar="DIR", required=True, help="directory to write")
    p.add_argument("--format", choices=("json", "ssa"), default="json",
                   help="file form of the programs (default: %(default)s)")
    transpile_args(p)
    p.set_defaults(func=cmd_transpile)

    p = add("launch", "start trainers and parameter servers of a PlaceableBlock program as "
                      "local processes", LAUNCH_EPILOG)
    p.add_argument("program", metavar="PROGRAM", help="program file (.json or .ssa)")
    transpile_args(p)
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive, default=10, help="steps (default: %(default)s)")
    g.add_argument("--batch", "-b", type=positive, default=32,
                   help="global batch, split between the trainers (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of the synthetic batch")
    g.add_argument("--port", type=int, default=None, help="MASTER_PORT (default: a free one)")
    g.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="after a process fails, how long the others may take to notice "
                        "(default: --timeout + 10)")
    p.set_defaults(func=cmd_launch)


def cmd_transpile(args):
    _, programs = load_and_transpile(args)
    for path in programs.save(args.output, "." + args.format):
        print(f"wrote {path}")
    for k, pieces in programs.placement.items():
        held = ", ".join(n if rows is None else f"{n} ({rows} rows)" for n, rows in pieces)
        print(f"pserver{k} (rank {programs.trainers + k}): {held or 'nothing'}")
    return EXIT_OK


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(stream, prefix, lock):
    for line in iter(stream.readline, ""):
        with lock:
            sys.stdout.write(f"[{prefix}] {line}")
            sys.stdout.flush()
    stream.close()


def cmd_launch(args):
    _, programs = load_and_transpile(args)  # fail here, once, on a bad program
    world = programs.world_size
    port = args.port or _free_port()
    grace = args.grace if args.grace is not None else args.timeout + 10
    argv = [sys.executable, "-m", "ssaexec.cli.launch_worker", args.program,
            "--trainers", str(args.trainers), "--pservers", str(args.pservers),
            "--mode", args.mode, "--split-threshold", str(args.split_threshold),
            "--timeout", str(args.timeout), "--steps", str(args.steps),
            "--batch", str(args.batch), "--seed", str(args.seed)]
    if args.startup:
        argv += ["--startup", args.startup]
    if args.debug:
        argv.append("--debug")
    procs, pumps, lock = [], [], threading.Lock()
    print(f"launching {args.trainers} trainers and {args.pservers} parameter servers "
          f"({args.mode}) on 127.0.0.1:{port}", flush=True)
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        kind, i = programs.role(rank)
        t = threading.Thread(target=_pump, args=(proc.stdout, f"{kind}{i}", lock), daemon=True)
        t.start()
        procs.append(proc)
        pumps.append(t)
    failed_at = None
    try:
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > grace:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait()
        for t in pumps:
            t.join(5)
    codes = [p.returncode for p in procs]
    bad = [f"{'%s%d' % programs.role(r)} (exit {c})" for r, c in enumerate(codes) if c != 0]
    if bad:
        print(f"ssaexec launch: failed: {', '.join(bad)}", file=sys.stderr)
        return EXIT_FAILURE
    print("all processes finished", flush=True)
    return EXIT_OK


def check_world(programs):
    """``UsageError`` unless torchrun's ``WORLD_SIZE`` matches the layout."""
    world = int(os.environ.get("WORLD_SIZE", "0") or 0)
    if world != programs.world_size:
        raise UsageError(f"WORLD_SIZE is {world}, but {programs.trainers} trainers and "
                         f"{len(programs.pservers)} servers make {programs.world_size} "
                         "processes")
