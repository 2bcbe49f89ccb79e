"""The graph-building passes: ``build_ssa_graph`` as an ordered list of named passes.

As Paddle's ``multi_devices_graph_pass`` and the passes after it, the multi-place
graph is made in steps, each a pure function from a ``BuildGraph`` to the next one:

=====================  ==============================================================
``replicate``          one compute node per op and place, reading and writing its vars
``gradient_scale``     the ``loss`` op's nodes become the loss-gradient seed per place
                       (1/ranks, 1), or go (``customized``: the user feeds it)
``sparse_gradients``   mark sparse gradient producers (``is_sparse``, sparse + sparse),
                       or make them dense in the graph's copy (``sparse_gradients=False``)
``zero_owners``        reduce strategy: owner places (balanced by gradient bytes); an
                       optimizer op keeps its owner's node only
``insert_collectives`` after a gradient's producer, its all-reduce (or reduce to the
                       owner); after an owner's optimizer op, the parameter broadcast
``shard_collectives``  ZeRO (``program.shard``): a sharded gradient's reduce-scatter
                       (and free), the parameters' all-gathers (after the update;
                       stage 3: before use, with frees after, and prefetch edges)
``fuse_buckets``       with bucketing, the dense all-reduces become one per bucket,
                       placed where it fills, before an op that touches a waiting
                       gradient, or at the end
``async_wait``         several processes, ``async_allreduce``: a wait node completes
                       each all-reduce
``sequential``         ``enable_sequential_execution``: program order per place
``collective_order``   chain the collectives in creation (program) order, the same
                       on every process
``fetch``              one fetch node per fetched var, reading every place
=====================  ==============================================================

The ``BuildGraph`` is the graph before versioning: an ordered list of nodes (what
handle to make and the var accesses and dependencies it adds, in order) and edges.
``materialize`` replays it into an ``SSAGraph``: versions and the write-after-read
and write-after-write hazard dummies come from ``SSAGraph.read``/``write``, so they
hold after every pass, and the graph after any pass can be drawn.

Invariants: a pass never mutates its input (nodes are frozen; a pass returns a new
``BuildGraph``); the order of the nodes is the order the handles get their ids, and
of the items, the order edges are added, so the final graph is, handle for handle
and edge for edge, the one the single-walk builder made before (the goldens of
``tests/graph/test_graph_passes.py``). A pass that does not apply returns its input.
"""

import dataclasses
from dataclasses import dataclass, field

from ..core.dtypes import torch_dtype
from ..core.errors import GraphError, ProgramError
from ..core.limits import depth_problem
from ..program.desc import EMPTY_VAR, OpDesc
from ..program.shard import SHARD_SUFFIX, is_sharded, layer_of, shard_program
from .fuse import GradBucketer
from .ssa import (AllGatherOpHandle, AllReduceOpHandle, AllReduceWaitOpHandle,
                  BroadcastOpHandle, CollectiveOpHandle, ComputationOpHandle, FetchOpHandle,
                  FreeOpHandle, ReduceOpHandle, ReduceScatterOpHandle, ScaleLossGradOpHandle,
                  SSAGraph)

__all__ = ["Node", "Edge", "BuildGraph", "Pass", "PASSES", "PASS_NAMES", "run_passes",
           "materialize", "op_reads_writes", "grad_owners"]


# --- helpers the passes share ------------------------------------------------------------

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


# --- the graph before versioning ---------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Node:
    """One op handle to make: ``cls(*args)`` (a wait node's argument is its all-reduce node).

    ``io`` is what the handle does to the graph, in order: ``("read", places, names)`` and
    ``("write", places, names)`` (each name in turn, on each of the place indices) and
    ``("after", node, reason)`` (a dummy edge from ``node``). ``op_index`` is the program
    op it comes from (None for fetches); ``sparse`` and ``bucketable`` are what the
    collective passes need to know.
    """

    cls: type
    args: tuple
    io: tuple = ()
    op_index: int = None
    op: OpDesc = None
    place_idx: int = None
    sparse: bool = False
    bucketable: bool = False

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    @property
    def names(self):
        """The var names a collective node carries."""
        return self.args[0]


