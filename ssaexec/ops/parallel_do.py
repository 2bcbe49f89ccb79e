"""``parallel_do`` and ``parallel_do_grad``: a sub-block run data-parallel over places.

``parallel_do`` (seed 000) splits each var of ``Inputs`` along dim 0 into one
slice per place (sizes differ by at most one row), runs ``sub_block`` on every
place side by side with ``ctx.run_places`` (the places' SSA graph on our
scheduler, ``runtime.parallel_block``) and merges each var of ``Outputs`` by
concatenating the places' values along dim 0 (0-d values are stacked, one row
per place). Every other outer name the block reads (``Parameters``: weights,
labels read whole, the learning rate) is shared: each place reads the op's own
tensor, so CPU places copy nothing and CUDA places on other devices get a copy
per step.

``prefetched`` names block-local data vars ``X@PLACE`` that place ``K`` reads
from the outer data var ``X@PLACE@K`` (fed already split, on the place's device,
by a background loader), neither split nor copied.

``saved`` names sub-block locals that the backward pass reads; ``Saved`` holds
their values, one var per (name, place) in that order, so the grad op gets the
forward activations of every place without recomputing them.

``parallel_do_grad`` runs its ``sub_block`` (made by ``append_backward``, see
``program.parallel_do``) on every place over the slices of the inputs, of each
``Outputs@GRAD`` and of the saved activations. The sub-block's backward ops carry
``role_var`` for the parameters, so each parameter gradient is all-reduced over
the places right after it is made, overlapping the rest of the backward pass;
``Parameters@GRAD`` is that sum (place 0's copy) and ``Inputs@GRAD`` the places'
input gradients concatenated. The optimizer runs outside, once, on the op's place:
parameters are never copied back.

Places travel as strings in the ``places`` attribute: ``cpu:I``, ``cuda:I`` or
``cuda:I/D`` (place ``I`` on device ``D``, several places sharing one GPU).

Places come from the program file, which is untrusted (docs/security.md), and each
is a thread. So a file may name only places of the executor's device, the device
of the place the op runs on (a CPU executor: ``cpu:I``; one on GPU ``D``:
``cuda:I/D``, never a GPU the user did not choose), and at most ``max_places``
(``ssaexec.core.limits``) of them, nested ``parallel_do`` ops counted together (their
places multiply). Validation checks the form and the count; the kernel checks all
of it again, before any thread starts.
"""

import torch

from ..core.errors import ProgramError
from ..core.limits import get_limit
from ..core.place import CPUPlace, CUDAPlace
from .registry import get_op_def, register_grad, register_op

__all__ = ["places_attr", "attr_places", "places_problem", "split_rows", "split_sizes"]

_ATTRS = {"sub_block": ("block", None), "places": ("strs", []), "saved": ("strs", []),
          "stacked": ("strs", []), "prefetched": ("strs", [])}


def places_attr(places):
    """The ``places`` attribute (list of str) of a list of places."""
    out = []
    for p in places:
        if p.is_cuda and p.device_index != p.index:
            out.append(f"cuda:{p.index}/{p.device_index}")
        else:
            out.append(str(p))
    return out


def attr_places(strs):
    """The places of a ``places`` attribute (``ValueError`` on a malformed entry)."""
    places = []
    for s in strs:
        family, _, rest = s.partition(":")
        idx, _, dev = rest.partition("/")
        if family not in ("cpu", "cuda") or not idx.isdigit() or (dev and not dev.isdigit()) \
                or (dev and family == "cpu"):
            raise ValueError(f"bad place {s!r}: use cpu:I, cuda:I or cuda:I/D")
        places.append(CPUPlace(int(idx)) if family == "cpu" else
                      CUDAPlace(int(idx), int(dev) if dev else None))
    if not places:
        raise ValueError("parallel_do needs at least one place")
    if len(set(places)) != len(places):
        raise ValueError(f"parallel_do places must be distinct, got {list(strs)}")
    return places


def places_problem(attrs):
    """A message when the ``places`` attribute is malformed or names too many places."""
    strs = attrs.get("places") or []
    limit = get_limit("max_places")
    if len(strs) > limit:
        return (f"parallel_do names {len(strs)} places, more than the {limit} a program may "
                "run one op on (the limit max_places; raise it with SSAEXEC_MAX_PLACES=N "
                "or ssaexec.core.limits.set_limits(max_places=N) if the program is trusted)")
    try:
        attr_places(strs)
    except ValueError as e:
        return f"attribute 'places': {e}"
    return None


def _run_places(attrs, ctx):
    """The op's places, checked against the executor it runs in (module docstring)."""
    problem = places_problem(attrs)
    if problem:
        raise ProgramError(problem)
    places = attr_places(attrs["places"])
    # places of enclosing parallel_do runs multiply: each of theirs runs this op
    outer = getattr(ctx.scope_of(), "fanout", 1) if ctx.scope_of is not None else 1
    limit = get_limit("max_places")
    if outer * len(places) > limit:
        raise ProgramError(f"parallel_do inside parallel_do would run {outer} x {len(places)} "
                           f"places at once, more than {limit} (the limit max_places)")
    device = _device(ctx)
    for p in places:
        if p.device != device:
            raise ProgramError(f"parallel_do place {str(p)!r} is on {p.device}, but the op "
                               f"runs on {device}: a program may only use the device of the "
                               "executor it runs in (choose places with --places or the "
                               "executor's places)")
    return places


