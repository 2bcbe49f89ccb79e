"""The multi-place SSA graph: builder, hazards, collectives, lint, export.

The checks here recompute the invariants independently of ``SSAGraph.lint``
(reachability comes from ``to_networkx()`` / ``op_graph()`` and networkx), so a
bug in lint and the same bug in the builder cannot hide each other.

Version numbering (as in the design brief): the handles of one (name, place)
are numbered 0..n-1. Version 0 is the value that exists before the run (it has
no writer, and no reader when the name's first access is a write); each write
makes the next version. So a read sees version = number of writes before it.
"""

import collections
import functools
import random

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ssaexec.core.errors import GraphError
from ssaexec.graph.build import build_ssa_graph, op_reads_writes
from ssaexec.graph.export import op_graph
from ssaexec.graph.ssa import AllReduceOpHandle, ComputationOpHandle
from ssaexec.program.example_models import build_cnn, build_mlp, build_seed_mlp
from ssaexec.core.dtypes import torch_dtype
from ssaexec.program.desc import BlockRef, Program
from ssaexec.core.place import CPUPlace, cpu_places
from ssaexec.core.strategy import BuildStrategy

PLACE_COUNTS = (1, 2, 4, 8)
MODELS = {"mlp": build_mlp, "cnn": build_cnn, "seed_mlp": build_seed_mlp}


@functools.lru_cache(maxsize=None)
def model(name):
    """(main, startup, loss_name); built once, the builder never mutates programs."""
    return MODELS[name]()


# --- independent checks --------------------------------------------------------------

def ancestor_bits(graph):
    """op id -> bitset of the op ids that precede it, computed from ``to_networkx()``."""
    nxg = graph.to_networkx()
    anc = {}
    for node in nx.topological_sort(nxg):
        bits = 0
        for pred in nxg.predecessors(node):
            bits |= anc[pred]
            if pred.startswith("op:"):
                bits |= 1 << int(pred[3:])
        anc[node] = bits
    return {int(k[3:]): v for k, v in anc.items() if k.startswith("op:")}


def check_invariants(graph):
    """lint, then every invariant again without lint's code."""
    graph.lint()
    anc = ancestor_bits(graph)
    assert len(anc) == len(graph.ops)

    def precedes(a, b):
        return bool((anc[b.id] >> a.id) & 1)

    for op in graph.ops:
        assert graph.ops[op.id] is op
        for v in op.inputs:
            assert op in v.pending_ops, (op.name, v)
        for v in op.outputs:
            assert v.generated_op is op, (op.name, v)
    for pi, names in enumerate(graph.vars):
        for name, versions in names.items():
            assert [v.version for v in versions] == list(range(len(versions))), (name, pi)
            for v in versions:
                assert (v.name, v.place_idx, v.place) == (name, pi, graph.places[pi])
            assert all(v.generated_op is not None for v in versions[1:]), (name, pi)
            writers = [v.generated_op for v in versions if v.generated_op is not None]
            assert len({id(w) for w in writers}) == len(writers), (name, pi)
            for a, b in zip(writers, writers[1:]):  # write-after-write: a total order
                assert precedes(a, b), f"{a.name} and {b.name} both write {name} unordered"
            for prev, nxt in zip(versions, versions[1:]):  # write-after-read
                w = nxt.generated_op
                for r in prev.pending_ops:
                    assert r is w or precedes(r, w), \
                        f"{r.name} reads {prev!r} but is not before {w.name}"
    return anc


def compute_handles(graph, place_idx=None):
    return [h for h in graph.ops if h.kind == "compute"
            and (place_idx is None or h.place_idx == place_idx)]


def input_on(handle, name, place_idx):
    vs = [v for v in handle.inputs if not v.is_dummy and v.name == name
          and v.place_idx == place_idx]
    assert len(vs) == 1, (handle.name, name, vs)
    return vs[0]


def output_on(handle, name, place_idx):
    vs = [v for v in handle.outputs if not v.is_dummy and v.name == name
          and v.place_idx == place_idx]
    assert len(vs) == 1, (handle.name, name, vs)
    return vs[0]


def optimizer_handles(graph, param):
    return [h for h in compute_handles(graph)
            if h.op.role == "optimize" and h.op.role_var and h.op.role_var[0][0] == param]


