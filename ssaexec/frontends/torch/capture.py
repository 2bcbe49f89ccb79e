"""Capture: trace a module's forward *and* backward into one functional ATen graph.

``capture_joint`` runs AOTAutograd's joint export (``aot_export_module`` with
``trace_joint=True``) on fake tensors whose batch dimension (and the dimensions
``dynamic=`` names) are symbols, in the state a non-strict ``torch.export`` traces
in, and hands the lowering a ``Joint``: the FX graph plus what its nodes mean.
``capture_forward`` is the same for an evaluation program: the module in eval
mode (``module.eval()`` for the trace, its flags restored after), forward only
(``trace_joint=False``), the forward's results as ``outputs``.

Policy:

* torch's private capture API (``aot_export_module``, fake tensors, the shape env, the
  export state, the decomposition table) is reached through ``ssaexec.core.compat`` only,
  which says what a torch version lacks; what a supported torch version traces
  differently is normalised after the trace (``normalise``: one program for one module
  on every supported torch, tests/frontends/torch/test_capture_golden.py).
* The user's module is never changed: its parameters and buffers are swapped for
  fake copies while tracing and always restored; nothing real is computed.
* Model code sees an export: ``torch.compiler.is_compiling()`` and
  ``is_exporting()`` are true while tracing, so libraries that ask (``transformers``'
  ``is_tracing()``) take their traceable branches instead of data-dependent
  shortcuts; nothing in them is patched.
* The trace decomposes what ``decompose.decompositions()`` lists: the ops the
  operator policy refuses, and a few whose fake kernels would fix the batch.
* ``output`` picks the loss (or what ``loss_fn`` reads, or the evaluation result)
  from the forward's result; a ``dict`` / ``ModelOutput`` without ``loss_fn`` gives
  its ``"loss"`` (``select_output``).
* Every capture failure becomes a ``ProgramError`` that names the construct
  and, where it can, the module path (``locate.capture_error``).

Invariants of a ``Joint``:

* ``feeds`` are the keys of ``example_inputs`` in order; parameter and buffer
  names are the module's own (the wrapper's ``module.`` prefix stripped);
* the symbols are named ``s0, s1 ...`` in input order, each bound to the first
  input dimension that is exactly that symbol; every batched input's dimension 0
  and every dimension ``dynamic=`` names is symbolic, one symbol per name (a module
  that fixes one, or makes two names equal, is refused);
* ``seed`` is the one ``ones_like`` of the loss that seeds the backward (a
  forward-only capture has no ``loss``, ``seed`` or ``grads``, and ``outputs``
  lists the nodes of the forward's results);
* no input or parameter is mutated in place and no op has side effects.
"""

import collections.abc
import inspect
import operator

import torch

from ...core import compat
from ...core.dtypes import DTYPES
from ...core.errors import ProgramError
from .decompose import decompositions
from .locate import capture_error, locate_mutation

__all__ = ["LossWrapper", "ForwardWrapper", "Joint", "BATCH", "export_state", "check_inputs",
           "symbolic_dims", "select_output", "capture_joint", "capture_forward", "op_type",
           "strip_wrapped"]

# the name of the batch dimension (dimension 0 of every batched input) among the
# dimension names of ``dynamic=``; user names cannot start with "@"
BATCH = "@batch"

# LossWrapper holds the user's module as ``module``, so its state names start so
_PREFIX = "module."
_SEEDS = frozenset({"aten.ones_like.default", "aten.full_like.default"})


def strip_wrapped(name):
    """A wrapper state name without the ``module.`` prefix (the module's own name)."""
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def export_state():
    """The state a non-strict ``torch.export`` traces in (``is_compiling()`` and
    ``is_exporting()`` true), as a context manager (``compat.export_state``)."""
    return compat.export_state()


def check_inputs(module, example_inputs, loss_fn, unbatched):
    """The checked ``example_inputs`` as a new dict (``ProgramError`` for a bad argument)."""
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


