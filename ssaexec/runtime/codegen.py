"""Prepared calls: a run of op handles on one place lowered to straight-line Python.

This is the hot path. A ``Segment`` (a run of computation handles of one place
with no collective in between, see ``runtime.compiled``) becomes one generated
function ``segment(D, L)`` whose body calls every kernel directly, the way
torch.fx's code generator writes a ``GraphModule``:

* values are Python locals, one per var version (SSA), loaded from the scope
  with ``L(name)`` (``Scope.find_var``) on first use and stored into the scope
  dict ``D`` only when some other node reads them, when they are the final value
  of a persistable, or when they are fetched; ``del`` drops a local after its
  last reader in the segment, so memory follows the live set;
* an ATen op calls its ``OpOverload`` with its arguments already decoded
  (constants bound once as globals of the generated module, tensor arguments as
  locals, size expressions evaluated from input shapes); a hand-written op calls
  its kernel with a dict literal of its slots; no name look-ups, dict building
  from names, or type dispatch happen per op;
* results that may alias an input are copied only where ``graph.aliasing``
  decided they must be (``copy``), and such copies are counted;
* optimizer ops of one kind, learning rate and ``SkipUpdate`` (fp16 loss scaling)
  run as one ``torch._foreach_*`` call (``ops.optim.FUSED``) at the place of the
  last of them, when no handle in between touches what they update (the rule:
  ``runtime.fusion``, shared with the simulator; ``plan_fusion`` is re-exported here).

Errors. The generated code has one line per load and per op; when anything
raises, ``Lowered.error`` maps the traceback's line in the generated frame back
to the handle and builds the same ``OpError`` the readable ``OpCall`` path
gives (op, index, place, input shapes from the frame's locals). A kernel that
returns something without the expected slot, or None for a needed result, is
an ``OpError`` naming the slot.

Size: the lowering of every handle kind into one segment function is one concept (over
500 lines).
"""

import functools
import itertools
import linecache

import torch

from ..core.errors import OpError, SSAExecError
from ..core.limits import _LIMITS, cap_sizes, check_result
from ..ops import aten as _aten
from ..ops.init import DEVICE_KERNELS
from ..ops.optim import FUSED
from ..ops.registry import get_op_def
from ..core.dtypes import torch_dtype
from ..graph.ssa import (CollectiveOpHandle, ComputationOpHandle, FreeOpHandle,
                         ScaleLossGradOpHandle)
from ..program.desc import EMPTY_VAR
from .fusion import plan_fusion
from .memory_plan import last_uses
from .op_call import OpCall
from .rng import needs_step_seed, op_seed, seeded

__all__ = ["Lowered", "lower_segment", "CloneCounter", "emit_handle", "plan_fusion"]

_IDS = itertools.count()


class CloneCounter:
    """Counts the copies made for aliasing (``ssaexec stats`` reports them per step)."""

    __slots__ = ("count",)

    def __init__(self):
        self.count = 0


def _fresh(counter):
    def fresh(t, inputs):
        # a may-alias result the alias plan must copy: only when it does share storage
        if not isinstance(t, torch.Tensor) or not t.numel():
            return t
        ptr = t.untyped_storage().data_ptr()
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.numel() and \
                    x.untyped_storage().data_ptr() == ptr:
                counter.count += 1
                return t.clone(memory_format=torch.preserve_format)
        return t
    return fresh


class _Unbound(Exception):
    """A kernel result lacks a slot the program reads (raised by generated code)."""

    def __init__(self, slot, what):
        super().__init__(slot, what)
        self.slot, self.what = slot, what


def _flat(out):
    flat = []
    for o in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(o, (tuple, list)):
            flat.extend(o)
        else:
            flat.append(o)
    return flat


