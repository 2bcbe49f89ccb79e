"""Graph building as named passes (``ssaexec.graph.passes``): each pass alone, the dumps
after each pass, and the whole pipeline against the goldens of the one-walk builder.

Each pass test runs the pipeline up to the pass (``run_passes``), then the pass, and
checks what it added or changed on a small program; ``materialize`` turns either side
into an ``SSAGraph`` where the check is about versions or edges.
"""

import json

import pytest

import graph_golden as golden
from ssaexec.core.errors import GraphError
from ssaexec.graph.build import build_ssa_graph, graph_after_each_pass, pass_dump_path
from ssaexec.graph.passes import (PASS_NAMES, PASSES, BuildGraph, Edge, Node, grad_owners,
                                  materialize, op_reads_writes, run_passes)
from ssaexec.graph.ssa import (AllGatherOpHandle, AllReduceOpHandle, AllReduceWaitOpHandle,
                               BroadcastOpHandle, CollectiveOpHandle, ComputationOpHandle,
                               FetchOpHandle, FreeOpHandle, ReduceOpHandle,
                               ReduceScatterOpHandle, ScaleLossGradOpHandle)
from ssaexec.core.place import cpu_places
from ssaexec.core.strategy import BuildStrategy
from ssaexec.program.shard import layer_of


def around(name, prog="seed_mlp", places=2, fetch=True, **strategy):
    """(before, after): the ``BuildGraph`` just before and just after pass ``name``."""
    main, _, loss = golden.program(prog)
    k = PASS_NAMES.index(name)
    before = run_passes(main, cpu_places(places), BuildStrategy(**strategy),
                        [loss] if fetch else (), passes=PASSES[:k])
    return before, PASSES[k](before)


def nodes_of(bg, cls):
    return [n for n in bg.nodes if n.cls is cls]


def grads_of(prog="seed_mlp"):
    main = golden.program(prog)[0]
    return [g for op in main.global_block().ops if op.role == "backward"
            for _, g in op.role_var]


# --- the pipeline -------------------------------------------------------------------------

def test_the_pass_list_is_named_and_ordered():
    assert PASS_NAMES == ("replicate", "gradient_scale", "sparse_gradients", "zero_owners",
                          "insert_collectives", "shard_collectives", "fuse_buckets",
                          "async_wait", "sequential", "collective_order", "fetch")
    assert all(p.doc and callable(p.fn) for p in PASSES)
    # build_ssa_graph is the pipeline, materialized
    main, _, loss = golden.program("seed_mlp")
    bg = run_passes(main, cpu_places(2), BuildStrategy(), [loss])
    assert golden.canonical(materialize(bg)) == \
        golden.canonical(build_ssa_graph(main, cpu_places(2), fetch_list=[loss]))


@pytest.mark.parametrize("prog", sorted(golden.PROGRAMS))
def test_graphs_equal_the_goldens_of_the_one_walk_builder(prog):
    gold = json.loads(golden.GOLDEN.read_text())
    cases = [c for c in golden.cases() if c.startswith(prog + "/")]
    assert len(cases) == len(golden.PLACES) * len(golden.STRATEGIES)
    for case in cases:
        text = golden.canonical(build_case_or_error(case))
        if case in gold["texts"] and text != gold["texts"][case]:
            old, new = gold["texts"][case].splitlines(), text.splitlines()
            first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b),
                         min(len(old), len(new)))
            pytest.fail(f"{case}: line {first} differs:\n  golden: "
                        f"{old[first] if first < len(old) else '<end>'}\n  now:    "
                        f"{new[first] if first < len(new) else '<end>'}")
        assert golden.digest(text) == gold["hashes"][case], case


def build_case_or_error(case):
    g = golden.build_case(case)
    g.lint()
    return g


def test_no_pass_mutates_its_input():
    main, _, loss = golden.program("embedding")
    strategy = BuildStrategy(reduce_strategy="reduce", enable_sequential_execution=True,
                             num_trainers=2)
    seen = []
    run_passes(main, cpu_places(2), strategy, [loss],
               after=lambda p, bg: seen.append((p.name, bg, bg.items)))
    for name, bg, items in seen:
        assert bg.items is items and all(isinstance(it, (Node, Edge)) for it in items), name


