"""The operator registry: one ``OpDef`` per op type.

An ``OpDef`` fixes an op's input and output slots, its attributes with types
and defaults, a torch kernel, optional shape/dtype inference and how its
gradient is made. Policy:

* Kernels are functions ``kernel(ins, attrs) -> outs``. ``ins`` maps each input
  slot to a tensor (a list for duplicable slots, ``None`` for an absent optional
  slot); ``outs`` maps output slots the same way. Kernels run on whatever device
  their inputs live on and never keep state between calls.
* Kernels return fresh tensors, except ops declared ``inplace`` (optimizer
  updates), which may update an input and return it: the SSA graph's
  write-after-read edges guarantee nobody still reads the old value.
* ``grad="auto"`` registers ``<type>_grad`` with a generic kernel built on
  ``torch.func.vjp`` over the forward kernel, so a new op needs only a forward.
  A hand-written grad op is registered with ``register_grad`` and names the
  forward slots it needs (``uses``); ``grad=None`` means not differentiable.
* Shape inference defaults to running the kernel on ``meta`` tensors twice
  with two batch sizes; a dimension that differs between the runs is the batch
  dimension (-1). Inputs without a -1 dim take one run: the two would be equal.
  Ops whose kernels cannot run on meta supply ``infer``. Ops whose meta kernels
  are slow (torch's Python decompositions: ~0.3-2 ms a run, issue 46: a 1 MB file of
  distinct ones cost tens of seconds to validate) supply a ``ShapeRule``
  (``rule=``): an exact stand-in for the probe, its shapes by arithmetic and its
  dtypes (with the kernel's dtype checks) from one run of the kernel on one-element
  meta tensors, cached per bounded key. ``tests/ops/test_infer_rules.py`` holds every
  rule to the probe's result, errors included.
* The registry is a leaf: it imports no kernel module. Importing ``ssaexec.ops``
  (which any import of ``ssaexec.ops.<module>`` does first) registers the built-in
  kernels; a family of op types made on demand (``aten.*``) registers a resolver
  with ``register_family``.
* Grad ops receive ``wanted``: per output slot, which entries anyone reads, so
  they can skip work; their kernels take ``(ins, attrs, wanted)``.
"""

import torch

from ..core.errors import ProgramError
from ..core.dtypes import dtype_name, torch_dtype

__all__ = ["Slot", "OpDef", "ShapeRule", "register_op", "register_grad", "register_family",
           "get_op_def", "registered_ops", "infer_outputs", "probe_outputs", "REQUIRED",
           "ATTR_TYPES", "check_attr", "EMPTY_VAR"]

# An output slot entry that is deliberately not produced (a grad nobody needs).
EMPTY_VAR = "@EMPTY@"


class _Required:
    __slots__ = ()

    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()

# attr type name -> predicate
ATTR_TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "ints": lambda v: isinstance(v, list) and all(ATTR_TYPES["int"](x) for x in v),
    "floats": lambda v: isinstance(v, list) and all(ATTR_TYPES["float"](x) for x in v),
    "strs": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "block": lambda v: type(v).__name__ == "BlockRef",
    "dtype": lambda v: isinstance(v, str),
    "any": lambda v: True,
}


def check_attr(op_def, name, value):
    """Return an error message when ``value`` does not fit attr ``name``, else None."""
    if name not in op_def.attrs:
        return f"unknown attribute {name!r} (known: {sorted(op_def.attrs) or 'none'})"
    atype, _ = op_def.attrs[name]
    if value is None and atype != "bool":
        return None if op_def.attrs[name][1] is None else \
            f"attribute {name!r} must be {atype}, got None"
    if not ATTR_TYPES[atype](value):
        return f"attribute {name!r} must be {atype}, got {type(value).__name__} {value!r}"
    if atype == "dtype":
        try:
            torch_dtype(value)
        except ProgramError as e:
            return f"attribute {name!r}: {e}"
    return None