def symbolic_dims(inputs, batched, dynamic):
    """``{input: {dim: name}}``: the dimensions traced as symbols, by name.

    Dimension 0 of every input in ``batched`` is ``BATCH``; ``dynamic`` (``{input:
    {dim: name}}``, from ``from_torch``) names others. Dimensions of one name are
    one symbol, so they must have one size in the example.
    """
    dims = {name: {0: BATCH} for name in batched}
    if dynamic is None:
        dynamic = {}
    if not isinstance(dynamic, dict):
        raise ProgramError("from_torch: dynamic= must be a dict {input name: {dimension: "
                           f"name}}, e.g. {{'input_ids': {{1: 'seq'}}}}; got "
                           f"{type(dynamic).__name__}")
    for name, named in dynamic.items():
        if name not in inputs:
            raise ProgramError(f"from_torch: dynamic= names input {name!r}, which is not an "
                               f"example input ({sorted(inputs)})")
        if not isinstance(named, dict):
            raise ProgramError(f"from_torch: dynamic[{name!r}] must be a dict {{dimension: "
                               f"name}}, e.g. {{1: 'seq'}}; got {type(named).__name__}")
        t = inputs[name]
        for d, label in named.items():
            if isinstance(d, bool) or not isinstance(d, int) or not -t.dim() <= d < t.dim():
                raise ProgramError(f"from_torch: dynamic[{name!r}] names dimension {d!r}, but "
                                   f"the example input has shape {list(t.shape)}")
            d %= t.dim()
            if not isinstance(label, str) or not label or label.startswith("@"):
                raise ProgramError(f"from_torch: dynamic[{name!r}][{d}] must be a name such as "
                                   f"'seq', got {label!r}")
            if dims.get(name, {}).get(d) == BATCH:
                raise ProgramError(f"from_torch: dimension 0 of {name!r} is the batch, which is "
                                   "dynamic already; name other dimensions in dynamic= (or "
                                   f"name {name!r} in unbatched= to name its dimension 0)")
            if t.shape[d] < 2:
                raise ProgramError(
                    f"from_torch: dimension {d} ({label!r}) of example input {name!r} has size "
                    f"{t.shape[d]}; a dynamic dimension must be at least 2 in the example (sizes "
                    "0 and 1 would be traced as constants)")
            dims.setdefault(name, {})[d] = label
    sizes = {}
    for name, named in dims.items():
        for d, label in named.items():
            size = inputs[name].shape[d]
            seen = sizes.setdefault(label, (name, d, size))
            if seen[2] != size:
                what = "the batch" if label == BATCH else repr(label)
                hint = ("; every input not named in unbatched= is split along dimension 0 "
                        "into the places' shares, so all hold one number of samples"
                        if label == BATCH else "")
                raise ProgramError(
                    f"from_torch: dimension {seen[1]} of {seen[0]!r} and dimension {d} of "
                    f"{name!r} are both {what} but have sizes {seen[2]} and {size} in the "
                    f"example inputs{hint}")
    return dims


def select_output(out, output, module):
    """What the forward's result ``out`` hands on: ``output`` picks it.

    ``output`` is None (the result itself), a key or attribute name
    (``"logits"`` of a ``dict`` or a transformers ``ModelOutput``), an index (of a
    tuple or list), or a callable applied to the result.
    """
    if output is None:
        return out
    if callable(output):
        return output(out)
    if isinstance(out, collections.abc.Mapping):
        if output in out:
            return out[output]
    elif isinstance(output, int) and not isinstance(output, bool) \
            and isinstance(out, (tuple, list)) and -len(out) <= output < len(out):
        return out[output]
    elif isinstance(output, str) and isinstance(getattr(out, output, None), torch.Tensor):
        return getattr(out, output)
    raise ProgramError(f"from_torch: output={output!r} picks nothing from the "
                       f"{_describe_result(out)} the forward of {type(module).__name__} returns")


def _describe_result(out):
    if isinstance(out, collections.abc.Mapping):
        return f"{type(out).__name__} with keys {list(out)}"
    if isinstance(out, (tuple, list)):
        return f"{type(out).__name__} of {len(out)}"
    return type(out).__name__


