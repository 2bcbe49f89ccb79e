"""``from_torch``: import a ``torch.nn.Module``'s training step as an ssaexec program.

    main, startup, loss = se.from_torch(model, {"x": x, "target": y},
                                        loss_fn=torch.nn.functional.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))

How. torch's own machinery captures the forward *and* the backward as one
functional ATen graph (AOTAutograd's joint export, ``_capture_joint``: the only
function here that touches torch's private APIs). Each ATen call becomes an op
of type ``aten.<name>.<overload>`` run by the generic kernel of
``ssaexec.ops.aten``; the rest of ssaexec sees an ordinary program.

Policy and invariants of the imported program:

* Feed vars are the keys of ``example_inputs`` (``target`` too when
  ``loss_fn`` is given). Dimension 0 of every input is the batch (-1 in the
  program, split across places) unless the input is named in ``unbatched``;
  the batch is traced symbolically, so sizes that depend on it (a flatten's
  ``[s0, 512]``) are size expressions, and one program runs any batch size.
* Parameters and buffers keep their module names (``layer1.0.conv1.weight``)
  and are persistable; ``startup`` sets them to the module's current values
  (``assign_bytes``: base64 of the raw bytes, about 1.33 bytes per byte of
  weights in the JSON file). The module itself is never changed.
* The loss is ``loss``; its gradient seed is a ``fill_constant`` of 1 with role
  ``loss`` writing ``loss@GRAD``, which the SSA graph builder replaces with
  ScaleLossGrad (1/places): each place's mean loss is scaled by 1/n, so the
  summed (all-reduced) gradient is the gradient of the mean over all places.
* The op that produces a parameter's gradient writes ``<param>@GRAD`` and
  carries ``role_var=[(param, <param>@GRAD)]`` (role ``backward``), so the graph
  builder all-reduces it right there. Ops that depend on the seed have role
  ``backward``, the others ``forward``. A parameter without a gradient gets no
  update, as in ``torch.optim``.
* A buffer the forward updates (batch norm's running statistics,
  ``num_batches_tracked``) is written back under its own name; with several
  places every place keeps its own statistics (as DDP does on rank 0).
* ``detach`` is a rename; views are copies (see ``ssaexec.ops.aten``); dead
  nodes are dropped.
* Optimizer ops come last (``Optimizer.apply_gradients``).

Anything the program cannot express raises ``ProgramError`` naming the
construct and the module path: data-dependent control flow (a Python ``if`` on
a tensor value, ``.item()``, ``nonzero``), a batch size the module's code fixes
(``x.view(8, -1)``), an in-place update of an input or a parameter, ops that
are not ATen overloads (higher-order ops such as ``torch.cond``, custom ops),
and dtypes or arguments the program format has no words for.
"""

import inspect
import operator
import traceback

import torch

from ..errors import ProgramError
from ..ops.aten import SYM_ATTR, arg_kinds, encode_bytes, parse_size_expr
from ..program.builder import program_guard
from ..dtypes import DTYPES, dtype_name
from ..program.desc import EMPTY_VAR, Program, grad_var_name

__all__ = ["from_torch", "LOSS_NAME"]

LOSS_NAME = "loss"
_WRAPPED = "module"  # attribute of the loss wrapper holding the user's module
_RENAMES = frozenset({"aten.detach.default", "aten.alias.default", "aten.lift_fresh.default"})
_ASSERTS = frozenset({"aten._assert_scalar.default", "aten._assert_tensor_metadata.default",
                      "aten.sym_constrain_range_for_size.default",
                      "aten.sym_constrain_range.default", "aten._assert_async.msg",
                      "aten._assert_async.default"})
_SEEDS = frozenset({"aten.ones_like.default", "aten.full_like.default"})
_DATA_DEPENDENT = frozenset({"GuardOnDataDependentSymNode", "DataDependentOutputException",
                             "DynamicOutputShapeException", "PendingUnbackedSymbolNotFound"})


