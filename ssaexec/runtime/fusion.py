"""The fusion rule: which optimizer updates of a segment fuse into one ``torch._foreach_*`` call.

Shared by the code generator (``runtime.codegen``, which emits the fused call) and the
simulator (``sim.engine``, which times it), so both agree on what runs as one call.

Policy. Updates fuse when they are optimizer ops with a fused kernel (``ops.optim.FUSED``)
of the same kind, with the same attributes, learning rate and ``SkipUpdate`` version
(fp16 loss scaling: the one FoundInf of the step), which the fused call takes once. A
group fuses only when no handle between its first and last member reads or writes a var
any member updates; it then runs at the place of its last member.

Invariants. The rule reads the handles only; it never changes them. A handle is in at
most one group; a group has at least two members, in run order.
"""

from ..graph.ssa import ComputationOpHandle
from ..ops.optim import FUSED
from ..ops.registry import get_op_def

__all__ = ["plan_fusion"]


def _version(h, slot):
    """The one input version of ``h`` in ``slot``, None when the slot is empty, or False."""
    names = h.op.input(slot)
    if not names:
        return None
    found = [v for v in h.inputs if not v.is_dummy and v.name in names]
    return found[0] if len(found) == 1 else False


def _fusable(h):
    # updates fuse when they share kind, attributes, learning rate and SkipUpdate (fp16
    # loss scaling: the one FoundInf of the step), which the fused pass takes once
    if not isinstance(h, ComputationOpHandle) or h.op.type not in FUSED:
        return None
    od = get_op_def(h.op.type)
    attrs = od.full_attrs(h.op.attrs)
    lr, skip = _version(h, "LearningRate"), _version(h, "SkipUpdate")
    if lr is None or lr is False or skip is False:
        return None
    try:
        key = (h.op.type, tuple(sorted(attrs.items())), id(lr), id(skip))
        hash(key)
    except TypeError:
        return None
    return key


def plan_fusion(handles):
    """(index of the last member -> group, indices to skip): the optimizer updates of
    one segment that run as one ``torch._foreach_*`` call (the simulator shares it)."""
    groups = {}
    for k, h in enumerate(handles):
        key = _fusable(h)
        if key is not None:
            groups.setdefault(key, []).append(k)
    fused_at, skip = {}, set()
    for members in groups.values():
        if len(members) < 2:
            continue
        touched = set()
        for k in members:
            touched.update(v.name for v in handles[k].outputs if not v.is_dummy)
        lo, hi = members[0], members[-1]
        mset = set(members)
        ok = all(not ({v.name for v in handles[k].inputs + handles[k].outputs
                       if not v.is_dummy} & touched)
                 for k in range(lo, hi + 1) if k not in mset)
        if not ok:
            continue
        fused_at[hi] = [handles[k] for k in members]
        skip.update(members[:-1])
    return fused_at, skip