class Lowered:
    """A generated segment function and what it needs to explain its errors."""

    __slots__ = ("fn", "code", "lines", "source", "place", "handles", "n_ops", "input_locals")

    def __init__(self, fn, source, lines, place, handles, n_ops, input_locals):
        self.fn = fn
        self.code = fn.__code__
        self.source = source
        self.lines = lines    # line number -> (handle, what): what is "op" or a var name
        self.place = place
        self.handles = handles
        self.n_ops = n_ops
        self.input_locals = input_locals  # id(handle) -> {var name: local name}

    def error(self, exc):
        """The ``OpError`` for ``exc`` raised while this segment ran (or ``exc`` itself)."""
        if isinstance(exc, SSAExecError):
            return exc
        tb, frame_tb, inner = exc.__traceback__, None, None
        while tb is not None:
            if tb.tb_frame.f_code is self.code:
                frame_tb = tb
            inner = tb
            tb = tb.tb_next
        if frame_tb is None:
            return exc
        handle, what = self.lines.get(frame_tb.tb_lineno, (None, None))
        if handle is None:
            return exc
        place = self.place
        op = handle.op if isinstance(handle, ComputationOpHandle) else None
        label = (f"op #{handle.op_index} '{op.type}'" if op is not None else handle.name)
        op_type = handle.op_type
        if what != "op":
            return OpError(f"While executing {label} on {place}: input var {what!r} has no "
                           "value (not fed, not initialised by the startup program, or freed)",
                           op_type, place)
        local = frame_tb.tb_frame.f_locals
        shapes = {}
        if op is not None:
            names = self.input_locals.get(id(handle), {})
            for slot, vals in op.inputs.items():
                got = [local.get(names.get(n)) for n in vals]
                shapes[slot] = [list(t.shape) if isinstance(t, torch.Tensor) else None
                                for t in got]
                od = get_op_def(op.type)
                s = od.input_slot(slot)
                if s is not None and not s.duplicable and len(shapes[slot]) == 1:
                    shapes[slot] = shapes[slot][0]
        if isinstance(exc, _Unbound):
            return OpError(f"While executing {label} on {place}: the kernel {exc.what} for "
                           f"output slot {exc.slot!r}", op_type, place, shapes)
        if inner is frame_tb and isinstance(exc, (KeyError, TypeError, IndexError)):
            # raised by the generated binding code itself: the kernel broke its contract
            return OpError(f"While executing {label} on {place}: the kernel returned "
                           f"{exc.__class__.__name__}: {exc} instead of its output slots "
                           f"(a dict of slot -> tensor)", op_type, place, shapes)
        return OpError(f"While executing {label} on {place} with input shapes {shapes}: "
                       f"{type(exc).__name__}: {exc}", op_type, place, shapes)


class _Emitter:
    """Builds one segment's source: lines, constants and the line -> handle map."""

    def __init__(self, place, scope_of, counter, program):
        self.place = place
        self.device = place.device
        self.scope_of = scope_of
        self.program = program
        self.ns = {"_full": torch.full, "_Unbound": _Unbound, "_flat": _flat,
                   "_fresh": _fresh(counter), "_LIMITS": _LIMITS,
                   "_check_result": check_result}
        self.body = []
        self.lines = {}
        self.local = {}      # id(VarHandle) -> local name
        self.n_const = 0

    def const(self, value, hint="c"):
        name = f"_{hint}{self.n_const}"
        self.n_const += 1
        self.ns[name] = value
        return name

    def emit(self, text, handle=None, what="op"):
        self.body.append("    " + text)
        if handle is not None:
            self.lines[len(self.body) + 1] = (handle, what)  # +1: the def line

    def name_of(self, v):
        n = self.local.get(id(v))
        if n is None:
            n = self.local[id(v)] = f"v{len(self.local)}"
        return n


def _literal(value, em):
    if value is None or isinstance(value, bool):
        return repr(value)
    if type(value) is int:
        return repr(value)
    return em.const(value)


def _per_batch(compute):
    """``compute(env)`` cached by the batch-dependent values (a tuple) it is called with."""
    cache = {}

    def cached(values, names):
        r = cache.get(values)
        if r is None:
            if len(cache) > 64:
                cache.clear()
            r = cache[values] = compute(dict(zip(names, values, strict=True)))
        return r
    return cached


