"""Static analysis of an SSA graph: sizes, critical path, width, traffic, memory.

``graph_stats(graph)`` gathers everything ``ssaexec stats`` prints; the pieces
are public so tests and notebooks can check one number at a time.
Definitions (all over the op-handle dependency DAG, where op B depends on op
A when B reads a var handle, dummy or not, that A generated):

* **level** of an op: 0 when it has no producers, else 1 + the largest level
  of its producers (the "as soon as possible" schedule with unit-time ops and
  unlimited threads).
* **critical path**: the longest chain of dependent ops, counted in ops
  (``max level + 1``). With unit-time ops no schedule finishes in fewer
  rounds. ``critical_path(graph, weight=...)`` takes per-op costs instead.
* **max width (level)**: the largest number of ops sharing one level: how
  many ops are ready at once in the level schedule. It is a lower bound of
* **max parallelism (antichain)**: the size of the largest set of ops no two
  of which depend on each other, directly or not. Every such set can be
  running at the same moment in some schedule, and no larger set can, so it
  is the exact answer to "how many ops could run at once". Computed exactly
  by Dilworth's theorem (``n`` minus a maximum matching in the bipartite
  graph of the transitive closure); skipped (``None``) above
  ``ANTICHAIN_LIMIT`` ops, where the closure gets too large.
* **collective traffic**: every collective's *payload* is the bytes of its
  vars on one place (declared shapes; a -1 dimension counts as 1). The bytes
  each place sends per step, on average, with ring (pipelined) algorithms over
  ``n`` places: all-reduce ``2 (n-1)/n x payload`` (a reduce-scatter and an
  all-gather, each ``(n-1)/n``), reduce and broadcast ``(n-1)/n x payload``
  (in all ``(n-1) x payload``: every non-root place must get or give the
  payload once); each collective handle class carries its ``traffic_factor``. Nothing moves when ``n == 1``.
  "On the wire" is the per-place figure times ``n``.
* **memory**: bytes of parameters, of their gradients (the ``role_var``
  pairs) and of the other persistable vars (optimizer state, running
  statistics, learning rates), per place and times the number of places.
  Activations are not counted: they depend on the batch size.
"""

from ..core.dtypes import torch_dtype

__all__ = ["op_levels", "critical_path", "level_widths", "max_width", "max_antichain_size",
           "collective_traffic", "memory_estimate", "var_counts", "op_counts", "graph_stats",
           "format_stats", "format_bytes", "ANTICHAIN_LIMIT"]

ANTICHAIN_LIMIT = 3000


def _producers(graph):
    return [[p.id for p in op.producers()] for op in graph.ops]


def _topo_ids(graph):
    return [op.id for op in graph.topological_order()]


def op_levels(graph):
    """Level of every op handle (list indexed by op id); see the module docstring."""
    prods = _producers(graph)
    level = [0] * len(graph.ops)
    for i in _topo_ids(graph):
        if prods[i]:
            level[i] = 1 + max(level[p] for p in prods[i])
    return level


def critical_path(graph, weight=None):
    """The longest dependency chain.

    Parameters
    ----------
    graph : SSAGraph
    weight : callable, optional
        ``weight(op_handle) -> float``; default 1 per op.

    Returns
    -------
    (length, ops) : (float, list of OpHandle)
        ``length`` is the summed weight of the chain (its number of ops by
        default); ``ops`` the chain from first to last (ties broken by lower id).
    """
    if not graph.ops:
        return 0, []
    prods = _producers(graph)
    w = [1 if weight is None else weight(op) for op in graph.ops]
    best = [0] * len(graph.ops)
    back = [None] * len(graph.ops)
    for i in _topo_ids(graph):
        top = None
        for p in sorted(prods[i]):
            if top is None or best[p] > best[top]:
                top = p
        best[i] = w[i] + (best[top] if top is not None else 0)
        back[i] = top
    end = max(range(len(graph.ops)), key=lambda i: (best[i], -i))
    chain = []
    i = end
    while i is not None:
        chain.append(graph.ops[i])
        i = back[i]
    chain.reverse()
    return best[end], chain


def level_widths(graph):
    """Number of ops at each level (list indexed by level)."""
    levels = op_levels(graph)
    widths = [0] * ((max(levels) + 1) if levels else 0)
    for lv in levels:
        widths[lv] += 1
    return widths


def max_width(graph):
    """(width, level): the most ops sharing one level, and the first level that has them."""
    widths = level_widths(graph)
    if not widths:
        return 0, None
    w = max(widths)
    return w, widths.index(w)