class LossWrapper(torch.nn.Module):
    """The traced root: calls the module by keyword and returns ``(loss,)``.

    ``module`` is the user's module, ``names`` the input names in
    order, ``loss_fn`` the loss function or None and ``output`` what of the
    forward's result the loss is or ``loss_fn`` reads (``select_output``).
    """

    # the state the capture traces in; locate's eager re-run of the forward uses it too,
    # so model code takes the same branches there
    trace_state = staticmethod(export_state)

    def __init__(self, module, names, loss_fn, output=None):
        super().__init__()
        self.module = module
        self.names = list(names)
        self.loss_fn = loss_fn
        self.output = output

    def around(self, module):
        """A wrapper with the same inputs and loss around ``module`` (a copy, say)."""
        return LossWrapper(module, self.names, self.loss_fn, self.output)

    def forward(self, *tensors):
        kw = dict(zip(self.names, tensors, strict=True))
        target = kw.pop("target") if self.loss_fn is not None else None
        out = self.module(**kw)
        if self.loss_fn is None and self.output is None \
                and isinstance(out, collections.abc.Mapping):
            # a dict or transformers' ModelOutput: the model's own loss (given labels)
            if "loss" not in out or not isinstance(out["loss"], torch.Tensor):
                raise ProgramError(
                    f"from_torch: the forward of {type(self.module).__name__} returns a "
                    f"{_describe_result(out)} and no 'loss': feed what makes the model compute "
                    "its loss (e.g. 'labels'), or pass loss_fn=... with a 'target' input and "
                    "output='logits'")
            out = out["loss"]
        out = select_output(out, self.output, self.module)
        loss = self.loss_fn(out, target) if self.loss_fn is not None else out
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = type(loss).__name__ if not isinstance(loss, torch.Tensor) else \
                f"a tensor of shape {list(loss.shape)}"
            raise ProgramError(
                f"from_torch: the loss must be a scalar tensor, got {what}; "
                + ("pass loss_fn=... (and a 'target' input) when the forward returns logits"
                   if self.loss_fn is None else "make loss_fn reduce to a scalar"))
        return (loss,)


class ForwardWrapper(torch.nn.Module):
    """The traced root of an evaluation capture: calls the module by keyword and
    returns its result as a tuple (one tensor, or a tuple or list of tensors).

    ``around(m)`` (the error path's eager re-run, on a copy) puts the copy in eval
    mode, as the capture saw the module.
    """

    trace_state = staticmethod(export_state)

    def __init__(self, module, names, output=None):
        super().__init__()
        self.module = module
        self.names = list(names)
        self.output = output

    def around(self, module):
        """A wrapper with the same inputs around ``module`` (a copy), in eval mode."""
        return ForwardWrapper(module.eval(), self.names, self.output)

    def forward(self, *tensors):
        out = self.module(**dict(zip(self.names, tensors, strict=True)))
        out = select_output(out, self.output, self.module)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not outs or not all(isinstance(t, torch.Tensor) for t in outs):
            kinds = _describe_result(out) if isinstance(out, collections.abc.Mapping) else \
                [type(t).__name__ for t in outs] if isinstance(out, (tuple, list)) \
                else type(out).__name__
            raise ProgramError(
                f"from_torch(for_test=True): the forward of {type(self.module).__name__} must "
                f"return a tensor or a tuple or list of tensors, got {kinds}"
                + ("; pass output='logits' (a key, an index or a callable) to pick what the "
                   "program returns" if self.output is None else ""))
        return tuple(outs)


class Joint:
    """What ``capture_joint`` (``capture_forward``) hands to the lowering: an FX graph
    plus its meaning.

    FX nodes keyed to names (feeds, parameters, buffers, gradients, mutated
    buffers), the loss and its gradient seed (None in a forward-only capture),
    ``outputs`` (the forward's results of a forward-only capture, else empty), and
    ``expr``, which renders a
    node's symbolic size as a number or a size expression over ``symbols``
    (symbol -> (feed name, dimension)), so the lowering needs no sympy.
    """

    __slots__ = ("gm", "feeds", "params", "buffers", "param_order", "buffer_order", "loss",
                 "seed", "grads", "mutations", "symbols", "expr", "wrapper", "outputs")


