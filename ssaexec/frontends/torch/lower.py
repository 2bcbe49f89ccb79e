"""Lower: turn a captured joint graph into the ops and vars of a training program.

``Lowering(joint, inputs, main, startup).run()`` walks the FX graph of a
``capture.Joint`` in order and builds ``main`` (forward, loss seed, backward)
and ``startup`` (the parameter values) through the ``BlockDesc`` API
(``create_var``, ``append_op``, ``rename_var``, ``remove_var``,
``add_role_var``); it never edits a block's tables directly. A forward-only
joint (``capture.capture_forward``, the evaluation import) lowers the same way
into a program without loss, seed or gradients.

Policy and invariants of the lowered program:

* Each ATen call becomes one op of type ``aten.<name>.<overload>`` (slots ``X``
  and ``Out``, one attribute per schema argument, see ``ssaexec.ops.aten``),
  run by the generic kernel; sizes that depend on the batch are size
  expressions bound by the ``@sym`` attribute.
* Feed vars are the keys of ``example_inputs`` (``is_data``); parameters and
  buffers keep their module names, are persistable, and ``startup`` sets them to
  the module's current values (``assign_bytes``). Tied tensors (one Parameter
  under two names) become one var, the first name, whose gradient sums the parts.
* A forward-only joint's results are ``output`` (``OUTPUT_NAME``), or
  ``output.0``, ``output.1`` ... when the forward returns a tuple or list (a
  ``_k`` suffix if a feed or parameter has the name already), each written by the
  op computing it or by a ``clone`` when it is an input, a parameter or another
  result; ``output_names`` lists them. Its graph constants are ``assign_bytes``
  ops in ``main`` (``constants_in_main``), so its persistable vars are exactly the
  module's parameters and buffers, under the names the training import gives
  them: an evaluation executor can run on the training executor's values. Such a
  constant is decoded and copied to a place's device on its first runs only, then
  cloned there each step (``ssaexec.ops.init.DeviceConstant``).
* The loss is ``loss`` (``LOSS_NAME``); its gradient seed is a ``fill_constant``
  of 1 with role ``loss`` writing ``loss@GRAD`` (filled on the place's device by
  the sequential executor), which the SSA graph builder replaces with
  ScaleLossGrad (1/places), so the summed (all-reduced) gradient is the gradient
  of the mean over all places.
* The op that produces a parameter's gradient writes ``<param>@GRAD`` and
  carries ``role_var=[(param, <param>@GRAD)]`` (role ``backward``), so the graph
  builder all-reduces it right there. Ops that depend on the seed have role
  ``backward``, the others ``forward``. A parameter without a gradient gets no
  update, as in ``torch.optim``.
* A buffer the forward updates (batch norm's running statistics,
  ``num_batches_tracked``) is written back under its own name; with several
  places every place keeps its own statistics (as DDP does on rank 0).
* ``detach``, ``alias`` and ``lift_fresh(_copy)`` are renames; views are copies (see
  ``ssaexec.ops.aten``); dead nodes are dropped; shape asserts are dropped.
* What the program cannot express (in-place updates, non-ATen calls,
  data-dependent values or shapes, unsupported dtypes, layouts or arguments)
  raises ``ProgramError`` naming the op and the module path (``locate``).
"""

import operator

import torch

from ...core.dtypes import DTYPES, dtype_name
from ...core.errors import ProgramError
from ...ops.aten import SYM_ATTR, arg_kinds, encode_bytes, parse_size_expr
from ...ops.schema import Unsupported
from ...program.desc import EMPTY_VAR, grad_var_name
from .capture import op_type, strip_wrapped
from .decompose import ASSERTS as _ASSERTS
from .decompose import RENAMES as _RENAMES
from .locate import UNKNOWN, locate_call, written_args

__all__ = ["LOSS_NAME", "OUTPUT_NAME", "Lowering"]

LOSS_NAME = "loss"
OUTPUT_NAME = "output"

# x[1:] is slice(start=1, end=2**63-1): an end past the dimension (which slicing clamps)
# is written as the dimension's size, so the program holds no out-of-range literal
_SLICES = frozenset({"aten.slice.Tensor", "aten.slice_scatter.default",
                     "aten.slice_backward.default"})
_HUGE = 2 ** 62
_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default"})


def _clamp_slice(node, t, positional):
    """``(args, kwargs)`` of a slice call with out-of-range start/end set to 0 or the size."""
    bound = dict(zip(positional, node.args))
    bound.update(node.kwargs)
    dim = bound.get("dim", 0)
    val = (node if t == "aten.slice_backward.default" else bound["self"]).meta["val"]
    size = val.shape[dim]
    for key in ("start", "end"):
        v = bound.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > _HUGE:
            bound[key] = size if v > 0 else 0
    n = len(node.args)
    return ([bound[k] for k in positional[:n]],
            {k: v for k, v in bound.items() if k not in positional[:n]})


