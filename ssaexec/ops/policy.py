"""The operator policy: which ATen operators a program may name, with which arguments.

Policy. A program file is untrusted data (docs/security.md): running one may
compute on tensors and do nothing else. Op types ``aten.<name>.<overload>``
reach torch's whole operator library, which also reads files
(``from_file``), resizes or re-points storage (``set_``, ``resize_``), copies
to the host (``_local_scalar_dense``), prints and asserts. So an ATen op type
is accepted only when

1. it is on the allowlist ``ALLOWED``: core ATen (``CORE_ATEN``: the overloads
   torch tags ``torch.Tag.core``, the operator set of ``torch.export``'s core
   ATen IR, as of torch 2.13) plus the non-core overloads ``from_torch`` emits
   for real models (``IMPORTER_EXTRAS``: backward kernels, loss functions,
   ``t``, ``transpose`` ... found by importing the models of ``bench/``,
   ``tests/`` and small MLPs, CNNs and transformers);
2. its family is not one of ``DENIED_FAMILIES`` (files, storage, host values,
   side effects), whatever list it is on;
3. its schema passes ``schema_problem``: no argument is written in place or
   is a ``Storage``, every result is a tensor (or a list of them), and a
   ``Generator`` argument is optional (the file must leave it out);

and an op's attributes pass ``attr_problem``: no ``generator`` (random ops draw
from the place's seeded generator, never from one the file names), no
``pin_memory=true`` (page-locked host memory), no device (ops run on their
place), size expressions in the language of ``ssaexec.ops.size_expr``, and
literal sizes within ``max_tensor_elements`` (``ssaexec.core.limits``).

A type that breaks the policy is a ``ProgramError`` when the file is read
(``ssaexec.program.serialize``/``text`` call ``op_problem`` with the op's
position) and when a program is validated or run (``aten_op_def`` refuses to
resolve it), naming the op and the rule::

    op 'aten.from_file.default' is not allowed: it reads or writes files; program
    files may only use pure tensor operators (see docs/security.md)

To allow another pure operator, add it to ``IMPORTER_EXTRAS`` with the model
that needs it; the rules still apply to it.
"""

import re

from ..core.errors import ProgramError
from ..core.limits import get_limit, numel_problem, shape_problem

__all__ = ["ALLOWED", "CORE_ATEN", "IMPORTER_EXTRAS", "DENIED_FAMILIES", "RULE",
           "is_allowed", "denial", "schema_problem", "attr_problem", "op_problem",
           "check_op_type"]

RULE = "program files may only use pure tensor operators (see docs/security.md)"

# torch 2.13's overloads tagged torch.Tag.core, less those the rules below deny
# (resize_, atan2.out, _native_batch_norm_legit.default write their arguments;
# _local_scalar_dense and sym_* return host values; as_strided reads raw storage).
CORE_ATEN = frozenset("""
    _adaptive_avg_pool2d.default _adaptive_avg_pool2d_backward.default
    _adaptive_avg_pool3d.default _cdist_forward.default _embedding_bag.default
    _fft_c2r.default _fft_r2c.default _log_softmax.default _native_batch_norm_legit.no_stats
    _native_batch_norm_legit_no_training.default _pdist_forward.default _softmax.default
    _to_copy.default abs.default acos.default acosh.default adaptive_avg_pool1d.default
    add.Scalar add.Tensor addmm.default alias.default amax.default amin.default any.default
    any.dim any.dims arange.start_step argmax.default argmin.default asin.default
    asinh.default atan.default atan2.default atanh.default avg_pool1d.default
    avg_pool2d.default avg_pool2d_backward.default avg_pool3d.default bitwise_and.Scalar
    bitwise_and.Tensor bitwise_not.default bitwise_or.Scalar bitwise_or.Tensor
    bitwise_xor.Scalar bitwise_xor.Tensor bmm.default cat.default ceil.default clamp.Tensor
    clamp.default clone.default col2im.default constant_pad_nd.default convolution.default
    convolution_backward.default copy.default cos.default cosh.default cumsum.default
    diagonal.default div.Scalar div.Scalar_mode div.Tensor div.Tensor_mode elu.default
    embedding.default embedding_dense_backward.default empty.memory_format
    empty_strided.default eq.Scalar eq.Tensor erf.default exp.default expand.default
    expm1.default fill.Scalar flip.default floor.default fmod.Scalar fmod.Tensor
    full.default full_like.default gather.default ge.Scalar ge.Tensor gelu.default
    grid_sampler_2d.default gt.Scalar gt.Tensor hardtanh.default index.Tensor
    index_put.default index_select.default isinf.default isnan.default le.Scalar le.Tensor
    leaky_relu.default log.default log10.default log1p.default log2.default
    logical_and.default logical_not.default logical_or.default logical_xor.default lt.Scalar
    lt.Tensor masked_scatter.default max.dim max_pool2d_with_indices.default
    max_pool2d_with_indices_backward.default max_pool3d_with_indices.default maximum.default
    mean.default mean.dim min.dim minimum.default mm.default mul.Scalar mul.Tensor
    native_dropout.default native_group_norm.default native_group_norm_backward.default
    native_layer_norm.default native_layer_norm_backward.default ne.Scalar ne.Tensor
    neg.default nonzero.default permute.default pow.Scalar pow.Tensor_Scalar
    pow.Tensor_Tensor prod.default prod.dim_int rand.default randn.default randperm.default
    reciprocal.default reflection_pad1d.default reflection_pad2d.default
    reflection_pad3d.default relu.default remainder.Scalar remainder.Tensor repeat.default
    replication_pad2d.default replication_pad3d.default round.default rsqrt.default
    scalar_tensor.default scatter.src scatter.value scatter_add.default scatter_reduce.two
    select.int select_scatter.default sigmoid.default sign.default sin.default sinh.default
    slice.Tensor slice_scatter.default sort.default split_with_sizes.default sqrt.default
    squeeze.dim squeeze.dims sub.Scalar sub.Tensor sum.dim_IntList tan.default tanh.default
    topk.default trunc.default unsqueeze.default upsample_bilinear2d.vec
    upsample_nearest2d.vec var.correction var.dim view.default where.self
""".split())