class Slot:
    """An input or output slot of an op."""

    __slots__ = ("name", "duplicable", "optional", "no_grad")

    def __init__(self, name, duplicable=False, optional=False, no_grad=False):
        self.name = name
        self.duplicable = duplicable
        self.optional = optional
        self.no_grad = no_grad

    def __repr__(self):
        return f"Slot({self.name!r})"


def _slot(spec):
    if isinstance(spec, Slot):
        return spec
    # "X", "X*" (duplicable), "X?" (optional), "X!" (no gradient); suffixes combine
    name = spec.rstrip("*?!")
    flags = spec[len(name):]
    return Slot(name, duplicable="*" in flags, optional="?" in flags, no_grad="!" in flags)


class OpDef:
    """The definition of one op type (see the module docstring)."""

    __slots__ = ("type", "inputs", "outputs", "attrs", "kernel", "infer", "grad", "grad_uses",
                 "inplace", "is_grad", "forward_type", "wants_mask", "is_random", "is_control",
                 "doc", "may_alias", "raw_kernel", "overload", "check", "bare_overload",
                 "bare_kernel", "rule")

    def __init__(self, type, inputs, outputs, attrs, kernel, infer=None, grad="auto",
                 inplace=False, is_random=False, doc="", rule=None):
        self.type = type
        self.inputs = [_slot(s) for s in inputs]
        self.outputs = [_slot(s) for s in outputs]
        self.attrs = dict(attrs)
        self.kernel = kernel
        self.infer = infer
        # an exact stand-in for the meta probe (ShapeRule), or None
        self.rule = rule
        self.grad = grad
        self.grad_uses = None
        self.inplace = inplace
        self.is_grad = False
        self.forward_type = None
        self.wants_mask = False
        self.is_random = is_random
        # control ops (sub-blocks) take (ins, attrs, ctx); ctx.run_block runs a block
        self.is_control = False
        self.doc = doc
        # may a result share storage with an input (True: any with any; or a dict of
        # output slot -> input slots)? Then ``raw_kernel`` is the kernel without its
        # run-time copy, for executors that decide aliasing on the graph
        # (graph.aliasing); ``kernel`` itself always returns fresh tensors.
        self.may_alias = False
        self.raw_kernel = kernel
        # what an ATen op calls: its torch OpOverload, or that behind its guard (ops.guards)
        self.overload = None
        # a guarded ATen op also keeps the bare overload and a kernel that calls it, for
        # programs ssaexec built in this process (ProgramDesc.trusted): kernel_for/overload_for
        self.bare_overload = None
        self.bare_kernel = None
        # check(attrs) -> message or None: what an op's attributes must satisfy beyond
        # their types (validation calls it; parallel_do bounds its places)
        self.check = None

    def kernel_for(self, program):
        """``kernel``; ``bare_kernel`` (no guard) when ``program.trusted``."""
        if self.bare_kernel is not None and getattr(program, "trusted", False):
            return self.bare_kernel
        return self.kernel

    def overload_for(self, program):
        """``overload``; ``bare_overload`` (no guard) when ``program.trusted``."""
        if self.bare_overload is not None and getattr(program, "trusted", False):
            return self.bare_overload
        return self.overload

    def input_slot(self, name):
        for s in self.inputs:
            if s.name == name:
                return s
        return None

    def output_slot(self, name):
        for s in self.outputs:
            if s.name == name:
                return s
        return None

    def full_attrs(self, attrs):
        """``attrs`` completed with defaults (``ProgramError`` if a required one is missing)."""
        out = {}
        for name, (_, default) in self.attrs.items():
            if name in attrs:
                out[name] = attrs[name]
            elif default is REQUIRED:
                raise ProgramError(f"op {self.type!r}: attribute {name!r} is required")
            else:
                out[name] = default
        for name in attrs:
            if name not in self.attrs:
                out[name] = attrs[name]
        return out

    def __repr__(self):
        return f"OpDef({self.type!r})"


_REGISTRY = {}