def _memo_size(fn, names):
    # a size expression depends on the batch only: evaluate (bounded) once per batch shape
    cached = _per_batch(fn)
    return lambda values: cached(values, names)


def _memo_size_list(items, names, op_type):
    # a size list with size expressions: made, and its product capped before the kernel
    # allocates (four factors of s0 pass one by one), once per batch shape
    fns = [_aten.parse_size_expr(v)[0] if isinstance(v, str) else None for v in items]
    cached = _per_batch(lambda env: tuple(cap_sizes(
        [fn(env) if fn is not None else v for fn, v in zip(fns, items, strict=True)], op_type)))
    # a fresh list each call: a kernel may keep or change its argument
    return lambda values: list(cached(values, names))


def _aten_expr(em, handle, xs, attrs):
    """``overload(args...)`` source for an ATen op with inputs ``xs`` (local names)."""
    op_def = get_op_def(handle.op.type)
    overload = op_def.overload_for(em.program)  # a program file's ATen ops run guarded
    compiled = _aten.CompiledCall(handle.op.type, _aten.arg_kinds(overload), attrs)  # validates
    env = None
    names = tuple(s for s, _, _ in compiled.binds)
    if compiled.binds:
        env = "(" + "".join(f"{xs[k]}.shape[{d}], " for _, k, d in compiled.binds) + ")"

    def value(enc, v):
        if isinstance(v, list):
            if enc == "size" and any(isinstance(x, str) for x in v) and \
                    all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
                fn = _memo_size_list(v, names, handle.op.type)
                return f"{em.const(fn, 'szl')}(_env)"
            return "[" + ", ".join(value(enc, x) for x in v) + "]"
        if _aten.is_ref(v):
            return xs[int(v[2:-1])]
        if isinstance(v, str):
            fn, _ = _aten.parse_size_expr(v)
            return f"{em.const(_memo_size(fn, names), 'sz')}(_env)"
        return _literal(v, em)

    args, kwargs = [], []
    for name, enc, kwarg_only in _aten.arg_kinds(overload):
        v = attrs.get(name, _aten.OMIT)
        if v is _aten.OMIT:
            continue
        if enc == "device":
            # a factory op (no input) is made on the place's device, as in CompiledCall
            src = f"{xs[0]}.device" if xs else em.const(em.device, "dev")
        elif enc == "dtype":
            src = "None" if v is None else em.const(torch_dtype(v), "dt")
        elif enc in ("layout", "memory_format"):
            table = _aten.LAYOUTS if enc == "layout" else _aten.MEMORY_FORMATS
            src = "None" if v is None else em.const(table[v], "mf")
        elif enc == "generator" or isinstance(enc, _aten.Unsupported):
            src = "None"
        elif enc == "literal":
            src = _literal(v, em) if not isinstance(v, list) else em.const(v)
        else:
            src = value(enc, v)
        (kwargs if kwarg_only else args).append(f"{name}={src}" if kwarg_only else src)
    call = f"{em.const(overload, 'ov')}({', '.join(args + kwargs)})"
    return call, env