def grad_bytes(program, grad):
    var = program.global_block().var(grad)
    return var.numel * torch_dtype(var.dtype).itemsize


# --- 1. the example models ---------------------------------------------------------------

@pytest.mark.parametrize("n", PLACE_COUNTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_all_reduce(name, n):
    main, _, _ = model(name)
    g = build_ssa_graph(main, cpu_places(n), BuildStrategy(reduce_strategy="all_reduce"))
    check_invariants(g)
    params = main.all_parameters()
    pairs = g.param_grads()
    assert sorted(p for p, _ in pairs) == sorted(p.name for p in params)
    all_reduces = g.ops_of_kind("all_reduce")
    assert len(all_reduces) == len(params)
    assert not g.ops_of_kind("reduce") and not g.ops_of_kind("broadcast")
    og = op_graph(g)
    block_ops = main.global_block().ops
    assert len(compute_handles(g)) == n * sum(op.role != "loss" for op in block_ops)
    for param, grad in pairs:
        (ar,) = [h for h in all_reduces if h.var_names == [grad]]
        opts = optimizer_handles(g, param)
        assert sorted(h.place_idx for h in opts) == list(range(n))
        for pi in range(n):
            vin = input_on(ar, grad, pi)
            producer = vin.generated_op
            assert isinstance(producer, ComputationOpHandle) and producer.place_idx == pi
            assert producer.op.role == "backward" and (param, grad) in producer.op.role_var
            vout = output_on(ar, grad, pi)
            assert vout.version == vin.version + 1
            (opt,) = [h for h in opts if h.place_idx == pi]
            assert input_on(opt, grad, pi) is vout
            assert nx.has_path(og, producer.id, ar.id)
            assert nx.has_path(og, ar.id, opt.id)
            assert not nx.has_path(og, opt.id, ar.id)


@pytest.mark.parametrize("bucket_mb", [0.01, 25.0])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_fused_all_reduce(name, bucket_mb):
    main, _, _ = model(name)
    n = 4
    g = build_ssa_graph(main, cpu_places(n), BuildStrategy(fuse_all_reduce_ops=True,
                                                           fuse_bucket_mb=bucket_mb))
    check_invariants(g)
    pairs = g.param_grads()
    buckets = g.ops_of_kind("all_reduce")
    assert [h.id for h in buckets] == [h.id for h in g.collectives]
    assert [gr for h in buckets for gr in h.var_names] == [gr for _, gr in pairs]
    cap = bucket_mb * (1 << 20)
    for k, h in enumerate(buckets):  # a bucket closes as soon as it is full
        sizes = [grad_bytes(main, gr) for gr in h.var_names]
        limit = min(cap, 1 << 20) if k == 0 else cap
        if k < len(buckets) - 1:
            assert sum(sizes) >= limit
        assert sum(sizes[:-1]) < limit
    og = op_graph(g)
    for param, grad in pairs:
        (ar,) = [h for h in buckets if grad in h.var_names]
        for pi in range(n):
            producer = input_on(ar, grad, pi).generated_op
            assert (param, grad) in producer.op.role_var and producer.place_idx == pi
            (opt,) = [h for h in optimizer_handles(g, param) if h.place_idx == pi]
            assert input_on(opt, grad, pi) is output_on(ar, grad, pi)
            assert nx.has_path(og, ar.id, opt.id)


def test_gradients_are_bucketed_by_default_across_processes_only():
    main, _, _ = model("mlp")
    n_grads = len(build_ssa_graph(main, cpu_places(2)).param_grads())
    assert not BuildStrategy().fuses_all_reduce()
    one = build_ssa_graph(main, cpu_places(2), BuildStrategy())
    assert len(one.ops_of_kind("all_reduce")) == n_grads  # one process: per gradient
    several = BuildStrategy(num_trainers=2)
    assert several.fuses_all_reduce()  # one process of two: DDP-style 25 MiB buckets
    assert len(build_ssa_graph(main, cpu_places(2), several).collectives) < n_grads
    assert not BuildStrategy(num_trainers=2, fuse_all_reduce_ops=False).fuses_all_reduce()
    assert BuildStrategy(fuse_all_reduce_ops=True).fuses_all_reduce()


@pytest.mark.parametrize("n", PLACE_COUNTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_reduce(name, n):
    main, _, _ = model(name)
    g = build_ssa_graph(main, cpu_places(n), BuildStrategy(reduce_strategy="reduce"))
    check_invariants(g)
    pairs = g.param_grads()
    reduces = g.ops_of_kind("reduce")
    assert not g.ops_of_kind("all_reduce")
    assert sorted(h.var_names[0] for h in reduces) == sorted(gr for _, gr in pairs)
    broadcasts = g.ops_of_kind("broadcast")
    assert len(broadcasts) == (len(pairs) if n > 1 else 0)
    og = op_graph(g)
    load = [0] * n
    for param, grad in pairs:
        (red,) = [h for h in reduces if h.var_names == [grad]]
        owner = g.param_owner[param]
        assert red.owner_idx == owner
        load[owner] += grad_bytes(main, grad)
        assert sorted(v.place_idx for v in red.inputs if not v.is_dummy) == list(range(n))
        assert [v.place_idx for v in red.outputs if not v.is_dummy] == [owner]
        (opt,) = optimizer_handles(g, param)  # the optimizer runs on the owner only
        assert opt.place_idx == owner
        assert input_on(opt, grad, owner) is output_on(red, grad, owner)
        assert nx.has_path(og, red.id, opt.id)
        if n > 1:
            (bc,) = [h for h in broadcasts if h.var_names == [param]]
            assert bc.root_idx == owner
            assert input_on(bc, param, owner) is output_on(opt, param, owner)
            assert sorted(v.place_idx for v in bc.outputs if not v.is_dummy) == \
                [pi for pi in range(n) if pi != owner]
            assert nx.has_path(og, opt.id, bc.id)
    # greedy balance: the heaviest place exceeds the lightest by at most one gradient
    biggest = max(grad_bytes(main, gr) for _, gr in pairs)
    assert max(load) - min(load) <= biggest, load


@pytest.mark.parametrize("strategy", ["coeff_num_device", "one", "customized"])
@pytest.mark.parametrize("n", (1, 2, 8))
def test_gradient_scale(strategy, n):
    main, _, loss = model("mlp")
    g = build_ssa_graph(main, cpu_places(n), BuildStrategy(gradient_scale_strategy=strategy))
    check_invariants(g)
    seeds = g.ops_of_kind("scale_loss_grad")
    loss_grad = loss + "@GRAD"
    if strategy == "customized":
        assert seeds == []
        for pi in range(n):  # fed by the user: a version-0 read with no writer
            v0 = g.vars[pi][loss_grad][0]
            assert v0.generated_op is None and v0.pending_ops
        return
    assert sorted(h.place_idx for h in seeds) == list(range(n))
    want = 1.0 / n if strategy == "coeff_num_device" else 1.0
    for h in seeds:
        assert h.coeff == pytest.approx(want)
        assert h.var_name == loss_grad
        assert [v.name for v in h.outputs if not v.is_dummy] == [loss_grad]


def test_gradient_scale_counts_trainers():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2), BuildStrategy(num_trainers=3, trainer_id=1))
    assert [h.coeff for h in g.ops_of_kind("scale_loss_grad")] == [pytest.approx(1 / 6)] * 2


