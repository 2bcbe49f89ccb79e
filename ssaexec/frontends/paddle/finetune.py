"""Fine-tune an imported Paddle inference program: attach a label, a loss and an optimizer.

An inference model (``model.json`` + ``model.pdiparams``, or a legacy ``.pdmodel``)
computes outputs and nothing else. ``finetune(model, loss=..., optimizer=...)`` adds
a label data var, a loss on one of its outputs and the optimizer's backward and
update ops, through the builder API, as ``from_torch`` does for modules; the result
trains like any program (``ParallelExecutor``: data-parallel, gradients all-reduced),
and ``save_params`` writes the trained weights back as a ``.pdiparams`` file that
Paddle loads with the unchanged program file.

Policy: the imported program is not changed (the training program is a clone); its
parameters keep their names, so the written file lines up with Paddle's program;
ops imported in inference form (dropout as a scale, batch norm on running
statistics) stay so: fine-tuning updates the weights, not the mode.
"""

from ...core.errors import ProgramError
from ...program import layers as L
from ...program import optimizer as opt
from ...program.builder import program_guard

__all__ = ["finetune", "LOSSES"]

# loss name -> (label shape given the output's, label dtype, builder of the loss)
LOSSES = {
    "cross_entropy": (lambda shape: [-1, 1], "int64",
                      lambda out, label: L.mean(L.softmax_with_cross_entropy(out, label))),
    "mse": (lambda shape: list(shape), None,
            lambda out, label: L.mean(L.square_error_cost(out, label))),
}


def finetune(model, loss="cross_entropy", optimizer=None, output=None, label="label"):
    """A training version of an imported inference ``model``.

    Parameters
    ----------
    model : PaddleModel
        What ``se.from_paddle`` returned for an inference program.
    loss : {"cross_entropy", "mse"} or callable
        ``cross_entropy``: softmax cross entropy of the output's logits against an
        int64 label of shape ``[-1, 1]`` (Paddle's ``F.cross_entropy`` with its
        defaults), averaged; ``mse``: mean squared error against a label shaped like
        the output; or ``loss(output_var, label_var) -> loss_var`` built with
        ``ssaexec.layers`` (the label is then declared like the output).
    optimizer : ssaexec optimizer, optional
        Default ``SGD(0.01)``.
    output : str, optional
        The output the loss reads (default: the model's first fetch target).
    label : str
        The label data var's name.

    Returns
    -------
    PaddleModel
        ``(main, startup, feed + [label], [loss])``: train it with
        ``ParallelExecutor(..., loss_name=fetch[0])``.
    """
    main, startup = model.main.clone(), model.startup.clone()
    block = main.global_block()
    if any(op.role == "loss" for op in block.ops):
        raise ProgramError("finetune: the program already has a loss (it is a training "
                           "program); train it as it is")
    output = output or (model.fetch[0] if model.fetch else None)
    if output is None or block.find_var(output) is None:
        raise ProgramError(f"finetune: output {output!r} is not a var of the program (its "
                           f"fetch targets: {', '.join(model.fetch) or 'none'})")
    if block.find_var(label) is not None:
        raise ProgramError(f"finetune: the program already has a var named {label!r}; pick "
                           "another label name")
    out = block.var(output)
    if callable(loss):
        label_shape, label_dtype, build = list(out.shape), out.dtype, loss
    elif loss in LOSSES:
        shape_of, label_dtype, build = LOSSES[loss]
        label_shape, label_dtype = shape_of(out.shape), label_dtype or out.dtype
    else:
        raise ProgramError(f"finetune: unknown loss {loss!r}: use one of "
                           f"{', '.join(LOSSES)} or a function (output, label) -> loss")
    with program_guard(main, startup):
        label_var = L.data(label, label_shape, label_dtype)
        loss_var = build(out, label_var)
        (optimizer or opt.SGD(0.01)).minimize(loss_var)
    main.validate()
    return type(model)(main, startup, list(model.feed) + [label], [loss_var.name])
