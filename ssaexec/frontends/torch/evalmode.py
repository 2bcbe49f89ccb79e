"""Eval mode for an imported training program: batch norm on running statistics, dropout off.

An imported training program computes batch norm with the batch's statistics and
updates the running ones (``aten._native_batch_norm_legit_functional`` with
``training=True``, plus ``num_batches_tracked + 1``), and draws dropout masks
(``aten.native_dropout`` with ``train=True``). ``Program.clone(for_test=True)``
keeps the forward ops of a program and sets builder ops' ``is_test``, which ATen
ops do not have; ``to_inference`` is the rewrite that gives them
``module.eval()`` behaviour. ``ssaexec.frontends.torch`` registers it with
``ssaexec.program.desc.register_test_rewrite``, so ``clone(for_test=True)`` applies
it to every clone (the program layer imports no frontend); ``inference_program``
is the same as a function of the training program.

The rewrite, op by op (a forward-only program: every op has role ``forward``):

* ``_native_batch_norm_legit_functional(..., training=True)`` becomes
  ``_native_batch_norm_legit_no_training`` on the same inputs (normalise with
  ``running_mean``/``running_var``, which it does not write); the batch's
  mean and inverse std (read by the backward only) are not produced. The
  running statistics and the module's ``num_batches_tracked`` are no longer
  written: the ops that wrote them (the counter's ``add``, a closing ``clone``)
  are removed, with the ops that only fed those, and a later reader of an
  updated statistic reads the buffer itself (in eval mode the two are equal);
* ``native_batch_norm(..., training=True)`` gets ``training=False``;
* ``native_dropout(..., train=True)`` gets ``train=False`` (the identity, with an
  all-true mask);
* ``bernoulli`` (what ``nn.Dropout2d``/``Dropout3d``/``AlphaDropout`` lower to)
  cannot be told apart from other randomness in the graph, so it raises
  ``ProgramError``: import the evaluation program with
  ``from_torch(..., for_test=True)``, which traces ``module.eval()`` itself.
  Other random ops (``randn_like`` noise) keep drawing, as they do in eval mode.

Anything else is left as it is; a program without these ops (every builder
program) is unchanged.
"""

from ...core.errors import ProgramError
from ...program.desc import EMPTY_VAR, OpDesc

__all__ = ["to_inference", "inference_program"]

BN_TRAIN = "aten._native_batch_norm_legit_functional.default"
BN_NATIVE = "aten.native_batch_norm.default"
BN_EVAL = "aten._native_batch_norm_legit_no_training.default"
DROPOUT = "aten.native_dropout.default"
_BN_EVAL_ARGS = ("input", "weight", "bias", "running_mean", "running_var", "momentum", "eps")
_COUNTER = "num_batches_tracked"


def inference_program(train_main):
    """The evaluation program of an imported training program.

    Parameters
    ----------
    train_main : Program
        ``from_torch``'s main program (with or without optimizer).

    Returns
    -------
    Program
        ``train_main.clone(for_test=True)``: the forward (loss included: feed
        ``target`` to fetch it), batch norm on running statistics that it does not
        update, dropout off. Its vars keep their names, so it runs on the training
        executor's values (``ParallelExecutor(..., share_vars_from=train_pe)``).

    Raises
    ------
    ProgramError
        For dropout variants that lower to ``bernoulli`` (see the module docstring).
    """
    return to_inference(train_main.clone(for_test=True))


def to_inference(program):
    """Rewrite the forward-only ``program`` in place for eval mode; return it.

    Idempotent. ``ProgramError`` when an op of a role other than ``forward`` is
    left (clone the program with ``for_test=True`` first) or for ``bernoulli``.
    """
    for block in program.blocks:
        if not any(op.type.startswith("aten.") for op in block.ops):
            continue
        training = [op for op in block.ops if op.role != "forward"]
        if training:
            raise ProgramError(
                f"to_inference: block {block.idx} still has {training[0].type} of role "
                f"{training[0].role!r}; rewrite a forward-only program "
                "(program.clone(for_test=True))")
        _rewrite_block(block)
    return program