def register_op(type, inputs, outputs, attrs=None, infer=None, grad="auto", inplace=False,
                is_random=False, control=False, rule=None):
    """Decorator registering ``fn(ins, attrs) -> outs`` as the kernel of op ``type``.

    ``inputs``/``outputs`` are slot specs: ``"X"``, ``"X*"`` duplicable,
    ``"X?"`` optional, ``"X!"`` no gradient. ``attrs`` maps name to
    ``(type, default)`` with ``REQUIRED`` for no default. ``control`` ops own
    sub-blocks and take ``(ins, attrs, ctx)``. ``rule`` (a ``ShapeRule``) stands in
    for the meta probe of shape inference.
    """
    def deco(fn):
        op_def = OpDef(type, inputs, outputs, attrs or {}, fn, infer, grad, inplace, is_random,
                       (fn.__doc__ or "").strip(), rule)
        _REGISTRY[type] = op_def
        op_def.is_control = control
        if grad == "auto":
            _register_auto_grad(op_def)
        return fn
    return deco


def register_grad(forward_type, uses):
    """Decorator registering a hand-written grad kernel ``fn(ins, attrs, wanted)``.

    ``uses`` lists the forward input/output slots the grad kernel reads; it also
    receives ``<out>@GRAD`` for every differentiable output slot.
    """
    def deco(fn):
        fwd = _REGISTRY[forward_type]
        fwd.grad = "custom"
        fwd.grad_uses = list(uses)
        _REGISTRY[forward_type + "_grad"] = _make_grad_def(fwd, fn, uses)
        return fn
    return deco


def _make_grad_def(fwd, kernel, uses):
    ins = []
    for name in uses:
        s = fwd.input_slot(name) or fwd.output_slot(name)
        ins.append(Slot(name, s.duplicable, s.optional or fwd.output_slot(name) is not None,
                        no_grad=True))
    for s in fwd.outputs:
        if not s.no_grad:
            ins.append(Slot(s.name + "@GRAD", s.duplicable, optional=True, no_grad=True))
    outs = [Slot(s.name + "@GRAD", s.duplicable, optional=True)
            for s in fwd.inputs if not s.no_grad]
    gdef = OpDef(fwd.type + "_grad", ins, outs, fwd.attrs, kernel, grad=None,
                 doc=f"gradient of {fwd.type}")
    gdef.is_grad = True
    gdef.forward_type = fwd.type
    gdef.wants_mask = True
    gdef.infer = _grad_infer
    return gdef


def _grad_infer(in_specs, attrs, op_def):
    # A grad has the shape and dtype of the forward input it belongs to.
    out = {}
    for s in op_def.outputs:
        fwd_name = s.name[: -len("@GRAD")]
        out[s.name] = in_specs.get(fwd_name)
    return out