def collective_signature(g):
    return [(h.kind, tuple(h.var_names), getattr(h, "owner_idx", None),
             getattr(h, "root_idx", None)) for h in g.collectives]


@pytest.mark.parametrize("reduce_strategy", ["all_reduce", "reduce"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_collectives_chained_in_program_order(name, reduce_strategy):
    main, _, _ = model(name)
    bs = BuildStrategy(reduce_strategy=reduce_strategy)
    g = build_ssa_graph(main, cpu_places(4), bs)
    chain = g.collectives
    assert sorted(h.id for h in chain) == sorted(h.id for h in g.ops if h.is_collective)
    assert [h.seq for h in chain] == list(range(len(chain)))
    og = op_graph(g)
    for a, b in zip(chain, chain[1:]):
        assert nx.has_path(og, a.id, b.id), (a.name, b.name)
    # gradients are reduced in the program order of the ops producing them ...
    producer_index = {}
    for i, op in enumerate(main.global_block().ops):
        for _, grad in op.role_var if op.role == "backward" else ():
            producer_index[grad] = i
    grads = [h.var_names[0] for h in chain if h.kind != "broadcast"]
    assert grads == [gr for _, gr in g.param_grads()]
    assert [producer_index[gr] for gr in grads] == sorted(producer_index[gr] for gr in grads)
    # ... and the order is the same for every build: two graphs, and a rebuilt program
    again = build_ssa_graph(main, cpu_places(4), bs)
    assert collective_signature(g) == collective_signature(again)
    rebuilt, _, _ = MODELS[name]()
    assert collective_signature(g) == collective_signature(
        build_ssa_graph(rebuilt, cpu_places(4), bs))


def test_fetch_handles_read_every_place():
    main, _, loss = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(3), fetch_list=[loss])
    check_invariants(g)
    (f,) = g.fetches
    assert f.kind == "fetch" and f.var_name == loss
    assert [(v.place_idx, v) for v in f.inputs] == [(pi, g.latest(pi, loss)) for pi in range(3)]


# --- 2. random valid programs -----------------------------------------------------------

SIMPLE_OPS = ("relu", "scale", "assign", "elementwise_add", "sum", "sgd")


class _Gen:
    """Draws ops into a program; all data vars are float32 [4] (``lr`` is [1])."""

    def __init__(self, draw, program):
        self.draw = draw
        self.program = program
        self.fresh = 0

    def new_name(self, block, prefix="t"):
        name = f"{prefix}{self.fresh}"
        self.fresh += 1
        block.create_var(name, [4], "float32")
        return name

    def pick(self, names):
        return self.draw(st.sampled_from(sorted(names)))

    def simple_op(self, block, avail, out, role="forward", role_var=None):
        """Append one op reading names of ``avail`` and writing ``out``: (reads, writes).

        When ``out`` already holds a value the op may be an in-place ``sgd``.
        """
        kind = self.draw(st.sampled_from(SIMPLE_OPS if out in avail else SIMPLE_OPS[:-1]))
        if kind == "sgd":
            ins = {"Param": [out], "Grad": [self.pick(avail)], "LearningRate": ["lr"]}
            outs = {"ParamOut": [out]}
        else:
            if kind == "elementwise_add":
                ins = {"X": [self.pick(avail)], "Y": [self.pick(avail)]}
            elif kind == "sum":
                ins = {"X": [self.pick(avail) for _ in range(self.draw(st.integers(1, 3)))]}
            else:
                ins = {"X": [self.pick(avail)]}
            outs = {"Out": [out]}
        attrs = {"scale": 2.0} if kind == "scale" else {}
        block.append_op(kind, ins, outs, attrs, role=role, role_var=role_var)
        return [n for ns in ins.values() for n in ns], [out]

    def cond_op(self, parent, avail, depth):
        """Append a conditional_block to ``parent``; its sub-block reads and rewrites
        names of ``avail`` (those with a value, visible in ``parent``), writes locals
        and brand-new names of ``parent``, and may nest one more level.

        Returns (reads, writes) among the names visible in ``parent``: what the graph
        must treat as the op's reads and writes.
        """
        sub = self.program.create_block(parent.idx)
        visible = set(avail)
        reads, writes = set(), set()
        for _ in range(self.draw(st.integers(1, 4))):
            if depth < 2 and self.draw(st.integers(0, 3)) == 0:
                r, w = self.cond_op(sub, visible, depth + 1)
            else:
                where = self.draw(st.sampled_from(["rewrite", "local", "new_outer"]))
                if where == "rewrite":
                    out = self.pick(visible)
                else:
                    out = self.new_name(sub if where == "local" else parent,
                                        "l" if where == "local" else "t")
                r, w = self.simple_op(sub, visible, out)
            visible |= set(w)
            reads |= {n for n in r if n not in sub.vars}
            writes |= {n for n in w if n not in sub.vars}
        # Input: outer reads that already hold a value, and the rewritten names (they
        # keep their value when the condition is false); Out: every outer write.
        ins = sorted((reads | writes) & set(avail))
        parent.append_op("conditional_block", {"Input": ins}, {"Out": sorted(writes)},
                         {"sub_block": BlockRef(sub.idx)})
        return reads | set(ins), writes


@st.composite
def random_programs(draw, max_ops=10):
    """A random valid program and, per block-0 op, the (reads, writes) it must have."""
    prog = Program()
    b0 = prog.global_block()
    b0.create_var("lr", [1], "float32", persistable=True)
    pool = [f"p{i}" for i in range(draw(st.integers(2, 5)))]
    for p in pool:
        b0.create_var(p, [4], "float32", persistable=True)
    gen = _Gen(draw, prog)
    avail = set(pool)  # float [4] names holding a value
    io = []
    n_grads = 0
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(["op", "op", "op", "cond", "grad"]))
        if kind == "cond":
            r, w = gen.cond_op(b0, avail, 1)
        elif kind == "grad" and n_grads < 3:
            # a backward op producing the gradient of a pool var: it gets a collective
            n_grads += 1
            out = gen.new_name(b0, "g")
            r, w = gen.simple_op(b0, avail, out, role="backward",
                                 role_var=[(gen.pick(pool), out)])
        else:
            out = gen.pick(avail) if draw(st.booleans()) else gen.new_name(b0)
            r, w = gen.simple_op(b0, avail, out)
        avail |= set(w)
        io.append((set(r), set(w)))
    return prog, io