def max_antichain_size(graph, limit=ANTICHAIN_LIMIT):
    """Size of the largest set of mutually independent ops (None above ``limit`` ops).

    Dilworth: the largest antichain equals the fewest chains covering the
    partial order, ``n - |maximum matching|`` of the bipartite graph with an
    edge u -> v whenever u precedes v.
    """
    n = len(graph.ops)
    if n == 0:
        return 0
    if limit is not None and n > limit:
        return None
    prods = _producers(graph)
    order = _topo_ids(graph)
    # ancestors as Python-int bitsets, then successors-by-closure lists
    anc = [0] * n
    for i in order:
        a = 0
        for p in prods[i]:
            a |= anc[p] | (1 << p)
        anc[i] = a
    later = [[] for _ in range(n)]
    for v in range(n):
        a = anc[v]
        while a:
            low = a & -a
            later[low.bit_length() - 1].append(v)
            a ^= low
    return n - _max_matching(n, later)


def _max_matching(n, adj):
    # Hopcroft-Karp on the bipartite graph left u -> right v (both 0..n-1).
    inf = float("inf")
    match_l = [-1] * n
    match_r = [-1] * n
    dist = [0] * n

    def bfs():
        queue = [u for u in range(n) if match_l[u] == -1]
        for u in range(n):
            dist[u] = 0 if match_l[u] == -1 else inf
        found = False
        head = 0
        while head < len(queue):
            u = queue[head]
            head += 1
            for v in adj[u]:
                w = match_r[v]
                if w == -1:
                    found = True
                elif dist[w] == inf:
                    dist[w] = dist[u] + 1
                    queue.append(w)
        return found

    def dfs(u):
        # iterative DFS along layered alternating paths
        stack = [(u, iter(adj[u]))]
        path = []
        while stack:
            x, it = stack[-1]
            advanced = False
            for v in it:
                w = match_r[v]
                if w == -1:
                    path.append((x, v))
                    for a, b in path:
                        match_l[a], match_r[b] = b, a
                    return True
                if dist[w] == dist[x] + 1:
                    path.append((x, v))
                    stack.append((w, iter(adj[w])))
                    advanced = True
                    break
            if not advanced:
                dist[x] = inf
                stack.pop()
                if path:
                    path.pop()
        return False

    size = 0
    while bfs():
        for u in range(n):
            if match_l[u] == -1 and dfs(u):
                size += 1
    return size


def _var_bytes(program, name):
    var = program.global_block().find_var(name)
    if var is None or var.numel is None:
        return 0
    return var.numel * torch_dtype(var.dtype).itemsize


def collective_traffic(graph):
    """Collectives per kind and the bytes they move per step (see the module docstring).

    Returns
    -------
    dict
        ``{"count": int, "by_kind": {kind: {"count", "payload_bytes",
        "bytes_per_place", "formula"}}, "payload_bytes", "bytes_per_place",
        "bytes_on_wire"}``.
    """
    n = len(graph.places)
    by_kind = {}
    for op in graph.ops:
        if not op.is_collective:
            continue
        d = by_kind.setdefault(op.kind, {"count": 0, "payload_bytes": 0, "bytes_per_place": 0.0,
                                          "formula": op.traffic_formula})
        payload = op.nbytes(graph.program)
        d["count"] += 1
        d["payload_bytes"] += payload
        d["bytes_per_place"] += op.traffic_factor(n) * payload
    per_place = sum(d["bytes_per_place"] for d in by_kind.values())
    return {"count": sum(d["count"] for d in by_kind.values()), "by_kind": by_kind,
            "payload_bytes": sum(d["payload_bytes"] for d in by_kind.values()),
            "bytes_per_place": per_place, "bytes_on_wire": per_place * n}


def memory_estimate(graph):
    """Bytes of parameters, gradients and other persistables, per place and in total."""
    program = graph.program
    block = program.global_block()
    params = [v.name for v in program.all_parameters()]
    grads = list(dict.fromkeys(g for _, g in graph.param_grads()))
    other = [v.name for v in block.vars.values()
             if v.persistable and not v.is_parameter and not v.is_data]
    p = sum(_var_bytes(program, n) for n in params)
    g = sum(_var_bytes(program, n) for n in grads)
    o = sum(_var_bytes(program, n) for n in other)
    n = len(graph.places)
    return {"parameters": len(params), "parameter_bytes": p, "gradients": len(grads),
            "gradient_bytes": g, "other_persistables": len(other), "other_persistable_bytes": o,
            "per_place_bytes": p + g + o, "total_bytes": (p + g + o) * n}


def _place_key(op):
    return str(op.place) if op.on_one_place else "all"


def op_counts(graph):
    """``{"total", "by_kind": {kind: n}, "by_place": {place or "all": n}}``."""
    by_kind, by_place = {}, {str(p): 0 for p in graph.places}
    for op in graph.ops:
        by_kind[op.kind] = by_kind.get(op.kind, 0) + 1
        key = _place_key(op)
        by_place[key] = by_place.get(key, 0) + 1
    return {"total": len(graph.ops), "by_kind": by_kind, "by_place": by_place}