@dataclass(frozen=True, eq=False)
class Edge:
    """A dummy edge ``before -> after`` (both nodes), added at this point of the list."""

    before: Node
    after: Node
    reason: str


@dataclass(frozen=True)
class BuildGraph:
    """What the passes pass on: the program, places, strategy and the items so far."""

    program: object
    places: tuple
    strategy: object
    fetch_list: tuple = ()
    items: tuple = ()
    param_owner: dict = field(default_factory=dict)
    collectives: tuple = ()
    shard_layout: object = None  # ZeRO's program.shard.ShardLayout, or None

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    @property
    def nodes(self):
        return [it for it in self.items if isinstance(it, Node)]

    # the policy every pass reads from the strategy, decided here once
    @property
    def reduce_mode(self):
        """Owners alone receive the summed gradient (reduce strategy)."""
        return self.strategy.reduce_strategy == "reduce"

    @property
    def owner_mode(self):
        """Owners alone update their parameters (reduce strategy)."""
        return self.reduce_mode

    @property
    def sharded(self):
        """``{parameter: ShardedParam}`` of ZeRO (empty without)."""
        return self.shard_layout.params if self.shard_layout is not None else {}

    @property
    def wire(self):
        """The dtype dense gradients travel in (``allreduce_dtype``), or None."""
        return {"bf16": "bfloat16", "fp16": "float16"}.get(self.strategy.allreduce_dtype)


def materialize(bg):
    """The ``SSAGraph`` of ``bg``: its items replayed through ``add_op``/``read``/``write``."""
    g = SSAGraph(bg.program, bg.places, bg.strategy)
    g.param_owner = dict(bg.param_owner)
    g.shard_layout = bg.shard_layout
    handle = {}

    def resolve(a):
        if not isinstance(a, Node):
            return a
        if a not in handle:  # a pass dropped or moved a node another one refers to
            raise GraphError(f"graph pass order: {a.cls.__name__} {a.args[:1]} is used "
                             "before it is made")
        return handle[a]

    read, write, depend = g.read, g.write, g.depend  # the hot loop: 8 places of BERT
    for it in bg.items:
        if isinstance(it, Edge):
            depend(resolve(it.before), resolve(it.after), it.reason)
            continue
        cls = it.cls
        if cls is AllReduceWaitOpHandle:  # the one kind made from another handle
            h = g.add_op(cls(resolve(it.args[0])))
            h.start.wait = h
        else:
            h = g.add_op(cls(*it.args))
        handle[it] = h
        for step, places, names in it.io:
            if step == "after":
                depend(resolve(places), h, names)
                continue
            access = read if step == "read" else write
            for name in names:
                for pi in places:
                    access(h, pi, name)
        if cls is FetchOpHandle:
            g.fetches.append(h)
    g.collectives = [handle[c] for c in bg.collectives]
    for k, h in enumerate(g.collectives):
        h.seq = k
    return g


def _read_write_all(names, n):
    names = tuple(names)
    return ("read", range(n), names), ("write", range(n), names)


def _all_reduce(names, n, wire, op_index, **kw):
    return Node(AllReduceOpHandle, (list(names), wire), _read_write_all(names, n),
                op_index=op_index, **kw)


def _by_op(items):
    """Items grouped by the program op they come from: [(op_index, [items])], in order."""
    groups = []
    for it in items:
        idx = it.op_index if isinstance(it, Node) else None
        if groups and groups[-1][0] == idx:
            groups[-1][1].append(it)
        else:
            groups.append((idx, [it]))
    return groups


# --- the passes --------------------------------------------------------------------------

def replicate(bg):
    """One compute node per op of block 0 and place, reading then writing its vars."""
    items = []
    for i, op in enumerate(bg.program.global_block().ops):
        reads, writes = map(tuple, op_reads_writes(bg.program, op))
        for pi, place in enumerate(bg.places):
            io = (("read", (pi,), reads), ("write", (pi,), writes))
            items.append(Node(ComputationOpHandle, (op, i, place, pi), io, op_index=i, op=op,
                              place_idx=pi))
    return bg.replace(items=tuple(items))