# Non-core overloads that from_torch emits for real models (torch 2.13): the joint
# graph keeps backward kernels and loss functions whole, and views as t/transpose.
IMPORTER_EXTRAS = frozenset("""
    _log_softmax_backward_data.default _native_batch_norm_legit_functional.default
    _prelu_kernel.default _prelu_kernel_backward.default _safe_softmax.default
    _scaled_dot_product_flash_attention_for_cpu.default
    _scaled_dot_product_flash_attention_for_cpu_backward.default
    _softmax_backward_data.default _unsafe_index.Tensor _unsafe_index_put.default
    _unsafe_view.default arange.default bernoulli.p binary_cross_entropy.default
    binary_cross_entropy_backward.default binary_cross_entropy_with_logits.default
    elu_backward.default empty_like.default gelu_backward.default hardsigmoid.default
    hardsigmoid_backward.default hardswish.default hardswish_backward.default
    hardtanh_backward.default huber_loss.default huber_loss_backward.default
    leaky_relu_backward.default log_sigmoid_backward.default log_sigmoid_forward.default
    masked_fill.Scalar mish.default mse_loss.default mse_loss_backward.default
    native_batch_norm_backward.default native_dropout_backward.default new_empty.default
    new_zeros.default nll_loss_backward.default nll_loss_forward.default
    select_backward.default sgn.default sigmoid_backward.default silu.default
    slice_backward.default smooth_l1_loss.default smooth_l1_loss_backward.default
    softplus.default softplus_backward.default split.Tensor stack.default sum.default
    t.default tanh_backward.default threshold_backward.default transpose.int unbind.int
    xlogy.Tensor zeros.default
""".split())

ALLOWED = frozenset("aten." + t for t in CORE_ATEN | IMPORTER_EXTRAS)

_FILES = "it reads or writes files"
_STORAGE = "it works on raw storage or memory layout rather than tensor values"
_HOST = "it hands a value to the host or has a side effect outside tensors"
_INPLACE = "it updates a tensor in place or resizes it"

