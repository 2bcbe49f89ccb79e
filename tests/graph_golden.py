"""Golden graphs of ``build_ssa_graph``: the canonical text of every graph the suite's
strategy combinations build, so a change to how the graph is built (the pass list of
``ssaexec.graph.passes``) that changes any node, name, version or edge fails
``tests/graph/test_graph_passes.py``.

The canonical text names each op handle (id, class, name, place, what its kind
carries) and its inputs and outputs in order (``name@vN/pPLACE`` or
``~dummy_K:reason<-#I`` / ``->#J``), then the collective order, the fetches and the
owner places. The goldens hold its sha256 per case (the whole text of a few small
cases, to show a diff); regenerate them only from a build you trust:
``.venv/bin/python tests/graph_golden.py`` (it writes ``tests/data/graph_build_golden.json``).
"""

import functools
import hashlib
import json
import pathlib

import ssaexec as se
from ssaexec.graph.build import build_ssa_graph
from ssaexec.program.example_models import build_cnn, build_mlp, build_seed_mlp
from ssaexec.core.place import cpu_places
from ssaexec.program.desc import BlockRef
from ssaexec.core.strategy import BuildStrategy

GOLDEN = pathlib.Path(__file__).parent / "data" / "graph_build_golden.json"

# every strategy option the suite's BuildStrategy(...) calls use, alone and in the
# combinations they appear in (grep tests for BuildStrategy)
STRATEGIES = {
    "default": {},
    "reduce": {"reduce_strategy": "reduce"},
    "all_reduce": {"reduce_strategy": "all_reduce"},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "zero1_fused": {"zero_stage": 1, "fuse_all_reduce_ops": True},
    "zero3": {"zero_stage": 3},
    "zero3_keep": {"zero_stage": 3, "reshard_after_forward": False, "zero_prefetch": 0},
    "fused": {"fuse_all_reduce_ops": True},
    "fused_tiny": {"fuse_all_reduce_ops": True, "fuse_bucket_mb": 0.0005},
    "fused_bf16": {"fuse_all_reduce_ops": True, "allreduce_dtype": "bf16"},
    "no_fuse": {"fuse_all_reduce_ops": False},
    "bf16": {"allreduce_dtype": "bf16"},
    "fp16": {"allreduce_dtype": "fp16"},
    "scale_one": {"gradient_scale_strategy": "one"},
    "scale_customized": {"gradient_scale_strategy": "customized"},
    "accumulate2": {"gradient_accumulation_steps": 2},
    "accumulate2_fused": {"gradient_accumulation_steps": 2, "fuse_all_reduce_ops": True},
    "accumulate4_no_fuse": {"gradient_accumulation_steps": 4, "fuse_all_reduce_ops": False},
    "trainers2": {"num_trainers": 2, "trainer_id": 1},
    "trainers2_sync": {"num_trainers": 2, "async_allreduce": False},
    "trainers2_no_fuse": {"num_trainers": 2, "fuse_all_reduce_ops": False},
    "trainers3_reduce": {"num_trainers": 3, "trainer_id": 1, "reduce_strategy": "reduce"},
    "dense_fallback": {"sparse_gradients": False},
    "dense_fallback_fused": {"sparse_gradients": False, "fuse_all_reduce_ops": True},
    "sequential": {"enable_sequential_execution": True},
    "sequential_reduce": {"enable_sequential_execution": True, "reduce_strategy": "reduce"},
}


def _embedding_twice():
    # a sparse table read twice: its two sparse gradients are summed (sparse + sparse)
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        a = se.layers.data("a", shape=[-1, 3], dtype="int64")
        b = se.layers.data("b", shape=[-1, 3], dtype="int64")
        ea = se.layers.embedding(a, size=[50, 4], is_sparse=True, name="emb")
        w = main.global_block().var("emb.w_0")
        eb = se.layers.embedding(b, size=[50, 4], is_sparse=True, name="other")
        main.global_block().ops[-1].inputs["W"] = [w.name]
        loss = se.layers.mean(se.layers.elementwise_add(ea, eb))
        se.optimizer.SGD(0.5).minimize(loss)
    return main, startup, loss.name


def _embedding():
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        ids = se.layers.data("ids", shape=[-1, 4], dtype="int64")
        y = se.layers.data("y", shape=[-1, 1], dtype="float32")
        emb = se.layers.embedding(ids, size=[1000, 8], is_sparse=True)
        pred = se.layers.fc(se.layers.reduce_mean(emb, dim=1), size=1)
        loss = se.layers.mean(se.layers.square_error_cost(pred, y))
        se.optimizer.Adam(0.01).minimize(loss)
    return main, startup, loss.name