def from_torch(module, example_inputs, loss_fn=None, optimizer=None, *, unbatched=(),
               random_seed=0, validate=True):
    """Capture ``module``'s forward and backward and return a training program.

    Parameters
    ----------
    module : torch.nn.Module
        In the mode it should train in (``module.train()``); it is not modified.
    example_inputs : dict of str -> torch.Tensor
        The forward's arguments by name (plus ``target`` with ``loss_fn``). The
        names become the program's feed vars, the tensors fix dtypes and the
        non-batch dimensions. The batch (dimension 0) must be at least 2.
    loss_fn : callable, optional
        ``loss_fn(output, target) -> scalar``. Without it the forward must
        return the scalar loss itself.
    optimizer : ssaexec.optimizer.Optimizer, optional
        Its update ops are appended; without one the program stops at the
        gradients ``<param>@GRAD``.
    unbatched : iterable of str
        Inputs without a batch dimension (copied whole to every place).
    random_seed : int
        The programs' ``random_seed``.
    validate : bool
        Run ``main.validate()`` before returning.

    Returns
    -------
    (Program, Program, str)
        ``(main_program, startup_program, loss_name)``.

    Raises
    ------
    ProgramError
        When the module does something the program cannot express (see the
        module docstring); the message names the construct and the module path.
    """
    if not isinstance(module, torch.nn.Module):
        raise ProgramError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    inputs = _check_inputs(module, example_inputs, loss_fn, unbatched)
    batched = [n for n in inputs if n not in set(unbatched)]
    joint = _capture_joint(module, inputs, loss_fn, batched)
    main, startup = Program(random_seed), Program(random_seed)
    lowering = _Lowering(joint, module, inputs, main, startup)
    lowering.run()
    if optimizer is not None:
        block = main.global_block()
        pairs = [(block.var(p), block.var(grad_var_name(p))) for p in lowering.param_order
                 if grad_var_name(p) in block.vars]
        if not pairs:
            raise ProgramError(f"from_torch: no parameter of {type(module).__name__} gets a "
                               "gradient from the loss, so there is nothing to optimize")
        with program_guard(main, startup):
            optimizer.apply_gradients(pairs, startup)
    if validate:
        main.validate()
        startup.validate()
    return main, startup, LOSS_NAME


def _check_inputs(module, example_inputs, loss_fn, unbatched):
    if not isinstance(example_inputs, dict) or not example_inputs:
        raise ProgramError("from_torch: example_inputs must be a non-empty dict mapping the "
                           "forward's argument names to example tensors")
    for name, t in example_inputs.items():
        if not isinstance(name, str) or not name:
            raise ProgramError(f"from_torch: example_inputs keys must be names, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise ProgramError(f"from_torch: example input {name!r} is a "
                               f"{type(t).__name__}, not a tensor")
        if t.dtype not in DTYPES.values():
            raise ProgramError(f"from_torch: example input {name!r} has dtype {t.dtype}, which "
                               f"programs cannot hold (use one of {sorted(DTYPES)})")
    unknown = [n for n in unbatched if n not in example_inputs]
    if unknown:
        raise ProgramError(f"from_torch: unbatched names {unknown} are not example inputs")
    for name, t in example_inputs.items():
        if name not in unbatched and (t.dim() == 0 or t.shape[0] < 2):
            raise ProgramError(
                f"from_torch: example input {name!r} has shape {list(t.shape)}; dimension 0 is "
                "the batch and must be at least 2 (a batch of 1 would be traced as a constant), "
                "or name the input in unbatched=")
    if loss_fn is not None and "target" not in example_inputs:
        raise ProgramError("from_torch: with loss_fn, example_inputs must also hold 'target', "
                           "the second argument of loss_fn(output, target)")
    names = [n for n in example_inputs if not (loss_fn is not None and n == "target")]
    try:
        inspect.signature(module.forward).bind(**{n: None for n in names})
    except TypeError as e:
        params = list(inspect.signature(module.forward).parameters)
        raise ProgramError(f"from_torch: example_inputs {names} do not fit the forward of "
                           f"{type(module).__name__}{tuple(params)}: {e}") from None
    return dict(example_inputs)