def expected_versions(program, io, graph):
    """Sequential semantics per place, and the expected collectives.

    Returns ``({(op_index, place): (read versions, write versions)}, [var_names of each
    collective])``. Walks block 0 in program order; a collective writes a gradient
    right after the op producing it (an all-reduce every place, a reduce the owner).
    With ``fuse_all_reduce_ops`` gradients wait in a bucket that is all-reduced when
    it fills (the first one at 1 MiB at most), before an op touches one of them, or
    at the end of the program.
    """
    strategy = graph.strategy
    n = len(graph.places)
    reduce_mode = strategy.reduce_strategy == "reduce"
    fuse = strategy.fuse_all_reduce_ops and not reduce_mode
    cap = strategy.fuse_bucket_mb * (1 << 20)
    first_cap = min(1 << 20, cap)
    state = [dict() for _ in range(n)]
    out, collectives, bucket = {}, [], []

    def reduce_(grads, places):
        collectives.append(list(grads))
        for pi in places:
            for grad in grads:
                state[pi][grad] += 1

    for i, (op, (reads, writes)) in enumerate(zip(program.global_block().ops, io, strict=True)):
        if fuse and (reads | writes) & set(bucket):
            reduce_(bucket, range(n))
            bucket = []
        for pi in range(n):
            rv = {}
            for name in reads:
                rv[name] = state[pi].setdefault(name, 0)
            wv = {}
            for name in writes:
                state[pi][name] = wv[name] = state[pi].get(name, 0) + 1
            out[i, pi] = (rv, wv)
        for param, grad in op.role_var if op.role == "backward" else ():
            if reduce_mode:
                reduce_([grad], [graph.param_owner[param]])
            elif fuse:
                bucket.append(grad)
                if grad_bytes(program, grad) * len(bucket) >= \
                        (first_cap if not collectives else cap):
                    reduce_(bucket, range(n))
                    bucket = []
            else:
                reduce_([grad], range(n))
    if bucket:
        reduce_(bucket, range(n))
    return out, collectives


