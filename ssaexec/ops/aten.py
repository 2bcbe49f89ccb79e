"""ATen overloads as program ops: one generic ``OpDef`` per overload, made on first use.

The torch importer (``ssaexec.frontends.torch``) turns every ATen call of a
captured graph into an op whose type names the overload, ``aten.<name>.<overload>``
(``aten.convolution.default``). ``get_op_def`` asks ``aten_op_def`` for such
types, which resolves ``torch.ops.aten.<name>.<overload>`` and registers an
``OpDef`` built from its schema. Nothing is imported or evaluated from a program
file to do so: the type string only selects an attribute of ``torch.ops.aten``.

An ATen op has two slots and one attribute per schema argument:

* ``X`` (duplicable): the distinct tensor inputs, in order of first use;
* ``Out`` (duplicable): the results, one var per tensor result (a tuple result
  such as ``native_batch_norm``'s three, or a ``Tensor[]`` result, lists them in
  order; ``@EMPTY@`` marks one nobody reads);
* attribute ``<argument name>`` holds that argument, JSON-safe:

  ===========================  ===================================================
  schema type                  attribute value
  ===========================  ===================================================
  Tensor, Tensor?              ``"X[k]"`` (the k-th ``X`` input), ``null``, or a
                               plain number where a Python scalar was passed
  Tensor[], Tensor?[]          a list of the above
  int, SymInt, float, Scalar   the number, or a size expression string (below)
  int[], SymInt[], float[]     a list of the above
  ScalarType                   a dtype name (``"float32"``)
  Layout, MemoryFormat         ``"strided"``, ``"contiguous_format"`` ...
  Device                       ``null``: the op runs where its place is; an op
                               with tensor inputs follows its first one, a factory
                               op (none) is made on its place's device, which
                               both execution paths pass as ``device``
  bool, str, None              as is
  ===========================  ===================================================

  Arguments the captured call did not pass are left out (torch's defaults apply).

Size expressions. A program imported with a dynamic batch carries sizes that
depend on it, such as the ``[s0, 512]`` of a flatten. Such a size is a string,
``"s0"`` or ``"16*s0"``, over symbols bound by the reserved attribute ``@sym``:
``[["s0", k, d], ...]`` says s0 is dimension d of input ``X[k]``. The
expression language (integers, symbols, ``+ - * //``, parentheses and sympy's
spelling of a few functions; no ``**``, no other calls) is parsed and evaluated
with bounds by ``ssaexec.ops.size_expr``, never ``eval``-ed.

Operator policy (``ssaexec.ops.policy``, docs/security.md). Only allowlisted
pure tensor overloads resolve: ``aten_op_def`` raises ``ProgramError`` for any
other existing overload (``aten.from_file.default`` ...), so a program can
neither load nor run one. Sizes are bounded (``ssaexec.core.limits``): shape
inference runs factory ops on the meta device and refuses outputs above
``max_tensor_elements``, and at run time the size arguments computed from size
expressions are checked before the kernel allocates.

Kernel guards (``ssaexec.ops.guards``). Some kernels trust their arguments: index
values, the shapes of statistics, sizes and strides. ``aten_op_def`` binds such an
overload behind its guard (a ``GuardedOverload``, called like the ``OpOverload``),
and ``OpDef.overload`` holds what both execution paths call, so no path reaches
the bare kernel. Shape and size guards also run in shape inference, on meta
tensors: a program that breaks them fails validation.

Kernel policy (see ``ssaexec.ops.registry``): results never share storage with
an input or with each other. ATen view ops (``view``, ``t``, ``expand`` ...)
return aliases; an alias of a parameter would see the optimizer's in-place
update, an alias of a gradient the in-place all-reduce, so aliased results are
copied (the price of a copy per view op, paid for correctness).

Also here: ``assign_bytes``, the compact constant the importer writes parameter
values with: base64 of the raw little-endian bytes, 4 characters per 3 bytes,
where ``assign_value``'s float lists take some 20 characters per element. In a
main program (an evaluation import's graph constants) it is decoded and copied
to the place's device on its first runs only (``ops.init.DeviceConstant``).
"""

import base64
import math
import sys

import torch

from ..core.compat import TorchDispatchMode
from ..core.errors import ProgramError
from ..core.limits import cap_sizes, get_limit, numel_problem
from ..core.dtypes import DTYPES, dtype_name, torch_dtype
from .guards import guarded
from .policy import check_op_type
from .portable import portable
from .schema import LAYOUTS, MEMORY_FORMATS, SYM_ATTR, Unsupported, arg_kinds, resolve_overload
from .registry import REQUIRED, OpDef, register_family, register_op, unaliased
from .init import DeviceConstant, register_device_kernel
from .size_expr import parse_size_expr