def gradient_scale(bg):
    """The ``loss`` op's nodes become one ``ScaleLossGradOpHandle`` per place writing the
    seed of ``loss@GRAD`` (1/(ranks x accumulation steps), or 1), or go (``customized``)."""
    strategy = bg.strategy
    ranks = len(bg.places) * strategy.num_trainers
    coeff = 1.0 / (ranks * strategy.gradient_accumulation_steps) \
        if strategy.gradient_scale_strategy == "coeff_num_device" else 1.0
    items = []
    for it in bg.items:
        if not (isinstance(it, Node) and it.cls is ComputationOpHandle and it.op.role == "loss"):
            items.append(it)
            continue
        op, index = it.op, it.op_index
        names = op.output_names()
        if len(names) != 1:
            raise GraphError(f"op #{index} {op.type!r} has role 'loss' but writes {names}; the "
                             "loss-gradient seed must write exactly one var")
        if strategy.gradient_scale_strategy == "customized":
            continue  # the user feeds loss@GRAD on every place: it is a version-0 read
        pi = it.place_idx
        args = (names[0], coeff, op.attrs.get("shape", []), op.attrs.get("dtype", "float32"),
                bg.places[pi], pi, index)
        items.append(Node(ScaleLossGradOpHandle, args, (("write", (pi,), (names[0],)),),
                          op_index=index, op=op, place_idx=pi))
    return bg.replace(items=tuple(items))


def sparse_gradients(bg):
    """Mark the nodes of grad ops that make a sparse gradient (``is_sparse``, or a ``sum``
    of sparse gradients); with ``sparse_gradients=False`` their op becomes dense instead
    (the program keeps its ``is_sparse``)."""
    sparse_ops, sparse_vars = set(), set()
    for i, op in enumerate(bg.program.global_block().ops):
        if op.role != "backward":
            continue
        if op.attrs.get("is_sparse") is True or (
                op.type == "sum" and set(op.input_names()) <= sparse_vars):  # sparse + sparse
            sparse_ops.add(i)
            if bg.strategy.sparse_gradients:
                sparse_vars.update(op.output_names())
    if not sparse_ops:
        return bg
    dense = {}
    items = []
    for it in bg.items:
        if isinstance(it, Node) and it.cls is ComputationOpHandle and it.op_index in sparse_ops:
            if bg.strategy.sparse_gradients:
                it = it.replace(sparse=True)
            else:
                op = dense.setdefault(it.op_index, _dense_grad(it.op))
                it = it.replace(op=op, args=(op,) + it.args[1:])
        items.append(it)
    return bg.replace(items=tuple(items))


def _dense_grad(op):
    # BuildStrategy(sparse_gradients=False): this graph's copy of the grad op makes a
    # dense gradient (the program keeps its is_sparse)
    return OpDesc(op.type, op.inputs, op.outputs, dict(op.attrs, is_sparse=False), op.role,
                  op.role_var)


def zero_owners(bg):
    """Reduce strategy: each parameter gets an owner place (``grad_owners``), and an
    optimizer op's node stays on its parameter's owner only. (ZeRO shards instead:
    ``shard_collectives``.)"""
    if not bg.owner_mode:
        return bg
    owners = grad_owners(bg.program, _param_grads(bg.program), len(bg.places))
    items = []
    for it in bg.items:
        if isinstance(it, Node) and it.cls is ComputationOpHandle and \
                it.op.role == "optimize" and it.op.role_var:
            p = it.op.role_var[0][0]
            if p not in owners:
                raise GraphError(f"op #{it.op_index} {it.op.type!r} updates parameter {p!r}, "
                                 "but no backward op lists it in role_var, so the reduce "
                                 "strategy has no owner place for it")
            if it.place_idx != owners[p]:
                continue
        items.append(it)
    return bg.replace(items=tuple(items), param_owner=owners)


def _param_grads(program):
    out = []
    for op in program.global_block().ops:
        if op.role == "backward":
            out.extend(op.role_var)
    return out


