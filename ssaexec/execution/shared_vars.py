"""``share_vars_from``: one executor running on another's values, and the clean-up after.

Policy. Each place's scope of the sharing executor is a child of the other executor's
scope of the same place, so lookups fall back to the other's current parameters and
statistics. What the sharing program writes to its own vars stays its own; what a step
writes to a persistable the other executor holds (an evaluation batch norm returns its
running statistics, unchanged) would hide that executor's later values from every
later step, so ``unshadow`` drops the step's binding when the parent has the var.

Under ZeRO stage 3 the other executor's places hold only shards of its parameters, so
each run of the sharing executor first borrows the whole values its program reads
(``borrowed``: joined from every rank's shard by the other executor, a collective in a
multi-process run) into its own scopes, and gives them back after the run
(``give_back``): between runs nothing whole is kept, as stage 3 promises.

Invariant: the places are the same, in the same order; otherwise an ``SSAExecError``
names both lists.
"""

from ..core.errors import SSAExecError

__all__ = ["shared_scopes", "shadowable", "unshadow", "borrowed", "lend", "give_back"]


def shared_scopes(places, other_places, other_scopes):
    """One child scope of each of ``other_scopes`` (the other executor's places' scopes)."""
    if list(other_places) != list(places):
        here, there = ", ".join(map(str, places)), ", ".join(map(str, other_places))
        raise SSAExecError(f"share_vars_from: the places differ ({here} here, {there} "
                           "there); an executor can only share the values of its own "
                           "places")
    return [s.new_scope() for s in other_scopes]


def shadowable(program):
    """The names a step may shadow: every persistable var of ``program``."""
    return frozenset(v.name for b in program.blocks for v in b.vars.values() if v.persistable)


def unshadow(local_scopes, names):
    """Drop the bindings of ``names`` in ``local_scopes`` that hide a parent's value."""
    for scope in local_scopes:
        for name in [n for n in scope.vars if n in names]:
            if scope.parent is not None and scope.parent.find_var(name) is not None:
                del scope.vars[name]


def borrowed(other, program):
    """The names of ``other``'s stage-3 parameters that ``program`` reads, whole values
    its places do not hold (() without stage 3)."""
    layout = other.shard_layout()
    if layout is None or layout.stage != 3:
        return ()
    reads = {n for b in program.blocks for op in b.ops for n in op.input_names()}
    return tuple(n for n in sorted(reads) if layout.sharded(n) is not None)


def lend(other, names, local_scopes, places):
    """Bind the whole value of each of ``names`` (joined by ``other``) in every scope."""
    for name in names:
        whole = other.gathered(name)
        for scope, place in zip(local_scopes, places, strict=True):
            scope.set_var(name, whole.to(place.device, copy=True))


def give_back(local_scopes, names):
    """Drop the values ``lend`` bound."""
    for scope in local_scopes:
        for name in names:
            scope.vars.pop(name, None)
