"""The stream-wait plan (pure, no GPU needed): only cross-stream edges synchronise."""

import ssaexec as se
from ssaexec.program.example_models import build_mlp
from ssaexec.runtime.streams import external_inputs, plan_stream_waits, plan_streams, stream_key


def test_only_cross_stream_edges_wait():
    main, _, loss = build_mlp(in_dim=6, hidden=(4,))
    graph = se.build_ssa_graph(main, se.cpu_places(2), fetch_list=[loss])
    waits, records = plan_stream_waits(graph)
    keys = [stream_key(op) for op in graph.ops]
    for op in graph.ops:
        for p in op.producers():
            crosses = keys[p.id] != keys[op.id]
            assert (p.id in waits[op.id]) == crosses
            if crosses:
                assert records[p.id]
    for op in graph.ops_of_kind("all_reduce"):
        assert keys[op.id] == (0, "comm")
        # every all-reduce waits for the grad producers on both places' compute streams
        producers = {p.id for p in op.producers() if p.kind == "compute"}
        assert producers and producers <= set(waits[op.id])
    for op in graph.ops_of_kind("compute"):
        if op.op.role == "optimize":
            assert any(graph.ops[j].kind == "all_reduce" for j in waits[op.id])
    fetch = graph.fetches[0]
    assert keys[fetch.id] == (0, "fetch") and waits[fetch.id]


def test_program_order_on_one_stream_needs_no_event():
    main, _, _ = build_mlp(in_dim=6, hidden=(4,))
    graph = se.build_ssa_graph(main, [se.CPUPlace(0)])
    waits, _ = plan_stream_waits(graph)
    fwd = [op for op in graph.ops_of_kind("compute") if op.op.role == "forward"]
    assert all(waits[op.id] == () for op in fwd)


def test_a_consumer_on_streams_its_producer_entered_needs_no_event():
    """Collectives in chain order enter the same comm streams: stream order is enough."""
    main, _, loss = build_mlp(in_dim=6, hidden=(4,))
    graph = se.build_ssa_graph(main, se.cpu_places(2), fetch_list=[loss])
    plan = plan_streams(graph.ops)
    chained = 0
    for op in graph.collectives:
        assert plan.enters[op.id] == ((0, "comm"), (1, "comm"))
        for p in op.producers():
            if p.is_collective:
                chained += 1
                assert p.id not in plan.waits[op.id]
    assert chained


def test_external_inputs_are_the_feeds():
    main, _, loss = build_mlp(in_dim=6, hidden=(4,))
    graph = se.build_ssa_graph(main, se.cpu_places(2), fetch_list=[loss])
    assert sorted(external_inputs(graph)) == [(0, "img"), (0, "label"), (1, "img"),
                                              (1, "label")]
