"""``HandleCalls``: each SSA handle as a zero-argument function over the places' scopes.

The shared part of both runners (``runtime.runner``): the readable path calls
one per node; the compiled path calls them for the collectives and fetches that
are nodes of their own. Which function a handle gets is dispatched on its class
(``handle_fn``), so a new handle kind registers here and nowhere else.

* A ``ComputationOpHandle`` becomes an ``OpCall`` bound to its place's scope.
* Collectives call the collective backend on the places' tensors, each with the
  op's name as ``label`` for its errors. A split all-reduce leaves its completion
  in ``pending``; its ``AllReduceWaitOpHandle`` runs it. A fused bucket goes through
  one flat buffer per place, except in one process (a ``local_only`` backend, no wire
  dtype), where its vars' own tensors are summed coalesced (``all_reduce_coalesced``:
  the copies in and out of the buffer cost more than the sums on small models).
* ZeRO's all-gather makes each place's full parameter from every rank's shard
  (rewriting the one the place holds, else binding a new tensor), its
  reduce-scatter each place's gradient shard, and a free drops a value from its
  place's scope (``zero_calls``).
* A fetch copies each place's value to the host into ``fetched`` (pinned memory,
  on the fetch stream its node entered, on a GPU).

Scopes are read when a function runs (collectives, fetches) or bound when it is
made (computations), from the list the runner owns: a runner that rebinds its
scopes between steps updates that list in place.
"""

import functools

import torch

from ..core.dtypes import torch_dtype
from ..core.errors import OpError, SSAExecError
from ..graph.ssa import (AllGatherOpHandle, AllReduceOpHandle, AllReduceWaitOpHandle,
                         CollectiveOpHandle, ComputationOpHandle, FetchOpHandle, FreeOpHandle,
                         ReduceScatterOpHandle, ScaleLossGradOpHandle)
from .op_call import OpCall

__all__ = ["HandleCalls", "collective_signature", "handle_fn", "gather_into", "padded_flat"]


