"""A decoded Paddle program (``reader.PaddleProgram``) as an ssaexec ``Program``.

``convert_program(paddle_program)`` builds the program through the ``BlockDesc`` API
(``create_var``, ``append_op``, ``add_role_var``) and returns it with what Paddle's
file says about feeding and fetching. The order of work, and its policy:

1. **Support first.** Every op type of block 0 is looked up in ``ops.MAPPINGS``
   before anything is built; the unmapped ones are reported in one
   ``ProgramError`` line with their counts and first positions, so a user sees
   the whole gap at once.
2. **Vars.** Every dense-tensor var of block 0 is declared with Paddle's name,
   shape, dtype and flags (``need_check_feed`` makes a data var). Feed and fetch
   holders (``FEED_MINIBATCH``/``FETCH_LIST``) are dropped with the ``feed``/
   ``fetch`` ops; other var kinds (LoD tensor arrays, selected rows, readers) are
   refused when an op uses them.
3. **Ops**, in program order, through their mapping. ``op_role`` becomes the op's
   role: Backward|Loss (the ``fill_constant`` of ones that seeds ``loss@GRAD``)
   is ``loss``, Optimize or LRSched is ``optimize``, Backward is ``backward``.
4. **Gradient all-reduce points.** Each (parameter, gradient) pair that an
   optimizer op updates, or that a backward op's ``op_role_var`` lists, goes on
   the last backward op writing the gradient (``role_var``), where the graph
   builder puts the all-reduce.
5. **0-d results.** Paddle before 2.5 declared reductions to a scalar (``mean``)
   as ``[1]``; ssaexec's kernels give ``[]``. Such vars (and their gradients, and
   ``fill_constant`` ops that write them) are declared ``[]``, so shapes agree.
6. ``program.validate()``: the operator policy and every static check apply.

Malformed ops are located errors: a mapping refuses what it cannot honour with
``Unsupported``, and any other Python error a malformed op provokes in its mapping
(``ValueError``, ``TypeError``, ``ZeroDivisionError`` ...) is caught around that
op and reported as a ``ProgramError`` naming it, never an internal error. Each
emitted op's per-dimension lists and count attributes are bounded as it is
emitted (``ssaexec.program.bounds``), so an op over a bound is refused naming the
Paddle (or PIR) op, before step 5 runs any shape inference. Every step is linear in
the program: the gradient writers and forward records are indexed once, not
searched per pair.

Only block 0 is converted: the ops that own sub-blocks (``while``,
``conditional_block``) are not mapped, so a program that needs a sub-block has an
unmapped op and fails in step 1.
"""

from ...core.errors import ProgramError
from ...ops.registry import EMPTY_VAR, get_op_def, infer_outputs
from ...program.bounds import count_problem, rank_attr_problem
from ...program.desc import GRAD_SUFFIX, Program, VarDesc
from .ops import MAPPINGS, Unsupported, grad_forward_type
from .reader import (FEED_MINIBATCH, FETCH_LIST, ROLE_BACKWARD, ROLE_LOSS, ROLE_LRSCHED,
                     ROLE_OPTIMIZE, var_type_name)

__all__ = ["Converted", "convert_program", "unsupported_ops"]

# Python errors a mapping may raise on a malformed op that no check foresaw
_MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError)


class Converted:
    """An ssaexec program and what the Paddle file says about it."""

    __slots__ = ("program", "feed", "fetch", "loss")

    def __init__(self, program, feed, fetch, loss):
        self.program, self.feed, self.fetch, self.loss = program, feed, fetch, loss


class _Forward:
    """A mapped forward op: the Paddle op, the ssaexec op it became, slot maps."""

    __slots__ = ("paddle", "ours", "ins", "outs")

    def __init__(self, paddle, ours, ins, outs):
        self.paddle, self.ours, self.ins, self.outs = paddle, ours, ins, outs


def _role(bits):
    if bits & ROLE_LOSS and bits & ROLE_BACKWARD:
        return "loss"
    if bits & (ROLE_OPTIMIZE | ROLE_LRSCHED):
        return "optimize"
    if bits & ROLE_BACKWARD:
        return "backward"
    return "forward"


def unsupported_ops(paddle_program, block=0):
    """``{op type: [count, first op index]}`` of block ``block``'s ops without a mapping."""
    out = {}
    for op in paddle_program.blocks[block].ops:
        if op.type not in MAPPINGS:
            entry = out.setdefault(op.type, [0, op.index])
            entry[0] += 1
    return out


