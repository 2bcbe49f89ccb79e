"""``from_torch``: import a ``torch.nn.Module``'s training step as an ssaexec program.

    main, startup, loss = se.from_torch(model, {"x": x, "target": y},
                                        loss_fn=torch.nn.functional.cross_entropy,
                                        optimizer=se.optimizer.SGD(0.1))

and, for evaluation and back to PyTorch:

    test, test_startup, out = se.from_torch(model, {"x": x}, for_test=True)
    se.frontends.torch.write_back(pe, model)     # trained weights and statistics

The steps, one module each:

* ``capture``: torch's own machinery (AOTAutograd's joint export) traces the
  forward *and* the backward into one functional ATen graph on fake tensors; the
  only module that touches torch's private APIs;
* ``decompose``: which ATen ops that trace decomposes (those the operator policy
  refuses, and a few whose fake kernels would fix the batch), and as what;
* ``lower``: every ATen call of that graph becomes an op ``aten.<name>.<overload>``
  run by the generic kernel of ``ssaexec.ops.aten``, built into ``main`` and
  ``startup`` through the ``BlockDesc`` API; the rest of ssaexec sees an ordinary
  program;
* ``locate``: on the error path only, find the module path and source line a
  failure comes from.

and two for after training:

* ``evalmode``: ``to_inference`` switches an imported training program's batch
  norm to its running statistics and its dropout off; registered with
  ``ssaexec.program.desc.register_test_rewrite``, so ``clone(for_test=True)``
  applies it (``inference_program(main)`` is the same as a function);
* ``writeback``: ``write_back(pe, module)`` copies the trained parameters and
  batch-norm statistics from the executor's places into the ``nn.Module``.

Policy (details in each module's docstring):

* Feed vars are the keys of ``example_inputs`` (``target`` too when ``loss_fn``
  is given). Dimension 0 of every input is the batch (-1 in the program, split
  across places) unless the input is named in ``unbatched``; the batch is traced
  symbolically, so sizes that depend on it (a flatten's ``[s0, 512]``) are size
  expressions, and one program runs any batch size. ``dynamic=`` names other
  symbolic dimensions (``{"input_ids": {1: "seq"}}``): one program, any length.
* Model code sees a ``torch.export`` trace (``torch.compiler.is_exporting()``), so
  libraries such as ``transformers`` take their traceable branches; keyword inputs
  are fed by name, and a forward returning a ``dict`` / ``ModelOutput`` trains on
  its ``"loss"`` (``output=`` picks another field, or what ``loss_fn`` reads).
* Parameters and buffers keep their module names and are persistable;
  ``startup`` sets them to the module's current values (``assign_bytes``: base64
  of the raw bytes, about 1.33 bytes per byte of weights in the JSON file). The
  module itself is never changed.
* The loss is ``loss`` (``LOSS_NAME``), each parameter's gradient
  ``<param>@GRAD``; optimizer ops come last (``Optimizer.apply_gradients``).
* ``for_test=True`` (``from_torch_eval``) traces the forward alone with the module
  in eval mode (its ``training`` flags restored after); the result is ``output``
  (``OUTPUT_NAME``), and the program's persistable vars are exactly the module's
  parameters and buffers under the training import's names (graph constants are
  ops of ``main``), so it runs on a training executor's values.

Anything the program cannot express raises ``ProgramError`` naming the
construct and the module path: data-dependent control flow (a Python ``if`` on
a tensor value, ``.item()``, ``nonzero``), a batch size the module's code fixes
(``x.view(8, -1)``), an in-place update of an input or a parameter, ops that
are not ATen overloads (higher-order ops such as ``torch.cond``, custom ops),
and dtypes or arguments the program format has no words for.
"""

import torch

from ...core.errors import ProgramError
from ...dist import world
from ...program.builder import program_guard
from ...program.desc import Program, grad_var_name, register_test_rewrite
from ...runtime.tiered import prestart
from .capture import capture_forward, capture_joint, check_inputs, symbolic_dims
from .evalmode import inference_program, to_inference
from .lower import LOSS_NAME, OUTPUT_NAME, Lowering
from .writeback import write_back

__all__ = ["from_torch", "from_torch_eval", "inference_program", "write_back", "LOSS_NAME",
           "OUTPUT_NAME"]

register_test_rewrite(to_inference)


