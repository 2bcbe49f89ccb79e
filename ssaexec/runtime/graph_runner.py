"""``GraphRunner``: the readable path, a node per SSA handle.

A ``Runner`` (``runtime.runner``) whose lowering, ``HandleLowering``, keeps the
graph as it is: every op handle is a node of its own (the step plan without
segments, ``runtime.plan``, so node ``i`` is handle ``i``) and its body is the handle's own
function (``runtime.handle_calls``: a ``ComputationOpHandle`` becomes an
``OpCall`` bound to its place's scope; the collectives call the collective
backend on the places' tensors). Every result lives in its place's scope, so
the plan's memory plan is ``handle_memory_plan``: the latest version of every
non-persistable var is erased as soon as its last reader has run, or right
after it is written when nobody reads it.

It is the path to read and debug: ``observe`` instruments its per-handle
functions (``Runner.fns``, one per handle), and every op is scheduled, timed
and traced on its own.
"""

from ..core.errors import SSAExecError
from .handle_calls import handle_fn
from .runner import Runner

__all__ = ["GraphRunner", "HandleLowering", "handle_fn"]


class HandleLowering:
    """Lower each handle to its own function (see the module docstring)."""

    __slots__ = ("calls",)
    compiled = False
    atomic = True  # the readable path always flags its commit phase
    keep_fetched = False
    rebindable = False  # computations bind their scope when they are made
    clones = 0

    def __init__(self):
        self.calls = None

    def prepare(self, runner):
        self.calls = runner.calls
        return runner.step_plan.memory_plan()[0]

    def handle_body(self, handle):
        return self.calls.fn(handle)

    def segment_body(self, segment):
        raise SSAExecError(f"the readable path has no segments ({segment.name})")

    def begin_step(self):
        pass


def GraphRunner(graph, scopes, collective, scheduler, contexts=None, sync="event",  # noqa: N802
                run_places=None):
    """A ``Runner`` of ``graph`` on the readable path (a constructor, named as one)."""
    return Runner(graph, scopes, collective, scheduler, HandleLowering(), contexts, sync,
                  run_places)