def _sub_block():
    prog = se.Program()
    g = prog.global_block()
    g.create_var("x", [-1, 3], "float64", is_data=True)
    g.create_var("flag", [1], "bool", is_data=True)
    g.create_var("y", [-1, 3], "float64")
    g.create_var("z", [-1, 3], "float64")
    g.append_op("scale", {"X": ["x"]}, {"Out": ["y"]}, {"scale": 2.0})
    sub = prog.create_block(parent_idx=0)
    sub.append_op("relu", {"X": ["y"]}, {"Out": ["y"]})
    g.append_op("conditional_block", {"Cond": ["flag"], "Input": ["y"]}, {"Out": ["y"]},
                {"sub_block": BlockRef(1)})
    g.append_op("elementwise_add", {"X": ["y"], "Y": ["x"]}, {"Out": ["z"]})
    return prog, None, "z"


def _model(build):
    main, startup, loss = build()
    return main, startup, getattr(loss, "name", loss)


PROGRAMS = {
    "seed_mlp": lambda: _model(build_seed_mlp),
    "mlp": lambda: _model(build_mlp),
    "cnn": lambda: _model(build_cnn),
    "embedding": _embedding,
    "embedding_twice": _embedding_twice,
    "sub_block": _sub_block,
}
PLACES = (1, 2, 3)
# full text kept for these, so a failure can show the first differing line
TEXT_CASES = ("seed_mlp/2/default", "seed_mlp/2/reduce", "seed_mlp/2/fused_tiny",
              "seed_mlp/2/trainers2", "embedding_twice/2/default", "sub_block/2/default")


@functools.lru_cache(maxsize=None)
def program(name):
    """(main, startup, fetch name); built once (the builder never mutates programs)."""
    return PROGRAMS[name]()


def cases():
    """Every case name ``program/places/strategy``."""
    return [f"{p}/{n}/{s}" for p in PROGRAMS for n in PLACES for s in STRATEGIES]


def build_case(case, build=build_ssa_graph, **kw):
    """The graph of ``case``, fetching the program's loss (or last var)."""
    prog, n, strat = case.split("/")
    main, _, fetch = program(prog)
    return build(main, cpu_places(int(n)), BuildStrategy(**STRATEGIES[strat]),
                 fetch_list=[fetch], **kw)


def _var(v, inbound):
    if v.is_dummy:
        if inbound:
            src = v.generated_op
            return f"~{v.name}:{v.reason}<-#{src.id if src is not None else '?'}"
        return f"~{v.name}:{v.reason}->" + ",".join(f"#{o.id}" for o in v.pending_ops)
    gen = v.generated_op.id if v.generated_op is not None else "-"
    return f"{v.name}@v{v.version}/p{v.place_idx}(w#{gen})"


_FIELDS = ("place_idx", "op_index", "var_names", "shard_names", "shapes", "seq", "wire_dtype",
           "owner_idx", "root_idx",
           "var_name", "coeff", "shape", "dtype")


def canonical(graph):
    """The graph as text: every op handle, var version and edge, in order."""
    lines = []
    for op in graph.ops:
        fields = [f"#{op.id}", type(op).__name__, op.name]
        desc = getattr(op, "op", None)
        if desc is not None:
            fields.append(f"op={desc.type}/{desc.role}/sparse={desc.attrs.get('is_sparse')}")
        for f in _FIELDS:
            try:
                value = getattr(op, f)
            except AttributeError:
                continue
            fields.append(f"{f}={value!r}")
        for f in ("wait", "start"):
            other = getattr(op, f, None)
            if other is not None:
                fields.append(f"{f}=#{other.id}")
        fields.append("in: " + " ".join(_var(v, True) for v in op.inputs))
        fields.append("out: " + " ".join(_var(v, False) for v in op.outputs))
        lines.append(" ".join(fields))
    for pi, names in enumerate(graph.vars):
        lines.append(f"vars p{pi}: " + " ".join(f"{k}:{len(v)}" for k, v in names.items()))
    lines.append("dummies: " + " ".join(f"{d.name}:{d.reason}" for d in graph.dummies))
    lines.append("collectives: " + " ".join(f"#{h.id}" for h in graph.collectives))
    lines.append("fetches: " + " ".join(f"#{h.id}" for h in graph.fetches))
    lines.append(f"param_owner: {sorted(graph.param_owner.items())}")
    return "\n".join(lines) + "\n"


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot():
    """{"hashes": {case: sha256}, "texts": {case: text}} of the current builder."""
    hashes, texts = {}, {}
    for case in cases():
        try:
            text = canonical(build_case(case))
        except Exception as e:  # a refused combination is part of the golden too
            text = f"error: {type(e).__name__}: {e}\n"
        hashes[case] = digest(text)
        if case in TEXT_CASES:
            texts[case] = text
    return {"hashes": hashes, "texts": texts}


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
