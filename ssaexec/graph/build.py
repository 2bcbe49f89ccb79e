"""``build_ssa_graph``: replicate a program over places as a versioned SSA graph.

Walks block 0 in program order once. For each op and place it creates a handle,
binds every read to the latest version of that name on that place and makes a
new version for every write (``SSAGraph.read``/``write`` add the hazard
edges). Then, as RAF's AutoDataParallel pass does after autodiff:

* the op with role ``loss`` that seeds ``loss@GRAD`` becomes a
  ``ScaleLossGradOpHandle`` per place (or disappears when the user feeds it);
* right after the op that produces a parameter's final gradient (its
  ``role_var``), one collective spanning all places (on one place too, where
  it is a no-op locally but still the hook for cross-process reduction): an all-reduce, or with the
  ``reduce`` strategy a reduce to the parameter's owner place, whose optimizer
  op alone runs and is followed by a broadcast of the parameter;
* with ``fuse_all_reduce_ops`` (by default across processes), gradients are
  bucketed (``graph.fuse``) and
  each bucket gets one all-reduce when it fills (or when an op reads one of
  its gradients, or at the end of the program);
* all collectives are chained by dummy edges in the order they were created,
  which is the program order and so the same on every process;
* a sparse gradient (a grad op with ``is_sparse``, ``ops.sparse``) is all-reduced
  alone, never put in a bucket (its rows and values are gathered, not flattened),
  or made dense in the graph's copy of the op with ``sparse_gradients=False``.

Ops owning sub-blocks become one handle whose reads and writes include those
of their sub-blocks (names declared outside the sub-block).
"""

from ..errors import GraphError, ProgramError
from ..dtypes import torch_dtype
from ..limits import depth_problem
from ..program.desc import EMPTY_VAR, OpDesc, Program
from ..place import Place
from ..strategy import BuildStrategy
from .fuse import GradBucketer
from .ssa import (AllReduceOpHandle, AllReduceWaitOpHandle, BroadcastOpHandle,
                  ComputationOpHandle, FetchOpHandle, ReduceOpHandle, ScaleLossGradOpHandle,
                  SSAGraph)

__all__ = ["build_ssa_graph", "op_reads_writes", "grad_owners"]


def _sub_block_io(program, idx, reads, writes, seen, local=frozenset()):
    if idx in seen:
        raise ProgramError(f"sub-block {idx} refers back to itself")
    # ``seen`` holds block 0 and the chain down to here: its size is the nesting, which
    # validation bounds; this bounds the recursion of programs built without it
    problem = depth_problem(len(seen), f"sub-block {idx}")
    if problem:
        raise ProgramError(problem)
    seen = seen | {idx}
    block = program.block(idx)
    # Names declared in this block or in an enclosing sub-block are not visible to
    # the graph; only the outer (block 0) names are reads and writes of the op.
    local = local | set(block.vars)
    for op in block.ops:
        for n in op.input_names():
            if n not in local and n not in reads:
                reads.append(n)
        for n in op.output_names():
            if n not in local and n not in writes:
                writes.append(n)
        for sub in op.sub_blocks():
            _sub_block_io(program, sub, reads, writes, seen, local)


def op_reads_writes(program, op):
    """(reads, writes): var names ``op`` reads and writes, sub-blocks included."""
    reads = list(dict.fromkeys(op.input_names()))
    writes = list(dict.fromkeys(n for n in op.output_names() if n != EMPTY_VAR))
    for sub in op.sub_blocks():
        _sub_block_io(program, sub, reads, writes, {0})
    return reads, writes


def _nbytes(program, name, wire=None):
    """Bytes of var ``name`` (as sent, when a floating var travels as ``wire``)."""
    var = program.global_block().find_var(name)
    if var is None or var.numel is None:
        return 0
    dtype = torch_dtype(var.dtype)
    if wire is not None and dtype.is_floating_point:
        dtype = torch_dtype(wire)
    return var.numel * dtype.itemsize


