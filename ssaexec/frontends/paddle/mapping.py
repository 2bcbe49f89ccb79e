"""How a Paddle op type becomes ssaexec ops: the table's machinery.

``MAPPINGS`` maps a Paddle op type to a ``Mapping`` (registered with ``_register``,
``simple`` or ``with_grad``); the attribute readers (``a_int`` ...) convert Paddle's
encodings and raise ``Unsupported`` for what ssaexec cannot honour; ``Simple`` is the
one-op mapping with renamed slots; ``GradOf`` maps a grad op through its forward op.
The entries themselves live by family in ``ops_*.py`` and are loaded by
``paddle/ops.py``, whose docstring states the conventions. Names with ``_`` are for
those modules only.
"""

from ...ops.registry import EMPTY_VAR, get_op_def
from .reader import DTYPES

__all__ = ["MAPPINGS", "Mapping", "Unsupported", "mapping_table", "grad_forward_type",
           "Simple", "simple", "with_grad", "GradOf", "a_int", "a_float", "a_bool", "a_ints",
           "a_str", "a_dtype", "require", "no_inputs"]


class Unsupported(Exception):
    """A Paddle op (or one of its attributes) that ssaexec cannot run; ``op`` and message."""

    def __init__(self, op, message):
        super().__init__(message)
        self.op = op


class Mapping:
    """How one Paddle op type becomes ssaexec ops: ``fn(ctx, op)``; ``ours`` and ``note``
    describe it for the docs."""

    __slots__ = ("paddle_type", "ours", "note", "fn")

    def __init__(self, paddle_type, ours, note, fn):
        self.paddle_type, self.ours, self.note, self.fn = paddle_type, ours, note, fn


MAPPINGS = {}


def _register(paddle_type, ours, fn, note=""):
    MAPPINGS[paddle_type] = Mapping(paddle_type, ours, note, fn)


# --- attributes -------------------------------------------------------------------------------

_REQUIRED = object()


def _get(op, name, default):
    if name in op.attrs:
        return op.attrs[name]
    if default is _REQUIRED:
        raise Unsupported(op, f"attribute {name!r} is missing")
    return default