__all__ = ["SYM_ATTR", "aten_op_def", "resolve_overload", "arg_kinds", "CompiledCall", "OMIT",
           "is_ref", "parse_size_expr", "encode_bytes", "decode_bytes"]

def _json_default(arg):
    # The attr default stands for "not passed". An Optional argument's None is its
    # default (and validation accepts an explicit None only where the default is None).
    if str(arg.real_type).startswith("Optional["):
        return None
    if not arg.has_default_value():
        return REQUIRED
    v = arg.default_value
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float)) for x in v):
        return list(v)
    return OMIT


class Omit:
    __slots__ = ()

    def __repr__(self):
        return "<torch default>"


OMIT = Omit()  # an attr default that means "do not pass this argument"


# --- the generic kernel --------------------------------------------------------------------
def is_ref(v):
    return isinstance(v, str) and v.startswith("X[") and v.endswith("]") and v[2:-1].isdigit()


class CompiledCall:
    """One op's attrs turned into a fast argument builder (cached per attrs dict).

    ``device`` is the place's device (None: not known, torch's default), passed as
    the ``device`` argument of an op with no tensor input.
    """

    __slots__ = ("attrs", "device", "steps", "kw_steps", "binds", "has_device")

    def __init__(self, op_type, kinds, attrs, device=None):
        self.attrs = attrs  # keeps id(attrs) from being reused while cached
        self.device = device
        self.binds = []
        for entry in attrs.get(SYM_ATTR) or []:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in entry[1:])):
                raise ProgramError(f"{op_type}: attribute {SYM_ATTR!r} entries must be "
                                   f"[symbol, input index, dim], got {entry!r}")
            self.binds.append(tuple(entry))
        self.steps, self.kw_steps = [], []
        self.has_device = False
        for name, enc, kwarg_only in kinds:
            value = attrs.get(name, OMIT)
            if value is OMIT:
                continue
            if enc == "device":
                self.has_device = True
            step = (name, self._decoder(op_type, name, enc, value))
            (self.kw_steps if kwarg_only else self.steps).append(step)

    def _decoder(self, op_type, name, enc, value):
        # Each decoder is fn(xs, env) -> the Python argument; constants are closed over.
        where = f"{op_type}: argument {name!r}"
        if isinstance(enc, Unsupported):
            if value is None:
                return lambda xs, env: None
            raise ProgramError(f"{where} has schema type {enc.type}, which ssaexec cannot "
                               "encode")
        if enc == "generator":
            if value is not None:
                raise ProgramError(f"{where}: only a null generator is supported")
            return lambda xs, env: None
        if enc == "device":
            # made where the op runs: with its inputs, or (a factory op) on the place's
            # device, never on the CPU for a copy to follow (the policy keeps the value null)
            device = self.device
            return lambda xs, env: xs[0].device if xs else device
        if enc == "dtype":
            if value is None:
                return lambda xs, env: None
            dt = torch_dtype(value) if isinstance(value, str) else None
            if dt is None:
                raise ProgramError(f"{where}: expected a dtype name, got {value!r}")
            return lambda xs, env: dt
        if enc in ("layout", "memory_format"):
            table = LAYOUTS if enc == "layout" else MEMORY_FORMATS
            if value is None:
                return lambda xs, env: None
            if value not in table:
                raise ProgramError(f"{where}: expected one of {sorted(table)}, got {value!r}")
            v = table[value]
            return lambda xs, env: v
        if enc == "literal":
            return lambda xs, env: value
        return self._value_decoder(where, enc, value)

    def _value_decoder(self, where, enc, value):
        # tensors, tensor lists, numbers and size expressions (possibly nested in lists)
        if isinstance(value, list):
            parts = [self._value_decoder(where, enc, v) for v in value]
            if all(getattr(p, "const", False) for p in parts):
                v = [p(None, None) for p in parts]
                return _const(v)
            if enc == "size" and any(isinstance(v, str) for v in value):
                # sizes computed from the batch: cap their product before the kernel runs
                op_type = where.split(":")[0]
                return lambda xs, env: cap_sizes([p(xs, env) for p in parts], op_type)
            return lambda xs, env: [p(xs, env) for p in parts]
        if is_ref(value):
            if enc not in ("tensor", "tensor_list"):
                raise ProgramError(f"{where}: a tensor reference {value!r} where the schema "
                                   "takes no tensor")
            k = int(value[2:-1])
            return lambda xs, env: xs[k]
        if isinstance(value, str):
            if enc == "literal":
                return _const(value)
            fn, symbols = parse_size_expr(value)
            missing = symbols - {b[0] for b in self.binds}
            if missing:
                raise ProgramError(f"{where}: size expression {value!r} uses "
                                   f"{sorted(missing)}, which {SYM_ATTR!r} does not bind")
            return lambda xs, env: fn(env)
        if value is None or isinstance(value, (bool, int, float)):
            return _const(value)
        raise ProgramError(f"{where}: cannot decode {value!r}")

    def call(self, overload, xs):
        env = None
        if self.binds:
            env = {s: xs[k].shape[d] for s, k, d in self.binds}
        args = [fn(xs, env) for _, fn in self.steps]
        kwargs = {name: fn(xs, env) for name, fn in self.kw_steps}
        return overload(*args, **kwargs)