def random_topological_order(graph, rng):
    indeg = {op.id: len(op.producers()) for op in graph.ops}
    succ = collections.defaultdict(list)
    for op in graph.ops:
        for p in op.producers():
            succ[p.id].append(op.id)
    ready = [i for i, d in indeg.items() if d == 0]
    order = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(graph.ops[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    assert len(order) == len(graph.ops)
    return order


build_options = st.fixed_dictionaries({
    "places": st.integers(1, 8),
    "reduce_strategy": st.sampled_from(["all_reduce", "reduce"]),
    "sequential": st.booleans(),
    "fuse_all_reduce_ops": st.booleans(),
    # gradients here are 16 bytes: buckets of 1, 2 or all of them
    "fuse_bucket_mb": st.sampled_from([1e-6, 3e-5, 25.0]),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), build_options, st.randoms(use_true_random=False))
def test_random_programs(prog_io, opts, rng):
    prog, io = prog_io
    prog.validate()  # the generator only makes valid programs
    n = opts["places"]
    g = build_ssa_graph(prog, cpu_places(n), BuildStrategy(
        reduce_strategy=opts["reduce_strategy"],
        enable_sequential_execution=opts["sequential"],
        fuse_all_reduce_ops=opts["fuse_all_reduce_ops"], fuse_bucket_mb=opts["fuse_bucket_mb"]))
    check_invariants(g)
    ops = prog.global_block().ops

    # one handle per op and place; reads/writes as the generator meant them
    handles = compute_handles(g)
    assert len(handles) == len(ops) * n
    assert collections.Counter((h.op_index, h.place_idx) for h in handles) == \
        collections.Counter((i, pi) for i in range(len(ops)) for pi in range(n))
    for i, op in enumerate(ops):
        reads, writes = op_reads_writes(prog, op)
        assert (set(reads), set(writes)) == io[i], (i, op)
    for h in handles:
        reads, writes = io[h.op_index]
        assert {v.name for v in h.inputs if not v.is_dummy} == reads
        assert {v.name for v in h.outputs if not v.is_dummy} == writes
        assert {v.place_idx for v in h.inputs + h.outputs if not v.is_dummy} <= {h.place_idx}

    # every read sees the version the sequential program would see; the collectives
    # reduce each gradient once, in program order, chained
    expect, collectives = expected_versions(prog, io, g)
    assert [h.var_names for h in g.collectives] == collectives
    assert [gr for names in collectives for gr in names] == [gr for _, gr in g.param_grads()]
    anc = ancestor_bits(g)
    for a, b in zip(g.collectives, g.collectives[1:]):
        assert (anc[b.id] >> a.id) & 1
    for h in handles:
        rv, wv = expect[h.op_index, h.place_idx]
        assert {v.name: v.version for v in h.inputs if not v.is_dummy} == rv, h.name
        assert {v.name: v.version for v in h.outputs if not v.is_dummy} == wv, h.name

    # any topological order, replayed, has each read see the then-latest version
    current = {}
    for pi, names in enumerate(g.vars):
        for name, versions in names.items():
            current[pi, name] = 0 if versions[0].generated_op is None else -1
    for h in random_topological_order(g, rng):
        for v in h.inputs:
            if not v.is_dummy:
                assert v.version == current[v.place_idx, v.name], (h.name, v)
        for v in h.outputs:
            if not v.is_dummy:
                assert v.version == current[v.place_idx, v.name] + 1, (h.name, v)
                current[v.place_idx, v.name] = v.version
    for pi, names in enumerate(g.vars):
        for name, versions in names.items():
            assert current[pi, name] == len(versions) - 1

    if opts["sequential"]:
        for pi in range(n):
            hs = sorted(compute_handles(g, pi), key=lambda h: h.op_index)
            for a, b in zip(hs, hs[1:]):
                assert (anc[b.id] >> a.id) & 1


def test_nested_sub_block_locals_are_not_outer_names():
    # a name declared in block 1 and used by block 2 (nested in it) is local to the op
    prog = Program()
    b0 = prog.global_block()
    for name in ("a", "b"):
        b0.create_var(name, [4], persistable=True)
    b1 = prog.create_block(0)
    b1.create_var("loc", [4])
    b2 = prog.create_block(1)
    b1.append_op("relu", {"X": ["a"]}, {"Out": ["loc"]})
    b2.append_op("relu", {"X": ["loc"]}, {"Out": ["b"]})
    b1.append_op("conditional_block", {"Input": ["loc", "b"]}, {"Out": ["b"]},
                 {"sub_block": BlockRef(2)})
    op = b0.append_op("conditional_block", {"Input": ["a", "b"]}, {"Out": ["b"]},
                      {"sub_block": BlockRef(1)})
    prog.validate()
    assert op_reads_writes(prog, op) == (["a", "b"], ["b"])
    g = build_ssa_graph(prog, cpu_places(2))
    check_invariants(g)
    assert all("loc" not in names for names in g.vars)


# --- 3. broken graphs fail lint, naming the handle ---------------------------------------

def two_op_program(first, second):
    """Block 0 with two ops given as (type, inputs, outputs) over vars a, b, x, y."""
    prog = Program()
    b0 = prog.global_block()
    for name in ("a", "b", "x", "y"):
        b0.create_var(name, [4], persistable=True)
    for t, ins, outs in (first, second):
        b0.append_op(t, ins, outs)
    return prog


def remove_dummy(dummy):
    dummy.generated_op.outputs.remove(dummy)
    for op in dummy.pending_ops:
        op.inputs.remove(dummy)


def test_lint_catches_missing_war_edge():
    prog = two_op_program(("relu", {"X": ["x"]}, {"Out": ["y"]}),
                          ("assign", {"X": ["a"]}, {"Out": ["x"]}))
    g = build_ssa_graph(prog, cpu_places(2))
    check_invariants(g)
    wars = [d for d in g.dummies if d.reason == "war"]
    assert len(wars) == 2  # one per place
    reader, writer = wars[1].generated_op, wars[1].pending_ops[0]
    remove_dummy(wars[1])
    with pytest.raises(GraphError, match="write-after-read") as e:
        g.lint()
    assert reader.name in str(e.value) and writer.name in str(e.value)


def test_lint_catches_missing_waw_edge():
    prog = two_op_program(("assign", {"X": ["a"]}, {"Out": ["y"]}),
                          ("assign", {"X": ["b"]}, {"Out": ["y"]}))
    g = build_ssa_graph(prog, cpu_places(1))
    check_invariants(g)
    (waw,) = [d for d in g.dummies if d.reason == "waw"]
    second = waw.pending_ops[0]
    remove_dummy(waw)
    with pytest.raises(GraphError, match="write-after-write") as e:
        g.lint()
    assert second.name in str(e.value)


def test_lint_catches_cycle():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2))
    a = compute_handles(g, 0)[0]
    b = next(h for h in compute_handles(g, 0) if h.op.role == "optimize")
    assert nx.has_path(op_graph(g), a.id, b.id)
    g.depend(b, a, "x")
    with pytest.raises(GraphError, match="cycle") as e:
        g.lint()
    assert a.name in str(e.value)