def a_int(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise Unsupported(op, f"attribute {name!r} must be an integer, got {v!r}")
    return v


def a_float(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Unsupported(op, f"attribute {name!r} must be a number, got {v!r}")
    return float(v)


def a_bool(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise Unsupported(op, f"attribute {name!r} must be a boolean, got {v!r}")


def a_ints(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise Unsupported(op, f"attribute {name!r} must be a list of integers, got {v!r}")
    return list(v)


def a_str(op, name, default=_REQUIRED):
    v = _get(op, name, default)
    if not isinstance(v, str):
        raise Unsupported(op, f"attribute {name!r} must be a string, got {v!r}")
    return v


def a_dtype(op, name, default=_REQUIRED):
    """A ``VarType.Type`` code attribute as our dtype name."""
    code = a_int(op, name, default)
    if code not in DTYPES:
        raise Unsupported(op, f"attribute {name!r}: data type code {code} has no ssaexec dtype "
                              f"(supported: {', '.join(sorted(DTYPES.values()))})")
    return DTYPES[code]


def require(op, cond, message):
    if not cond:
        raise Unsupported(op, message)


def no_inputs(op, *slots):
    """Refuse tensor inputs that would make an attribute dynamic (``ShapeTensor`` ...)."""
    for s in slots:
        if any(n != EMPTY_VAR for n in op.input(s)):
            raise Unsupported(op, f"input {s!r} (a value computed at run time) is not supported; "
                                  "ssaexec needs it as an attribute")


def _data_format(op, name="data_format"):
    fmt = a_str(op, name, "NCHW")
    require(op, fmt in ("NCHW", "AnyLayout"), f"{name}={fmt!r} is not supported; ssaexec "
                                               "convolutions and pools are NCHW")


def _one(op, slot, outputs=False):
    names = op.output(slot) if outputs else op.input(slot)
    if len(names) != 1:
        kind = "output" if outputs else "input"
        raise Unsupported(op, f"{kind} slot {slot!r} must name one var, names {len(names)}")
    return names[0]


# --- one op, renamed slots --------------------------------------------------------------------

class Simple:
    """Map to one ssaexec op: slots renamed (``ins``/``outs``: Paddle slot -> ours), attributes
    from ``attrs(op)``. Output slots in ``drop`` (``XShape``) are not produced; input slots in
    ``dynamic`` must be empty. Any other non-empty slot is refused."""

    def __init__(self, ours, ins, outs, attrs=None, drop=(), dynamic=()):
        self.ours, self.ins, self.outs = ours, dict(ins), dict(outs)
        self.attrs, self.drop, self.dynamic = attrs, tuple(drop), tuple(dynamic)

    def check_slots(self, op):
        no_inputs(op, *self.dynamic)
        for slot, names in op.inputs.items():
            if slot not in self.ins and slot not in self.dynamic and \
                    any(n != EMPTY_VAR for n in names):
                raise Unsupported(op, f"input slot {slot!r} is not supported")
        for slot, names in op.outputs.items():
            if slot not in self.outs and slot not in self.drop and \
                    any(n != EMPTY_VAR for n in names):
                raise Unsupported(op, f"output slot {slot!r} is not supported")

    def __call__(self, ctx, op, attrs=None):
        self.check_slots(op)
        if attrs is None:
            attrs = self.attrs(op) if self.attrs is not None else {}
        ours = ctx.emit(self.ours, {o: op.input(p) for p, o in self.ins.items() if op.input(p)},
                        {o: op.output(p) for p, o in self.outs.items() if op.output(p)}, attrs)
        ctx.record(op, ours, self.ins, self.outs)
        return ours


def simple(paddle_type, ours, ins=("X",), outs=("Out",), attrs=None, drop=(), dynamic=(),
           note=""):
    """Register a ``Simple`` mapping; ``ins``/``outs`` are dicts or same-name slot lists."""
    ins = ins if isinstance(ins, dict) else {s: s for s in ins}
    outs = outs if isinstance(outs, dict) else {s: s for s in outs}
    m = Simple(ours, ins, outs, attrs, drop, dynamic)
    _register(paddle_type, ours, m, note)
    return m


# --- gradients --------------------------------------------------------------------------------

# Paddle grad op types that are not "<forward>_grad"
_GRAD_NAMES = {"cross_entropy_grad2": "cross_entropy2"}


def grad_forward_type(grad_type):
    """The forward op type of Paddle grad op type ``grad_type``."""
    if grad_type in _GRAD_NAMES:
        return _GRAD_NAMES[grad_type]
    return grad_type[: -len("_grad")]


class GradOf:
    """Map a Paddle grad op to ssaexec's grad op of what its forward op became."""

    def __call__(self, ctx, op):
        rec = ctx.forward(op)
        fwd = rec.ours
        gdef = get_op_def(fwd.type + "_grad", missing_ok=True)
        if gdef is None:
            raise Unsupported(op, f"ssaexec's {fwd.type!r} has no gradient op")
        rev_in = {o: p for p, o in rec.ins.items()}
        rev_out = {o: p for p, o in rec.outs.items()}
        ins = {}
        for s in gdef.inputs:
            if s.name.endswith("@GRAD"):
                p = rev_out.get(s.name[:-5])
                names = op.input(p + "@GRAD") if p else []
            else:
                names = fwd.input(s.name) or fwd.output(s.name)
            if names:
                ins[s.name] = list(names)
        outs, used = {}, set()
        for s in gdef.outputs:
            p = rev_in.get(s.name[:-5])
            if p is not None and op.output(p + "@GRAD"):
                outs[s.name] = op.output(p + "@GRAD")
                used.add(p + "@GRAD")
        for slot, names in op.outputs.items():
            if slot not in used and any(n != EMPTY_VAR for n in names):
                raise Unsupported(op, f"output {slot!r} has no counterpart in ssaexec's "
                                      f"{gdef.type!r}")
        if not any(n != EMPTY_VAR for names in outs.values() for n in names):
            return None  # nothing wanted
        return ctx.emit(gdef.type, ins, outs, dict(fwd.attrs))


_GRAD = GradOf()


def with_grad(paddle_type, ours, note=""):
    """Register ``<paddle_type>_grad`` (mapped through its forward op)."""
    grad_type = paddle_type + "_grad"
    for k, v in _GRAD_NAMES.items():
        if v == paddle_type:
            grad_type = k
    _register(grad_type, ours + "_grad", _GRAD, note)


def mapping_table():
    """The docs table: one Markdown row per mapped Paddle op type, sorted."""
    rows = ["| Paddle op | ssaexec op | notes |", "|---|---|---|"]
    for name in sorted(MAPPINGS):
        m = MAPPINGS[name]
        rows.append(f"| `{name}` | {m.ours} | {m.note} |")
    return "\n".join(rows)