# Operator families (the <name> of aten.<name>.<overload>) refused whatever their
# overload, with the rule each breaks. Documentation as much as defence: none of
# them is on the allowlist, and the schema rules catch most of them again.
DENIED_FAMILIES = {
    "from_file": _FILES,
    "_copy_from": _STORAGE, "_copy_from_and_resize": _STORAGE, "set": _STORAGE,
    "set_": _STORAGE, "as_strided": _STORAGE, "as_strided_": _STORAGE,
    "as_strided_scatter": _STORAGE, "_reshape_alias": _STORAGE, "_unsafe_set_": _STORAGE,
    "resize": _INPLACE, "resize_": _INPLACE, "resize_as": _INPLACE, "resize_as_": _INPLACE,
    "_resize_output": _INPLACE, "_resize_output_": _INPLACE, "copy_": _INPLACE,
    "_local_scalar_dense": _HOST, "item": _HOST, "sym_size": _HOST, "sym_numel": _HOST,
    "sym_stride": _HOST, "sym_storage_offset": _HOST, "sym_is_contiguous": _HOST,
    "_assert_async": _HOST, "_assert_scalar": _HOST, "_assert_tensor_metadata": _HOST,
    "_functional_assert_async": _HOST, "_functional_assert_scalar": _HOST,
    "_print": _HOST, "_pin_memory": _HOST, "pin_memory": _HOST, "is_pinned": _HOST,
    "record_stream": _HOST, "_make_dep_token": _HOST, "_nested_tensor_from_mask": _HOST,
}

_NAME = re.compile(r"aten\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")
# Schema argument names that hold a tensor size (or a factor of one), checked
# against max_tensor_elements when their values are literal.
_SIZE_ARGS = frozenset({"size", "sizes", "input_sizes", "input_size", "self_sizes",
                        "output_size", "repeats", "shape"})
_PATH_ARGS = frozenset({"filename", "file", "path", "filepath"})


def is_allowed(op_type):
    """True when ATen op type ``op_type`` passes the policy (module docstring)."""
    return denial(op_type) is None


def denial(op_type):
    """Why ATen op type ``op_type`` is refused (a clause for a message), or None.

    Only the name and the installed torch's schema are looked at; an allowed name
    that torch does not have is not refused here (it is an unknown op type).
    """
    hit = _DENIALS.get(op_type, _MISSING)
    if hit is _MISSING:
        hit = _denial(op_type)
        if len(_DENIALS) < 4096:  # bounded: the names come from files
            _DENIALS[op_type] = hit
    return hit


_MISSING = object()
_DENIALS = {}


def _denial(op_type):
    m = _NAME.match(op_type)
    if m is None:
        return "it is not an ATen operator name (aten.<name>.<overload>)"
    family = m.group(1)
    if family in DENIED_FAMILIES:
        return DENIED_FAMILIES[family]
    if family.startswith("__"):  # never an operator; do not even look it up
        return "it is not on the allowlist of pure tensor operators"
    from .schema import resolve_overload
    overload = resolve_overload(op_type)
    if overload is None:
        return None if op_type in ALLOWED else \
            f"torch {_torch_version()} has no such ATen operator"
    # the schema rules first: they say what is wrong with an op, not only that it is unlisted
    return schema_problem(overload) or (
        None if op_type in ALLOWED else "it is not on the allowlist of pure tensor operators")


def _torch_version():
    import torch
    return torch.__version__


def schema_problem(overload):
    """Why ``overload``'s schema breaks the policy (a clause), or None."""
    schema = overload._schema
    for a in schema.arguments:
        t = str(a.real_type)
        if a.alias_info is not None and a.alias_info.is_write:
            return f"it updates its argument {a.name!r} in place"
        if "Storage" in t:
            return _STORAGE
        if a.name in _PATH_ARGS and "str" in t:
            return _FILES
        if t == "Generator":
            return "it needs a Generator, which a program file cannot supply"
    for r in schema.returns:
        t = str(r.real_type)
        if t not in ("Tensor", "Optional[Tensor]", "List[Tensor]"):
            return f"it returns a {t}, not tensors ({_HOST})"
        if r.alias_info is not None and r.alias_info.is_write:
            return _INPLACE
    return None


def attr_problem(op_type, attrs, n_inputs=None):
    """``(attribute name, clause)`` for the first attribute breaking the policy, or None.

    ``op_type`` is an allowed ATen type; ``attrs`` its attributes as read from
    the file (see ``ssaexec.ops.aten`` for the encoding); ``n_inputs`` the number
    of vars in its ``X`` slot, when known, to check ``"X[k]"`` and ``@sym``.
    """
    from .schema import SYM_ATTR, arg_kinds, resolve_overload
    overload = resolve_overload(op_type)
    if overload is None:
        return None
    kinds = {name: enc for name, enc, _ in arg_kinds(overload)}
    symbols = set()
    for name, value in attrs.items():
        enc = kinds.get(name)
        if name == SYM_ATTR or enc is None:
            continue  # @sym below; the validator refuses unknown names
        if enc == "generator" and value is not None:
            return name, ("a generator is not allowed: random ops draw from the place's "
                          "seeded generator (leave it out or null)")
        if name == "pin_memory" and value not in (None, False):
            return name, "pinned (page-locked) host memory is not available to programs"
        if enc == "device" and value is not None:
            return name, "a device is not allowed: ops run on their place's device (leave it " \
                         "out or null)"
        if enc in ("size", "tensor", "tensor_list"):
            # what the generic kernel decodes as numbers: a string that is not a tensor
            # reference is a size expression there (ssaexec.ops.aten)
            bad = _size_problem(name, value, n_inputs, symbols)
            if bad:
                return name, bad
    bad = _sym_problem(attrs.get(SYM_ATTR), n_inputs, symbols)
    if bad:
        return SYM_ATTR, bad
    return None