def _register_auto_grad(fwd):
    uses = [s.name for s in fwd.inputs]

    def vjp_kernel(ins, attrs, wanted, fresh=True):
        diff = []  # (slot, index) of every float input that some consumer wants
        for s in fwd.inputs:
            if s.no_grad:
                continue
            mask = wanted.get(s.name + "@GRAD")
            vals = ins[s.name]
            vals = vals if s.duplicable else [vals]
            for i, v in enumerate(vals):
                if v is not None and mask and mask[i] and v.is_floating_point():
                    diff.append((s.name, i))
        if not diff:
            return {}
        primals = [ins[n][i] if fwd.input_slot(n).duplicable else ins[n] for n, i in diff]

        def f(*prims):
            local = {k: (list(v) if isinstance(v, list) else v) for k, v in ins.items()
                     if fwd.input_slot(k) is not None}
            for (n, i), p in zip(diff, prims, strict=True):
                if fwd.input_slot(n).duplicable:
                    local[n][i] = p
                else:
                    local[n] = p
            outs = fwd.kernel(local, attrs)
            flat = []
            for s in fwd.outputs:
                if s.no_grad:
                    continue
                v = outs[s.name]
                flat.extend(v if s.duplicable else [v])
            return tuple(flat)

        outs, vjp_fn = torch.func.vjp(f, *primals)
        cot = []
        k = 0
        for s in fwd.outputs:
            if s.no_grad:
                continue
            g = ins.get(s.name + "@GRAD")
            n = len(ins[s.name]) if s.duplicable and s.name in ins else None
            gs = g if s.duplicable else [g]
            count = len(gs) if gs is not None else (n or 1)
            for j in range(count):
                gj = gs[j] if gs is not None else None
                cot.append(gj if gj is not None else torch.zeros_like(outs[k + j]))
            k += count
        grads = vjp_fn(tuple(c.to(o.dtype) if c.dtype != o.dtype else c
                             for c, o in zip(cot, outs, strict=True)))
        if fresh:
            grads = _unaliased(grads, ins)
        result = {}
        for (n, i), g in zip(diff, grads, strict=True):
            key = n + "@GRAD"
            if fwd.input_slot(n).duplicable:
                lst = result.setdefault(key, [None] * len(ins[n]))
                lst[i] = g
            else:
                result[key] = g
        return result

    def vjp_raw(ins, attrs, wanted):
        # vjp hands back the cotangent (or a view of it) for linear ops: may alias
        return vjp_kernel(ins, attrs, wanted, False)

    gdef = _REGISTRY[fwd.type + "_grad"] = _make_grad_def(fwd, vjp_kernel, uses)
    # a vjp result is a function of the cotangents: at most one of them, or a view
    cotangents = [s.name for s in gdef.inputs if s.name.endswith("@GRAD")]
    gdef.may_alias = {s.name: cotangents for s in gdef.outputs}
    gdef.raw_kernel = vjp_raw
    fwd.grad_uses = uses


def unaliased(outs, inputs):
    """``outs`` with every tensor that shares memory with an input (or an earlier output) copied.

    Kernels must return fresh tensors: the executor binds each result to its own
    var, and an in-place update of one (an in-place all-reduce of a gradient)
    must not change another. vjp hands back the cotangent itself, or a view of
    it, for linear ops; ATen view ops alias their input. Meta tensors are skipped.
    A copy keeps the view's strides (``preserve_format``), so the kernels that
    read it take the same code path as on the view itself: the compiled path,
    which copies nothing it can prove safe, then gives bit-identical results.
    """
    taken = set()
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
            taken.add(t.untyped_storage().data_ptr())
    fresh = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.numel() and o.device.type != "meta":
            ptr = o.untyped_storage().data_ptr()
            if ptr in taken:
                o = o.clone(memory_format=torch.preserve_format)
                ptr = o.untyped_storage().data_ptr()
            taken.add(ptr)
        fresh.append(o)
    return fresh


def _unaliased(grads, ins):
    flat = [t for v in ins.values() for t in (v if isinstance(v, list) else [v])]
    return unaliased(grads, flat)


_FAMILIES = {}  # prefix -> resolver(type) -> OpDef or None


def register_family(prefix, resolver):
    """Make op types starting with ``prefix`` on first use with ``resolver(type)``."""
    _FAMILIES[prefix] = resolver