def from_torch(module, example_inputs, loss_fn=None, optimizer=None, *, output=None,
               dynamic=None, unbatched=(), random_seed=0, validate=True, for_test=False):
    """Capture ``module``'s forward and backward and return a training program
    (``for_test=True``: its eval-mode forward, an evaluation program).

    Parameters
    ----------
    module : torch.nn.Module
        In the mode it should train in (``module.train()``); it is not modified.
        With ``for_test=True`` its mode does not matter: it is traced in eval mode.
    example_inputs : dict of str -> torch.Tensor
        The forward's arguments by name (plus ``target`` with ``loss_fn``). The
        names become the program's feed vars, the tensors fix dtypes and the
        non-batch dimensions. The batch (dimension 0) must be at least 2.
    loss_fn : callable, optional
        ``loss_fn(output, target) -> scalar``. Without it the forward must
        return the scalar loss itself, or a ``dict`` / transformers
        ``ModelOutput`` holding it as ``"loss"`` (the model's own loss, e.g.
        given ``labels``).
    optimizer : ssaexec.optimizer.Optimizer, optional
        Its update ops are appended; without one the program stops at the
        gradients ``<param>@GRAD``.
    output : str, int or callable, optional
        What of the forward's result the loss is (without ``loss_fn``), what
        ``loss_fn`` reads, or (``for_test=True``) what the program returns: a
        key or attribute (``"logits"`` of a ``ModelOutput``), an index, or a
        callable applied to the result.
    dynamic : dict of str -> dict of int -> str, optional
        Dimensions besides the batch that the program keeps symbolic, by name:
        ``{"input_ids": {1: "seq"}, "attention_mask": {1: "seq"}}``. One name
        is one size (dimensions of one name must be equal in every feed); one
        program then runs any such size (at least 2 in the example).
    unbatched : iterable of str
        Inputs without a batch dimension (copied whole to every place).
    random_seed : int
        The programs' ``random_seed``.
    validate : bool
        Run ``main.validate()`` before returning.
    for_test : bool
        Import an evaluation program instead: ``module.eval()`` semantics (batch
        norm normalises with its running statistics and does not update them,
        dropout is off), the forward only; no ``loss_fn``, ``target`` or
        ``optimizer``. Parameters and buffers keep the names the training import
        gives them and are its only persistable vars, so the program runs on a
        training executor's values (``ParallelExecutor(..., share_vars_from=...)``
        or copies through ``pe.get_var``/``pe.set_var``); ``startup`` sets them to
        the module's current values.

    Returns
    -------
    (Program, Program, str)
        ``(main_program, startup_program, loss_name)``; with ``for_test=True``
        ``(main_program, startup_program, output_name)``, where ``output_name``
        is the var holding the forward's result (``"output"``), or a list of
        names (``"output.0"``, ``"output.1"`` ...) when the forward returns a
        tuple or list of several tensors. Fetch it like any var.

    Raises
    ------
    ProgramError
        When the module does something the program cannot express (see the
        module docstring); the message names the construct and the module path.
    """
    if not isinstance(module, torch.nn.Module):
        raise ProgramError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    if for_test:
        if loss_fn is not None or optimizer is not None:
            given = [n for n, v in (("loss_fn", loss_fn), ("optimizer", optimizer))
                     if v is not None]
            raise ProgramError(f"from_torch(for_test=True) imports the forward alone: pass no "
                               f"{' and no '.join(given)} (and no 'target' input); fetch the "
                               "returned output var and compute metrics from it")
        return _import_eval(module, example_inputs, unbatched, random_seed, validate, output,
                            dynamic)
    inputs = check_inputs(module, example_inputs, loss_fn, unbatched)
    # training is coming: the default's compile worker starts beside this import (seconds
    # of its own start off the first steps; runtime.tiered.prestart says where not)
    prestart(world.local_world_size())
    batched = [n for n in inputs if n not in set(unbatched)]
    dims = symbolic_dims(inputs, batched, dynamic)
    joint = capture_joint(module, inputs, loss_fn, dims, output)
    main, startup = Program(random_seed), Program(random_seed)
    # built here from the caller's module: its ATen ops may skip the kernel guards
    main.trusted = startup.trusted = True
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


def from_torch_eval(module, example_inputs, *, output=None, dynamic=None, unbatched=(),
                    random_seed=0, validate=True):
    """``from_torch(module, example_inputs, for_test=True, ...)``: an evaluation program.

    Returns ``(main_program, startup_program, output_name)``; see ``from_torch``.
    """
    return from_torch(module, example_inputs, output=output, dynamic=dynamic,
                      unbatched=unbatched, random_seed=random_seed, validate=validate,
                      for_test=True)


def _import_eval(module, example_inputs, unbatched, random_seed, validate, output, dynamic):
    inputs = check_inputs(module, example_inputs, None, unbatched)
    batched = [n for n in inputs if n not in set(unbatched)]
    dims = symbolic_dims(inputs, batched, dynamic)
    joint = capture_forward(module, inputs, dims, output)
    main, startup = Program(random_seed), Program(random_seed)
    # built here from the caller's module: its ATen ops may skip the kernel guards
    main.trusted = startup.trusted = True
    lowering = Lowering(joint, inputs, main, startup, constants_in_main=True)
    lowering.run()
    if validate:
        main.validate()
        startup.validate()
    names = lowering.output_names
    return main, startup, names[0] if len(names) == 1 else names