def insert_collectives(bg):
    """After a grad op's nodes, per gradient in its ``role_var``: an all-reduce on every
    place (on one place too: the hook for cross-process reduction), or a reduce to the
    owner; after an owner's optimizer op (several places), the parameter's broadcast."""
    n = len(bg.places)
    out = []
    for idx, group in _by_op(bg.items):
        out.extend(group)
        first = group[0]
        if not isinstance(first, Node) or first.op is None:
            continue
        op = first.op
        if op.role == "backward" and first.cls is ComputationOpHandle:
            for p, grad in op.role_var:
                if p in bg.sharded:
                    continue  # ZeRO: reduce-scattered (shard_collectives)
                if bg.reduce_mode:
                    owner = bg.param_owner[p]
                    io = (("read", range(n), (grad,)), ("write", (owner,), (grad,)))
                    out.append(Node(ReduceOpHandle, ([grad], owner), io, op_index=idx))
                else:
                    out.append(_all_reduce([grad], n, None if first.sparse else bg.wire, idx,
                                           sparse=first.sparse, bucketable=not first.sparse))
        if bg.owner_mode and op.role == "optimize" and op.role_var and n > 1:
            p = op.role_var[0][0]
            root = bg.param_owner[p]
            others = tuple(pi for pi in range(n) if pi != root)
            io = (("read", (root,), (p,)), ("write", others, (p,)))
            out.append(Node(BroadcastOpHandle, ([p], root), io, op_index=idx))
    return bg.replace(items=tuple(out))