# --- each pass ----------------------------------------------------------------------------

def test_replicate_makes_one_compute_node_per_op_and_place():
    _, bg = around("replicate", places=3)
    main = golden.program("seed_mlp")[0]
    ops = main.global_block().ops
    assert [(n.op_index, n.place_idx) for n in bg.nodes] == \
        [(i, pi) for i in range(len(ops)) for pi in range(3)]
    assert all(n.cls is ComputationOpHandle for n in bg.nodes)
    for n in bg.nodes:
        reads, writes = op_reads_writes(main, ops[n.op_index])
        assert n.io == (("read", (n.place_idx,), tuple(reads)),
                        ("write", (n.place_idx,), tuple(writes)))
    g = materialize(bg)
    assert not g.collectives and not g.fetches and not g.ops_of_kind(CollectiveOpHandle)
    assert {d.reason for d in g.dummies} <= {"war", "waw"}  # hazards come with versions


@pytest.mark.parametrize("scale,coeff", [("coeff_num_device", 1 / (2 * 3 * 4)),
                                         ("one", 1.0), ("customized", None)])
def test_gradient_scale_seeds_the_loss_gradient(scale, coeff):
    before, after = around("gradient_scale", places=3, gradient_scale_strategy=scale,
                           num_trainers=2, gradient_accumulation_steps=4)
    loss_nodes = [n for n in before.nodes if n.op.role == "loss"]
    assert len(loss_nodes) == 3
    seeds = nodes_of(after, ScaleLossGradOpHandle)
    rest = [n for n in after.nodes if n.cls is ComputationOpHandle]
    assert rest == [n for n in before.nodes if n.op.role != "loss"]  # the same nodes
    if coeff is None:
        assert seeds == []
        return
    assert [n.place_idx for n in seeds] == [0, 1, 2]
    g = materialize(after)
    handles = g.ops_of_kind(ScaleLossGradOpHandle)
    assert [h.coeff for h in handles] == pytest.approx([coeff] * 3)
    assert all(len(h.inputs) == 0 and len(h.outputs) == 1 for h in handles)


def test_sparse_gradients_marks_or_densifies_sparse_grad_ops():
    main = golden.program("embedding_twice")[0]
    before, after = around("sparse_gradients", prog="embedding_twice")
    sparse = {n.op.type for n in after.nodes if n.sparse}
    assert sparse == {"lookup_table_grad", "sum"}  # the sum of two sparse gradients too
    assert not any(n.sparse for n in before.nodes)
    _, dense = around("sparse_gradients", prog="embedding_twice", sparse_gradients=False)
    changed = [n for n in dense.nodes if n.op.attrs.get("is_sparse") is False]
    assert {n.op.type for n in changed} == {"lookup_table_grad"} and not any(
        n.sparse for n in dense.nodes)
    assert all(op.attrs.get("is_sparse") is not False for op in main.global_block().ops
               if op.type == "lookup_table_grad")  # the program keeps its is_sparse
    b, a = around("sparse_gradients")  # nothing sparse: the input itself
    assert a is b


@pytest.mark.parametrize("strategy", [{"reduce_strategy": "reduce"}])
def test_zero_owners_keeps_each_optimizer_op_on_its_owner(strategy):
    main = golden.program("mlp")[0]
    before, after = around("zero_owners", prog="mlp", places=3, **strategy)
    pg = [(p, g) for op in main.global_block().ops if op.role == "backward"
          for p, g in op.role_var]
    assert after.param_owner == grad_owners(main, pg, 3)
    assert len(set(after.param_owner.values())) == 3  # balanced over all places
    opt = [n for n in after.nodes if n.op.role == "optimize" and n.op.role_var]
    assert opt and all(n.place_idx == after.param_owner[n.op.role_var[0][0]] for n in opt)
    assert len(before.nodes) - len(after.nodes) == 2 * len(opt)
    b, a = around("zero_owners", prog="mlp")
    assert a is b and a.param_owner == {}
    b, a = around("zero_owners", prog="mlp", zero_stage=2)
    assert a is b and a.param_owner == {}  # ZeRO shards: shard_collectives