def capture_joint(module, inputs, loss_fn, dims, output=None):
    """Trace ``loss_fn(module(**inputs), target)`` forward and backward into one ATen graph.

    Uses ``torch._functorch.aot_autograd.aot_export_module(trace_joint=True)``
    on fake tensors whose dimensions named in ``dims`` (``symbolic_dims``: the
    batch and ``dynamic=``) are symbols (``FakeTensorMode`` with a ``ShapeEnv``),
    in the state ``torch.export`` traces in (``torch.compiler.is_exporting()``
    is true), so model code takes its traceable branches. Parameters and buffers
    are swapped for fake copies while tracing (and always restored), so nothing
    real is computed or changed. ``output`` picks the loss (or what ``loss_fn``
    reads) from the forward's result (``select_output``). Tested with torch 2.13
    and 2.14 (see docs/torch_frontend.md).
    """
    _refuse_cumulative_batch_norm(module)
    wrapper = LossWrapper(module, list(inputs), loss_fn, output)
    gm, sig = _export(wrapper, inputs, dims, trace_joint=True)
    joint, nodes = _joint(module, wrapper, gm, sig, inputs, dims)
    joint.loss = nodes[sig.user_outputs[0]]
    joint.outputs = []
    bwd = sig.backward_signature
    joint.grads = [(nodes[k], strip_wrapped(v)) for k, v in bwd.gradients_to_parameters.items()]
    seeds = [u for u in joint.loss.users if op_type(u) in _SEEDS]
    if len(seeds) != 1:
        raise ProgramError(f"from_torch: cannot find the loss-gradient seed in the graph torch "
                           f"{torch.__version__} captured (expected one ones_like of the loss, "
                           f"found {len(seeds)}); this torch version is not supported")
    joint.seed = seeds[0]
    return joint


def capture_forward(module, inputs, dims, output=None):
    """Trace ``module(**inputs)`` in eval mode, forward only, into one ATen graph.

    ``module.eval()`` holds while tracing (batch norm reads its running
    statistics, dropout is off) and every submodule's ``training`` flag is
    restored afterwards. Same export as ``capture_joint`` with
    ``trace_joint=False``; the ``Joint`` has no loss, seed or gradients, and
    ``outputs`` are the nodes of the forward's results in order (``output``
    picks them from the forward's result).
    """
    wrapper = ForwardWrapper(module, list(inputs), output)
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        gm, sig = _export(wrapper, inputs, dims, trace_joint=False)
    finally:
        for m, training in flags:
            m.training = training
    joint, nodes = _joint(module, wrapper, gm, sig, inputs, dims)
    joint.loss = joint.seed = None
    joint.grads = []
    joint.outputs = [nodes[n] if isinstance(n, str) else n for n in sig.user_outputs]
    return joint


def _refuse_cumulative_batch_norm(module):
    # momentum=None makes batch norm read num_batches_tracked into a Python float
    # (1 / num_batches_tracked) each training step: data-dependent, so say so plainly
    for path, m in module.named_modules():
        if isinstance(m, compat.batch_norm_base()) and m.training and m.track_running_stats \
                and m.momentum is None:
            where = f"module {path!r}" if path else "the root module"
            raise ProgramError(
                f"from_torch: {where} ({type(m).__name__}) has momentum=None (a cumulative "
                "moving average of the statistics, whose factor 1/num_batches_tracked is read "
                "out of a tensor each step), which one program cannot express; give it a "
                "momentum (e.g. 0.1)")


def _fake_inputs(inputs, dims):
    """``(fake_mode, fakes)``: a fake mode with a shape env of its own and the inputs as
    fakes whose dimensions named in ``dims`` are symbols."""
    fake_mode = compat.fake_tensor_mode(shape_env=compat.shape_env())
    fakes, first = [], {}
    for name, t in inputs.items():
        named = dims.get(name, {})
        # DYNAMIC, not DUCK: a symbol per dimension, whatever its size; the dimensions of
        # one name are made one symbol below (x's and target's batch)
        fake = fake_mode.from_tensor(t, symbolic_context=compat.symbolic_context(
            [d in named for d in range(t.dim())]))
        for d, label in named.items():
            if label in first:
                compat.check(fake.shape[d] == first[label])  # the shape env unifies them
            else:
                first[label] = fake.shape[d]
        fakes.append(fake)
    return fake_mode, fakes


