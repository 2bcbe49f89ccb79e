"""The sequential ``Executor``: runs a program's ops one by one in program order.

By default it runs the program's one-place SSA graph through the same
prepared-call lowering as ``ParallelExecutor`` (``runtime.compiled``), in the
calling thread. ``compiled=False`` keeps the readable reference path, simple
on purpose: no threads, no graph; per (program version, fetch list) it
compiles the ``OpCall`` of every op and, for each op, the non-persistable
vars whose last reader it is, dropped from the scope right after so peak
memory follows the live set as in eager PyTorch. Tests check that both paths
give bit-identical results. Both hand control ops the block runner of
``parallel_do`` (``runtime.parallel_block.run_places``; ``runtime.op_call``). Fetched values are returned as CPU tensors
detached from the scope (later runs may update parameters in place).

Values the program reads from its scope before writing them (parameters a startup
program wrote, values set with ``Scope.set_var``) are checked against their
declarations before a step whenever the scope changed since this program's last step
(``runtime.boundary.EntryCheck``); feeds are checked as they come (``feed``).
"""

import weakref

from ..core.errors import SSAExecError
from ..core.host_allocator import keep_freed_memory
from ..data.feed import bind_feeds, check_feed, forget_feeds, missing_data_error
from ..program.desc import Program
from ..graph.build import build_ssa_graph
from ..runtime.boundary import EntryCheck
from ..runtime.collective import LocalCollective
from ..runtime.compiled import CompiledRunner
from ..runtime.memory_plan import last_uses
from ..runtime.op_call import OpCall
from ..runtime.parallel_block import run_places
from ..core.place import CPUPlace
from ..runtime.scheduler import Scheduler
from ..runtime import interrupt
from ..runtime.interrupt import hold
from ..runtime.scope import Scope, global_scope

__all__ = ["Executor", "fetch_names"]


def fetch_names(fetch_list):
    """Normalise a fetch list of names or vars to a tuple of names."""
    if fetch_list is None:
        return ()
    if isinstance(fetch_list, (str,)) or hasattr(fetch_list, "name"):
        fetch_list = [fetch_list]
    return tuple(f if isinstance(f, str) else f.name for f in fetch_list)


class _Plan:
    __slots__ = ("calls", "free_after", "data_read", "step", "entry")

    def __init__(self, program, fetch, device):
        self.entry = EntryCheck()
        block = program.global_block()
        self.calls = [OpCall(op, i, program, device, run_places)
                      for i, op in enumerate(block.ops)]
        last = last_uses([op.input_names() for op in block.ops],
                         [op.output_names() for op in block.ops])
        keep = set(fetch)
        free = [[] for _ in block.ops]
        for n, i in last.items():
            var = block.find_var(n)
            if var is not None and not var.persistable and n not in keep:
                free[i].append(n)
        self.free_after = [tuple(f) for f in free]
        read = {n for op in block.ops for n in op.input_names()}
        self.data_read = [v.name for v in program.data_vars() if v.name in read]
        self.step = 0


class _Compiled:
    """The compiled path: the program's one-place SSA graph lowered by ``CompiledRunner``."""

    __slots__ = ("runner", "in_graph", "data_read", "scheduler", "entry")

    def __init__(self, program, fetch, place):
        self.entry = EntryCheck()
        block = program.global_block()
        touched = {n for op in block.ops for n in op.input_names() + op.output_names()}
        # fetches of names the program never touches are read from the scope afterwards
        self.in_graph = tuple(n for n in fetch if n in touched)
        graph = build_ssa_graph(program, [place], fetch_list=list(self.in_graph))
        graph.lint()
        self.scheduler = Scheduler(1, name="ssaexec-executor")
        self.runner = CompiledRunner(graph, [Scope()], LocalCollective(), self.scheduler,
                                     _contexts(place), "event", keep_fetched=True,
                                     run_places=run_places)
        read = {n for op in block.ops for n in op.input_names()}
        self.data_read = [v.name for v in program.data_vars() if v.name in read]

    def run(self, scope):
        self.runner.bind_scopes([scope])
        return self.runner.run()