def var_counts(graph):
    """Var handles (every version) and distinct names per place, plus dummy vars by reason."""
    by_place = {}
    for place, names in zip(graph.places, graph.vars, strict=True):
        by_place[str(place)] = {"handles": sum(len(vs) for vs in names.values()),
                                "names": len(names)}
    reasons = {}
    for d in graph.dummies:
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    return {"handles": sum(d["handles"] for d in by_place.values()), "by_place": by_place,
            "dummies": len(graph.dummies), "dummies_by_reason": reasons}


def graph_stats(graph, antichain_limit=ANTICHAIN_LIMIT):
    """Every number ``ssaexec stats`` reports, as a JSON-ready dict."""
    length, chain = critical_path(graph)
    width, at_level = max_width(graph)
    strategy = graph.strategy
    return {
        "places": [str(p) for p in graph.places],
        "strategy": {"reduce_strategy": strategy.reduce_strategy,
                     "gradient_scale_strategy": strategy.gradient_scale_strategy},
        "ops": op_counts(graph),
        "vars": var_counts(graph),
        "critical_path": {"length": length, "ops": [op.name for op in chain]},
        "max_width": {"level_schedule": width, "at_level": at_level,
                      "levels": len(level_widths(graph)),
                      "antichain": max_antichain_size(graph, antichain_limit)},
        "collectives": collective_traffic(graph),
        "memory": memory_estimate(graph),
    }


def format_bytes(n):
    """``1536`` -> ``"1.5 KiB"``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _kv(d):
    return ", ".join(f"{k} {v}" for k, v in d.items())


def format_stats(stats, source=None):
    """The text report of ``graph_stats`` (what ``ssaexec stats`` prints)."""
    n = len(stats["places"])
    ops, vs, cp, mw = stats["ops"], stats["vars"], stats["critical_path"], stats["max_width"]
    coll, mem = stats["collectives"], stats["memory"]
    lines = []
    if source:
        lines.append(f"program         {source}")
    st = stats["strategy"]
    lines.append(f"places          {', '.join(stats['places'])} ({n})   "
                 f"[{st['reduce_strategy']}, loss grad scale {st['gradient_scale_strategy']}]")
    lines.append(f"op handles      {ops['total']}")
    lines.append(f"  by kind       {_kv(ops['by_kind'])}")
    lines.append(f"  by place      {_kv(ops['by_place'])}   (all = spans every place)")
    lines.append(f"var handles     {vs['handles']} (all versions)")
    lines.append("  by place      " + ", ".join(f"{p} {d['handles']} ({d['names']} names)"
                                               for p, d in vs["by_place"].items()))
    reasons = f" ({_kv(vs['dummies_by_reason'])})" if vs["dummies_by_reason"] else ""
    lines.append(f"  dummy vars    {vs['dummies']}{reasons}")
    chain = cp["ops"]
    shown = " -> ".join(chain) if len(chain) <= 6 else \
        " -> ".join(chain[:3]) + " -> ... -> " + " -> ".join(chain[-2:])
    lines.append(f"critical path   {cp['length']} ops: {shown}")
    anti = mw["antichain"]
    anti_s = f"{anti} ops (maximum antichain)" if anti is not None else \
        "not computed (graph too large)"
    lines.append(f"max width       {mw['level_schedule']} ops at level {mw['at_level']} of "
                 f"{mw['levels']} (level schedule); could run at once: {anti_s}")
    lines.append(f"collectives     {coll['count']} per step, payload "
                 f"{format_bytes(coll['payload_bytes'])}")
    for kind, d in coll["by_kind"].items():
        lines.append(f"  {kind:<13} {d['count']} x, payload {format_bytes(d['payload_bytes'])}, "
                     f"sent per place {format_bytes(d['bytes_per_place'])}  [{d['formula']}]")
    lines.append(f"  traffic       {format_bytes(coll['bytes_per_place'])} per place per step, "
                 f"{format_bytes(coll['bytes_on_wire'])} on the wire (n = {n})")
    lines.append(f"memory          per place: parameters {format_bytes(mem['parameter_bytes'])} "
                 f"({mem['parameters']}), gradients {format_bytes(mem['gradient_bytes'])} "
                 f"({mem['gradients']}), other persistables "
                 f"{format_bytes(mem['other_persistable_bytes'])} ({mem['other_persistables']})")
    lines.append(f"                total {format_bytes(mem['per_place_bytes'])} per place, "
                 f"{format_bytes(mem['total_bytes'])} over {n} places (activations not counted)")
    comp = stats.get("compiled")
    if comp:
        lines.append(f"compiled        {comp['segments']} segments of straight-line code "
                     f"(largest {comp['ops_per_segment']} ops), {comp['nodes']} scheduled nodes")
        lines.append(f"  aliasing      {comp['may_alias_results']} results may alias an input; "
                     f"copies per step: {comp['alias_copies']}, order edges added: "
                     f"{comp['alias_edges']}")
    return "\n".join(lines) + "\n"