class Lowering:
    """Turn a ``capture.Joint`` into ops and vars of ``main`` and initialisers of ``startup``.

    ``inputs`` are the example inputs (the error path re-runs the forward on them);
    after ``run()``, ``param_order`` lists the program's parameters in module order
    and ``output_names`` the vars of a forward-only joint's results.
    ``constants_in_main``: graph constants become ``assign_bytes`` ops of ``main``
    writing ordinary vars, instead of persistable vars set by ``startup``.
    """

    def __init__(self, joint, inputs, main, startup, constants_in_main=False):
        self.j = joint
        self.inputs = inputs
        self.block = main.global_block()
        self.startup_block = startup.global_block()
        self.var_of = {}       # FX node -> var name (single-tensor nodes)
        self.outs_of = {}      # FX node -> list of var names (multi-result nodes)
        self.sym_shape = {}    # var name -> [int | size expression]
        self.taken = set()
        self.backward = set()
        self.canonical = {}    # parameter or buffer name -> the name of its var (tied ones)
        self.param_order = []  # the program's parameters, in module order
        self.constants_in_main = constants_in_main
        self.output_names = []  # a forward-only joint's results, in order
        self._output_of = {}    # FX node of a result -> its name (first occurrence)

    # names
    def fresh(self, base):
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def declare(self, name, val, **flags):
        shape = [self.j.expr(d) for d in val.shape]
        if val.dtype not in DTYPES.values():
            raise ProgramError(f"from_torch: var {name!r} has dtype {val.dtype}, which programs "
                               f"cannot hold (supported: {sorted(DTYPES)})")
        self.sym_shape[name] = shape
        return self.block.create_var(name, [d if isinstance(d, int) else -1 for d in shape],
                                     dtype_name(val.dtype), **flags)

    def run(self):
        j = self.j
        graph = j.gm.graph
        graph.eliminate_dead_code()
        self.taken.update(j.feeds.values())
        self.taken.update(j.params.values())
        self.taken.update(j.buffers.values())
        self.taken.update({LOSS_NAME, grad_var_name(LOSS_NAME)})
        self.taken.update(grad_var_name(p) for p in j.param_order)
        self._declare_inputs()
        outs = j.outputs or []
        for k, node in enumerate(outs):
            name = self.fresh(OUTPUT_NAME if len(outs) == 1 else f"{OUTPUT_NAME}.{k}")
            self.output_names.append(name)
            self._output_of.setdefault(node, name)
        self._mark_backward()
        self.param_order = [p for p in j.param_order if self.canonical[p] == p]
        for node in graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            if node.op == "get_attr":
                self._constant(node)
            elif node.op == "call_function":
                self._call(node)
            else:
                raise ProgramError(f"from_torch: unsupported FX node {node.op} {node.target}")
        self._finish_grads()
        self._finish_mutations()
        self._finish_outputs()

    def _declare_inputs(self):
        j = self.j
        for node, name in j.feeds.items():
            self.var_of[node] = name
            self.declare(name, node.meta["val"], is_data=True, stop_gradient=True)
        # names as the signature has them: the module's own, or "loss_fn.weight" for the
        # state of a loss_fn that is itself a module
        named = {strip_wrapped(n): v for n, v in
                 [*j.wrapper.named_parameters(remove_duplicate=False),
                  *j.wrapper.named_buffers(remove_duplicate=False)]}
        # Tied tensors (one Parameter under two names) are traced as two inputs with a
        # partial gradient each; the program keeps one var, the first name.
        canonical = {}
        for node, name in list(j.params.items()) + list(j.buffers.items()):
            real = named[name]
            first = canonical.setdefault(id(real), name)
            self.canonical[name] = first
            self.var_of[node] = first
            if first != name:
                continue
            is_param = node in j.params
            flags = dict(persistable=True, is_parameter=is_param,
                         stop_gradient=not (is_param and real.requires_grad))
            self.declare(name, node.meta["val"], **flags)
            self._init_value(name, real, flags)

    def _init_value(self, name, value, flags):
        value = value.detach()
        self.startup_block.create_var(name, list(value.shape), dtype_name(value.dtype), **flags)
        self.startup_block.append_op(
            "assign_bytes", {}, {"Out": [name]},
            {"shape": list(value.shape), "dtype": dtype_name(value.dtype),
             "data": encode_bytes(value)})

    def _constant(self, node):
        value = getattr(self.j.gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise ProgramError(f"from_torch: graph constant {node.target!r} is a "
                               f"{type(value).__name__}, not a tensor")
        if value.dtype not in DTYPES.values():
            raise ProgramError(f"from_torch: constant {node.target!r} has dtype {value.dtype}")
        name = self.fresh(f"const.{node.target}")
        self.var_of[node] = name
        if self.constants_in_main:
            value = value.detach()
            self.block.create_var(name, list(value.shape), dtype_name(value.dtype),
                                  stop_gradient=True)
            self.sym_shape[name] = list(value.shape)
            self.block.append_op("assign_bytes", {}, {"Out": [name]},
                                 {"shape": list(value.shape), "dtype": dtype_name(value.dtype),
                                  "data": encode_bytes(value)})
            return
        flags = dict(persistable=True, stop_gradient=True)
        self.block.create_var(name, list(value.shape), dtype_name(value.dtype), **flags)
        self.sym_shape[name] = list(value.shape)
        self._init_value(name, value, flags)

    def _mark_backward(self):
        # Ops that depend on the seed are the backward pass (none without a seed).
        todo = [self.j.seed] if self.j.seed is not None else []
        while todo:
            n = todo.pop()
            if n in self.backward:
                continue
            self.backward.add(n)
            todo.extend(n.users)

    def _is_symbolic(self, node):
        v = node.meta.get("val")
        return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) \
            and not isinstance(v, torch.Tensor)

    def _call(self, node):
        j = self.j
        t = op_type(node)
        if node.target is operator.getitem:
            parent = node.args[0]
            if parent in self.outs_of:
                return  # named when the parent op was emitted
            if self._is_symbolic(node):
                return
            raise ProgramError(f"from_torch: unsupported getitem on {parent.format_node()}")
        if t in _ASSERTS:
            return
        if self._is_symbolic(node):
            # sizes are inlined into the ops that use them as size expressions; a value no
            # input size defines was read out of a tensor (.item()): data-dependent
            try:
                j.expr(node.meta["val"])
            except ProgramError:
                where = locate_call(j.wrapper, self.inputs, node.target) \
                    if t is not None else UNKNOWN
                raise ProgramError(
                    f"from_torch: data-dependent value in {where}: {t or node.target} reads a "
                    "tensor's value into a Python number (.item(), .tolist(), int(x)), which "
                    "one program cannot express") from None
            return
        if t is None:
            raise self._unsupported(node, f"{getattr(node.target, '__name__', node.target)} "
                                          "(not an ATen operator: higher-order ops such as "
                                          "torch.cond and Python-level calls have no op)")
        if not t.startswith("aten."):
            raise self._unsupported(node, f"{t} (only ATen operators are supported)")
        if node is j.seed:
            val = node.meta["val"]
            self.var_of[node] = grad_var_name(LOSS_NAME)
            self.declare(grad_var_name(LOSS_NAME), val)
            self.block.append_op("fill_constant", {}, {"Out": [grad_var_name(LOSS_NAME)]},
                                 {"shape": list(self.block.var(LOSS_NAME).shape),
                                  "value": 1.0, "dtype": dtype_name(val.dtype)}, role="loss")
            return
        if t in _RENAMES and isinstance(node.args[0], torch.fx.Node) \
                and node.args[0] in self.var_of and node is not j.loss:
            self.var_of[node] = self.var_of[node.args[0]]
            return
        self._emit(node, t)

    def _unsupported(self, node, what):
        where = locate_call(self.j.wrapper, self.inputs, node.target) \
            if callable(node.target) else UNKNOWN
        return ProgramError(f"from_torch: unsupported operation {what} in {where}")

    def _out_name(self, node):
        if node is self.j.loss:
            return LOSS_NAME
        name = self._output_of.pop(node, None)
        if name is not None:
            return name
        return self.fresh(node.name)

    def _emit(self, node, t):
        overload = node.target
        written = written_args(overload)
        if written:
            raise self._unsupported(node, f"{t} (it updates its argument {written[0][1]!r} in "
                                          "place)")
        schema = arg_kinds(overload)
        kinds = {name: kind for name, kind, _ in schema}
        xs, x_index = [], {}
        symbols = set()

        def tensor_ref(n):
            name = self.var_of.get(n)
            if name is None:
                raise ProgramError(f"from_torch: {t} ({node.name}) reads {n.name}, which has "
                                   "no var (an unsupported producer)")
            if name not in x_index:
                x_index[name] = len(xs)
                xs.append(name)
            return f"X[{x_index[name]}]"

        def enc(v, arg):
            if isinstance(v, torch.fx.Node):
                if self._is_symbolic(v):
                    e = self.j.expr(v.meta["val"])
                    if isinstance(e, str):
                        symbols.update(parse_size_expr(e)[1])
                    return e
                if not isinstance(v.meta.get("val"), torch.Tensor):
                    raise self._unsupported(node, f"{t} (argument {arg!r} is a "
                                                  f"{type(v.meta.get('val')).__name__})")
                return tensor_ref(v)
            if isinstance(v, (list, tuple)):
                return [enc(x, arg) for x in v]
            if isinstance(v, torch.dtype):
                if v not in DTYPES.values():
                    raise self._unsupported(node, f"{t} (dtype {v})")
                return dtype_name(v)
            if isinstance(v, torch.device):
                return None
            if isinstance(v, torch.memory_format):
                return str(v).replace("torch.", "")
            if isinstance(v, torch.layout):
                if v is not torch.strided:
                    raise self._unsupported(node, f"{t} (layout {v})")
                return "strided"
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                e = self.j.expr(v)
                if isinstance(e, str):
                    symbols.update(parse_size_expr(e)[1])
                return e
            if v is None or isinstance(v, (bool, int, float, str)):
                return v
            raise self._unsupported(node, f"{t} (argument {arg!r} = {v!r} of type "
                                          f"{type(v).__name__})")

        attrs = {}
        positional = [name for name, _, kwarg_only in schema if not kwarg_only]
        if len(node.args) > len(positional):
            raise self._unsupported(node, f"{t} (more positional arguments than its schema)")
        args, kwargs = node.args, node.kwargs
        if t in _SLICES:
            args, kwargs = _clamp_slice(node, t, positional)
        elif t in _VIEWS and any(isinstance(d, int) and d == -1 for d in args[1]):
            # view(x, [4*s0, 4, -1]): the -1 written as the size it stands for, so shape
            # inference (which probes -1 dimensions with sample batches) cannot guess it wrong
            args = (args[0], list(node.meta["val"].shape), *args[2:])
        for name, v in zip(positional, args):
            attrs[name] = enc(v, name)
        for k, v in kwargs.items():
            if k not in kinds:
                raise self._unsupported(node, f"{t} (unknown keyword {k!r})")
            attrs[k] = enc(v, k)
        for name, kind in kinds.items():
            if isinstance(kind, Unsupported) and attrs.get(name) is not None:
                raise self._unsupported(node, f"{t} (argument {name!r} of type {kind.type})")
        if symbols:
            binds = []
            for s in sorted(symbols):
                bound = next(([s, k, d] for k, n in enumerate(xs)
                              for d, size in enumerate(self.sym_shape[n]) if size == s), None)
                if bound is None:
                    feed, d = self.j.symbols[s]
                    if feed not in x_index:
                        x_index[feed] = len(xs)
                        xs.append(feed)
                    bound = [s, x_index[feed], d]
                binds.append(bound)
            attrs[SYM_ATTR] = binds

        # results
        val = node.meta.get("val")
        role = "backward" if node in self.backward else "forward"
        if isinstance(val, torch.Tensor):
            name = self._out_name(node)
            self.var_of[node] = name
            self._declare_result(node, t, name, val)
            outs = [name]
        elif isinstance(val, (tuple, list)):
            outs = []
            flat = []
            for i, v in enumerate(val):
                if isinstance(v, (tuple, list)):
                    raise self._unsupported(node, f"{t} (nested list results)")
                flat.append(v)
            users = {}
            for u in node.users:
                if u.op == "call_function" and u.target is operator.getitem:
                    users.setdefault(u.args[1], []).append(u)
            for i, v in enumerate(flat):
                us = users.get(i, [])
                if not us or v is None:
                    outs.append(EMPTY_VAR)
                    continue
                name = self._out_name(us[0])
                self._declare_result(node, t, name, v)
                for u in us:
                    self.var_of[u] = name
                    if u in self.backward:
                        role = "backward"
                outs.append(name)
            self.outs_of[node] = outs
        else:
            raise self._unsupported(node, f"{t} (returns {type(val).__name__}, not tensors)")
        self.block.append_op(t, {"X": xs}, {"Out": outs}, attrs, role=role)

    def _declare_result(self, node, t, name, val):
        try:
            self.declare(name, val)
        except ProgramError as e:
            if "data-dependent" not in str(e):
                raise
            where = locate_call(self.j.wrapper, self.inputs, node.target)
            raise ProgramError(
                f"from_torch: data-dependent shape in {where}: the size of {t}'s result depends "
                "on tensor values (boolean masks, nonzero, unique), which one program cannot "
                "express") from None

    # gradients: every trainable parameter's gradient ends up in <param>@GRAD, written by
    # an op of role backward that carries role_var
    def _finish_grads(self):
        block = self.block
        writers = {}
        readers = {}
        for i, op in enumerate(block.ops):
            for n in op.output_names():
                writers.setdefault(n, []).append(i)
            for n in op.input_names():
                readers[n] = readers.get(n, 0) + 1
        parts = {}  # canonical parameter -> var names of its gradient contributions
        for node, param in self.j.grads:
            src = self.var_of.get(node)
            if src is None:
                raise ProgramError(f"from_torch: the gradient of {param!r} has no producer")
            parts.setdefault(self.canonical.get(param, param), []).append(src)
        claimed = set()
        order = {p: k for k, p in enumerate(self.param_order)}
        for p in sorted(parts, key=lambda q: order.get(q, len(order))):
            srcs, gname = parts[p], grad_var_name(p)
            src = srcs[0]
            ws = writers.get(src, [])
            # Rename the producer's output to p@GRAD when nothing else reads or owns it.
            if len(srcs) == 1 and len(ws) == 1 and src not in claimed and not readers.get(src) \
                    and block.ops[ws[0]].role == "backward" and not block.var(src).persistable \
                    and src not in (LOSS_NAME, grad_var_name(LOSS_NAME)):
                claimed.add(src)
                block.rename_var(src, gname)
                self.sym_shape[gname] = self.sym_shape.pop(src)
                block.add_role_var(block.ops[ws[0]], p, gname)
                continue
            val = block.var(src)
            block.create_var(gname, val.shape, val.dtype)
            self.sym_shape[gname] = self.sym_shape[src]
            if len(srcs) == 1:
                block.append_op("aten.clone.default", {"X": [src]}, {"Out": [gname]},
                                {"self": "X[0]"}, role="backward", role_var=[(p, gname)])
                continue
            acc = srcs[0]
            for k, other in enumerate(srcs[1:]):
                last = k == len(srcs) - 2
                out = gname if last else self.fresh(f"{gname}@PART{k}")
                if not last:
                    block.create_var(out, val.shape, val.dtype)
                block.append_op("aten.add.Tensor", {"X": [acc, other]}, {"Out": [out]},
                                {"self": "X[0]", "other": "X[1]"}, role="backward",
                                role_var=[(p, gname)] if last else None)
                acc = out

    def _finish_mutations(self):
        # A buffer's new value is written under the buffer's name: by its producer directly
        # when that is safe (one writer, no later reader of the old value), else by a copy
        # appended after every other op.
        block = self.block
        moved = {}  # var renamed to a buffer -> that buffer
        for node, buf in self.j.mutations:
            buf = self.canonical.get(buf, buf)
            src = self.var_of.get(node)
            if src is None:
                raise ProgramError(f"from_torch: the new value of buffer {buf!r} has no producer")
            src = moved.get(src, src)
            writers = [i for i, op in enumerate(block.ops) if src in op.output_names()]
            direct = False
            if len(writers) == 1 and src not in self.j.feeds.values() and src != buf:
                w = writers[0]
                var = block.var(src)
                direct = (not var.persistable and src not in moved.values()
                          and src not in (LOSS_NAME, grad_var_name(LOSS_NAME))
                          and src not in self.output_names
                          and not src.endswith("@GRAD")
                          and not any(buf in op.input_names() for op in block.ops[w + 1:]))
            if direct:
                # src has one writer, so only that op and later ones name it
                block.remove_var(src)
                block.rename_var(src, buf)
                moved[src] = buf
            elif src != buf:
                block.append_op("aten.clone.default", {"X": [src]}, {"Out": [buf]},
                                {"self": "X[0]"}, role="forward")

    def _finish_outputs(self):
        # A result that no op wrote under its name (an input, a parameter, a renamed
        # detach, a result returned twice) is a copy of the var it is.
        block = self.block
        for node, name in zip(self.j.outputs or [], self.output_names, strict=True):
            src = self.var_of.get(node)
            if src is None:
                raise ProgramError(f"from_torch: the forward's result {node.name} has no "
                                   "producer")
            if src == name:
                continue
            val = block.var(src)
            block.create_var(name, val.shape, val.dtype)
            self.sym_shape[name] = self.sym_shape[src]
            block.append_op("aten.clone.default", {"X": [src]}, {"Out": [name]},
                            {"self": "X[0]"}, role="forward")
