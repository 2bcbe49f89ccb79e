"""The runner cache: which runner runs a step, built once per key.

A step of a ``ParallelExecutor`` runs one runner; the runner is determined by its key
``(fetch, compiled, amp, phase, compiler)``: the fetch list, whether the compiled path
runs (``ExecutionStrategy.compiled``, unless the steps are observed on the readable
per-op path), the AMP mode, the phase ("apply" or "accumulate") and the compiler
(``"inductor"``, ``"auto"`` or None). The key is read from the strategies at each call, so a
strategy changed between steps gets its own runner.

Policy. ``compiler="inductor"`` runs ``runtime.runner.Runner`` with ``InductorLowering``;
``compiler="auto"`` runs ``runtime.tiered.TieredRunner`` (straight-line code at once,
Inductor's graphs from a step boundary on), or, where ``tiered.straight_reason`` gives a
reason (said once), the compiled path; so does a runner of a multi-process run whose graph
holds no cross-process collective (one rank may run it alone, so the ranks could not agree
on its tier: ``tiered.agrees``); else the compiled path runs ``CompiledRunner`` and the
readable one ``GraphRunner``. The graph is built with ``BuildStrategy.for_compiler``: under
a compiler, gradients go in buckets unless the strategy says otherwise (the default is
decided in ``ssaexec.core.strategy``, not here).

Invariants: a runner is built once per key and kept until the executor closes (its
graph, compiled segments and captured CUDA graphs are reused by every later step);
the caller's strategy objects are never written; CUDA places get one
``DeviceContext`` each, made once and shared by every runner of the executor.
"""

from ..graph.build import build_ssa_graph
from ..runtime.compiled import CompiledRunner
from ..runtime.graph_runner import GraphRunner
from ..runtime.inductor import InductorLowering
from ..runtime.parallel_block import run_places
from ..runtime.runner import Runner
from ..runtime.tiered import TieredRunner, agrees, say_straight, straight_reason

__all__ = ["RunnerCache"]


class RunnerCache:
    """The runners of one executor, by key.

    Parameters
    ----------
    places : list of Place
    build_strategy, exec_strategy : BuildStrategy, ExecutionStrategy
        The executor's strategies (read at each call, never written).
    scheduler : runtime.scheduler.Scheduler
    local_processes : int, optional
        The run's processes on this machine (they share its cores: a tiered runner's
        background compile counts this process's share, ``runtime.tiered``).
    """

    def __init__(self, places, build_strategy, exec_strategy, scheduler, local_processes=1):
        self.places = places
        self.local_processes = local_processes
        self.build_strategy = build_strategy
        self.exec_strategy = exec_strategy
        self._scheduler = scheduler
        self._runners = {}
        self._contexts = None

    def key(self, fetch, phase, readable=False):
        """The cache key of the runner of ``fetch`` in ``phase``: what makes runners
        differ. ``readable``: the steps run the per-op path (``observe``)."""
        st = self.exec_strategy
        compiled = st.compiled and not readable
        compiler = st.compiler if compiled else None
        return (fetch, compiled, st.amp, phase, compiler)

    def find(self, fetch, phase, readable=False):
        """The runner of ``fetch`` in ``phase`` if one was built, else None."""
        return self._runners.get(self.key(fetch, phase, readable))

    def runner(self, fetch, phase, program_for, local_scopes, collective, readable=False):
        """The runner of ``fetch`` (a tuple of names) in ``phase``, built on first use
        from ``program_for(phase)`` over ``local_scopes`` with ``collective``.

        ``program_for`` is passed, not kept: the cache holds no reference back to its
        executor, so an executor dropped without ``close`` is freed (and its workers
        stopped) at once, not at the next cyclic collection."""
        key = self.key(fetch, phase, readable)
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners[key] = self._build(key, program_for(phase), local_scopes,
                                                      collective)
        return runner

    def _build(self, key, program, local_scopes, collective):
        fetch, compiled, _, phase, compiler = key
        if compiler == "auto":
            why = straight_reason(self.places, self.build_strategy, self.exec_strategy)
            if why is not None:
                if self.build_strategy.trainer_id == 0:  # once, not once per rank
                    say_straight(why)
                compiler = None
        build = self.build_strategy.for_compiler(compiler)
        graph = build_ssa_graph(program, self.places, build, list(fetch))
        graph.lint()
        sync = self.exec_strategy.sync
        if compiler == "inductor":
            return Runner(graph, local_scopes, collective, self._scheduler, InductorLowering(),
                          self.contexts(), sync, run_places)
        agree = agrees(collective, graph)
        if compiler == "auto" and agree is not False:
            # the run's processes on this machine share its cores (compile_beside)
            local = self.local_processes if agree else 1
            return TieredRunner(graph, local_scopes, collective, self._scheduler,
                                self.contexts(), sync, run_places, local_processes=local)
        kind = CompiledRunner if compiled else GraphRunner
        return kind(graph, local_scopes, collective, self._scheduler, self.contexts(), sync,
                    run_places=run_places)

    def close(self):
        """Stop what runners do beside the steps (a tiered runner's background compiles)."""
        for runner in self._runners.values():
            close = getattr(runner, "close", None)
            if close is not None:
                close()

    def contexts(self):
        """One ``DeviceContext`` (compute/comm/fetch streams) per CUDA place, None for CPU."""
        if self._contexts is None:
            if any(p.is_cuda for p in self.places):
                from ..runtime.streams import DeviceContext
                self._contexts = [DeviceContext(p) if p.is_cuda else None for p in self.places]
            else:
                self._contexts = [None] * len(self.places)
        return self._contexts
