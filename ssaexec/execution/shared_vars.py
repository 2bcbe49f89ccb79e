"""``share_vars_from``: one executor running on another's values, and the clean-up after.

Policy. Each place's scope of the sharing executor is a child of the other executor's
scope of the same place, so lookups fall back to the other's current parameters and
statistics. What the sharing program writes to its own vars stays its own; what a step
writes to a persistable the other executor holds (an evaluation batch norm returns its
running statistics, unchanged) would hide that executor's later values from every
later step, so ``unshadow`` drops the step's binding when the parent has the var.

Invariant: the places are the same, in the same order; otherwise an ``SSAExecError``
names both lists.
"""

from ..core.errors import SSAExecError

__all__ = ["shared_scopes", "shadowable", "unshadow"]


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