class _LossWrapper(torch.nn.Module):
    """The traced root: calls the module by keyword and returns ``(loss,)``."""

    def __init__(self, module, names, loss_fn):
        super().__init__()
        setattr(self, _WRAPPED, module)
        self.names = list(names)
        self.loss_fn = loss_fn

    def forward(self, *tensors):
        kw = dict(zip(self.names, tensors, strict=True))
        target = kw.pop("target") if self.loss_fn is not None else None
        out = getattr(self, _WRAPPED)(**kw)
        loss = self.loss_fn(out, target) if self.loss_fn is not None else out
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = type(loss).__name__ if not isinstance(loss, torch.Tensor) else \
                f"a tensor of shape {list(loss.shape)}"
            raise ProgramError(
                f"from_torch: the loss must be a scalar tensor, got {what}; "
                + ("pass loss_fn=... (and a 'target' input) when the forward returns logits"
                   if self.loss_fn is None else "make loss_fn reduce to a scalar"))
        return (loss,)


# --- capture (all private torch API lives here) ----------------------------------------------
class _Joint:
    """What ``_capture_joint`` hands to the lowering: an FX graph plus its meaning.

    FX nodes keyed to names (feeds, parameters, buffers, gradients, mutated
    buffers), the loss and its gradient seed, and ``expr``, which renders a
    node's symbolic size as a number or a size expression over ``symbols``
    (symbol -> (feed name, dimension)), so the lowering needs no sympy.
    """

    __slots__ = ("gm", "feeds", "params", "buffers", "param_order", "buffer_order", "loss",
                 "seed", "grads", "mutations", "symbols", "expr", "wrapper")