def split_rows(t, n, name):
    """``t`` split along dim 0 into ``n`` parts whose sizes differ by at most one (views)."""
    if t.dim() == 0 or t.shape[0] < n:
        rows = "no rows" if t.dim() == 0 else f"{t.shape[0]} rows"
        raise ValueError(f"parallel_do input {name!r} has {rows} but there are {n} places: "
                         "every place needs at least one")
    return list(torch.split(t, split_sizes(t.shape[0], n)))


def split_sizes(rows, n):
    """``rows`` cut into ``n`` sizes that differ by at most one, larger first."""
    base, extra = divmod(rows, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _merge(parts, stacked, device):
    parts = [p.to(device) for p in parts]
    return torch.stack(parts) if stacked else torch.cat(parts)


def _device(ctx):
    return ctx.place.device if ctx.place is not None else torch.device("cpu")


def _input_envs(op, ins, attrs, places):
    envs = [{} for _ in places]
    n = len(places)
    for name, t in zip(op.input("Inputs"), ins["Inputs"], strict=True):
        for env, part, place in zip(envs, split_rows(t, n, name), places, strict=True):
            env[name] = part.to(place.device)
    if attrs["prefetched"]:
        shared = dict(zip(op.input("Parameters"), ins["Parameters"], strict=True))
        for name in attrs["prefetched"]:  # X@PLACE, fed per place as X@PLACE@K
            for k, (env, place) in enumerate(zip(envs, places, strict=True)):
                env[name] = shared[f"{name}@{k}"].to(place.device)
    return envs


def _no_infer(ins, attrs):
    return {}


def parallel_do(ins, attrs, ctx):
    """Run ``sub_block`` on every place over its slice of Inputs; merge Outputs."""
    op = ctx.op
    places = _run_places(attrs, ctx)
    envs = _input_envs(op, ins, attrs, places)
    outs, saved = op.output("Outputs"), attrs["saved"]
    results = ctx.run_places(attrs["sub_block"].idx, envs, places, list(outs) + list(saved))
    for name in outs:
        if any(r[name] is None for r in results):
            raise ValueError(f"parallel_do: the sub-block did not write its output {name!r}")
    device, stacked = _device(ctx), set(attrs["stacked"])
    merged = [_merge([r[name] for r in results], name in stacked, device) for name in outs]
    return {"Outputs": merged, "Saved": [r[name] for name in saved for r in results]}


register_op("parallel_do", ["Inputs*", "Parameters*"], ["Outputs*", "Saved*!"], _ATTRS,
            infer=_no_infer, grad="custom", control=True)(parallel_do)


def parallel_do_grad(ins, attrs, ctx):
    """Run the grad ``sub_block`` on every place; all-reduced Parameters@GRAD, Inputs@GRAD."""
    op = ctx.op
    places = _run_places(attrs, ctx)
    n = len(places)
    envs = _input_envs(op, ins, attrs, places)
    saved = attrs["saved"]
    for j, name in enumerate(saved):
        for k, env in enumerate(envs):
            env[name] = ins["Saved"][j * n + k]
    # the places' row counts, as the forward split the first input
    first = (op.input("Inputs") + attrs["prefetched"])[:1]
    rows = [len(env[first[0]]) for env in envs] if first else None
    stacked = set(attrs["stacked"])
    for name, g in zip(op.input("Outputs@GRAD"), ins.get("Outputs@GRAD") or [], strict=True):
        if name[: -len("@GRAD")] in stacked:
            parts = list(g.unbind(0))
        elif rows is not None and g.shape[0] == sum(rows):
            parts = list(torch.split(g, rows))
        else:
            parts = split_rows(g, n, name)
        for env, part, place in zip(envs, parts, places, strict=True):
            env[name] = part.to(place.device)
    in_grads = [x + "@GRAD" for x in op.input("Inputs")]
    param_grads = [p + "@GRAD" for p in op.input("Parameters")]
    results = ctx.run_places(attrs["sub_block"].idx, envs, places, in_grads + param_grads)
    device = _device(ctx)
    out = {"Inputs@GRAD": [], "Parameters@GRAD": []}
    for slot, names, merge in (("Inputs@GRAD", in_grads, True),
                               ("Parameters@GRAD", param_grads, False)):
        for want, name in zip(op.output(slot), names, strict=True):
            vals = [r[name] for r in results]
            if any(v is None for v in vals) or want == "@EMPTY@":
                out[slot].append(None)
            elif merge:
                out[slot].append(_merge(vals, False, device))
            else:
                out[slot].append(vals[0].to(device))  # all-reduced: every place has the sum
    return out


register_grad("parallel_do", uses=["Inputs", "Parameters", "Saved"])(parallel_do_grad)
_grad_def = get_op_def("parallel_do_grad")
_grad_def.is_control = True
_grad_def.wants_mask = False
_grad_def.doc = (parallel_do_grad.__doc__ or "").strip()
get_op_def("parallel_do").check = _grad_def.check = places_problem