def lower_segment(handles, place, scope_of, plan, counter, program, label):
    """Generate the function of one segment.

    Parameters
    ----------
    handles : list of op handles
        Computation and loss-scaling handles of one place, and no-op collectives
        (one place, one process) that only rename a version, in run order.
    place : Place
    scope_of : callable
        Returns the place's current scope (control ops run sub-blocks against it);
        the generated function itself gets the scope's dict and ``find_var``.
    plan : object
        ``export`` (ids of versions to store), ``copy`` (ids of versions to copy
        when made), ``needed`` (ids of versions some handle or the step reads),
        ``step`` (a one-item list holding the step number, for random ops),
        ``place_idx`` and ``run_places`` (the block runner of control ops).
    counter : CloneCounter
    program : Program
    label : str
        Name of the generated code (shows in tracebacks).

    Returns
    -------
    Lowered
    """
    em = _Emitter(place, scope_of, counter, program)
    em.ns["_step"] = plan.step
    em.ns["_seeded"] = seeded
    em.ns["_op_seed"] = op_seed
    em.place_idx = plan.place_idx
    # last local use of every version, to drop it early
    last_use = last_uses([[id(v) for v in h.inputs if not v.is_dummy] for h in handles])
    fused_at, fused_skip = plan_fusion(handles)
    n_ops = 0
    for k, h in enumerate(handles):
        if k in fused_skip:
            continue
        if k in fused_at:
            group = fused_at[k]
            _emit_fused(em, group, plan)
            n_ops += 1
        else:
            n_ops += emit_handle(h, em, plan)
        keep = _aliased_names(em, h)
        dead = [em.local[id(v)] for v in h.inputs
                if not v.is_dummy and last_use.get(id(v)) == k and id(v) in em.local]
        dead = [d for d in dict.fromkeys(dead) if d not in keep]
        if dead:
            em.emit("del " + ", ".join(dead))
    if not em.body:
        em.emit("pass")
    name = f"segment_{next(_IDS)}"
    source = f"def {name}(D, L):\n" + "\n".join(em.body) + "\n"
    filename = f"<ssaexec {label}>"
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, em.ns)
    fn = em.ns[name]
    input_locals = {id(h): {v.name: em.local[id(v)] for v in h.inputs
                            if not v.is_dummy and id(v) in em.local} for h in handles}
    return Lowered(fn, source, em.lines, place, handles, n_ops, input_locals)


def _aliased_names(em, h):
    # a no-op collective output shares its input's local: do not drop it
    return {em.local[id(o)] for o in h.outputs if not o.is_dummy and id(o) in em.local}


def _load(em, v, h):
    """The local holding version ``v``, loading it from the scope on first use."""
    n = em.local.get(id(v))
    if n is None:
        n = em.name_of(v)
        em.emit(f"{n} = L({v.name!r})", h, v.name)
        em.emit(f"if {n} is None: raise KeyError({v.name!r})", h, v.name)
    return n


def _bind(em, v, src_name, plan, h, check_none=False, inputs=None, cap=False):
    """Bind output version ``v`` (local ``src_name`` already holds it); copy/store as planned.

    ``cap``: check the result against ``max_tensor_elements`` (``limits.check_result``):
    a hand-written op's result size is bounded by no check before its kernel.
    """
    n = em.name_of(v)
    if src_name != n:
        em.emit(f"{n} = {src_name}", h)
    if check_none:
        em.emit(f"if {n} is None: raise _Unbound({v.name!r}, 'returned None')", h)
    if cap:
        # inline compare, call only when over: the hot path pays one numel() per result
        label = f"op #{h.op_index} '{h.op.type}' on {em.place}"
        em.emit(f"if {n}.numel() > _LIMITS['max_tensor_elements']: "
                f"_check_result({n}, {v.name!r}, {label!r})", h)
    if id(v) in plan.copy and inputs:
        em.emit(f"{n} = _fresh({n}, ({', '.join(inputs)},))", h)
    if id(v) in plan.export:
        em.emit(f"D[{v.name!r}] = {n}", h)
    return n


def _call_line(em, h, od, text):
    """Emit the kernel call ``text``; a random op runs under its step seed (``runtime.rng``)."""
    if isinstance(h, ComputationOpHandle) and needs_step_seed(od, h.op):
        seed = (f"_op_seed({em.program.random_seed}, {h.op_index}, {em.place_idx}, "
                f"_step[0])")
        em.emit(f"with _seeded({seed}, {em.const(em.device, 'dev')}):", h)
        em.emit("    " + text, h)
    else:
        em.emit(text, h)


@functools.singledispatch
def emit_handle(h, em, plan):
    """Emit the lines of handle ``h`` into segment emitter ``em``; return the ops it ran.

    Dispatched on the handle class; a new kind that can run inside a compiled segment
    registers with ``@emit_handle.register``.
    """
    raise SSAExecError(f"the compiled path cannot run op handle kind {h.kind!r}")


