"""ZeRO ownership: which place keeps which optimizer state (``BuildStrategy(zero_stage=1|2)``).

Policy. Each parameter has an owner place (``graph.build.grad_owners``: balanced by
bytes, the same choice the graph builder makes for its updates). An optimizer state
var (a persistable, not a parameter) belongs to a parameter's owner when that one
parameter's update is its only reader; state read by anything else (several
parameters' updates, a non-optimizer op) stays on every place.

Invariant: no ZeRO, or a single place, owns nothing ({}), so every place keeps every
state var.
"""

from ..graph.build import grad_owners

__all__ = ["state_owners"]


def state_owners(program, build_strategy, num_places):
    """``{optimizer state var: owner place index}`` of ``program`` over ``num_places``
    places; {} without ZeRO or with one place."""
    if not build_strategy.zero_stage or num_places == 1:
        return {}
    block = program.global_block()
    owners = grad_owners(program, [pair for op in block.ops if op.role == "backward"
                                   for pair in op.role_var], num_places)
    users = {}  # persistable -> parameters whose update reads it (None: other readers)
    for op in block.ops:
        param = op.role_var[0][0] if op.role == "optimize" and op.role_var else None
        for n in op.input_names():
            var = block.find_var(n)
            if var is None or not var.persistable or var.is_parameter:
                continue
            users.setdefault(n, set()).add(param)
    return {n: owners[next(iter(ps))] for n, ps in users.items()
            if len(ps) == 1 and None not in ps and next(iter(ps)) in owners}