def shard_collectives(bg):
    """ZeRO (``BuildStrategy(zero_stage=1|2|3)``, the layout of ``program.shard``).

    The unit of every collective here is a *layer* (``program.shard.layer_of``: the
    parameters of one module, read off their names), as FSDP2's per-module calls: the
    adjacent parameters (or gradients) of one layer move in one call, a flat buffer of
    their shards rank by rank (``runtime.handle_calls``).

    * Reduce-scatters: the sharded gradients of one layer, in backward's program order,
      are reduce-scattered by one ``ReduceScatterOpHandle`` into their shards on every
      place, right after the producer of the layer's last one; stages 2 and 3 then free
      the layer's full gradients on each place (one ``FreeOpHandle`` a place; an
      accumulator, persistable, stays).
    * Stages 1 and 2: after the updates of a layer's parameters (on their shards, every
      place), one ``AllGatherOpHandle`` rewrites the layer's full parameters in place.
    * Stage 3: the parameters of a layer whose first readers in a phase are adjacent are
      gathered by one all-gather right before the first of those readers, and each is
      freed on each place after its own last reader of the phase. The phases are forward
      and the rest (backward), or one with ``reshard_after_forward=False``.
      Prefetch: the gather of group k waits for the first readers of group
      k-1-``zero_prefetch`` (a ``prefetch`` dummy edge), so at most
      ``zero_prefetch``+1 groups are gathered ahead of the compute reading them.
    * Stages 2 and 3, back-pressure: the producer of the first gradient of the k-th
      reduce-scatter waits for the (k-1-``zero_prefetch``)-th (a ``zero_backpressure``
      dummy edge), so backward never holds more than ``zero_prefetch``+1 layers' full
      gradients that wait for their reduce-scatter.
    """
    layout = bg.shard_layout
    if layout is None or not len(layout):
        return bg
    n, strategy = len(bg.places), bg.strategy
    stage = layout.stage
    ops = bg.program.global_block().ops
    block = bg.program.global_block()
    gather_wire = {"bf16": "bfloat16", "fp16": "float16"}.get(strategy.zero_gather_dtype)
    everyone = range(n)
    before, after = {}, {}  # op index -> nodes to put before / after its nodes

    def free_nodes(names, idx):
        return [Node(FreeOpHandle, (list(names), bg.places[pi], pi),
                     (("write", (pi,), tuple(names)),), op_index=idx, place_idx=pi)
                for pi in everyone]

    producers = {}
    for it in bg.items:
        if isinstance(it, Node) and it.cls is ComputationOpHandle:
            producers.setdefault(it.op_index, []).append(it)
    scatters = []  # each reduce-scatter so far, in program order
    bucket = []    # [(op index, ShardedParam, gradient)] of the layer whose gradients wait

    def scatter(bucket):
        last = bucket[-1][0]
        grads = [g for _, _, g in bucket]
        shards = [g + SHARD_SUFFIX for g in grads]
        io = (("read", everyone, tuple(grads)), ("write", everyone, tuple(shards)))
        made = Node(ReduceScatterOpHandle, (grads, shards, bg.wire), io, op_index=last)
        after.setdefault(last, []).append(made)
        if stage >= 2:
            frees = [g for g in grads
                     if not (block.find_var(g) is not None and block.find_var(g).persistable)]
            if frees:
                after[last].extend(free_nodes(frees, last))
        scatters.append(made)

    gathered = []  # stages 1 and 2: [(op index, ShardedParam)] updated, not yet gathered

    def gather(group):
        last = group[-1][0]
        sps = [sp for _, sp in group]
        io = (("read", everyone, tuple(x for sp in sps for x in (sp.shard_name, sp.name))),
              ("write", everyone, tuple(sp.name for sp in sps)))
        after.setdefault(last, []).append(
            Node(AllGatherOpHandle, ([sp.name for sp in sps], [sp.shard_name for sp in sps],
                                     [sp.shape for sp in sps], gather_wire),
                 io, op_index=last))

    for i, op in enumerate(ops):
        if op.role == "backward":
            for p, grad in op.role_var:
                sp = bg.sharded.get(p)
                if sp is None or sp.grad is None:
                    continue
                if bucket and layer_of(bucket[-1][1].name) != layer_of(p):
                    scatter(bucket)
                    bucket = []
                if not bucket:
                    j = len(scatters) - 1 - strategy.zero_prefetch
                    if stage >= 2 and j >= 0:
                        # back-pressure: at most zero_prefetch+1 layers' full gradients
                        # wait for their reduce-scatter (and free) while backward goes on
                        after.setdefault(i, []).extend(
                            Edge(scatters[j], x, "zero_backpressure") for x in producers[i])
                bucket.append((i, sp, grad))
        if stage < 3 and op.role == "optimize" and op.role_var and \
                op.role_var[0][0] in bg.sharded:
            sp = bg.sharded[op.role_var[0][0]]
            if gathered and layer_of(gathered[-1][1].name) != layer_of(sp.name):
                gather(gathered)
                gathered = []
            gathered.append((i, sp))
    if bucket:
        scatter(bucket)
    if gathered:
        gather(gathered)
    if stage == 3:
        _stage3_gathers(bg, ops, before, after, free_nodes, gather_wire)
    out = []
    for idx, group in _by_op(bg.items):
        out.extend(before.pop(idx, ()) if idx is not None else ())
        out.extend(group)
        out.extend(after.pop(idx, ()) if idx is not None else ())
    if before or after:
        raise GraphError(f"shard_collectives: program ops {sorted(set(before) | set(after))} "
                         "have no nodes to place ZeRO's collectives by")
    return bg.replace(items=tuple(out))