def get_op_def(type, missing_ok=False):
    """The ``OpDef`` of ``type``; ``ProgramError`` (or None) if it is not registered."""
    op_def = _REGISTRY.get(type)
    if op_def is None:
        for prefix, resolver in _FAMILIES.items():
            if type.startswith(prefix):
                op_def = resolver(type)
                break
    if op_def is None and not missing_ok:
        import difflib
        close = difflib.get_close_matches(type, list(_REGISTRY), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ProgramError(f"unknown op type {type!r}{hint}")
    return op_def


def registered_ops():
    """Sorted names of every registered op type."""
    return sorted(_REGISTRY)


# --- shape / dtype inference -------------------------------------------------------------
_BATCH_PROBES = (5, 7)


def _meta(shape, dtype, batch):
    dims = [batch if d < 0 else d for d in shape]
    return torch.empty(dims, dtype=torch_dtype(dtype), device="meta")


class ShapeRule:
    """An exact, cheap stand-in for the meta probe of one op type (module docstring).

    ``shapes(ins, attrs)`` returns, per output slot, the output shape (a list of them
    for a duplicable slot) for concrete input shapes, and raises where the kernel
    would refuse them. ``ins`` maps each given input slot to its ``(shape, dtype)`` (a
    list of them for a duplicable slot). Like the probe, ``outputs`` calls it with
    every -1 dim as 5 and as 7 and marks an output dim that differs -1, so what a -1
    may meet (a 1, another -1, a bound of at least 7) is the probe's by construction.

    The dtypes, and the kernel's refusal of dtypes, come from the kernel itself, run
    once on meta tensors of one element: ``canon(ins, attrs)`` returns the shapes and
    attrs of that run, ``({slot: shape or [shapes]}, attrs)``, which must keep what the
    dtypes depend on (a 0-dim input stays 0-dim: it promotes differently) and draw
    from a small set, since with the input dtypes they are the cache key. Without
    ``canon`` every input is ``[]`` (0-dim) or ``[1]`` and the attrs are kept. An op
    whose inputs are many (``sum``) returns a list of runs instead, ``(shapes, attrs,
    ins)`` each with the input specs whose dtypes it takes: all must pass, and the first
    gives the dtypes (the run count, not its size, grows with the distinct inputs).
    """

    __slots__ = ("shapes", "canon")

    def __init__(self, shapes, canon=None):
        self.shapes = shapes
        self.canon = canon

    def outputs(self, op_def, ins, attrs):
        """slot -> list of (shape, dtype), as ``probe_outputs`` would give."""
        batched = any(d < 0 for v in ins.values()
                      for sh, _ in (v if isinstance(v, list) else [v]) for d in sh)
        runs = [self.shapes(_at_batch(ins, b) if batched else ins, attrs)
                for b in (_BATCH_PROBES if batched else _BATCH_PROBES[:1])]
        dtypes = self._dtypes(op_def, ins, attrs)
        out = {}
        for slot, shape in runs[0].items():
            if slot not in dtypes:
                continue
            dup = op_def.output_slot(slot).duplicable
            a, b = (shape, runs[-1][slot]) if dup else ([shape], [runs[-1][slot]])
            out[slot] = [None if dt is None else
                         ([da if da == db else -1 for da, db in zip(sa, sb, strict=True)], dt)
                         for sa, sb, dt in zip(a, b, dtypes[slot], strict=True)]
        return out

    def _dtypes(self, op_def, ins, attrs):
        if self.canon is None:
            shapes = {k: [_one(sh) for sh, _ in v] if isinstance(v, list) else _one(v[0])
                      for k, v in ins.items()}
            return self._run(op_def, shapes, attrs, ins)
        runs = self.canon(ins, attrs)
        if isinstance(runs, tuple) and len(runs) == 2:
            return self._run(op_def, runs[0], runs[1], ins)
        first = None
        for shapes, run_attrs, run_ins in runs:
            got = self._run(op_def, shapes, run_attrs, run_ins)
            first = got if first is None else first
        return first

    def _run(self, op_def, shapes, attrs, ins):
        dts = {k: tuple(dt for _, dt in v) if isinstance(v, list) else v[1]
               for k, v in ins.items()}
        key = (op_def.type, repr(shapes), repr(dts), repr(attrs))
        hit = _DTYPE_RUNS.get(key)
        if hit is None:
            metas = {}
            for s in op_def.inputs:
                if s.name not in ins:
                    metas[s.name] = [] if s.duplicable else None
                elif s.duplicable:
                    metas[s.name] = [_meta(sh, dt, 1)
                                     for sh, dt in zip(shapes[s.name], dts[s.name], strict=True)]
                else:
                    metas[s.name] = _meta(shapes[s.name], dts[s.name], 1)
            try:
                outs = op_def.kernel(metas, attrs)
                hit = {k: [None if t is None else dtype_name(t.dtype)
                           for t in (v if isinstance(v, list) else [v])]
                       for k, v in outs.items() if v is not None}
            except Exception as e:  # noqa: BLE001 - the kernel refuses the dtypes: so does the rule
                hit = e
            if len(_DTYPE_RUNS) >= _DTYPE_RUNS_MAX:
                _DTYPE_RUNS.clear()
            _DTYPE_RUNS[key] = hit
        if isinstance(hit, Exception):
            raise hit.with_traceback(None)
        return hit


def _one(shape):
    return [] if not shape else [1]


def _at_batch(ins, batch):
    def sub(spec):
        return [batch if d < 0 else d for d in spec[0]], spec[1]
    return {k: [sub(s) for s in v] if isinstance(v, list) else sub(v) for k, v in ins.items()}


# (op type, canonical shapes, dtypes, attrs) -> {slot: [dtype name]} or the kernel's error;
# the keys come from a small set per op type (ShapeRule.canon), so this stays small
_DTYPE_RUNS = {}
_DTYPE_RUNS_MAX = 4096


def infer_outputs(op_def, op, in_specs, rule=True):
    """Infer output (shape, dtype) per output slot of ``op``.

    ``in_specs`` maps input slot -> list of (shape, dtype) (shape may be None
    when unknown). Returns slot -> list of (shape, dtype) or None when nothing
    can be inferred. Raises whatever the kernel raises on incompatible inputs.
    ``rule=False`` runs the meta probe even where the op has a ``ShapeRule``.
    """
    attrs = op_def.full_attrs(op.attrs)
    if op_def.infer is not None:
        flat = {k: (v if op_def.input_slot(k) and op_def.input_slot(k).duplicable else
                    (v[0] if v else None)) for k, v in in_specs.items()}
        res = op_def.infer(flat, attrs, op_def) if op_def.is_grad else op_def.infer(flat, attrs)
        out = {}
        for k, v in res.items():
            out[k] = v if isinstance(v, list) else [v]
        return out
    if any(sh is None for specs in in_specs.values() for sh, _ in specs):
        return None
    if rule and op_def.rule is not None:
        flat = {k: (v if op_def.input_slot(k).duplicable else v[0])
                for k, v in in_specs.items() if v}
        return op_def.rule.outputs(op_def, flat, attrs)
    return probe_outputs(op_def, op, in_specs, attrs)


def probe_outputs(op_def, op, in_specs, attrs):
    """Output specs from running the kernel on meta tensors (shapes all known).

    Each -1 dim is probed as 5 and as 7; an output dim that differs is -1. Without
    a -1 dim in any input one run does: both would get the same tensors, and a
    kernel's output shapes depend on nothing else (random ops draw values, not
    shapes; size expressions read input dims).
    """
    batched = any(d < 0 for specs in in_specs.values() for sh, _ in specs for d in sh)
    runs = []
    for batch in (_BATCH_PROBES if batched else _BATCH_PROBES[:1]):
        ins = {}
        for s in op_def.inputs:
            specs = in_specs.get(s.name)
            if not specs:
                ins[s.name] = [] if s.duplicable else None
                continue
            ts = [_meta(sh, dt, batch) for sh, dt in specs]
            ins[s.name] = ts if s.duplicable else ts[0]
        if op_def.wants_mask:
            wanted = {s.name: [n != EMPTY_VAR for n in op.output(s.name)] for s in op_def.outputs}
            outs = op_def.kernel(ins, attrs, wanted)
        else:
            outs = op_def.kernel(ins, attrs)
        runs.append(outs)
    result = {}
    for s in op_def.outputs:
        a, b = runs[0].get(s.name), runs[-1].get(s.name)
        if a is None:
            continue
        a = a if isinstance(a, list) else [a]
        b = b if isinstance(b, list) else [b]
        specs = []
        for ta, tb in zip(a, b, strict=True):
            if ta is None:
                specs.append(None)
                continue
            shape = [da if da == db else -1 for da, db in zip(ta.shape, tb.shape, strict=True)]
            specs.append((shape, dtype_name(ta.dtype)))
        result[s.name] = specs
    return result