_REF = re.compile(r"X\[([0-9]{1,9})\]\Z")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _size_problem(name, value, n_inputs, symbols):
    # Tensor references must name an input; size expressions must parse; literal sizes
    # must fit a tensor.
    from .size_expr import parse_size_expr
    flat = list(_flatten(value, 0))
    for v in flat:
        if not isinstance(v, str):
            continue
        ref = _REF.match(v)
        if ref:
            if n_inputs is not None and int(ref.group(1)) >= n_inputs:
                return f"{v!r} refers to input {ref.group(1)}, but the op has {n_inputs} " \
                       f"input{'s' if n_inputs != 1 else ''} in slot X"
            continue
        try:
            symbols.update(parse_size_expr(v)[1])
        except ProgramError as e:
            return str(e)
    ints = [v for v in flat if isinstance(v, int) and not isinstance(v, bool)]
    cap = get_limit("max_size_value")
    for v in ints:
        if abs(v) > cap:
            return f"{v if v.bit_length() <= 64 else 'an integer'} is out of range " \
                   f"(max_size_value={cap})"
    if name in _SIZE_ARGS:
        if isinstance(value, list):
            return shape_problem([v if v >= -1 else 1 for v in ints], f"size {name!r}")
        if ints:
            return numel_problem(abs(ints[0]), f"size {name!r}")
    return None


def _sym_problem(binds, n_inputs, used):
    # @sym: [[symbol, input index, dim], ...], binding every symbol the expressions use
    if binds is None:
        binds = []
    if not isinstance(binds, list):
        return "expected a list of [symbol, input index, dim] entries"
    bound = set()
    for entry in binds:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and _SYMBOL.match(entry[0])
                and all(isinstance(x, int) and not isinstance(x, bool) for x in entry[1:])):
            return f"entries are [symbol, input index, dim], got {_clip(entry)}"
        _, k, d = entry
        if not 0 <= k < (n_inputs if n_inputs is not None else k + 1) or d < 0:
            return f"entry {_clip(entry)} names no dimension of the op's {n_inputs} inputs"
        bound.add(entry[0])
    missing = used - bound
    if missing:
        return f"size expressions use {sorted(missing)}, which it does not bind"
    return None


def _clip(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _flatten(value, depth):
    if isinstance(value, list) and depth < 8:
        for v in value:
            yield from _flatten(v, depth + 1)
    else:
        yield value


def op_problem(op_type, attrs, inputs=None):
    """The policy applied to one op as read from a file.

    Parameters
    ----------
    op_type : str
    attrs : dict
        The op's attributes.
    inputs : dict, optional
        Its input slots (slot -> var names), to check ATen tensor references.

    Returns
    -------
    None or (str or None, str)
        None when the op passes; else the attribute at fault (None: the type)
        and a complete message for a ``ProgramError``.
    """
    if op_type.startswith("aten."):
        why = denial(op_type)
        if why is not None:
            return None, _message(op_type, why)
        n_inputs = None if inputs is None else len(inputs.get("X") or [])
        bad = attr_problem(op_type, attrs, n_inputs)
        if bad is not None:
            return bad[0], f"op {op_type!r}: attribute {bad[0]!r}: {bad[1]}"
        return None
    shape = attrs.get("shape")
    if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                       for d in shape):
        # the hand-written factories (fill_constant, uniform_random ...) size from it
        bad = shape_problem(shape, "attribute 'shape'")
        if bad is not None:
            return "shape", f"op {op_type!r}: {bad}"
    return None


def _message(op_type, why):
    return f"op {op_type!r} is not allowed: {why}; {RULE}"


def check_op_type(op_type):
    """Raise ``ProgramError`` when ATen op type ``op_type`` breaks the policy."""
    why = denial(op_type)
    if why is not None:
        raise ProgramError(_message(op_type, why))
