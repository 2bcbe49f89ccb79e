"""``from_torch``: import a ``torch.nn.Module``'s training step as an ssaexec program.

    main, startup, loss = se.from_torch(model, {"x": x, "target": y},
                                        loss_fn=torch.nn.functional.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))

Three steps, one module each:

* ``capture``: torch's own machinery (AOTAutograd's joint export) traces the
  forward *and* the backward into one functional ATen graph on fake tensors; the
  only module that touches torch's private APIs;
* ``lower``: every ATen call of that graph becomes an op ``aten.<name>.<overload>``
  run by the generic kernel of ``ssaexec.ops.aten``, built into ``main`` and
  ``startup`` through the ``BlockDesc`` API; the rest of ssaexec sees an ordinary
  program;
* ``locate``: on the error path only, find the module path and source line a
  failure comes from.

Policy (details in each module's docstring):

* Feed vars are the keys of ``example_inputs`` (``target`` too when ``loss_fn``
  is given). Dimension 0 of every input is the batch (-1 in the program, split
  across places) unless the input is named in ``unbatched``; the batch is traced
  symbolically, so sizes that depend on it (a flatten's ``[s0, 512]``) are size
  expressions, and one program runs any batch size.
* Parameters and buffers keep their module names and are persistable;
  ``startup`` sets them to the module's current values (``assign_bytes``: base64
  of the raw bytes, about 1.33 bytes per byte of weights in the JSON file). The
  module itself is never changed.
* The loss is ``loss`` (``LOSS_NAME``), each parameter's gradient
  ``<param>@GRAD``; optimizer ops come last (``Optimizer.apply_gradients``).

Anything the program cannot express raises ``ProgramError`` naming the
construct and the module path: data-dependent control flow (a Python ``if`` on
a tensor value, ``.item()``, ``nonzero``), a batch size the module's code fixes
(``x.view(8, -1)``), an in-place update of an input or a parameter, ops that
are not ATen overloads (higher-order ops such as ``torch.cond``, custom ops),
and dtypes or arguments the program format has no words for.
"""

import torch

from ...errors import ProgramError
from ...program.builder import program_guard
from ...program.desc import Program, grad_var_name
from .capture import capture_joint, check_inputs
from .lower import LOSS_NAME, Lowering

__all__ = ["from_torch", "LOSS_NAME"]


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
    inputs = check_inputs(module, example_inputs, loss_fn, unbatched)
    batched = [n for n in inputs if n not in set(unbatched)]
    joint = capture_joint(module, inputs, loss_fn, batched)
    main, startup = Program(random_seed), Program(random_seed)
    lowering = Lowering(joint, inputs, main, startup)
    lowering.run()
    if optimizer is not None:
        block = main.global_block()
        pairs = [(block.var(p), block.var(grad_var_name(p))) for p in lowering.param_order
                 if block.has_var(grad_var_name(p))]
        if not pairs:
            raise ProgramError(f"from_torch: no parameter of {type(module).__name__} gets a "
                               "gradient from the loss, so there is nothing to optimize")
        with program_guard(main, startup):
            optimizer.apply_gradients(pairs, startup)
    if validate:
        main.validate()
        startup.validate()
    return main, startup, LOSS_NAME
