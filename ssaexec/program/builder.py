"""The builder's state: the default main/startup programs and ``program_guard``.

Layers append to the current block of the default main program and put
parameter initialisers in the default startup program. Output vars get
shapes and dtypes from op shape inference, so a built program is fully typed.
Name counters live on the main program, so building the same model twice
yields the same names.

Module state (deliberate, as in Paddle Fluid): ``_main`` and ``_startup`` are one
pair of default programs per process, made at import. Every layer call outside a
``program_guard`` builds into them, so two models built without a guard end up in
the same programs; ``program_guard(main, startup)`` (or ``set_default_programs``)
swaps the pair in and restores the previous one on the way out. The swap is not
thread-local: build programs from one thread at a time.
"""

import contextlib

from ..core.errors import ProgramError
from ..ops.registry import get_op_def, infer_outputs
from .desc import Program

__all__ = ["default_main_program", "default_startup_program", "program_guard", "append_op",
           "create_parameter", "create_persistable", "unique_name", "set_default_programs"]

_main = Program()
_startup = Program()


def default_main_program():
    """The program layers append to."""
    return _main


def default_startup_program():
    """The program initialisers append to."""
    return _startup


def set_default_programs(main, startup):
    """Replace the default programs (returns the previous pair)."""
    global _main, _startup
    prev = (_main, _startup)
    _main, _startup = main, startup
    return prev


@contextlib.contextmanager
def program_guard(main_program, startup_program=None):
    """Within the block, layers build into ``main_program`` and ``startup_program``."""
    if not isinstance(main_program, Program):
        raise ProgramError(f"program_guard expects a Program, got {type(main_program).__name__}")
    prev = set_default_programs(main_program,
                                startup_program if startup_program is not None else _startup)
    try:
        yield
    finally:
        set_default_programs(*prev)


def unique_name(prefix):
    """A fresh name from the main program's counters."""
    return _main.unique_name(prefix)


def _var_names(value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v if isinstance(v, str) else v.name for v in value]
    return [value if isinstance(value, str) else value.name]


def append_op(type, inputs, outputs=None, attrs=None, prefix=None, role="forward",
              stop_gradient=False):
    """Append op ``type`` to the current block, creating typed output vars.

    ``outputs`` maps slot -> var(s) for outputs that already exist; every other
    output slot of the op gets a new temporary named ``<prefix>.tmp_N`` (one per
    entry for duplicable slots: pass an int count in ``outputs``). Returns the
    ``OpDesc`` and a dict slot -> list of ``VarDesc``.
    """
    block = _main.current_block()
    op_def = get_op_def(type)
    ins = {k: _var_names(v) for k, v in inputs.items() if v is not None}
    given = dict(outputs or {})
    prefix = prefix or unique_name(type)
    in_specs = {k: [(block.var(n).shape, block.var(n).dtype) for n in names]
                for k, names in ins.items()}
    out_names = {}
    counts = {}
    for s in op_def.outputs:
        v = given.get(s.name)
        if isinstance(v, int):
            counts[s.name] = v
        elif v is not None:
            out_names[s.name] = _var_names(v)
    # Infer with placeholder outputs first, so new vars get their shapes.
    from .desc import OpDesc
    probe = OpDesc(type, ins, {}, attrs or {})
    try:
        specs = infer_outputs(op_def, probe, in_specs) or {}
    except ProgramError:
        raise
    except Exception as e:
        shapes = {k: [s for s, _ in v] for k, v in in_specs.items()}
        raise ProgramError(f"{type}: cannot infer output shapes from inputs {shapes}: {e}") from e
    for s in op_def.outputs:
        if s.name in out_names:
            continue
        slot_specs = specs.get(s.name) or []
        n = counts.get(s.name, len(slot_specs) if s.duplicable else 1)
        names = []
        for i in range(n):
            spec = slot_specs[i] if i < len(slot_specs) and slot_specs[i] else (None, "float32")
            name = _main.unique_name(prefix + ".tmp")
            block.create_var(name, spec[0], spec[1], stop_gradient=stop_gradient or s.no_grad)
            names.append(name)
        out_names[s.name] = names
    op = block.append_op(type, ins, out_names, attrs or {}, role)
    out_vars = {k: [block.var(n) for n in v] for k, v in out_names.items()}
    return op, out_vars


def create_parameter(name, shape, dtype, initializer, trainable=True):
    """Declare parameter ``name`` in main and startup, initialised by ``initializer``."""
    var = _main.global_block().create_var(name, shape, dtype, persistable=True,
                                          is_parameter=True, stop_gradient=not trainable)
    svar = _startup.global_block().create_var(name, shape, dtype, persistable=True,
                                              is_parameter=True, stop_gradient=not trainable)
    initializer.init(svar, _startup)
    return var


def create_persistable(name, shape, dtype, initializer):
    """Declare a non-trainable persistable var (running stats, optimizer state)."""
    var = _main.global_block().create_var(name, shape, dtype, persistable=True,
                                          stop_gradient=True)
    svar = _startup.global_block().create_var(name, shape, dtype, persistable=True,
                                              stop_gradient=True)
    initializer.init(svar, _startup)
    return var