def test_insert_collectives_all_reduces_each_gradient_after_its_producer():
    _, bg = around("insert_collectives", places=2)
    items = list(bg.items)
    ars = nodes_of(bg, AllReduceOpHandle)
    assert [n.names for n in ars] == [[g] for g in grads_of()]
    for n in ars:
        k = items.index(n)
        producer = [it for it in items[:k] if it.cls is ComputationOpHandle][-1]
        assert producer.op.role == "backward" and n.names[0] in producer.op.output_names()
        assert n.bucketable and n.args[1] is None
    g = materialize(bg)
    for h in g.ops_of_kind(AllReduceOpHandle):  # reads and writes the gradient on every place
        assert sorted(v.place_idx for v in h.inputs if not v.is_dummy) == [0, 1]
        assert sorted(v.place_idx for v in h.outputs if not v.is_dummy) == [0, 1]


def test_insert_collectives_reduces_to_owners_and_broadcasts():
    _, bg = around("insert_collectives", places=2, reduce_strategy="reduce")
    reduces = nodes_of(bg, ReduceOpHandle)
    assert [n.names for n in reduces] == [[g] for g in grads_of()]
    casts = nodes_of(bg, BroadcastOpHandle)
    assert len(casts) == len(reduces) and not nodes_of(bg, AllReduceOpHandle)
    for n in casts:
        k = list(bg.items).index(n)
        opt = bg.items[k - 1]
        assert opt.op.role == "optimize" and n.args == ([opt.op.role_var[0][0]], opt.place_idx)
    _, one = around("insert_collectives", places=1, reduce_strategy="reduce")
    assert not nodes_of(one, BroadcastOpHandle)  # nothing to send on one place


def test_insert_collectives_sends_sparse_gradients_uncompressed_and_alone():
    _, bg = around("insert_collectives", prog="embedding", allreduce_dtype="bf16")
    by_grad = {n.names[0]: n for n in nodes_of(bg, AllReduceOpHandle)}
    sparse = [n for n in by_grad.values() if n.sparse]
    assert len(sparse) == 1 and sparse[0].args[1] is None and not sparse[0].bucketable
    assert all(n.args[1] == "bfloat16" for n in by_grad.values() if not n.sparse)


@pytest.mark.parametrize("mb", [25.0, 0.0005])
def test_fuse_buckets_all_reduces_each_dense_gradient_once_per_bucket(mb):
    before, after = around("fuse_buckets", prog="mlp", fuse_all_reduce_ops=True,
                           fuse_bucket_mb=mb)
    buckets = nodes_of(after, AllReduceOpHandle)
    names = [g for n in buckets for g in n.names]
    assert sorted(names) == sorted(grads_of("mlp")) and len(set(names)) == len(names)
    per_grad = len(nodes_of(before, AllReduceOpHandle))
    assert (len(buckets) < per_grad) if mb == 25.0 else (len(buckets) > 1)
    g = materialize(after)
    for h in g.ops_of_kind(AllReduceOpHandle):  # before every optimizer op reading its grads
        for v in h.outputs:
            assert v.is_dummy or all(r.id > h.id for r in v.pending_ops)
    b, a = around("fuse_buckets", prog="mlp", fuse_all_reduce_ops=False)
    assert a is b
    b, a = around("fuse_buckets", prog="mlp", fuse_all_reduce_ops=True,
                  reduce_strategy="reduce")
    assert a is b  # reduce strategies never bucket