def _const(v):
    def fn(xs, env):
        return v
    fn.const = True
    return fn


def _results(out):
    """The flat list of an overload's results (None for an undefined one)."""
    if isinstance(out, torch.Tensor) or out is None:
        return [out]
    if isinstance(out, (tuple, list)):
        flat = []
        for o in out:
            if isinstance(o, (tuple, list)):
                flat.extend(o)
            else:
                flat.append(o)
        return flat
    raise TypeError(f"returned {type(out).__name__}, not tensors")


def _fresh(outs, xs):
    """``outs`` with every result that shares storage with an input or an earlier result copied."""
    return unaliased(outs, xs)


def _make_kernel(op_type, overload, kinds):
    cache = {}  # id(attrs) -> CompiledCall; OpCall keeps one attrs dict per op

    def kernel(ins, attrs, device=None):
        # device: the place's, for a factory op (runtime.op_call passes it)
        compiled = cache.get(id(attrs))
        if compiled is None or compiled.attrs is not attrs or compiled.device != device:
            compiled = CompiledCall(op_type, kinds, attrs, device)
            if len(cache) > 4096:
                cache.clear()
            cache[id(attrs)] = compiled
        xs = ins.get("X") or []
        outs = _results(compiled.call(overload, xs))
        return {"Out": _fresh(outs, xs)}

    return kernel


class _MetaFactories(TorchDispatchMode):
    """Inside it, ops that create tensors (a ``device`` argument) create them on meta.

    Shape inference must never allocate (a program file may ask ``aten.full`` for
    any size): inputs are meta tensors already, and this moves factory ops there too.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _takes_device(func):
            kwargs = dict(kwargs, device=_META)
            kwargs.pop("pin_memory", None)
        return func(*args, **kwargs)


_META = torch.device("meta")
_TAKES_DEVICE = {}


def _takes_device(func):
    hit = _TAKES_DEVICE.get(func)
    if hit is None:
        hit = _TAKES_DEVICE[func] = any(a.name == "device" and a.kwarg_only
                                        for a in func._schema.arguments)
    return hit


def _make_infer(kernel):
    # The registry's default probes -1 dims with two batch sizes. Here a -1 may stand for
    # 16*s0 rather than s0, which no probe fits; such an op's shapes are then unknown
    # (an empty result) rather than an error. The importer records exact shapes anyway.
    # A ProgramError (a bad size expression, a size over the limits) is an error, though.
    def infer(ins, attrs):
        specs = ins.get("X") or []
        if any(s is None or s[0] is None for s in specs):
            return {}
        runs = []
        for batch in (5, 7):
            xs = [torch.empty([batch if d < 0 else d for d in shape], dtype=torch_dtype(dt),
                              device="meta") for shape, dt in specs]
            try:
                with _MetaFactories():
                    runs.append(kernel({"X": xs}, attrs)["Out"])
            except ProgramError:
                raise
            except Exception:  # noqa: BLE001 - see above: unknown, not wrong
                return {}
        out = []
        for a, b in zip(*runs, strict=True):
            if a is None or a.dtype not in _DTYPE_OK:
                out.append(None)
                continue
            shape = [da if da == db else -1 for da, db in zip(a.shape, b.shape, strict=True)]
            # per unit of batch, as declared shapes count -1 (run time sizes: size_expr)
            numel = math.prod(max(d, 1) for d in shape) if 0 not in shape else 0
            if numel > get_limit("max_tensor_elements"):
                raise ProgramError(numel_problem(numel, f"its result {shape}"))
            out.append((shape, dtype_name(a.dtype)))
        return {"Out": out}
    return infer


_DTYPE_OK = frozenset(DTYPES.values())


# Made on demand and kept apart from the registry's table, so ``registered_ops()`` lists
# the hand-written ops only (there are thousands of ATen overloads).
_DEFS = {}


def aten_op_def(type):
    """The ``OpDef`` of ATen type ``type`` (made once); None if there is no such overload."""
    op_def = _DEFS.get(type)
    if op_def is not None:
        return op_def
    overload = resolve_overload(type)
    if overload is None:
        return None
    check_op_type(type)  # the operator policy: pure tensor ops only (ssaexec.ops.policy)
    schema = overload._schema
    kinds = arg_kinds(overload)
    attrs = {a.name: ("any", _json_default(a)) for a in schema.arguments}
    attrs[SYM_ATTR] = ("any", None)
    # The overload behind its guard when its kernel trusts its arguments (ssaexec.ops.guards);
    # both execution paths call what op_def.overload holds.
    # A CPU-only overload (traced on the CPU) gets its device-generic twin off the CPU.
    base = portable(type, overload)
    call = guarded(type, base)
    kernel = _make_kernel(type, call, kinds)
    op_def = OpDef(type, ["X*"], ["Out*"], attrs, kernel, infer=_make_infer(kernel), grad=None,
                   is_random=torch.Tag.nondeterministic_seeded in overload.tags,
                   doc=f"ATen {schema}")
    op_def.overload = call
    if call is not base:  # for programs built in this process (ProgramDesc.trusted)
        op_def.bare_overload = base
        op_def.bare_kernel = _make_kernel(type, base, kinds)
    # view ops and ops that may return an input (schema alias annotations, Tensor(a))
    op_def.may_alias = any(r.alias_info is not None for r in schema.returns)
    _DEFS[type] = op_def
    return op_def


# --- compact constants ---------------------------------------------------------------------
register_family("aten.", aten_op_def)


def encode_bytes(tensor):
    """Base64 of ``tensor``'s raw bytes in row-major, little-endian order."""
    if sys.byteorder != "little":  # pragma: no cover - torch supports little-endian hosts
        raise ProgramError("assign_bytes needs a little-endian host")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat.new_empty(0, dtype=torch.uint8)
    return base64.b64encode(raw.numpy().tobytes()).decode("ascii")