def _rewrite_block(block):
    frozen = set()  # buffers whose training-time update is dropped
    for i, op in enumerate(list(block.ops)):
        if op.type == BN_TRAIN and op.attrs.get("training") is True:
            _batch_norm(block, i, op, frozen)
        elif op.type == BN_NATIVE and op.attrs.get("training") is True \
                and op.attrs.get("running_mean") is not None:
            block.set_attr(op, "training", False)
        elif op.type == DROPOUT and op.attrs.get("train") is not False:
            block.set_attr(op, "train", False)
        elif op.type.startswith("aten.bernoulli."):
            raise ProgramError(
                f"to_inference: block {block.idx} op {i} ({op.type}) draws a random mask "
                "(nn.Dropout2d, nn.Dropout3d and nn.AlphaDropout lower to bernoulli), which "
                "cannot be switched off in the imported training program; import the "
                "evaluation program with from_torch(module, inputs, for_test=True)")
    if frozen:
        _drop_writes(block, frozen)


def _batch_norm(block, index, op, frozen):
    outs = op.output("Out")
    xs = op.input("X")
    out, save_mean, save_invstd, new_mean, new_var = (outs + [EMPTY_VAR] * 5)[:5]
    readers = {n for o in block.ops if o is not op for n in o.input_names()}
    for n in (save_mean, save_invstd):
        if n != EMPTY_VAR and n in readers:
            raise ProgramError(
                f"to_inference: block {block.idx} op {index} ({op.type}): {n!r}, the batch "
                "statistics of a batch norm, is read by a forward op; eval mode has none")
    attrs = {k: op.attrs[k] for k in _BN_EVAL_ARGS if k in op.attrs}
    stats = []
    for arg in ("running_mean", "running_var"):
        ref = attrs.get(arg)
        if not (isinstance(ref, str) and ref.startswith("X[")):
            raise ProgramError(f"to_inference: block {block.idx} op {index} ({op.type}) has "
                               f"no {arg} input")
        stats.append(xs[int(ref[2:-1])])
    new = OpDesc(BN_EVAL, {"X": list(xs)}, {"Out": [out, EMPTY_VAR, EMPTY_VAR]}, attrs,
                   role="forward")
    block.remove_op(op)
    block.insert_op(index, new)
    # later readers of the updated statistics read the (unchanged) buffers
    for updated, buf in ((new_mean, stats[0]), (new_var, stats[1])):
        if updated in (EMPTY_VAR, buf):
            continue
        for later in block.ops[index + 1:]:
            for k, v in list(later.inputs.items()):
                if updated in v:
                    block.set_input(later, k, [buf if n == updated else n for n in v])
    frozen.update(stats)
    prefix = stats[0].rpartition(".")[0]
    counter = f"{prefix}.{_COUNTER}" if prefix else _COUNTER
    var = block.find_var(counter)
    if var is not None and var.persistable:
        frozen.add(counter)


def _drop_writes(block, frozen):
    """Remove the ops writing ``frozen`` vars, then the ops that only fed removed ones."""
    dead = [o for o in block.ops if set(o.output_names()) & frozen]
    read = {n for o in block.ops if all(o is not d for d in dead) for n in o.input_names()}
    for o in dead:
        kept = [n for n in o.output_names() if n not in frozen and n in read]
        if kept:
            raise ProgramError(
                f"to_inference: block {block.idx}: {o.type} updates the batch-norm statistics "
                f"{sorted(set(o.output_names()) & frozen)} and also writes {kept}, which "
                "later ops read")
    while dead:
        fed = set()
        for o in dead:
            fed.update(o.input_names())
            block.remove_op(o)
        read = {n for o in block.ops for n in o.input_names()}
        dead = []
        for o in block.ops:
            names = o.output_names()
            if o.type.startswith("aten.") and names and set(names) & fed \
                    and not any(n in read or block.var(n).persistable or block.var(n).is_data
                                for n in names):
                dead.append(o)