@pytest.mark.parametrize("stage", [1, 2])
def test_shard_collectives_reduce_scatter_each_gradient_and_gather_each_update(stage):
    before, after = around("shard_collectives", prog="mlp", places=3, zero_stage=stage)
    layout = after.shard_layout
    assert layout.world == 3 and layout.stage == stage and len(layout) == 6
    assert not nodes_of(before, ReduceScatterOpHandle) and \
        not nodes_of(before, AllReduceOpHandle)  # insert_collectives left them to ZeRO
    g = materialize(after)
    layer = {sp.grad: layer_of(sp.name) for sp in layout}
    scatters = g.ops_of_kind(ReduceScatterOpHandle)
    # one reduce-scatter a layer (fc_0..fc_2: its weight's and bias's gradients)
    assert len(scatters) == 3 and sorted(n for h in scatters for n in h.var_names) == \
        sorted(layer)
    for rs in scatters:
        assert len({layer[n] for n in rs.var_names}) == 1
        producer = {v.generated_op.op_index for v in rs.inputs if not v.is_dummy}
        writers = [h for h in g.ops if isinstance(h, ComputationOpHandle)
                   and any(v.name in rs.var_names for v in h.outputs)]
        assert {h.op_index for h in writers} == producer  # after the layer's gradient ops
        frees = [h for h in g.ops_of_kind(FreeOpHandle) if h.var_names == rs.var_names]
        assert len(frees) == (3 if stage == 2 else 0)  # stage 2 drops the full gradients
        assert all(rs in [d.generated_op for d in f.inputs] for f in frees)
    gathers = g.ops_of_kind(AllGatherOpHandle)
    assert len(gathers) == 3 and sorted(n for h in gathers for n in h.var_names) == \
        sorted(sp.name for sp in layout)
    for ag in gathers:  # after the updates of the layer's parameters on every place
        upd = {v.generated_op for v in ag.inputs
               if not v.is_dummy and v.name.endswith("@SHARD")}
        assert len(upd) == 3 * len(ag.var_names) and \
            all(h.op.role == "optimize" for h in upd)
    # every optimizer op on every place runs on the shards
    opt = [h for h in g.ops if isinstance(h, ComputationOpHandle) and h.op.role == "optimize"
           and h.op.role_var]
    assert len(opt) == 18 and all(h.op.input("Param")[0].endswith("@SHARD") for h in opt)
    g.lint()


@pytest.mark.parametrize("reshard", [True, False])
def test_stage3_gathers_before_first_use_frees_after_last_with_prefetch_edges(reshard):
    main, _, loss = golden.program("mlp")
    bs = BuildStrategy(zero_stage=3, reshard_after_forward=reshard, zero_prefetch=1)
    g = build_ssa_graph(main, cpu_places(2), bs, [loss])
    g.lint()
    gathers = g.ops_of_kind(AllGatherOpHandle)
    # a group: the adjacent parameters of one layer (program.shard.layer_of) in a
    # phase: fc_i's weight (read by mul) and bias (by elementwise_add) together
    assert len(gathers) == 3 * (2 if reshard else 1)
    assert sorted(n for h in gathers for n in h.var_names) == \
        sorted([sp.name for sp in g.shard_layout] * (2 if reshard else 1))
    for h in gathers:  # right before the group's first reader: the next handles
        first = min(r.id for v in h.outputs if not v.is_dummy for r in v.pending_ops)
        assert all(isinstance(x, ComputationOpHandle) or x.is_collective
                   for x in g.ops[h.id + 1:first + 1])
    for name in (sp.name for sp in g.shard_layout):
        versions = g.vars[0][name]
        writers = [type(v.generated_op).__name__ for v in versions]
        assert not versions[0].pending_ops  # stage 3: no place holds it when a step starts
        assert writers[1:] == ["AllGatherOpHandle", "FreeOpHandle"] * (2 if reshard else 1)
        assert not versions[-1].pending_ops  # nothing reads a freed parameter
    prefetch = [d for d in g.dummies if d.reason == "prefetch"]
    # gather k waits for the first readers (2 places) of group k-2
    assert len(prefetch) == 2 * (len(gathers) - 2)
    assert all(isinstance(d.generated_op, ComputationOpHandle) and
               all(isinstance(r, AllGatherOpHandle) for r in d.pending_ops) for d in prefetch)
    # the collectives are one chain in program order, gathers included
    assert [h.seq for h in g.collectives] == list(range(len(g.collectives)))


def test_shard_collectives_is_a_no_op_without_zero_or_on_one_rank():
    b, a = around("shard_collectives", prog="mlp")
    assert a is b and a.shard_layout is None
    b, a = around("shard_collectives", prog="mlp", places=1, zero_stage=3)
    assert a is b and a.shard_layout is None


