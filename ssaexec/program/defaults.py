"""What a tool assumes about a program file that does not say: its loss and initial values.

A program file holds one program: the ops of a training step. To run it, a tool
(``ssaexec run``/``trace``, scripts) also needs a loss var to fetch and initial
values for the persistable vars. This module holds that policy, in one place:

* ``loss_var(program)``: the var whose gradient the ``loss``-role op seeds;
* ``find_startup(path)``: the startup program stored next to a program file,
  ``STEM.startup.EXT`` (the same suffix first, then the other forms);
* ``default_startup(main, startup)``: a startup program that also initialises
  every persistable var ``startup`` leaves unset, by documented rules;
* ``startup_for(main, ...)``: the three together, as the command line uses them
  (an explicit startup file, else the one found next to the program, plus defaults).

Program-level: it reads and builds ``Program`` objects only (no graph, no runtime).
"""

import copy
from pathlib import Path

from .desc import GRAD_SUFFIX, Program
from .initializer import Constant, Xavier
from .io import FORMATS, load_program

__all__ = ["loss_var", "find_startup", "default_startup", "startup_for"]


def loss_var(program):
    """The loss var: the one whose gradient the ``loss``-role op seeds, or None."""
    for op in program.global_block().ops:
        if op.role == "loss":
            for name in op.output_names():
                if name.endswith(GRAD_SUFFIX):
                    return name[: -len(GRAD_SUFFIX)]
    return None


def find_startup(program_path):
    """``STEM.startup.EXT`` next to ``program_path`` (same suffix first), or None."""
    path = Path(program_path)
    if path.stem.endswith(".startup"):
        return None
    suffixes = [path.suffix.lower()] + [s for s in FORMATS if s != path.suffix.lower()]
    for suffix in suffixes:
        cand = path.with_name(path.stem + ".startup" + suffix)
        if cand.is_file():
            return cand
    return None


def _readers(program):
    """name -> [(op, slot)] for every input slot of block 0 that reads it (for an imported
    ATen op, the slot is the schema argument that names the input: ``weight``,
    ``running_var`` ...)."""
    out = {}
    for op in program.global_block().ops:
        args = {v: k for k, v in op.attrs.items() if isinstance(v, str) and v.startswith("X[")}
        for slot, names in op.inputs.items():
            for k, n in enumerate(names):
                out.setdefault(n, []).append((op, args.get(f"X[{k}]", slot)))
    return out


# norm layers whose scale and running variance start at one
_NORMS = ("batch_norm", "layer_norm", "group_norm", "instance_norm")


def _initializer(var, readers, learning_rate):
    """The default initialiser of persistable ``var`` (rules in ``default_startup``)."""
    for op, slot in readers:
        if slot == "LearningRate":
            return Constant(learning_rate)
        if slot in ("Beta1Pow", "Beta2Pow"):
            key = "beta1" if slot == "Beta1Pow" else "beta2"
            return Constant(op.attrs.get(key, 0.9 if key == "beta1" else 0.999))
        if any(norm in op.type for norm in _NORMS) and \
                slot in ("Scale", "Variance", "weight", "running_var"):
            return Constant(1.0)
    return Xavier() if var.is_parameter and len(var.shape) >= 2 else Constant(0.0)


def default_startup(main, startup=None, learning_rate=0.01):
    """A startup program that also initialises what ``startup`` leaves unset.

    Every persistable var of ``main`` with a known shape that ``startup`` (if
    given) does not write gets one op, by the first rule that applies:

    * read as ``LearningRate`` by an op: the constant ``learning_rate``;
    * read as ``Beta1Pow``/``Beta2Pow`` (Adam): that op's ``beta1``/``beta2``;
    * the scale or running variance of a norm layer (``batch_norm``/``layer_norm``
      ``Scale``/``Variance``, an imported ATen norm's ``weight``/``running_var``): ones;
    * a parameter with two or more dims: Xavier uniform (fan-in/out as in
      ``se.initializer.Xavier``: [in, out] for fc weights, OIHW for conv);
    * anything else (biases, momenta, running means): zeros.

    Returns ``(program, names)``: a copy of ``startup`` (or a new program) with
    the added ops, and the names it added.
    """
    prog = startup.clone() if startup is not None else Program(main.random_seed)
    written = {n for op in prog.global_block().ops for n in op.output_names()}
    readers = _readers(main)
    block = prog.global_block()
    added = []
    for var in main.global_block().vars.values():
        if not var.persistable or var.is_data or var.name in written or var.shape is None:
            continue
        if any(d < 0 for d in var.shape):
            continue
        if block.find_var(var.name) is None:
            block.add_var(copy.copy(var))
        init = _initializer(var, readers.get(var.name, ()), learning_rate)
        init.init(block.var(var.name), prog)
        added.append(var.name)
    return prog, added


def startup_for(main, program_path=None, startup_path=None, search=True, learning_rate=0.01,
                load=load_program):
    """The startup program to run before ``main``: ``(program, path, names defaulted)``.

    It is ``startup_path`` when given, else (with ``search``) the file
    ``find_startup(program_path)`` finds, else none; ``default_startup`` then
    initialises whatever it leaves unset. ``path`` is the file used, or None.
    ``load(path)`` reads the file (the command line passes its validating loader).
    """
    path = startup_path
    if path is None and search and program_path is not None:
        path = find_startup(program_path)
    startup = load(path) if path is not None else None
    prog, added = default_startup(main, startup, learning_rate)
    return prog, path, added