class Converter:
    """The ``ctx`` of ``ops.MAPPINGS`` functions: emits into one block (see module docstring)."""

    def __init__(self, paddle_program, source):
        self.pp = paddle_program
        self.source = source
        self.program = Program()
        self.block = self.program.global_block()
        self.pblock = paddle_program.blocks[0]
        self.op = None
        self.forwards = []
        # (forward type, slot, names) and (forward type, None, output name) -> positions in
        # ``forwards``: a grad op's candidates are looked up, not searched (``forward``)
        self._forward_index = {}
        self._forward_slots = {}  # (forward type, slot) -> how many records have the slot
        self._forward_count = {}  # forward type -> how many records
        self.feeds, self.fetches = [], []
        self.pairs = []
        self._tmp = 0

    # --- the ctx API used by ops.py ---------------------------------------------------------
    def emit(self, type, inputs, outputs, attrs=None, role_var=None):
        """Append ssaexec op ``type`` with the current Paddle op's role; return the ``OpDesc``."""
        for names in list(inputs.values()) + list(outputs.values()):
            for n in names:
                if n != EMPTY_VAR:
                    self._need_var(n)
        # the bounds that keep inference linear (program.bounds), named at the Paddle op
        bad = rank_attr_problem(attrs or {})
        problem = bad[1] if bad else count_problem(
            type, attrs or {}, {slot: [None if n == EMPTY_VAR else self.block.var(n).shape
                                       for n in names] for slot, names in inputs.items()},
            outputs)
        if problem:
            raise Unsupported(self.op, problem)
        role = _role(self.op.role)
        if role == "loss" and type != "fill_constant":
            role = "backward"
        op = self.block.append_op(type, inputs, outputs, attrs or {}, role=role,
                                  role_var=role_var)
        if role_var:
            self.pairs.extend(role_var)
        return op

    def tmp(self, like, dtype=None):
        """A new scratch var shaped like var ``like`` (``dtype`` overrides its dtype)."""
        src = self.block.var(like)
        while True:
            name = f"{like}@ssaexec_{self._tmp}"
            self._tmp += 1
            if not self.block.has_var(name) and name not in self.pblock.vars:
                break
        self.block.create_var(name, src.shape, dtype or src.dtype, stop_gradient=True)
        return name

    def shape(self, name):
        """The declared shape of var ``name`` (None when unknown)."""
        var = self.block.find_var(self._need_var(name))
        return None if var.shape is None else list(var.shape)

    def dtype(self, name):
        return self.block.var(self._need_var(name)).dtype

    def record(self, paddle_op, ours, ins, outs):
        """Remember a forward op's mapping, for its grad op (``forward``)."""
        pos = len(self.forwards)
        self.forwards.append(_Forward(paddle_op, ours, dict(ins), dict(outs)))
        index, f = self._forward_index, paddle_op
        self._forward_count[f.type] = self._forward_count.get(f.type, 0) + 1
        for slot in {**f.outputs, **f.inputs}:
            self._forward_slots[f.type, slot] = self._forward_slots.get((f.type, slot), 0) + 1
            key = (f.type, slot, tuple(f.inputs.get(slot) or f.outputs.get(slot) or ()))
            index.setdefault(key, []).append(pos)
        for names in f.outputs.values():
            for name in names:
                index.setdefault((f.type, None, name), []).append(pos)

    def forward(self, grad_op):
        """The ``_Forward`` record of the forward op that ``grad_op`` differentiates.

        Candidates are the mapped ops of the forward type; the grad op names some of
        the forward op's vars in slots of the same names (``X``, ``Out``, ``XShape``
        ...), which must agree. With no shared slot, the grad of an output of the
        forward op (``Out@GRAD``) decides. The latest candidate wins.
        """
        ftype = grad_forward_type(grad_op.type)
        # every forward op that can match shares a slot's names with the grad op, or has
        # an output whose gradient the grad op reads: gather those, then apply the rule
        index, candidates = self._forward_index, set()
        # a slot every record of the type has must agree in a match: its bucket alone holds
        # every candidate (the smallest such bucket, so many ops reading one var stay cheap)
        total = self._forward_count.get(ftype, 0)
        buckets = [index.get((ftype, slot, tuple(names)), ())
                   for slot, names in grad_op.inputs.items()
                   if total and self._forward_slots.get((ftype, slot), 0) == total]
        if buckets:
            candidates.update(min(buckets, key=len))
        else:
            for slot, names in grad_op.inputs.items():
                candidates.update(index.get((ftype, slot, tuple(names)), ()))
                if slot.endswith(GRAD_SUFFIX):
                    for n in names:
                        candidates.update(index.get((ftype, None, n.split(GRAD_SUFFIX)[0]),
                                                    ()))
        # the latest match wins: look from the newest (Paddle's backward runs in reverse,
        # so the match is usually the first candidate looked at)
        grads = {n.split(GRAD_SUFFIX)[0] for s, ns in grad_op.inputs.items()
                 if s.endswith(GRAD_SUFFIX) for n in ns}
        for pos in sorted(candidates, reverse=True):
            rec = self.forwards[pos]
            f = rec.paddle
            shared = [s for s in grad_op.inputs if s in f.inputs or s in f.outputs]
            if shared:
                if all(grad_op.inputs[s] == (f.inputs.get(s) or f.outputs.get(s))
                       for s in shared):
                    return rec
            elif grads & {n for ns in f.outputs.values() for n in ns}:
                return rec
        raise Unsupported(grad_op, f"no {ftype!r} op before it computes the values it "
                                   "differentiates")

    def feed(self, name, col):
        self.feeds.append((col, name))

    def fetch(self, name, col):
        self.fetches.append((col, name))

    # --- the conversion ---------------------------------------------------------------------
    def fail(self, op, message):
        raise ProgramError(f"{self.source}: {op.where}: {message}")

    def _need_var(self, name):
        if self.block.has_var(name):
            return name
        var = self.pblock.vars.get(name)
        if var is None:
            raise Unsupported(self.op, f"var {name!r} is not declared in block 0")
        if not var.is_tensor:
            raise Unsupported(self.op, f"var {name!r} is a {var_type_name(var.vtype)}; only dense "
                                       "tensors are supported")
        raise Unsupported(self.op, f"var {name!r} has data type code {var.dtype_code}, which "
                                   "has no ssaexec dtype")

    def _declare_vars(self):
        for var in self.pblock.vars.values():
            if not var.is_tensor or var.dtype is None:
                continue
            self.block.create_var(var.name, var.shape, var.dtype, persistable=var.persistable,
                                  is_parameter=var.is_parameter,
                                  stop_gradient=var.stop_gradient, is_data=var.need_check_feed)

    def _check_support(self):
        missing = unsupported_ops(self.pp)
        if missing:
            parts = [f"{t!r} (x{n}, first at op {i})" for t, (n, i) in
                     sorted(missing.items(), key=lambda kv: kv[1][1])]
            total = sum(n for n, _ in missing.values())
            raise ProgramError(f"{self.source}: {total} ops of {len(missing)} types are not "
                               f"supported: {', '.join(parts)}; docs/paddle.md lists the "
                               "supported ones")

    def _role_vars(self):
        pairs = list(self.pairs)
        for op in self.pblock.ops:
            value = op.attrs.get("op_role_var")
            if op.role & ROLE_BACKWARD and isinstance(value, list) and len(value) % 2 == 0 \
                    and all(isinstance(v, str) for v in value):
                pairs.extend(zip(value[0::2], value[1::2], strict=True))
        # the last backward op writing each var, indexed once (not searched per pair)
        writers = {}
        for op in self.block.ops:
            if op.role == "backward":
                for name in op.output_names():
                    writers[name] = op
        done = set()
        for param, grad in pairs:
            if (param, grad) in done:
                continue
            done.add((param, grad))
            writer = writers.get(grad)
            if writer is not None and (param, grad) not in writer.role_var:
                self.block.add_role_var(writer, param, grad)

    def _zero_dim(self):
        # Paddle < 2.5 declared scalar reductions as [1]; our kernels give []
        squeezed, inferred = set(), {}
        for op in self.block.ops:
            op_def = get_op_def(op.type, missing_ok=True)
            if op_def is None or op_def.is_grad or op.type == "fill_constant":
                continue
            specs = {}
            for slot, names in op.inputs.items():
                vs = [self.block.find_var(n) for n in names]
                if any(v is None for v in vs):
                    break
                specs[slot] = [(v.shape, v.dtype) for v in vs]
            else:  # every op was bounded when emitted (``emit``): inference is linear
                # a model repeats its layers: each distinct inference runs once. What
                # inference reads of the outputs is which are wanted (not EMPTY_VAR), never
                # their names: a key with names would make every op distinct
                wanted = {slot: [n != EMPTY_VAR for n in names]
                          for slot, names in op.outputs.items()}
                key = (op.type, repr(op.attrs), repr(specs), repr(wanted))
                try:
                    out = inferred.get(key)
                    if out is None:
                        out = inferred[key] = infer_outputs(op_def, op, specs) or {}
                except Exception:  # noqa: BLE001 - validation reports it properly below
                    continue
                for slot, got in out.items():
                    for name, spec in zip(op.output(slot), got or [], strict=False):
                        var = self.block.find_var(name)
                        if spec and spec[0] == [] and var is not None and var.shape == [1]:
                            self._redeclare_scalar(var)
                            squeezed.add(name)
        for name in list(squeezed):
            grad = self.block.find_var(name + GRAD_SUFFIX)
            if grad is not None and grad.shape == [1]:
                self._redeclare_scalar(grad)
                squeezed.add(grad.name)
        for op in self.block.ops:
            if op.type == "fill_constant" and any(n in squeezed for n in op.output_names()):
                self.block.set_attr(op, "shape", [])

    def _redeclare_scalar(self, var):
        self.block.add_var(VarDesc(var.name, [], var.dtype, persistable=var.persistable,
                                   is_parameter=var.is_parameter,
                                   stop_gradient=var.stop_gradient, is_data=var.is_data))

    def _data_vars(self):
        fed = [n for _, n in sorted(self.feeds)]
        for name in fed:
            if self.block.find_var(name) is not None:
                self.block.update_var(name, is_data=True)
        if fed:
            return fed
        marked = [v.name for v in self.program.data_vars()]
        if marked:
            return marked
        # a bare serialized program: what is read before any op writes it
        written, out, seen = set(), [], set()
        for op in self.block.ops:
            for n in op.input_names():
                var = self.block.find_var(n)
                if var is not None and n not in written and not var.persistable and \
                        not n.endswith(GRAD_SUFFIX) and n not in seen:
                    self.block.update_var(n, is_data=True)
                    out.append(n)
                    seen.add(n)
            written.update(op.output_names())
        return out

    def _loss(self):
        for op in self.block.ops:
            if op.role == "loss":
                for n in op.output_names():
                    if n.endswith(GRAD_SUFFIX):
                        return n[: -len(GRAD_SUFFIX)]
        for op in self.pblock.ops:
            if op.role & ROLE_LOSS and not op.role & ROLE_BACKWARD:
                names = [n for ns in op.outputs.values() for n in ns]
                if names:
                    return names[0]
        return None

    def run(self, validate=True):
        self._check_support()
        self._declare_vars()
        for op in self.pblock.ops:
            self.op = op
            try:
                MAPPINGS[op.type].fn(self, op)
            except Unsupported as e:
                self.fail(e.op, str(e))
            except ProgramError as e:
                self.fail(op, str(e))
            except _MALFORMED as e:  # a malformed op no check foresaw: located
                detail = str(e).splitlines()[0][:200] if str(e) else ""
                self.fail(op, f"malformed op ({type(e).__name__}"
                              f"{': ' + detail if detail else ''}); docs/paddle.md lists "
                              "what each op takes")
        self.op = None
        self._role_vars()
        self._zero_dim()
        feed = self._data_vars()
        loss = self._loss()
        fetch = [n for _, n in sorted(self.fetches)]
        if not fetch and loss is not None:
            fetch = [loss]
        for name in (v.name for v in self.pblock.vars.values()
                     if v.vtype in (FEED_MINIBATCH, FETCH_LIST)):
            if self.block.has_var(name):  # pragma: no cover - holders are never declared
                self.block.remove_var(name)
        if validate:
            try:
                self.program.validate()
            except ProgramError as e:
                raise ProgramError(f"{self.source}: the converted program is not valid: {e}") \
                    from None
        return Converted(self.program, feed, fetch, loss)


def convert_program(paddle_program, source=None, validate=True):
    """Map a decoded Paddle program onto an ssaexec ``Program`` (see the module docstring).

    Parameters
    ----------
    paddle_program : reader.PaddleProgram
    source : str, optional
        How errors name the input (default: the program's own source).
    validate : bool
        Run ``program.validate()`` on the result.

    Returns
    -------
    Converted
        ``program``, ``feed`` (data var names: the ``feed`` ops' targets in column
        order, else the vars marked ``need_check_feed``, else the non-persistable
        vars read before any op writes them), ``fetch`` (the ``fetch`` ops' targets,
        else ``[loss]`` when there is a loss, else ``[]``) and ``loss`` (the var whose
        gradient the Backward|Loss op seeds, or the output of the Forward|Loss op).

    Raises
    ------
    ProgramError
        Naming ``SOURCE: block 0, op I (TYPE)`` for an op that cannot be mapped, or
        listing every unmapped op type at once.
    """
    return Converter(paddle_program, source or paddle_program.source).run(validate)