def test_fuse_buckets_leaves_sparse_gradients_alone():
    _, after = around("fuse_buckets", prog="embedding", fuse_all_reduce_ops=True)
    alone = [n for n in nodes_of(after, AllReduceOpHandle) if n.sparse]
    assert len(alone) == 1 and len(alone[0].names) == 1


def test_async_wait_follows_each_all_reduce():
    before, after = around("async_wait", num_trainers=2, fuse_all_reduce_ops=False)
    items = list(after.items)
    ars = nodes_of(after, AllReduceOpHandle)
    assert ars == nodes_of(before, AllReduceOpHandle) and len(ars) == len(grads_of())
    for n in ars:
        wait = items[items.index(n) + 1]
        assert wait.cls is AllReduceWaitOpHandle and wait.args == (n,)
    g = materialize(after)
    for h in g.ops_of_kind(AllReduceOpHandle):
        assert isinstance(h.wait, AllReduceWaitOpHandle) and h.wait.start is h
        assert any(d.is_dummy and d.reason == "async" for d in h.wait.inputs)
    for strategy in ({"num_trainers": 2, "async_allreduce": False}, {}):
        b, a = around("async_wait", **strategy)
        assert a is b


def test_sequential_chains_compute_nodes_per_place():
    _, after = around("sequential", places=2, enable_sequential_execution=True)
    g = materialize(after)
    for pi in range(2):
        hs = [h for h in g.ops_of_kind(ComputationOpHandle) if h.place_idx == pi]
        for a, b in zip(hs, hs[1:]):
            assert any(d.is_dummy and d.reason == "sequential" and d.generated_op is a
                       for d in b.inputs) or any(v.generated_op is a for v in b.inputs)
    assert any(d.reason == "sequential" for d in g.dummies)
    b, a = around("sequential")
    assert a is b


def test_collective_order_chains_collectives_in_creation_order():
    before, after = around("collective_order", places=2, reduce_strategy="reduce")
    chain = [n for n in before.nodes if issubclass(n.cls, CollectiveOpHandle)]
    assert list(after.collectives) == chain and len(chain) == 2 * len(grads_of())
    edges = [it for it in after.items if isinstance(it, Edge)]
    assert [(e.before, e.after) for e in edges] == list(zip(chain, chain[1:]))
    g = materialize(after)
    assert [h.seq for h in g.collectives] == list(range(len(chain)))
    assert [h.id for h in g.collectives] == sorted(h.id for h in g.collectives)


def test_fetch_reads_every_place_and_refuses_unknown_vars():
    main, _, loss = golden.program("seed_mlp")
    before, after = around("fetch", places=3)
    (f,) = nodes_of(after, FetchOpHandle)
    assert f.io == (("read", range(3), (loss,)),)
    assert after.items[:-1] == before.items
    assert materialize(after).fetches[0].var_name == loss
    bg = BuildGraph(main, tuple(cpu_places(1)), BuildStrategy(), ("no_such_var",))
    with pytest.raises(GraphError, match="not declared"):
        PASSES[-1](bg)


# --- dumps after each pass ----------------------------------------------------------------

def test_debug_graphviz_path_writes_the_graph_after_each_pass(tmp_path):
    main, _, loss = golden.program("seed_mlp")
    path = tmp_path / "g.dot"
    strategy = BuildStrategy(debug_graphviz_path=str(path), reduce_strategy="reduce")
    g = build_ssa_graph(main, cpu_places(2), strategy, [loss])
    assert path.read_text() == g.to_dot()  # today's single file: the built graph
    steps = graph_after_each_pass(main, cpu_places(2), strategy, [loss])
    files = sorted(tmp_path.glob("g.dot.*.dot"))
    assert [f.name for f in files] == [pass_dump_path("g.dot", k, name)
                                       for k, name in enumerate(PASS_NAMES, 1)]
    for f, (p, graph) in zip(files, steps):
        assert f.read_text() == graph.to_dot(), p.name
    assert files[-1].read_text() == g.to_dot()
    assert "reduce(" not in files[3].read_text() and "reduce(" in files[4].read_text()