def test_lint_catches_all_reduce_missing_a_place():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2))
    ar = g.ops_of_kind("all_reduce")[1]
    (v,) = [v for v in ar.inputs if not v.is_dummy and v.place_idx == 1]
    ar.inputs.remove(v)
    v.pending_ops.remove(ar)
    with pytest.raises(GraphError, match="does not span all 2 places") as e:
        g.lint()
    assert ar.name in str(e.value)


def test_lint_catches_duplicate_all_reduce():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2))
    grad = g.param_grads()[0][1]
    dup = g.add_op(AllReduceOpHandle([grad]))
    for pi in range(2):
        g.read(dup, pi, grad)
    for pi in range(2):
        g.write(dup, pi, grad)
    with pytest.raises(GraphError, match="reduced 2 times") as e:
        g.lint()
    assert dup.name in str(e.value)


def test_lint_catches_inconsistent_links():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2))
    h = compute_handles(g, 1)[3]
    h.inputs[0].pending_ops.remove(h)
    with pytest.raises(GraphError) as e:
        g.lint()
    assert h.name in str(e.value)


# --- 4. the seed's example ----------------------------------------------------------------

def test_seed_example_graph():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2))
    check_invariants(g)
    block_ops = main.global_block().ops
    want = collections.Counter(op.type for op in block_ops if op.role != "loss")
    assert want["mul"] == 2 and want["mul_grad"] == 2 and want["sgd"] == 4
    for pi in range(2):
        got = collections.Counter(h.op.type for h in compute_handles(g, pi))
        assert got == want
        for role in ("forward", "backward", "optimize"):
            assert sum(h.op.role == role for h in compute_handles(g, pi)) == \
                sum(op.role == role for op in block_ops)
    assert len(g.ops_of_kind("scale_loss_grad")) == 2
    all_reduces = g.ops_of_kind("all_reduce")
    assert len(all_reduces) == 4 == len(main.all_parameters())
    assert len(g.ops) == 2 * (len(block_ops) - 1) + 2 + 4
    for param, grad in g.param_grads():
        (ar,) = [h for h in all_reduces if h.var_names == [grad]]
        for pi in range(2):
            (sgd,) = [h for h in optimizer_handles(g, param) if h.place_idx == pi]
            assert sgd.op.type == "sgd"
            read = input_on(sgd, grad, pi)
            producer = input_on(ar, grad, pi).generated_op
            produced = output_on(producer, grad, pi)
            assert read.generated_op is ar
            assert read.version == produced.version + 1