def decode_bytes(data, shape, dtype):
    """Inverse of ``encode_bytes``: a CPU tensor of ``shape`` and ``dtype`` (a name)."""
    dt = torch_dtype(dtype)
    try:
        raw = bytearray(base64.b64decode(data.encode("ascii"), validate=True))
    except (ValueError, UnicodeEncodeError) as e:
        raise ProgramError(f"assign_bytes: data is not base64: {e}") from None
    numel = math.prod(shape)
    if len(raw) != numel * dt.itemsize:
        raise ProgramError(f"assign_bytes: {len(raw)} bytes do not make a {dtype}{list(shape)} "
                           f"tensor ({numel * dt.itemsize} bytes)")
    if numel == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(raw, dtype=dt).reshape(shape)


def _bytes_infer(ins, attrs):
    # the byte count from the base64 length alone (validation never decodes the data)
    shape, data = list(attrs["shape"]), attrs["data"]
    if any(d < 0 for d in shape):
        raise ProgramError(f"assign_bytes: shape {shape} has a negative size")
    want = math.prod(shape) * torch_dtype(attrs["dtype"]).itemsize
    pad = len(data) - len(data.rstrip("="))
    have = len(data) // 4 * 3 - min(pad, 2) if len(data) % 4 == 0 and pad <= 2 else None
    if have != want:
        got = "data whose length is not base64's" if have is None else f"{have} bytes"
        raise ProgramError(f"assign_bytes: {got} do not make a {attrs['dtype']}{shape} tensor "
                           f"({want} bytes)")
    return {"Out": (shape, attrs["dtype"])}


@register_op("assign_bytes", [], ["Out"],
             {"shape": ("ints", REQUIRED), "dtype": ("dtype", "float32"),
              "data": ("str", REQUIRED)}, infer=_bytes_infer, grad=None)
def assign_bytes(ins, attrs):
    """Out = the tensor whose raw little-endian bytes ``data`` holds in base64."""
    return {"Out": decode_bytes(attrs["data"], attrs["shape"], attrs["dtype"])}


def _decoded(attrs):
    return decode_bytes(attrs["data"], attrs["shape"], attrs["dtype"])


# a main program's constant (an evaluation import's graph constants) is decoded and copied
# to the device once, not every step (ops.init.DeviceConstant)
register_device_kernel("assign_bytes", lambda device: DeviceConstant(_decoded, device))