@emit_handle.register
def _(h: ScaleLossGradOpHandle, em, plan):
    (out,) = [v for v in h.outputs if not v.is_dummy]
    shape = em.const(list(h.shape), "sh")
    dt = em.const(torch_dtype(h.dtype), "dt")
    dev = em.const(em.device, "dev")
    n = em.name_of(out)
    em.emit(f"{n} = _full({shape}, {h.coeff!r}, dtype={dt}, device={dev})", h)
    if id(out) in plan.export:
        em.emit(f"D[{out.name!r}] = {n}", h)
    return 1


@emit_handle.register
def _(h: CollectiveOpHandle, em, plan):
    # a collective with nothing to do (one place, one process): the new version is the
    # same tensor as the old one
    ins = {(v.place_idx, v.name): v for v in h.inputs if not v.is_dummy}
    for o in h.outputs:
        if o.is_dummy:
            continue
        src = ins[(o.place_idx, o.name)]
        if id(o) in plan.needed or id(o) in plan.export:
            em.local[id(o)] = _load(em, src, h)
            if id(o) in plan.export and id(src) not in plan.export:
                em.emit(f"D[{o.name!r}] = {em.local[id(o)]}", h)
    return 0


@emit_handle.register
def _(h: FreeOpHandle, em, plan):
    # ZeRO's free: drop the place's value (the locals of the segment holding it were
    # dropped after their last reader, which the SSA hazards put before this handle)
    for name in h.var_names:
        em.emit(f"D.pop({name!r}, None)", h)
    return 0


@emit_handle.register
def _(h: ComputationOpHandle, em, plan):
    op = h.op
    od = get_op_def(op.type)
    by_name = {v.name: v for v in h.inputs if not v.is_dummy}
    outs_by_name = {v.name: v for v in h.outputs if not v.is_dummy}
    needed = [v for v in h.outputs if not v.is_dummy
              and (id(v) in plan.needed or id(v) in plan.export)]
    attrs = od.full_attrs(op.attrs)
    if od.is_control:
        return _emit_control(em, h, od, attrs, by_name, outs_by_name, plan)
    if od.overload is not None:
        xs_names = op.input("X")
        xs = [_load(em, by_name[n], h) for n in xs_names]
        call, env = _aten_expr(em, h, xs, attrs)
        if env is not None:
            em.emit(f"_env = {env}", h)
        returns = od.overload._schema.returns
        outs = op.output("Out")
        single = len(returns) == 1 and str(returns[0].type) == "Tensor"
        wanted = [(j, outs_by_name[n]) for j, n in enumerate(outs)
                  if n != EMPTY_VAR and n in outs_by_name and outs_by_name[n] in needed]
        if single:
            if wanted:
                n = em.name_of(wanted[0][1])
                _call_line(em, h, od, f"{n} = {call}")
                _bind(em, wanted[0][1], n, plan, h, inputs=xs)
            else:
                _call_line(em, h, od, call)
            return 1
        plain = all(str(r.type) == "Tensor" for r in returns)
        _call_line(em, h, od, f"_r = {call}" if plain else f"_r = _flat({call})")
        for j, v in wanted:
            _bind(em, v, f"_r[{j}]", plan, h, inputs=xs)
        return 1
    # a hand-written op: its kernel takes a dict of slots
    ins_src = _slots_src(od, op, lambda n: _load(em, by_name[n], h))
    kernel = od.raw_kernel if od.may_alias else od.kernel
    creates = not any(op.input(s.name) for s in od.inputs if s.name in op.inputs)
    bind = DEVICE_KERNELS.get(op.type) if creates else None
    if bind is not None:  # made on the place's device, as in OpCall (ops.init)
        kernel = bind(em.device)
    k = em.const(kernel, "k")
    a = em.const(attrs, "a")
    inputs = [em.local[id(by_name[n])] for n in op.input_names() if n in by_name
              and id(by_name[n]) in em.local]
    if od.wants_mask:
        wanted = {s.name: [n != EMPTY_VAR for n in op.output(s.name)] for s in od.outputs
                  if s.name in op.outputs}
        _call_line(em, h, od, f"_o = {k}({ins_src}, {a}, {em.const(wanted, 'w')})")
    else:
        _call_line(em, h, od, f"_o = {k}({ins_src}, {a})")
    move = creates and bind is None and em.device.type != "cpu"
    dev = em.const(em.device, "dev") if move else None
    for s in od.outputs:
        if s.name not in op.outputs:
            continue
        names = op.output(s.name)
        for j, name in enumerate(names):
            if name == EMPTY_VAR or name not in outs_by_name:
                continue
            v = outs_by_name[name]
            if v not in needed:
                continue
            src = f"_o[{s.name!r}][{j}]" if s.duplicable else f"_o[{s.name!r}]"
            if move:
                src = f"{src}.to({dev})"
            _bind(em, v, src, plan, h, check_none=True, inputs=inputs, cap=True)
    return 1


