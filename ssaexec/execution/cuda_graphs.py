"""The executor's glue to CUDA graphs (``ExecutionStrategy(cuda_graph=True)``).

``runtime.cuda_graph`` captures and replays a step (``StepGraphs``); this module only
decides which ``StepGraphs`` a step uses and reports their status. The capture
machinery itself is that module's, not this one's.

Invariants: one ``StepGraphs`` per runner (keyed by the runner's identity; runners live
as long as the executor, so the key is never reused), made on the runner's first
graphed step with the executor's persistables, which a replay must keep in place;
``status`` is None until a step ran with graphs.
"""

__all__ = ["check_places", "StepGraphCache"]


def check_places(exec_strategy, places, distributed):
    """Refuse ``cuda_graph=True`` where graphs cannot run (``runtime.cuda_graph``)."""
    if exec_strategy.cuda_graph:
        from ..runtime.cuda_graph import check_places as check
        check(places, distributed)


class StepGraphCache:
    """The ``StepGraphs`` of one executor's runners.

    Attributes
    ----------
    graphs : dict
        ``id(runner) -> runtime.cuda_graph.StepGraphs``.
    """

    def __init__(self):
        self.graphs = {}

    def of(self, runner, program, exec_strategy, capture=None):
        """The ``StepGraphs`` of ``runner`` (made on first use). ``program``: the full
        step's program (its persistables stay in place); ``capture``: makes the capture
        mechanism (None: CUDA graphs)."""
        graphs = self.graphs.get(id(runner))
        if graphs is None:
            from ..runtime.cuda_graph import StepGraphs
            st = exec_strategy
            persist = [v.name for v in program.global_block().vars.values() if v.persistable]
            graphs = self.graphs[id(runner)] = StepGraphs(
                runner, persist, st.cuda_graph_warmup, st.cuda_graph_cache,
                capture() if capture is not None else None)
        return graphs

    def status(self, runner):
        """``StepGraphs.status()`` of ``runner`` (None for no runner, or no graphed step)."""
        graphs = self.graphs.get(id(runner)) if runner is not None else None
        return graphs.status() if graphs is not None else None