# --- 5. export and debugging switches ---------------------------------------------------

def test_to_networkx_attributes():
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(2))
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    kinds = collections.Counter(d["kind"] for _, d in nxg.nodes(data=True))
    assert kinds["compute"] == len(compute_handles(g))
    assert kinds["all_reduce"] == 4 and kinds["scale_loss_grad"] == 2
    assert kinds["dummy"] == sum(1 for d in g.dummies if d.pending_ops)
    for node, d in nxg.nodes(data=True):
        assert set(d) >= {"kind", "place", "op_type", "var_name", "version"}
        if node.startswith("op:"):
            h = g.ops[int(node[3:])]
            assert d["kind"] == h.kind
            if h.kind == "compute":
                assert d["place"] == str(h.place) and d["op_type"] == h.op.type
        elif d["kind"] == "var":
            assert node == f"var:{d['place']}:{d['var_name']}@v{d['version']}"
            pi = [str(p) for p in g.places].index(d["place"])
            assert g.vars[pi][d["var_name"]][d["version"]] is not None
    for a, b, d in nxg.edges(data=True):
        assert d["dummy"] == (a.startswith("dummy:") or b.startswith("dummy:"))
    assert any(d["dummy"] for _, _, d in nxg.edges(data=True))


@pytest.mark.parametrize("n", (1, 3))
def test_to_dot_clusters_and_dashed_dummies(n):
    main, _, _ = model("seed_mlp")
    g = build_ssa_graph(main, cpu_places(n))
    dot = g.to_dot()
    assert dot.startswith("digraph")
    for pi in range(n):
        assert dot.count(f"subgraph cluster_place_{pi} ") == 1
    assert f"cluster_place_{n} " not in dot
    assert "style=dashed" in dot
    assert dot.count("style=dashed") >= sum(1 for d in g.dummies if d.pending_ops)
    assert "all_reduce(" in dot


