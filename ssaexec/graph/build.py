"""``build_ssa_graph``: replicate a program over places as a versioned SSA graph.

The graph is built by the ordered list of named passes of ``graph.passes``
(``PASSES``), as Paddle's ``multi_devices_graph_pass`` and the passes after it:
replicate each op of block 0 per place, seed the loss gradient, mark sparse
gradients, pick ZeRO/reduce owners, insert each gradient's collective, fuse
them into buckets, add the asynchronous waits, the sequential and the
collective-order edges, and the fetches. Each read binds to the latest version
of that name on that place and each write makes a new version (``SSAGraph.read``/
``write`` add the hazard edges) when the result is materialized. As RAF's
AutoDataParallel pass does after autodiff:

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

``BuildStrategy(debug_graphviz_path=PATH)`` writes the built graph's DOT text to
``PATH`` and the graph after each pass to ``PATH.<nn>_<pass>.dot`` (``pass_dump_path``).
"""

from ..core.errors import GraphError
from ..program.desc import Program
from ..core.place import Place
from ..core.strategy import BuildStrategy
from .passes import PASSES, _nbytes, grad_owners, materialize, op_reads_writes, run_passes

__all__ = ["build_ssa_graph", "op_reads_writes", "grad_owners", "graph_after_each_pass",
           "pass_dump_path"]


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


def pass_dump_path(path, k, name):
    """Where the graph after pass number ``k`` (from 1) named ``name`` is written."""
    return f"{path}.{k:02d}_{name}.dot"


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
    path = strategy.debug_graphviz_path
    after = None
    if path:
        numbered = {p.name: k for k, p in enumerate(PASSES, 1)}

        def after(p, bg):
            _write(pass_dump_path(path, numbered[p.name], p.name), materialize(bg).to_dot())
    g = materialize(run_passes(program, places, strategy, fetch_list, after=after))
    if path:
        _write(path, g.to_dot())
    return g


def graph_after_each_pass(program, places, build_strategy=None, fetch_list=None):
    """[(pass, SSAGraph)]: the graph after each pass of ``PASSES``, in order (the last is
    ``build_ssa_graph``'s). Writes no debugging files."""
    places = _check_args(program, places)
    strategy = build_strategy or BuildStrategy()
    out = []
    run_passes(program, places, strategy, fetch_list,
               after=lambda p, bg: out.append((p, materialize(bg))))
    return out


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