def grad_owners(program, param_grads, num_places):
    """Assign each parameter an owner place, greedily balancing gradient bytes."""
    load = [0] * num_places
    owners = {}
    for p, g in param_grads:
        if p in owners:
            continue
        i = min(range(num_places), key=lambda k: (load[k], k))
        owners[p] = i
        load[i] += _nbytes(program, g)
    return owners


def _check_args(program, places):
    if not isinstance(program, Program):
        raise GraphError(f"build_ssa_graph expects a Program, got {type(program).__name__}")
    if not places:
        raise GraphError("build_ssa_graph needs at least one place")
    places = list(places)
    for p in places:
        if not isinstance(p, Place):
            raise GraphError(f"places must be se.CPUPlace/se.CUDAPlace objects, got {p!r}")
    if len(set(places)) != len(places):
        raise GraphError(f"places must be distinct, got {[str(p) for p in places]}")
    return places


def build_ssa_graph(program, places, build_strategy=None, fetch_list=None):
    """Build the multi-place SSA graph of ``program``.

    Parameters
    ----------
    program : Program
        A training (or any) program; block 0 is replicated.
    places : list of Place
        One replica per place.
    build_strategy : BuildStrategy, optional
        Reduce and loss-scaling strategies and debugging switches.
    fetch_list : list of str, optional
        Vars to fetch: one ``FetchOpHandle`` each, reading every place.

    Returns
    -------
    SSAGraph
    """
    places = _check_args(program, places)
    strategy = build_strategy or BuildStrategy()
    g = SSAGraph(program, places, strategy)
    block = program.global_block()
    n = len(places)
    ranks = n * strategy.num_trainers
    # owners update their parameters alone (reduce strategy, ZeRO 1 and 2), and with the
    # reduce strategy or ZeRO 2 only they receive the summed gradient
    reduce_mode = strategy.reduce_strategy == "reduce" or strategy.zero_stage == 2
    owner_mode = reduce_mode or strategy.zero_stage == 1
    wire = {"bf16": "bfloat16", "fp16": "float16"}.get(strategy.allreduce_dtype)
    param_grads = g.param_grads()
    if owner_mode:
        g.param_owner = grad_owners(program, param_grads, n)
    chain = []
    sparse_vars = set()  # sparse gradients made so far (ops.sparse)
    last_on_place = [None] * n
    bucketer = None
    if strategy.fuses_all_reduce() and not reduce_mode:
        bucketer = GradBucketer(strategy.fuse_bucket_mb * (1 << 20))

    for i, op in enumerate(block.ops):
        if bucketer is not None and bucketer.holds(sum(op_reads_writes(program, op), [])):
            # someone reads or overwrites a gradient still waiting in a bucket: reduce it first
            chain.append(_all_reduce(g, bucketer.take(), wire))
        if op.role == "loss":
            _scale_loss_grad(g, op, i, strategy, ranks)
            continue
        targets = range(n)
        if owner_mode and op.role == "optimize" and op.role_var:
            p = op.role_var[0][0]
            if p not in g.param_owner:
                raise GraphError(f"op #{i} {op.type!r} updates parameter {p!r}, but no backward "
                                 "op lists it in role_var, so the reduce strategy has no owner "
                                 "place for it")
            targets = [g.param_owner[p]]
        sparse = op.role == "backward" and (op.attrs.get("is_sparse") is True or (
            op.type == "sum" and set(op.input_names()) <= sparse_vars))  # sparse + sparse
        if sparse and not strategy.sparse_gradients:
            op, sparse = _dense_grad(op), False
        if sparse:
            sparse_vars.update(op.output_names())
        reads, writes = op_reads_writes(program, op)
        for pi in targets:
            h = g.add_op(ComputationOpHandle(op, i, places[pi], pi))
            for name in reads:
                g.read(h, pi, name)
            for name in writes:
                g.write(h, pi, name)
            if strategy.enable_sequential_execution:
                if last_on_place[pi] is not None:
                    g.depend(last_on_place[pi], h, "sequential")
                last_on_place[pi] = h
        if op.role == "backward":
            for p, grad in op.role_var:
                if reduce_mode:
                    chain.append(_reduce(g, grad, g.param_owner[p]))
                elif bucketer is not None and not sparse:  # rows and values: not flattened
                    var = block.find_var(grad)
                    for names in bucketer.add(grad, _nbytes(program, grad, wire), var.dtype):
                        chain.append(_all_reduce(g, names, wire))
                else:
                    chain.append(_all_reduce(g, [grad], None if sparse else wire))
        if owner_mode and op.role == "optimize" and op.role_var and n > 1:
            p = op.role_var[0][0]
            chain.append(_broadcast(g, [p], g.param_owner[p]))

    if bucketer is not None and bucketer.names:
        chain.append(_all_reduce(g, bucketer.take(), wire))
    for prev, cur in zip(chain, chain[1:]):
        g.depend(prev, cur, "collective_order")
    for k, h in enumerate(chain):
        h.seq = k
    g.collectives = chain

    for name in fetch_list or ():
        if block.find_var(name) is None:
            raise GraphError(f"fetch var {name!r} is not declared in the program")
        h = g.add_op(FetchOpHandle(name))
        for pi in range(n):
            if g.latest(pi, name) is None:
                raise GraphError(f"fetch var {name!r} is neither written by the program nor "
                                 f"read by it on {places[pi]}; nothing to fetch")
            g.read(h, pi, name)
        g.fetches.append(h)

    if strategy.debug_graphviz_path:
        with open(strategy.debug_graphviz_path, "w", encoding="utf-8") as f:
            f.write(g.to_dot())
    return g