def _export(wrapper, inputs, dims, trace_joint):
    """``(gm, signature)`` of ``aot_export_module`` on fake inputs and fake module state."""
    aot_export_module = compat.aot_export_module
    # every (table, key) holding a parameter or buffer, with its real tensor
    swapped = [(table, key, real) for mod in wrapper.modules()
               for table in (mod._parameters, mod._buffers)
               for key, real in list(table.items()) if real is not None]

    def trace(fakes):
        if trace_joint:
            return aot_export_module(wrapper, fakes, trace_joint=True, output_loss_index=0,
                                     decompositions=decompositions())
        return aot_export_module(wrapper, fakes, trace_joint=False,
                                 decompositions=decompositions())

    try:
        fake_mode, fakes = _fake_inputs(inputs, dims)
        _swap_in_fakes(swapped, fake_mode)
        # Inside the fake mode: the export re-traces its joint graph with make_fx, and factory
        # ops with symbolic sizes (an LSTM's zero state) must not reach real kernels there.
        # Under torch.export's own state (torch.compiler.is_compiling() and is_exporting()
        # are true, as in a non-strict torch.export): libraries ask for it before
        # data-dependent shortcuts (transformers' is_tracing() skips `if (mask == 0).all()`
        # and builds the causal mask with tensor ops instead).
        with fake_mode, export_state():
            try:
                return trace(fakes)
            except Exception as e:  # noqa: BLE001 - one kind is retried, the rest re-raised
                if not (trace_joint and _no_gradient(e)):
                    raise
        # A parameter name the forward never reads (an unused layer, or the first name
        # of a tied embedding that only its aliases read: T5's and BART's `shared`) gets
        # no gradient, which the joint export refuses. Find those names with a fake
        # forward and backward, and trace again with them frozen, each name its own fake
        # (the lowering sums a tied parameter's parts). The probe and the new trace each
        # get a shape env of their own: what the failed trace and the probe's eager
        # backward recorded (torch 2.11's embedding backward fixes the batch) must not
        # reach the trace.
        probe_mode, probe_fakes = _fake_inputs(inputs, dims)
        with probe_mode, export_state():
            frozen = _unread(wrapper, probe_fakes, swapped, probe_mode)
        fake_mode, fakes = _fake_inputs(inputs, dims)
        _swap_in_fakes(swapped, fake_mode, frozen=frozen)
        with fake_mode, export_state():
            return trace(fakes)
    except ProgramError:
        raise
    except Exception as e:  # noqa: BLE001 - every capture failure becomes a ProgramError
        raise capture_error(e, wrapper) from e
    finally:
        for table, key, real in reversed(swapped):
            table[key] = real


def _swap_in_fakes(entries, fake_mode, frozen=None):
    """Put a fake of each ``(table, key, real)`` in ``table[key]``.

    ``frozen=None``: tied tensors (one object under several names) get one fake, so
    they stay tied. Else every entry gets its own fake, a parameter requiring grad
    unless ``(id(table), key)`` is in ``frozen``.
    """
    fake_of = {}
    for table, key, real in entries:
        fake = fake_of.get(id(real)) if frozen is None else None
        if fake is None:
            fake = fake_mode.from_tensor(real, static_shapes=True)
            if isinstance(real, torch.nn.Parameter):
                grad = real.requires_grad and (frozen is None or (id(table), key) not in frozen)
                fake = torch.nn.Parameter(fake, requires_grad=grad)
            fake_of[id(real)] = fake
        table[key] = fake


def _no_gradient(exc):
    e, seen = exc, []
    while e is not None and e not in seen:
        if "did not receive a gradient" in str(e):
            return True
        seen.append(e)
        e = e.__cause__ or e.__context__
    return False


def _unread(wrapper, fakes, entries, fake_mode):
    """``{(id(table), key)}`` of the trainable parameter names whose fake gets no gradient
    from a fake run of the forward and backward (each name its own fake)."""
    _swap_in_fakes(entries, fake_mode, frozen=set())
    trainable = [(table, key) for table, key, _ in entries
                 if isinstance(table[key], torch.nn.Parameter) and table[key].requires_grad]
    loss = wrapper(*fakes)[0]
    grads = torch.autograd.grad(loss, [table[key] for table, key in trainable],
                                allow_unused=True)
    return {(id(table), key) for (table, key), g in zip(trainable, grads, strict=True)
            if g is None}


def normalise(gm):
    """Make what a supported torch version traces differently the same, in place.

    One module must import as one program on every supported torch
    (tests/frontends/torch/test_capture_golden.py). What differs between the versions' traces, each
    normalised to what the kernels compute on all of them:

    * ``aten._scaled_dot_product_flash_attention_for_cpu``: torch 2.11's fake kernel
      says the logsumexp (result 1) is float32 whatever the query's dtype, while the
      CPU kernel returns it in its accumulation dtype, the query's promoted to at least
      float32 (float64 for a float64 query; torch 2.13 says so too); the declared dtype
      follows the kernel.
    """
    for node in gm.graph.nodes:
        if op_type(node) == compat.SDPA_CPU:
            _sdpa_logsumexp_dtype(node)