def _contexts(place):
    if not place.is_cuda:
        return None
    from ..runtime.streams import DeviceContext
    return [DeviceContext(place)]


class Executor:
    """Run programs sequentially on one place.

    Parameters
    ----------
    place : Place, optional
        Where tensors live (default ``CPUPlace(0)``).
    compiled : bool
        True (default): run the program's one-place graph lowered to prepared
        calls (``runtime.compiled``), as ``ParallelExecutor`` does. False: the
        readable reference path, one ``OpCall`` per op in program order.
    """

    def __init__(self, place=None, compiled=True):
        self.place = place or CPUPlace(0)
        self.compiled = bool(compiled)
        if not self.place.is_cuda:
            keep_freed_memory()  # steps reuse what they free (core.host_allocator)
        self._plans = {}  # id(program) -> (weakref, version, fetch, plan)

    def _plan(self, program, fetch):
        # Keyed by identity: programs compare by value, which is too slow for a cache.
        entry = self._plans.get(id(program))
        if entry is not None and entry[0]() is program and entry[1:3] == (program._version,
                                                                           fetch):
            return entry[3]
        if self.compiled:
            plan = _Compiled(program, fetch, self.place)
        else:
            plan = _Plan(program, fetch, self.place.device)
        self._plans = {k: v for k, v in self._plans.items() if v[0]() is not None}
        self._plans[id(program)] = (weakref.ref(program), program._version, fetch, plan)
        return plan

    def run(self, program=None, feed=None, fetch_list=None, scope=None, return_numpy=False):
        """Run ``program`` once.

        Parameters
        ----------
        program : Program, optional
            Default: the default main program.
        feed : dict, optional
            Data var name -> tensor, NumPy array or list.
        fetch_list : list of str or VarDesc, optional
            Vars whose values to return.
        scope : Scope, optional
            Default: ``se.global_scope()``.
        return_numpy : bool
            Return NumPy arrays instead of CPU tensors.

        Returns
        -------
        list
            One value per fetched var, in ``fetch_list`` order.
        """
        with hold():  # Ctrl-C stops the step cleanly (runtime.interrupt)
            return self._run_step(program, feed, fetch_list, scope, return_numpy)

    def _run_step(self, program, feed, fetch_list, scope, return_numpy):
        if program is None:
            from ..program.builder import default_main_program
            program = default_main_program()
        if not isinstance(program, Program):
            raise SSAExecError(f"Executor.run expects a Program, got {type(program).__name__}")
        scope = scope if scope is not None else global_scope()
        fetch = fetch_names(fetch_list)
        plan = self._plan(program, fetch)
        feeds = check_feed(program, feed)
        missing = [n for n in plan.data_read if n not in feeds and scope.find_var(n) is None]
        if missing:
            raise missing_data_error(program.global_block().var(missing[0]))
        plan.entry.before((program,), [scope], [self.place], feeds)
        replaced = bind_feeds([scope], [self.place], [feeds], ())
        fetched = {}
        ok = False
        try:
            if self.compiled:
                fetched = plan.run(scope)
            else:
                for call, free in zip(plan.calls, plan.free_after, strict=True):
                    if interrupt.requested():
                        raise KeyboardInterrupt
                    call.run(scope, self.place, plan.step)
                    for n in free:
                        scope.erase(n)
                plan.step += 1
            ok = True
        except BaseException:
            forget_feeds(program, [scope], [feeds], replaced)
            raise
        finally:
            plan.entry.after([scope], ok)
        out = []
        for n in fetch:
            if n in fetched:
                t = fetched[n][0]
                out.append(t.numpy() if return_numpy else t)
                continue
            t = scope.find_var(n)
            if t is None:
                raise SSAExecError(f"fetch var {n!r} has no value after the run; is it written "
                                   "by the program?")
            t = t.detach().to("cpu", copy=True)
            out.append(t.numpy() if return_numpy else t)
        return out
