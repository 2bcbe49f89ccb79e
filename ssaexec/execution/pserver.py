"""Run one process of a transpiled program: a trainer or a parameter server.

``se.transpile`` (``program.distribute``) makes the programs; every process of the
run (``ssaexec launch``, torchrun, or a test's subprocesses) calls
``se.distributed.init()`` and then ``run_trainer`` or ``run_pserver`` with the
same ``DistributedPrograms``, which tell each rank its role:

* a trainer runs its startup program, then one step of the trainer program per
  feed (forward, backward, ``send`` of its gradient pieces, ``recv`` of the updated
  parameters), and finally ``trainer_exit``, which tells every server it is done;
* a server runs its startup program and then its program once: the
  ``listen_and_serv`` op serves the trainers until each has said it is done.

Both run the programs with the sequential ``Executor``; an error (a peer reported
dead by an op's timeout) propagates as ``DistributedError``.
"""

from ..core.errors import SSAExecError
from .executor import Executor
from ..runtime.scope import Scope

__all__ = ["run_trainer", "run_pserver", "run_role"]


def run_trainer(programs, trainer_id, feeds, fetch_list=(), scope=None, place=None,
                on_step=None):
    """Train on ``feeds`` (an iterable of feed dicts, this trainer's share of each batch).

    Returns
    -------
    (Scope, list)
        The trainer's scope (parameters as the servers last sent them) and the fetched
        values of every step.
    """
    role, _ = programs.role(trainer_id)
    if role != "trainer":
        raise SSAExecError(f"rank {trainer_id} is a {role}, not a trainer")
    scope = scope if scope is not None else Scope()
    exe = Executor(place)
    exe.run(programs.trainer_startup, scope=scope)
    fetched = []
    # A failed step raises at once: the servers, waiting for this trainer, report it
    # when their timeout runs out (telling them here could wait as long, on a server
    # that is itself stuck sending to this trainer).
    for k, feed in enumerate(feeds):
        values = exe.run(programs.trainer, feed=feed, fetch_list=list(fetch_list),
                         scope=scope)
        fetched.append(values)
        if on_step is not None:
            on_step(k, values)
    exe.run(programs.trainer_exit, scope=scope)
    return scope, fetched


def run_pserver(programs, server_id, scope=None, place=None):
    """Serve the trainers until they are done; return the server's scope (its pieces)."""
    scope = scope if scope is not None else Scope()
    exe = Executor(place)
    exe.run(programs.pserver_startups[server_id], scope=scope)
    exe.run(programs.pservers[server_id], scope=scope)
    return scope


def run_role(programs, rank, feeds=None, fetch_list=(), scope=None, place=None, on_step=None):
    """``run_trainer`` or ``run_pserver``, by ``programs.role(rank)``; returns the scope."""
    role, i = programs.role(rank)
    if role == "pserver":
        return run_pserver(programs, i, scope, place)
    return run_trainer(programs, i, feeds or [], fetch_list, scope, place, on_step)[0]