class HandleCalls:
    """The handle functions of ``graph`` over ``scopes`` (one per place).

    ``step`` is the runner's step counter (a one-item list: random ops seed from
    it, ``runtime.rng``); ``run_places`` the block runner control ops get.
    """

    __slots__ = ("graph", "scopes", "collective", "run_places", "step", "fetched", "pending")

    def __init__(self, graph, scopes, collective, step, run_places=None):
        self.graph, self.scopes, self.collective = graph, scopes, collective
        self.step, self.run_places = step, run_places
        self.fetched = {}
        self.pending = {}  # started asynchronous all-reduces: id -> function completing it

    def fn(self, op):
        """The function that runs handle ``op``."""
        return handle_fn(op, self)

    def _compute_fn(self, op):
        call = OpCall(op.op, op.op_index, self.graph.program, op.place.device, self.run_places)
        scope, place, pi, step = self.scopes[op.place_idx], op.place, op.place_idx, self.step
        return lambda: call.run(scope, place, step[0], pi)

    def _scale_loss_grad_fn(self, op):
        scope, name = self.scopes[op.place_idx], op.var_name
        shape, dtype, coeff = list(op.shape), torch_dtype(op.dtype), op.coeff
        device = op.place.device
        return lambda: scope.set_var(name, torch.full(shape, coeff, dtype=dtype, device=device))

    def _tensors(self, name, place_ids, op):
        out = []
        for pi in place_ids:
            t = self.scopes[pi].find_var(name)
            if t is None:
                raise OpError(f"While executing {op.name}: var {name!r} has no value on "
                              f"{self.graph.places[pi]}", op.kind, self.graph.places[pi])
            out.append(t)
        return out

    def _collective_fn(self, op):
        everyone = list(range(len(self.graph.places)))
        coll = self.collective
        is_all_reduce = isinstance(op, AllReduceOpHandle)
        fused = is_all_reduce and len(op.var_names) > 1
        split = is_all_reduce and op.wait is not None
        label = op.name

        def run():
            try:
                if fused:
                    finish = self._fused_all_reduce(op, everyone)
                elif is_all_reduce:
                    parts = [op.apply_start(coll, self._tensors(name, everyone, op), label)
                             for name in op.var_names]

                    def finish():
                        for f in parts:
                            f()
                else:
                    for name in op.var_names:
                        op.apply(coll, self._tensors(name, everyone, op), label)
                    return
                if split:
                    self.pending[op.id] = finish  # AllReduceWaitOpHandle completes it
                else:
                    finish()
            except SSAExecError:
                raise  # DistributedError too: a peer's failure must surface as itself
            except Exception as e:
                raise OpError(f"While executing {op.name}: {type(e).__name__}: {e}",
                              op.kind) from e
        return run

    def _zero_fn(self, op, body):
        # ZeRO's collectives: the same error policy as the others
        def run():
            try:
                body()
            except SSAExecError:
                raise
            except Exception as e:
                raise OpError(f"While executing {op.name}: {type(e).__name__}: {e}",
                              op.kind) from e
        return run

    def _all_gather_fn(self, op):
        everyone = list(range(len(self.graph.places)))
        scopes, coll, label = self.scopes, self.collective, op.name
        world = _world(self.graph, coll)

        def body():
            per = [self._tensors(s, everyone, op) for s in op.shard_names]
            for ks in _by_dtype(per):  # one call a layer (one dtype: the usual case)
                sizes = [per[k][0].numel() for k in ks]
                if len(ks) == 1:
                    shards = per[ks[0]]
                else:  # each rank's chunk: its shards of the layer's parameters, in order
                    shards = [torch.cat([per[k][pi].reshape(-1) for k in ks])
                              for pi in range(len(everyone))]
                c = sum(sizes)
                outs = [torch.empty(world * c, dtype=t.dtype, device=t.device)
                        for t in shards]
                op.apply(coll, (shards, outs), label)
                offset = 0
                for k, s in zip(ks, sizes, strict=True):
                    parts = outs if len(ks) == 1 else \
                        [o.view(world, c)[:, offset:offset + s].reshape(-1) for o in outs]
                    gather_into(scopes, everyone, op.var_names[k], parts, op.shapes[k])
                    offset += s
        return self._zero_fn(op, body)

    def _reduce_scatter_fn(self, op):
        everyone = list(range(len(self.graph.places)))
        scopes, coll, label = self.scopes, self.collective, op.name
        world = _world(self.graph, coll)

        def body():
            per = [self._tensors(name, everyone, op) for name in op.var_names]
            for ks in _by_dtype(per):  # one call a layer (one dtype: the usual case)
                sizes = [-(-per[k][0].numel() // world) for k in ks]
                c = sum(sizes)
                fulls = []
                for pi in range(len(everyone)):
                    if len(ks) == 1:
                        fulls.append(padded_flat(per[ks[0]][pi], world))
                        continue
                    # rank r's chunk: its slice of every gradient of the layer, in order
                    t0 = per[ks[0]][pi]
                    flat = torch.empty(world * c, dtype=t0.dtype, device=t0.device)
                    rows, offset = flat.view(world, c), 0
                    for k, s in zip(ks, sizes, strict=True):
                        _put_padded(rows[:, offset:offset + s], per[k][pi])
                        offset += s
                    fulls.append(flat)
                shards = [torch.empty(c, dtype=f.dtype, device=f.device) for f in fulls]
                op.apply(coll, (fulls, shards), label)
                offset = 0
                for k, s in zip(ks, sizes, strict=True):
                    for pi, t in zip(everyone, shards, strict=True):
                        scopes[pi].vars[op.shard_names[k]] = t if len(ks) == 1 else \
                            t[offset:offset + s]
                    offset += s
        return self._zero_fn(op, body)

    def _free_fn(self, op):
        names, pi = list(op.var_names), op.place_idx

        def run():
            scope = self.scopes[pi]
            for name in names:
                scope.erase(name)
        return run

    def _wait_fn(self, op):
        def run():
            finish = self.pending.pop(op.start.id, None)
            if finish is None:
                raise SSAExecError(f"{op.name}: its all-reduce was not started")
            finish()
        return run

    def _fused_all_reduce(self, op, everyone):
        per_name = [self._tensors(name, everyone, op) for name in op.var_names]
        coll = self.collective
        if getattr(coll, "local_only", False) and not op.wire_dtype:
            # in one process: the sums of the vars' own tensors, coalesced (no flat buffer)
            coll.all_reduce_coalesced(per_name, op.name)
            return _done
        # one flat buffer per place, one collective, then copy the slices back
        flats = [torch.cat([ts[pi].reshape(-1) for ts in per_name]) for pi in everyone]
        started = op.apply_start(self.collective, flats, op.name)

        def finish():
            started()
            _unflatten(per_name, flats, everyone)
        return finish

    def _fetch_fn(self, op):
        name = op.var_name
        n = len(self.graph.places)

        def run():
            vals = []
            for pi in range(n):
                t = self.scopes[pi].find_var(name)
                if t is None:
                    raise OpError(f"While executing {op.name}: var {name!r} has no value on "
                                  f"{self.graph.places[pi]}", "fetch", self.graph.places[pi])
                # a snapshot: later ops and runs update parameters in place
                if t.is_cuda:
                    # pinned host memory, copied on the current stream of t's device: the
                    # fetch stream this handle entered there (StreamSync.wrap), which waited
                    # for t's producer; run() waits for the fetch's event
                    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    vals.append(host.copy_(t.detach(), non_blocking=True))
                elif t.is_cpu:  # clone: to("cpu", copy=True) parses its device each call
                    vals.append(t.detach().clone())
                else:
                    vals.append(t.detach().to("cpu", copy=True))
            self.fetched[name] = vals
        return run


def _done():
    return None


def _world(graph, collective):
    """Ranks of ZeRO's collectives: the layout's (places x processes)."""
    layout = graph.shard_layout
    if layout is not None:
        return layout.world
    return len(graph.places) * getattr(collective, "processes", 1)


def _by_dtype(per):
    """Indices of ``per`` (per var, its tensors per place) grouped by dtype, in order: the
    vars of a layer that one flat buffer can hold."""
    groups = {}
    for k, ts in enumerate(per):
        groups.setdefault(ts[0].dtype, []).append(k)
    return list(groups.values())


def _put_padded(rows, t):
    """Write ``t`` flattened into ``rows`` (``[W, S]``, a strided view of a flat buffer),
    row by row, zero past its ``numel``."""
    n, s = t.numel(), rows.shape[1]
    full = n // s
    flat = t.reshape(-1)
    if full:
        rows[:full].copy_(flat[:full * s].view(full, s))
    if full < rows.shape[0]:
        tail = torch.zeros(rows.shape[0] - full, s, dtype=rows.dtype, device=rows.device)
        tail.view(-1)[:n - full * s] = flat[full * s:]
        rows[full:].copy_(tail)


def padded_flat(t, world):
    """``t`` flattened and zero-padded to a multiple of ``world`` elements (a new tensor
    the reduce-scatter may use as its buffer)."""
    n = t.numel()
    s = -(-n // world)
    out = torch.zeros(world * s, dtype=t.dtype, device=t.device)
    out[:n] = t.reshape(-1)
    return out


def gather_into(scopes, places, name, outs, shape):
    """Bind each place's gathered full ``name`` (the first ``prod(shape)`` elements of
    ``outs[i]``, viewed as ``shape``): copied into the tensor the place holds when it has
    that shape and type (stages 1 and 2: the parameter lives on), else bound anew."""
    n = 1
    for d in shape:
        n *= d
    for pi, out in zip(places, outs, strict=True):
        full = out[:n].view(shape)
        old = scopes[pi].vars.get(name)
        if old is not None and old.shape == full.shape and old.dtype == full.dtype:
            old.copy_(full)
        else:
            scopes[pi].vars[name] = full


def _unflatten(per_name, flats, everyone):
    for pi in everyone:
        offset = 0
        for ts in per_name:
            t = ts[pi]
            k = t.numel()
            t.copy_(flats[pi][offset:offset + k].view_as(t))
            offset += k


def collective_signature(graph):
    """Each collective of ``graph`` in chain order as ``(seq, kind, var names, declared
    shapes, dtypes)``: what the debug mode of a multi-process run compares across ranks
    (``begin_step``)."""
    block = graph.program.global_block()
    out = []
    for op in graph.collectives:
        vars_ = [block.find_var(n) for n in op.var_names]
        out.append((op.seq, op.kind, tuple(op.var_names),
                    tuple(tuple(v.shape) if v is not None and v.shape is not None else None
                          for v in vars_),
                    tuple(v.dtype if v is not None else None for v in vars_)))
    return out


@functools.singledispatch
def handle_fn(op, calls):
    """A zero-argument function that runs handle ``op`` with ``calls`` (a ``HandleCalls``),
    by handle class.

    A new handle kind registers here: ``@handle_fn.register`` on a function taking
    ``(op: NewOpHandle, calls)``.
    """
    raise SSAExecError(f"no runner for op handle kind {op.kind!r}")


handle_fn.register(ComputationOpHandle, lambda op, calls: calls._compute_fn(op))
handle_fn.register(ScaleLossGradOpHandle, lambda op, calls: calls._scale_loss_grad_fn(op))
handle_fn.register(FetchOpHandle, lambda op, calls: calls._fetch_fn(op))
handle_fn.register(CollectiveOpHandle, lambda op, calls: calls._collective_fn(op))
handle_fn.register(AllReduceWaitOpHandle, lambda op, calls: calls._wait_fn(op))
handle_fn.register(AllGatherOpHandle, lambda op, calls: calls._all_gather_fn(op))
handle_fn.register(ReduceScatterOpHandle, lambda op, calls: calls._reduce_scatter_fn(op))
handle_fn.register(FreeOpHandle, lambda op, calls: calls._free_fn(op))
