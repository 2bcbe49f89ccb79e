"""Observing steps: a callback around every op handle, on the readable per-op path.

``ParallelExecutor.observe`` (the trace, the simulator's profiler and calibration use
it) swaps each op handle's function of a readable runner (``GraphRunner.fns``, one
function per op handle) for a timed wrapper, and restores the originals on leaving.

Policy: observed steps run the readable path whatever ``ExecutionStrategy.compiled``
says, and the executor chooses that path itself (``ParallelExecutor._runner``): the
user's ``ExecutionStrategy`` object is never written, since other executors and
threads may share and read it.

Nodes. ``observe(..., nodes=True)`` keeps the path the strategy chose (compiled,
and with ``compiler="inductor"`` each segment compiled) and calls back once per node
of its node graph: a segment (a compiled run of one place's ops) is one callback.
``ssaexec trace --compiler inductor`` draws those.

Invariant: on leaving ``instrumented``, even by an exception, every runner's ``fns``
holds exactly the functions it held on entering.
"""

import contextlib
import threading
import time

import torch

__all__ = ["observed", "instrumented"]


def observed(op, fn, on_op, cuda_sync):
    """``fn`` wrapped to call ``on_op(op, thread_ident, start_ns, end_ns)`` after it runs
    (``time.perf_counter_ns`` clock; also when ``fn`` raises). ``cuda_sync``
    synchronises ``op``'s CUDA devices before the end time."""
    clock = time.perf_counter_ns
    devices = _cuda_devices(op) if cuda_sync else ()

    def wrapper():
        t0 = clock()
        try:
            fn()
            for d in devices:
                torch.cuda.synchronize(d)
        finally:
            on_op(op, threading.get_ident(), t0, clock())
    return wrapper


def _cuda_devices(op):
    """The CUDA devices ``op`` (an op handle, or a node: its handles') runs on."""
    places = set()
    for h in getattr(op, "handles", None) or (op,):
        places.update((h.place,) if h.on_one_place else h.places)
    return {p.device for p in places if p.is_cuda}


@contextlib.contextmanager
def instrumented(runners, on_op, cuda_sync=False, nodes=False):
    """Wrap every op handle function of the readable ``runners`` with ``observed`` inside
    the block (with ``nodes``, every node function of any runner: ``on_op`` then gets the
    node, ``runtime.node_graph``); yields None."""
    originals = [list(r.fns) for r in runners]
    try:
        for runner in runners:
            for op in (runner.nodes if nodes else runner.graph.ops):
                runner.fns[op.id] = observed(op, runner.fns[op.id], on_op, cuda_sync)
        yield
    finally:
        for runner, fns in zip(runners, originals, strict=True):
            runner.fns[:] = fns