def _capture_joint(module, inputs, loss_fn, batched):
    """Trace ``loss_fn(module(**inputs), target)`` forward and backward into one ATen graph.

    Uses ``torch._functorch.aot_autograd.aot_export_module(trace_joint=True)``
    on fake tensors whose batch dimension is a symbol (``FakeTensorMode`` with a
    ``ShapeEnv``). Parameters and buffers are swapped for fake copies while
    tracing (and always restored), so nothing real is computed or changed.
    Tested with torch 2.13 and 2.14 (see docs/torch_frontend.md).
    """
    import sympy
    from torch._functorch.aot_autograd import aot_export_module
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    wrapper = _LossWrapper(module, list(inputs), loss_fn)
    shape_env = ShapeEnv()
    fake_mode = FakeTensorMode(shape_env=shape_env)
    fakes = []
    for name, t in inputs.items():
        # DUCK: batch dims of equal size share one symbol (x and target have one batch)
        dims = [DimDynamic.DUCK if d == 0 and name in batched else DimDynamic.STATIC
                for d in range(t.dim())]
        fakes.append(fake_mode.from_tensor(
            t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
    swapped = []
    try:
        fake_of = {}
        for mod in wrapper.modules():
            for table in (mod._parameters, mod._buffers):
                for key, real in list(table.items()):
                    if real is None:
                        continue
                    fake = fake_of.get(id(real))
                    if fake is None:  # tied tensors stay tied
                        fake = fake_mode.from_tensor(real, static_shapes=True)
                        if isinstance(real, torch.nn.Parameter):
                            fake = torch.nn.Parameter(fake, requires_grad=real.requires_grad)
                        fake_of[id(real)] = fake
                    swapped.append((table, key, real))
                    table[key] = fake
        # Inside the fake mode: the export re-traces its joint graph with make_fx, and factory
        # ops with symbolic sizes (an LSTM's zero state) must not reach real kernels there.
        with fake_mode:
            gm, sig = aot_export_module(wrapper, fakes, trace_joint=True, output_loss_index=0)
    except ProgramError:
        raise
    except Exception as e:  # noqa: BLE001 - every capture failure becomes a ProgramError
        raise _capture_error(e, wrapper) from e
    finally:
        for table, key, real in reversed(swapped):
            table[key] = real

    nodes = {n.name: n for n in gm.graph.nodes}
    prefix = _WRAPPED + "."

    def strip(name):
        return name[len(prefix):] if name.startswith(prefix) else name

    joint = _Joint()
    joint.gm, joint.wrapper = gm, wrapper
    joint.param_order = [strip(p) for p in sig.parameters]
    joint.buffer_order = [strip(b) for b in sig.buffers]
    joint.params = {nodes[k]: strip(v) for k, v in sig.inputs_to_parameters.items()}
    joint.buffers = {nodes[k]: strip(v) for k, v in sig.inputs_to_buffers.items()}
    joint.feeds = {nodes[k]: name for k, name in zip(sig.user_inputs, inputs, strict=True)}
    problems = []
    for what, table in (("an input", sig.user_inputs_to_mutate),
                        ("a parameter", getattr(sig, "parameters_to_mutate", {}) or {})):
        for target in table.values():
            problems.append((what, strip(target) if what != "an input" else target))
    if problems:
        what, name = problems[0]
        if what == "an input":
            name = dict(zip(sig.user_inputs, inputs, strict=True)).get(name, name)
        raise ProgramError(
            f"from_torch: in-place mutation of {what} ({name!r}) in "
            f"{_locate_mutation(wrapper, inputs, name if what == 'an input' else None)}; the "
            "program treats inputs and parameters as values: write the result to a new tensor")
    if getattr(sig, "input_tokens", None) or getattr(sig, "output_tokens", None):
        raise ProgramError(f"from_torch: the forward of {type(module).__name__} calls an op "
                           "with side effects (effect tokens), which programs cannot express")
    joint.loss = nodes[sig.user_outputs[0]]
    bwd = sig.backward_signature
    joint.grads = [(nodes[k], strip(v)) for k, v in bwd.gradients_to_parameters.items()]
    joint.mutations = [(nodes[k], strip(v)) for k, v in sig.buffers_to_mutate.items()]
    seeds = [u for u in joint.loss.users if _type_of(u) in _SEEDS]
    if len(seeds) != 1:
        raise ProgramError(f"from_torch: cannot find the loss-gradient seed in the graph torch "
                           f"{torch.__version__} captured (expected one ones_like of the loss, "
                           f"found {len(seeds)}); this torch version is not supported")
    joint.seed = seeds[0]

    # Symbols: name them s0, s1 ... in input order, each bound to the first input
    # dimension that is exactly that symbol.
    rename, joint.symbols = {}, {}
    for node, name in joint.feeds.items():
        for d, size in enumerate(node.meta["val"].shape):
            e = size.node.expr if isinstance(size, torch.SymInt) else None
            if isinstance(e, sympy.Symbol) and e not in rename:
                new = f"s{len(rename)}"
                rename[e] = sympy.Symbol(new, integer=True, positive=True)
                joint.symbols[new] = (name, d)
        if name in batched:
            size = node.meta["val"].shape[0]
            e = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
            if e.is_number:
                raise ProgramError(
                    f"from_torch: the forward of {type(module).__name__} fixes the batch size of "
                    f"input {name!r} to {int(e)} (e.g. x.view({int(e)}, -1) or a check on "
                    "x.shape[0]); the program must run any batch size: use x.view(x.shape[0], "
                    f"-1)/x.flatten(1), or name {name!r} in unbatched=")

    def expr(value):
        """A meta value (int, float, bool, SymInt, SymFloat) as a number or size expression."""
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            e = value.node.expr
            if e.is_number:
                return bool(e) if isinstance(value, torch.SymBool) else \
                    (int(e) if isinstance(value, torch.SymInt) else float(e))
            unknown = e.free_symbols - set(rename)
            if unknown:
                raise ProgramError(f"from_torch: a size depends on {sorted(map(str, unknown))}, "
                                   "which no input dimension defines (data-dependent shape)")
            return str(e.xreplace(rename))
        return value

    joint.expr = expr
    return joint


def _capture_error(exc, wrapper):
    """The ``ProgramError`` for an exception raised while tracing."""
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        if isinstance(e, ProgramError):
            return e
    data_dependent = any(type(e).__name__ in _DATA_DEPENDENT or "data-dependent" in str(e).lower()
                         or "data dependent" in str(e).lower() for e in chain)
    where = _where_in_traceback(chain, wrapper)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if data_dependent:
        return ProgramError(
            f"from_torch: data-dependent control flow in {where}: the module branches on (or "
            "reads out) a tensor's value, e.g. `if x.sum() > 0`, `.item()`, `.tolist()` or "
            f"`nonzero`, which one program cannot express ({type(exc).__name__}: {first})")
    return ProgramError(f"from_torch: cannot capture {where}: {type(exc).__name__}: {first}")


def _module_paths(module):
    return {id(m): name for name, m in module.named_modules()}


def _describe(path, module):
    """``module 'layer1.0' (BasicBlock)``, or ``the root module (ResNet)``."""
    if path:
        return f"module '{path}' ({type(module.get_submodule(path)).__name__})"
    return f"the root module ({type(module).__name__})"


def _where_in_traceback(chain, wrapper):
    """``module 'layer1.0' (BasicBlock) at file.py:42``: the innermost module frame."""
    module = getattr(wrapper, _WRAPPED)
    paths = _module_paths(module)
    found, line = None, None
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    for e in reversed(chain):
        for frame, lineno in traceback.walk_tb(e.__traceback__):
            owner = frame.f_locals.get("self")
            if owner is not None and id(owner) in paths:
                found = paths[id(owner)]
            fname = frame.f_code.co_filename
            if not fname.startswith(torch_dir) and "ssaexec" not in fname.split("/")[-3:-1]:
                line = f"{fname}:{lineno}"
    if found is None:
        return f"the forward of {type(module).__name__} (module path unknown)"
    return _describe(found, module) + (f" at {line}" if line else "")


def _locate(wrapper, inputs, hit, fresh_inputs=True):
    """Where an eager run of the forward first makes an ATen call with ``hit(func, args)``.

    Error path only: runs a copy of the module (so buffers stay untouched)
    under a dispatch mode, with forward hooks tracking the module path.
    """
    import copy

    from torch.utils._python_dispatch import TorchDispatchMode

    module = getattr(wrapper, _WRAPPED)
    try:
        clone = copy.deepcopy(module)
    except Exception:  # noqa: BLE001 - best effort
        return f"the forward of {type(module).__name__} (module path unknown)"
    names = _module_paths(clone)
    inputs = {k: v.clone() for k, v in inputs.items()} if fresh_inputs else inputs
    stack, found = [], []

    def pre(m, args):
        stack.append(names[id(m)])

    def post(m, args, out):
        stack.pop()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not found and hit(func, args, kwargs or {}):
                found.append(stack[-1] if stack else None)
            return func(*args, **(kwargs or {}))

    handles = [m.register_forward_pre_hook(pre) for m in clone.modules()]
    handles += [m.register_forward_hook(post) for m in clone.modules()]
    w = _LossWrapper(clone, wrapper.names, wrapper.loss_fn)
    try:
        with Mode():
            w(*inputs.values())
    except Exception:  # noqa: BLE001 - the capture error is the one to report
        pass
    finally:
        for h in handles:
            h.remove()
    if found and found[0] is not None:
        return _describe(found[0], module)
    return f"the forward of {type(module).__name__} (module path unknown)"


def _locate_mutation(wrapper, inputs, input_name):
    inputs = {k: v.clone() for k, v in inputs.items()}
    ptrs = {inputs[input_name].untyped_storage().data_ptr()} if input_name else None

    def hit(func, args, kwargs):
        schema = getattr(func, "_schema", None)
        if schema is None:
            return False
        for a, v in zip(schema.arguments, args):
            if a.alias_info is not None and a.alias_info.is_write and isinstance(v, torch.Tensor):
                if ptrs is None:
                    return isinstance(v, torch.nn.Parameter)
                if v.untyped_storage().data_ptr() in ptrs:
                    return True
        return False

    return _locate(wrapper, inputs, hit, fresh_inputs=False)


def _type_of(node):
    """``aten.<name>.<overload>`` for a call of an operator overload, else None."""
    t = node.target
    schema, overload = getattr(t, "_schema", None), getattr(t, "_overloadname", None)
    if node.op != "call_function" or schema is None or overload is None:
        return None
    return f"{t.namespace}.{schema.name.split('::')[-1]}.{overload}"


# --- lowering: FX graph -> program -------------------------------------------------------------
class _Lowering:
    """Turn a ``_Joint`` into ops and vars of ``main`` and initialisers of ``startup``."""

    def __init__(self, joint, module, inputs, main, startup):
        self.j = joint
        self.module = module
        self.inputs = inputs
        self.main, self.startup = main, startup
        self.block = main.global_block()
        self.var_of = {}       # FX node -> var name (single-tensor nodes)
        self.outs_of = {}      # FX node -> list of var names (multi-result nodes)
        self.sym_shape = {}    # var name -> [int | size expression]
        self.taken = set()
        self.backward = set()

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

    def _declare_inputs(self):
        j = self.j
        for node, name in j.feeds.items():
            self.var_of[node] = name
            self.declare(name, node.meta["val"], is_data=True, stop_gradient=True)
        # names as the signature has them: the module's own, or "loss_fn.weight" for the
        # state of a loss_fn that is itself a module
        prefix = _WRAPPED + "."
        named = {(n[len(prefix):] if n.startswith(prefix) else n): v for n, v in
                 [*j.wrapper.named_parameters(remove_duplicate=False),
                  *j.wrapper.named_buffers(remove_duplicate=False)]}
        # Tied tensors (one Parameter under two names) are traced as two inputs with a
        # partial gradient each; the program keeps one var, the first name.
        canonical = {}
        self.canonical = {}
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
        self.startup.global_block().create_var(name, list(value.shape), dtype_name(value.dtype),
                                               **flags)
        self.startup.global_block().append_op(
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
        flags = dict(persistable=True, stop_gradient=True)
        self.block.create_var(name, list(value.shape), dtype_name(value.dtype), **flags)
        self.sym_shape[name] = list(value.shape)
        self._init_value(name, value, flags)

    def _mark_backward(self):
        # Ops that depend on the seed are the backward pass.
        todo = [self.j.seed]
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
        t = _type_of(node)
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
                where = _locate(j.wrapper, self.inputs, lambda f, a, k: f is node.target) \
                    if t is not None else "the forward (module path unknown)"
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
        hit_type = node.target

        def hit(func, args, kwargs):
            return func is hit_type

        where = _locate(self.j.wrapper, self.inputs, hit) if callable(hit_type) else \
            "the forward (module path unknown)"
        return ProgramError(f"from_torch: unsupported operation {what} in {where}")

    def _out_name(self, node):
        if node is self.j.loss:
            return LOSS_NAME
        return self.fresh(node.name)

    def _emit(self, node, t):
        overload = node.target
        schema = overload._schema
        for a in schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write:
                raise self._unsupported(node, f"{t} (it updates its argument {a.name!r} in "
                                              "place)")
        kinds = {name: kind for name, kind, _ in arg_kinds(overload)}
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
        positional = [a for a in schema.arguments if not a.kwarg_only]
        if len(node.args) > len(positional):
            raise self._unsupported(node, f"{t} (more positional arguments than its schema)")
        for a, v in zip(positional, node.args):
            attrs[a.name] = enc(v, a.name)
        for k, v in node.kwargs.items():
            if k not in kinds:
                raise self._unsupported(node, f"{t} (unknown keyword {k!r})")
            attrs[k] = enc(v, k)
        for name, kind in kinds.items():
            if kind.startswith("unsupported:") and attrs.get(name) is not None:
                raise self._unsupported(node, f"{t} (argument {name!r} of type {kind[12:]})")
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
            where = _locate(self.j.wrapper, self.inputs, lambda f, a, k: f is node.target)
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
                var = block.vars.pop(src)
                var.name = gname
                block.vars[gname] = var
                self.sym_shape[gname] = self.sym_shape.pop(src)
                op = block.ops[ws[0]]
                op.outputs = {k: [gname if n == src else n for n in v]
                              for k, v in op.outputs.items()}
                op.role_var = op.role_var + [(p, gname)]
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
        self.main._version += 1

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
                          and not src.endswith("@GRAD")
                          and not any(buf in op.input_names() for op in block.ops[w + 1:]))
            if direct:
                for op in block.ops[w:]:
                    op.inputs = {k: [buf if n == src else n for n in v]
                                 for k, v in op.inputs.items()}
                    op.outputs = {k: [buf if n == src else n for n in v]
                                  for k, v in op.outputs.items()}
                del block.vars[src]
                moved[src] = buf
            elif src != buf:
                block.append_op("aten.clone.default", {"X": [src]}, {"Out": [buf]},
                                {"self": "X[0]"}, role="forward")
        self.main._version += 1