def _sdpa_logsumexp_dtype(node):
    val = node.meta.get("val")
    query = node.args[0].meta.get("val") if node.args else None
    if not isinstance(val, (tuple, list)) or len(val) < 2 or query is None or val[1] is None:
        return
    acc = torch.promote_types(query.dtype, torch.float32)
    if val[1].dtype == acc:
        return
    lse = val[1].to(acc)
    node.meta["val"] = type(val)([val[0], lse, *val[2:]])
    for user in node.users:
        if user.target is operator.getitem and user.args[1] == 1:
            user.meta["val"] = lse


def _joint(module, wrapper, gm, sig, inputs, dims):
    """The ``Joint`` parts both captures share, and the graph's nodes by name."""
    import sympy

    normalise(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    joint = Joint()
    joint.gm, joint.wrapper = gm, wrapper
    joint.param_order = [strip_wrapped(p) for p in sig.parameters]
    joint.buffer_order = [strip_wrapped(b) for b in sig.buffers]
    joint.params = {nodes[k]: strip_wrapped(v) for k, v in sig.inputs_to_parameters.items()}
    joint.buffers = {nodes[k]: strip_wrapped(v) for k, v in sig.inputs_to_buffers.items()}
    joint.feeds = {nodes[k]: name for k, name in zip(sig.user_inputs, inputs, strict=True)}
    problems = []
    for what, table in (("an input", sig.user_inputs_to_mutate),
                        ("a parameter", getattr(sig, "parameters_to_mutate", {}) or {})):
        for target in table.values():
            problems.append((what, strip_wrapped(target) if what != "an input" else target))
    if problems:
        what, name = problems[0]
        if what == "an input":
            name = dict(zip(sig.user_inputs, inputs, strict=True)).get(name, name)
        raise ProgramError(
            f"from_torch: in-place mutation of {what} ({name!r}) in "
            f"{locate_mutation(wrapper, inputs, name if what == 'an input' else None)}; the "
            "program treats inputs and parameters as values: write the result to a new tensor")
    if getattr(sig, "input_tokens", None) or getattr(sig, "output_tokens", None):
        raise ProgramError(f"from_torch: the forward of {type(module).__name__} calls an op "
                           "with side effects (effect tokens), which programs cannot express")
    joint.mutations = [(nodes[k], strip_wrapped(v)) for k, v in sig.buffers_to_mutate.items()]

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
    _check_symbolic(module, joint.feeds, dims)

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
    return joint, nodes


def _check_symbolic(module, feeds, dims):
    # every named dimension is still a symbol after the trace, one per name
    import sympy

    label_of = {}
    for node, name in feeds.items():
        shape = node.meta["val"].shape
        for d, label in dims.get(name, {}).items():
            size = shape[d]
            e = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
            if e.is_number and label == BATCH:
                raise ProgramError(
                    f"from_torch: the forward of {type(module).__name__} fixes the batch size of "
                    f"input {name!r} to {int(e)} (e.g. x.view({int(e)}, -1) or a check on "
                    "x.shape[0]); the program must run any batch size: use x.view(x.shape[0], "
                    f"-1)/x.flatten(1), or name {name!r} in unbatched=")
            if e.is_number:
                raise ProgramError(
                    f"from_torch: the forward of {type(module).__name__} fixes dimension {d} of "
                    f"input {name!r} (named {label!r} in dynamic=) to {int(e)}: it is combined "
                    "with a fixed size (another input whose dimension is not named "
                    f"{label!r} too, a size taken from the example, or a check on it)")
            other = label_of.setdefault(e, label)
            if other != label:
                names = ["the batch" if x == BATCH else repr(x) for x in (other, label)]
                raise ProgramError(
                    f"from_torch: the forward of {type(module).__name__} makes dimensions "
                    f"{names[0]} and {names[1]} equal (dimension {d} of {name!r}); give them "
                    "one name in dynamic=")


def op_type(node):
    """``aten.<name>.<overload>`` for a call of an operator overload, else None."""
    t = node.target
    schema, overload = getattr(t, "_schema", None), getattr(t, "_overloadname", None)
    if node.op != "call_function" or schema is None or overload is None:
        return None
    return f"{t.namespace}.{schema.name.split('::')[-1]}.{overload}"