def _stage3_gathers(bg, ops, before, after, free_nodes, gather_wire):
    """Stage 3's gathers, frees and prefetch edges into ``before``/``after``: a gather per
    run of one layer's parameters whose first readers in a phase are adjacent."""
    readers = {}
    for i, op in enumerate(ops):
        for name in op_reads_writes(bg.program, op)[0]:
            if name in bg.sharded:
                readers.setdefault(name, []).append(i)
    spans = []   # (first reader, phase, ShardedParam)
    frees = {}   # last reader op index -> [param names]
    for sp in bg.sharded.values():
        rs = readers.get(sp.name, [])
        if not rs:
            continue
        fwd = [i for i in rs if ops[i].role == "forward"]
        rest = [i for i in rs if ops[i].role != "forward"]
        if not bg.strategy.reshard_after_forward or not fwd or not rest or \
                min(rest) < max(fwd):
            phases = [rs]
        else:
            phases = [fwd, rest]
        for phase, span in enumerate(phases):
            spans.append((min(span), phase, sp))
            frees.setdefault(max(span), []).append(sp.name)
    groups = []  # [((phase, layer), first reader, [ShardedParam])]: adjacent spans
    for first, phase, sp in sorted(spans, key=lambda t: (t[0], t[1])):
        key = (phase, layer_of(sp.name))
        if groups and groups[-1][0] == key:
            groups[-1][2].append(sp)
        else:
            groups.append((key, first, [sp]))
    nodes_of = {}
    for it in bg.items:
        if isinstance(it, Node) and it.cls is ComputationOpHandle:
            nodes_of.setdefault(it.op_index, []).append(it)
    everyone = range(len(bg.places))
    firsts = [first for _, first, _ in groups]
    for k, (_, first, sps) in enumerate(groups):
        io = [("read", everyone, tuple(sp.shard_name for sp in sps)),
              ("write", everyone, tuple(sp.name for sp in sps))]
        j = k - 1 - bg.strategy.zero_prefetch
        if j >= 0:
            io.extend(("after", r, "prefetch") for r in nodes_of.get(firsts[j], ()))
        before.setdefault(first, []).append(
            Node(AllGatherOpHandle, ([sp.name for sp in sps], [sp.shard_name for sp in sps],
                                     [sp.shape for sp in sps], gather_wire),
                 tuple(io), op_index=first))
    for last, names in frees.items():
        after.setdefault(last, []).extend(free_nodes(names, last))


def fuse_buckets(bg):
    """Bucketing (``fuses_all_reduce()``, all-reduce strategies): the dense gradients'
    all-reduces become one per bucket (``graph.fuse``), made when the bucket fills, before
    an op that reads or overwrites a gradient waiting in it, or at the end."""
    if not bg.strategy.fuses_all_reduce() or bg.reduce_mode:
        return bg
    program, n, wire = bg.program, len(bg.places), bg.wire
    ops = program.global_block().ops
    bucketer = GradBucketer(bg.strategy.fuse_bucket_mb * (1 << 20))
    # op index -> its nodes (ops with none too: below); dummy edges (ZeRO's back-pressure)
    # go after every node, where they still join the same handles
    edges = [it for it in bg.items if isinstance(it, Edge)]
    groups = dict(_by_op([it for it in bg.items if not isinstance(it, Edge)]))
    out = []
    for idx in range(len(ops)):
        if bucketer.holds(sum(op_reads_writes(program, ops[idx]), [])):
            # someone reads or overwrites a gradient still waiting in a bucket: reduce it first
            out.append(_all_reduce(bucketer.take(), n, wire, idx))
        for it in groups.pop(idx, ()):
            if isinstance(it, Node) and it.bucketable:
                grad = it.names[0]
                var = program.global_block().find_var(grad)
                for names in bucketer.add(grad, _nbytes(program, grad, wire), var.dtype):
                    out.append(_all_reduce(names, n, wire, idx))
            else:
                out.append(it)
    if bucketer.names:
        out.append(_all_reduce(bucketer.take(), n, wire, len(ops)))
    if groups:
        raise GraphError(f"fuse_buckets runs before nodes of no program op: {list(groups)}")
    return bg.replace(items=tuple(out + edges))


def async_wait(bg):
    """Several processes with ``async_allreduce``: after each all-reduce, the wait node that
    completes its cross-process call (its readers wait for it alone)."""
    if not (bg.strategy.num_trainers > 1 and bg.strategy.async_allreduce):
        return bg
    n = len(bg.places)
    out = []
    for it in bg.items:
        out.append(it)
        if isinstance(it, Node) and it.cls is AllReduceOpHandle:
            io = (("after", it, "async"),) + _read_write_all(it.names, n)
            out.append(Node(AllReduceWaitOpHandle, (it,), io, op_index=it.op_index))
    return bg.replace(items=tuple(out))


def sequential(bg):
    """``enable_sequential_execution``: each compute node runs after the one before it on
    its place (a ``sequential`` dummy edge)."""
    if not bg.strategy.enable_sequential_execution:
        return bg
    last = {}
    out = []
    for it in bg.items:
        if isinstance(it, Node) and it.cls is ComputationOpHandle:
            prev = last.get(it.place_idx)
            last[it.place_idx] = it = it.replace(
                io=it.io + ((("after", prev, "sequential"),) if prev is not None else ()))
        out.append(it)
    return bg.replace(items=tuple(out))