def test_debug_graphviz_path(tmp_path):
    main, _, _ = model("seed_mlp")
    path = tmp_path / "g.dot"
    g = build_ssa_graph(main, cpu_places(2), BuildStrategy(debug_graphviz_path=str(path)))
    assert path.read_text() == g.to_dot()


@pytest.mark.parametrize("n", (1, 4))
def test_sequential_execution_orders_compute_ops(n):
    main, _, _ = model("mlp")
    g = build_ssa_graph(main, cpu_places(n), BuildStrategy(enable_sequential_execution=True))
    check_invariants(g)
    og = op_graph(g)
    for pi in range(n):
        hs = compute_handles(g, pi)
        assert [h.op_index for h in hs] == sorted(h.op_index for h in hs)
        assert nx.is_simple_path(og, [h.id for h in hs])  # a direct edge between neighbours
        for a, b in zip(hs, hs[1:]):
            assert og.has_edge(a.id, b.id), (a.name, b.name)
    plain = build_ssa_graph(main, cpu_places(n))
    assert len([d for d in g.dummies if d.reason == "sequential"]) > 0
    assert not [d for d in plain.dummies if d.reason == "sequential"]


# --- 6. bad arguments -----------------------------------------------------------------------

@pytest.mark.parametrize("places, message", [
    ([], "at least one place"),
    ([CPUPlace(0), CPUPlace(0)], "distinct"),
    (["cpu:0"], "Place"),
    ([CPUPlace(0), 1], "Place"),
])
def test_bad_places(places, message):
    main, _, _ = model("seed_mlp")
    with pytest.raises(GraphError, match=message):
        build_ssa_graph(main, places)


def test_not_a_program():
    with pytest.raises(GraphError, match="Program"):
        build_ssa_graph("main", cpu_places(1))


def test_unknown_fetch_var():
    main, _, _ = model("seed_mlp")
    with pytest.raises(GraphError, match="'no_such_var'.*not declared"):
        build_ssa_graph(main, cpu_places(2), fetch_list=["no_such_var"])


def test_fetch_var_nobody_touches():
    main, _, _ = model("seed_mlp")
    main2 = main.clone()
    main2.global_block().create_var("orphan", [1])
    with pytest.raises(GraphError, match="'orphan'.*nothing to fetch"):
        build_ssa_graph(main2, cpu_places(1), fetch_list=["orphan"])