def _slots_src(od, op, local):
    """Source of the dict literal a hand-written kernel takes: slot -> local (list)."""
    parts = []
    for s in od.inputs:
        if s.name not in op.inputs:
            continue
        names = op.input(s.name)
        if s.duplicable:
            parts.append(f"{s.name!r}: [{', '.join(local(n) for n in names)}]")
        else:
            parts.append(f"{s.name!r}: {local(names[0])}")
    return "{" + ", ".join(parts) + "}"


def _emit_control(em, h, od, attrs, by_name, outs_by_name, plan):
    # sub-blocks read outer names through the scope: store every input first
    for v in by_name.values():
        n = _load(em, v, h)
        em.emit(f"D[{v.name!r}] = {n}", h)
    op = h.op
    ctx = OpCall(op, h.op_index, em.program, em.device, plan.run_places).context(em.scope_of,
                                                                                em.place)
    ins_src = _slots_src(od, op, lambda n: em.local[id(by_name[n])])
    em.emit(f"_o = {em.const(od.kernel, 'k')}({ins_src}, {em.const(attrs, 'a')}, "
            f"{em.const(ctx, 'ctx')})", h)
    for s in od.outputs:
        if s.name not in op.outputs:
            continue
        for j, name in enumerate(op.output(s.name)):
            v = outs_by_name.get(name)
            if name == EMPTY_VAR or v is None:
                continue
            src = f"_o[{s.name!r}][{j}]" if s.duplicable else f"_o[{s.name!r}]"
            _bind(em, v, src, plan, h, check_none=True, cap=True)
    return 1


# --- fused optimizer updates (which ones fuse: runtime.fusion) ----------------------------
def _emit_fused(em, group, plan):
    h0 = group[-1]
    op_type = h0.op.type
    od = get_op_def(op_type)
    attrs = od.full_attrs(h0.op.attrs)
    slots = [s.name for s in od.inputs]
    cols = {s: [] for s in slots}
    for h in group:
        by_name = {v.name: v for v in h.inputs if not v.is_dummy}
        for s in slots:
            names = h.op.input(s)
            cols[s].append(_load(em, by_name[names[0]], h) if names else "None")
    lr = cols.pop("LearningRate")[0]
    skip = cols.pop("SkipUpdate", ["None"])[0]
    args = ", ".join(f"{s!r}: [{', '.join(v)}]" for s, v in cols.items())
    em.emit(f"{em.const(FUSED[op_type], 'fz')}({{{args}}}, {lr}, {em.const(attrs, 'a')}, "
            f"{skip})", h0)
    for h in group:
        by_name = {v.name: v for v in h.inputs if not v.is_dummy}
        for v in h.outputs:
            if v.is_dummy:
                continue
            src = em.local[id(by_name[v.name])]  # updated in place
            em.local[id(v)] = src
            if id(v) in plan.export:
                em.emit(f"D[{v.name!r}] = {src}", h)
