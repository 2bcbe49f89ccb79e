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
  dimension (-1). Ops whose kernels cannot run on meta supply ``infer``.
* The registry is a leaf: it imports no kernel module. Importing ``ssaexec.ops``
  (which any import of ``ssaexec.ops.<module>`` does first) registers the built-in
  kernels; a family of op types made on demand (``aten.*``) registers a resolver
  with ``register_family``.
* Grad ops receive ``wanted``: per output slot, which entries anyone reads, so
  they can skip work; their kernels take ``(ins, attrs, wanted)``.
"""

import torch

from ..errors import ProgramError
from ..dtypes import dtype_name, torch_dtype

__all__ = ["Slot", "OpDef", "register_op", "register_grad", "register_family", "get_op_def",
           "registered_ops", "infer_outputs", "REQUIRED", "ATTR_TYPES", "check_attr",
           "EMPTY_VAR"]

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
                 "bare_kernel")

    def __init__(self, type, inputs, outputs, attrs, kernel, infer=None, grad="auto",
                 inplace=False, is_random=False, doc=""):
        self.type = type
        self.inputs = [_slot(s) for s in inputs]
        self.outputs = [_slot(s) for s in outputs]
        self.attrs = dict(attrs)
        self.kernel = kernel
        self.infer = infer
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
                is_random=False, control=False):
    """Decorator registering ``fn(ins, attrs) -> outs`` as the kernel of op ``type``.

    ``inputs``/``outputs`` are slot specs: ``"X"``, ``"X*"`` duplicable,
    ``"X?"`` optional, ``"X!"`` no gradient. ``attrs`` maps name to
    ``(type, default)`` with ``REQUIRED`` for no default. ``control`` ops own
    sub-blocks and take ``(ins, attrs, ctx)``.
    """
    def deco(fn):
        op_def = OpDef(type, inputs, outputs, attrs or {}, fn, infer, grad, inplace, is_random,
                       (fn.__doc__ or "").strip())
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


def infer_outputs(op_def, op, in_specs):
    """Infer output (shape, dtype) per output slot of ``op``.

    ``in_specs`` maps input slot -> list of (shape, dtype) (shape may be None
    when unknown). Returns slot -> list of (shape, dtype) or None when nothing
    can be inferred. Raises whatever the kernel raises on incompatible inputs.
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
    runs = []
    for batch in _BATCH_PROBES:
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
        a, b = runs[0].get(s.name), runs[1].get(s.name)
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