def collective_order(bg):
    """Chain the collectives by dummy edges in the order they were made (program order, so
    the same on every process); their position in the chain is their ``seq``."""
    chain = tuple(it for it in bg.items
                  if isinstance(it, Node) and issubclass(it.cls, CollectiveOpHandle))
    edges = tuple(Edge(a, b, "collective_order") for a, b in zip(chain, chain[1:]))
    return bg.replace(items=bg.items + edges, collectives=chain)


def fetch(bg):
    """One ``FetchOpHandle`` per var of the fetch list, reading its latest version on
    every place (``GraphError`` for a var the program neither declares nor touches)."""
    if not bg.fetch_list:
        return bg
    touched = {(pi, name) for it in bg.nodes for step, places, names in it.io
               if step != "after" for name in names for pi in places}
    block = bg.program.global_block()
    out = list(bg.items)
    for name in bg.fetch_list:
        if block.find_var(name) is None:
            raise GraphError(f"fetch var {name!r} is not declared in the program")
        for pi, place in enumerate(bg.places):
            if (pi, name) not in touched:
                raise GraphError(f"fetch var {name!r} is neither written by the program nor "
                                 f"read by it on {place}; nothing to fetch")
        io = (("read", range(len(bg.places)), (name,)),)
        touched.update((pi, name) for pi in range(len(bg.places)))
        out.append(Node(FetchOpHandle, (name,), io))
    return bg.replace(items=tuple(out))


@dataclass(frozen=True)
class Pass:
    """A named graph-building pass: ``fn(BuildGraph) -> BuildGraph``, and what it does."""

    name: str
    fn: object
    doc: str

    def __call__(self, bg):
        return self.fn(bg)


PASSES = (
    Pass("replicate", replicate, "one compute node per op and place"),
    Pass("gradient_scale", gradient_scale,
         "the loss op becomes the loss-gradient seed per place (or goes: customized)"),
    Pass("sparse_gradients", sparse_gradients,
         "mark sparse gradient producers, or make them dense (sparse_gradients=False)"),
    Pass("zero_owners", zero_owners,
         "reduce strategy and ZeRO: owner places; optimizer ops on their owner only"),
    Pass("insert_collectives", insert_collectives,
         "after each gradient's producer its all-reduce (or reduce); parameter broadcasts"),
    Pass("shard_collectives", shard_collectives,
         "ZeRO: reduce-scatters, all-gathers and frees of the sharded parameters"),
    Pass("fuse_buckets", fuse_buckets, "dense all-reduces become one per gradient bucket"),
    Pass("async_wait", async_wait, "several processes: a wait node after each all-reduce"),
    Pass("sequential", sequential, "enable_sequential_execution: program order per place"),
    Pass("collective_order", collective_order,
         "chain the collectives in program order (their seq)"),
    Pass("fetch", fetch, "one fetch node per fetched var"),
)
PASS_NAMES = tuple(p.name for p in PASSES)


def run_passes(program, places, strategy, fetch_list=(), passes=PASSES, after=None):
    """Run ``passes`` in order from the empty ``BuildGraph``; return the last one.

    ``after(pass, build_graph)``, when given, sees the graph after each pass (the
    debugging dumps: ``materialize`` it to draw it).
    """
    layout = None
    world = len(places) * strategy.num_trainers
    if strategy.zero_stage and world > 1:
        program, layout = shard_program(program, strategy.zero_stage, world)
    elif is_sharded(program):
        raise GraphError(f"the program is sharded (ZeRO's @SHARD vars) but the strategy "
                         f"has zero_stage={strategy.zero_stage} over {world} rank(s)")
    bg = BuildGraph(program, tuple(places), strategy, tuple(fetch_list or ()),
                    shard_layout=layout)
    for p in passes:
        bg = p(bg)
        if after is not None:
            after(p, bg)
    return bg