def _dense_grad(op):
    # BuildStrategy(sparse_gradients=False): this graph's copy of the grad op makes a
    # dense gradient (the program keeps its is_sparse)
    return OpDesc(op.type, op.inputs, op.outputs, dict(op.attrs, is_sparse=False), op.role,
                  op.role_var)


def _scale_loss_grad(g, op, index, strategy, ranks):
    names = op.output_names()
    if len(names) != 1:
        raise GraphError(f"op #{index} {op.type!r} has role 'loss' but writes {names}; the "
                         "loss-gradient seed must write exactly one var")
    if strategy.gradient_scale_strategy == "customized":
        return  # the user feeds loss@GRAD on every place: it is a version-0 read
    # the mean over every sample of the step: all ranks, and all accumulated micro-batches
    coeff = 1.0 / (ranks * strategy.gradient_accumulation_steps) \
        if strategy.gradient_scale_strategy == "coeff_num_device" else 1.0
    shape = op.attrs.get("shape", [])
    dtype = op.attrs.get("dtype", "float32")
    for pi, place in enumerate(g.places):
        h = g.add_op(ScaleLossGradOpHandle(names[0], coeff, shape, dtype, place, pi, index))
        g.write(h, pi, names[0])


def _all_reduce(g, grads, wire=None):
    h = g.add_op(AllReduceOpHandle(grads, wire))
    _read_write_all(g, h, grads)
    if g.strategy.num_trainers > 1 and g.strategy.async_allreduce:
        # the handle starts the cross-process call (its version of each gradient is "in
        # flight"); a wait handle completes it, and only the readers of its version wait
        h.wait = g.add_op(AllReduceWaitOpHandle(h))
        g.depend(h, h.wait, "async")
        _read_write_all(g, h.wait, grads)
    return h


def _read_write_all(g, h, names):
    for name in names:
        for pi in range(len(g.places)):
            g.read(h, pi, name)
    for name in names:
        for pi in range(len(g.places)):
            g.write(h, pi, name)


def _reduce(g, grad, owner):
    h = g.add_op(ReduceOpHandle([grad], owner))
    for pi in range(len(g.places)):
        g.read(h, pi, grad)
    g.write(h, owner, grad)
    return h


def _broadcast(g, names, root):
    h = g.add_op(BroadcastOpHandle(names, root))
    for name in names:
        g.read(h, root, name)
        for pi in range(len(g.places)):
            if pi != root:
                g.write(h, pi, name)
    return h
