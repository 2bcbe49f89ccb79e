"""Run one sub-block on several places side by side: the engine of ``parallel_do``.

``run_places(program, idx, envs, places, keep, outer, outer_place)`` runs block
``idx`` once per place, out of order, as ``ParallelExecutor`` runs block 0:

* the block is viewed as a program of its own (``flat_program``): its ops, its
  vars and every var of its ancestors (parameters, the op's inputs), with the
  names in ``keep`` marked persistable so that the compiled runner stores their
  final value in each place's scope and never frees them;
* ``build_ssa_graph`` replicates it over ``places``: a backward op's ``role_var``
  gets one all-reduce handle spanning the places, right after the op that makes
  the gradient (the seed's "all-reduce inside parallel_do_grad", overlapping the
  rest of the backward pass), in-process through ``LocalCollective``;
* the graph is lowered once by ``CompiledRunner`` and cached per (program
  version, block, places, kept names, outer place); each run binds fresh
  per-place scopes: a place's scope holds its ``envs[k]`` (its slice of the
  inputs) and falls back to ``outer``, the scope of the op, for everything else
  (parameters are shared, never copied on CPU places);
* a ``Scheduler`` with one thread per place runs the node graph and is closed
  when the run ends, so no thread outlives the op;
* ``run_places`` is the *block runner* of control ops (``runtime.op_call``): the
  executors pass it to their runners, and an engine passes it to its own runner
  (a ``parallel_do`` nested in the sub-block). Nothing below imports this module.

The first error of any place stops the run and is raised in the caller with its
op, place and input shapes, as in ``ParallelExecutor``. An engine is used by one
run at a time (a lock); two outer places (the op inside a ``ParallelExecutor``)
get engines of their own.
"""

import copy
import threading
import weakref

from ..core.errors import ProgramError
from ..graph.build import build_ssa_graph
from ..core.limits import depth_problem
from ..program.desc import Program
from ..core.strategy import BuildStrategy
from .collective import LocalCollective
from .compiled import CompiledRunner
from .scheduler import Scheduler
from .scope import Scope

__all__ = ["run_places", "flat_program"]


class _PlaceScope(Scope):
    """One place's scope for a run: its own values, then the op's scope.

    ``depth`` counts the sub-block runs it is nested in and ``fanout`` the places
    running side by side at this level (the product over the enclosing
    ``parallel_do`` runs): the op checks both against ``ssaexec.core.limits``.
    """

    __slots__ = ("outer", "depth", "fanout")

    def __init__(self, env, outer, n_places=1):
        super().__init__()
        self.vars = env
        self.outer = outer
        self.depth = getattr(outer, "depth", 0) + 1
        self.fanout = getattr(outer, "fanout", 1) * n_places

    def find_var(self, name):
        t = self.vars.get(name)
        return t if t is not None else self.outer.find_var(name)


def flat_program(program, idx, keep=()):
    """Block ``idx`` of ``program`` as the global block of a program of its own.

    The new block 0 declares every var of ``idx`` and its ancestors (the nearest
    declaration wins) and lists block ``idx``'s ops (shared, not copied); the
    other blocks are ``program``'s, so nested sub-blocks keep their indices.
    Vars named in ``keep`` are marked persistable.
    """
    chain = []
    block = program.block(idx)
    while block is not None:
        chain.append(block)
        block = block.parent
    flat = Program(program.random_seed)
    flat.trusted = program.trusted
    top = flat.global_block()
    # through the BlockDesc API (issue 31): a copy per var, the nearest declaration last
    for b in reversed(chain):
        for v in b.vars.values():
            top.add_var(copy.copy(v))
    for name in keep:
        if name in top.vars:
            top.update_var(name, persistable=True)
    top.ops = list(program.block(idx).ops)
    flat.blocks = [top] + list(program.blocks[1:])
    return flat


class _Engine:
    __slots__ = ("runner", "places", "lock")

    def __init__(self, program, idx, places, keep):
        self.places = places
        graph = build_ssa_graph(flat_program(program, idx, keep), places, BuildStrategy())
        contexts = None
        if any(p.is_cuda for p in places):
            from .streams import DeviceContext
            contexts = [DeviceContext(p) if p.is_cuda else None for p in places]
        scopes = [Scope() for _ in places]
        self.runner = CompiledRunner(graph, scopes, LocalCollective(), None, contexts,
                                     run_places=run_places)
        self.lock = threading.Lock()

    def run(self, envs, outer, keep):
        with self.lock:
            scopes = [_PlaceScope(dict(env), outer, len(envs)) for env in envs]
            self.runner.bind_scopes(scopes)
            scheduler = Scheduler(len(self.places), name="ssaexec-parallel-do")
            self.runner.scheduler = scheduler
            try:
                self.runner.run()
            finally:
                scheduler.close()
                self.runner.scheduler = None
            return [{n: s.vars.get(n) for n in keep} for s in scopes]


# program -> {(version, block, places, keep, outer place): _Engine}
_ENGINES = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


def run_places(program, idx, envs, places, keep, outer, outer_place=None):
    """Run block ``idx`` of ``program`` on every place of ``places`` (module docstring).

    Parameters
    ----------
    program : Program
        The program owning the block.
    idx : int
        The block to run.
    envs : list of dict
        Per place, name -> tensor: the place's own values (its slice of the inputs).
    places : list of Place
        Distinct places, one per entry of ``envs``.
    keep : list of str
        Names whose values to return.
    outer : scope
        Where every other name is read from (anything with ``find_var``).
    outer_place : Place, optional
        The place of the calling op (engines are cached per outer place).

    Returns
    -------
    list of dict
        Per place, name -> value for the names in ``keep`` (None when not made).
    """
    keep = tuple(keep)
    # validation bounds the nesting; this bounds programs run without it
    problem = depth_problem(getattr(outer, "depth", 0) + 1, f"sub-block {idx} of parallel_do")
    if problem:
        raise ProgramError(problem)
    key = (program._version, idx, tuple(str(p) for p in places), keep, str(outer_place))
    with _ENGINES_LOCK:
        per_program = _ENGINES.setdefault(program, {})
        engine = per_program.get(key)
        if engine is None:
            # a new version of the program makes the old engines useless
            for k in [k for k in per_program if k[0] != program._version]:
                del per_program[k]
    if engine is None:
        engine = _Engine(program, idx, list(places), keep)
        with _ENGINES_LOCK:
            engine = per_program.setdefault(key, engine)
    return engine.run(envs, outer, keep)
