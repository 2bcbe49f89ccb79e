"""The text form of a program, printed: ``program_to_text`` (what ``print(program)`` shows).

The grammar, the invariants and the parser are in ``ssaexec.program.text``, which
re-exports ``program_to_text``. The printer only reads a program, so it imports no
``ProgramDesc`` and ``ProgramDesc.__str__`` uses it without an import cycle; the parser,
which builds programs, sits above ``ssaexec.program.desc``.

Invariants: a name prints bare when it is a ``WORD`` and no keyword, else as a JSON
string; floats print with ``repr`` (bit-exact, and always with ``.``, ``e``, ``inf`` or
``nan``, so ints and floats stay distinct); forward is the role left unsaid.
"""

import json
import re

from ..core.errors import ProgramError
from .elements import BlockRef
from .json_write import VERSION

__all__ = ["MAGIC", "KEYWORDS", "VAR_FLAGS", "WORD", "program_to_text"]

MAGIC = "ssaexec-program"
# names that would be misread at the start of a statement (or look like one)
KEYWORDS = frozenset({"var", "block", "names"})
# (VarDesc field, its flag word)
VAR_FLAGS = (("persistable", "persistable"), ("is_parameter", "parameter"),
             ("is_data", "data"), ("stop_gradient", "stop_gradient"))

# A word may contain '-' but not start '->' inside it, so 'a->b' lexes as a, ->, b.
WORD = r"(?:[A-Za-z0-9_.@/+]|-(?!>))+"
_BARE = re.compile(WORD + r"\Z")


def program_to_text(program):
    """Return the text form of ``program`` (ends with a newline).

    Parameters
    ----------
    program : ProgramDesc

    Returns
    -------
    str
        Text that ``program_from_text`` reads back to an equal program.
    """
    lines = [f"{MAGIC} v{VERSION} random_seed={program.random_seed}"]
    if program.name_counts:
        lines.append("names " + " ".join(f"{_name(k)}={int(v)}"
                                         for k, v in program.name_counts.items()))
    for block in program.blocks:
        lines.append("")
        lines.append(f"block {block.idx} parent={block.parent_idx} {{")
        lines += ["  " + _var_text(v) for v in block.vars.values()]
        lines += ["  " + _op_text(op) for op in block.ops]
        lines.append("}")
    return "\n".join(lines) + "\n"


def _name(name):
    if _BARE.match(name) and name not in KEYWORDS:
        return name
    return json.dumps(name, ensure_ascii=False)


def _var_text(var):
    text = f"var {_name(var.name)} : {var.dtype}"
    if var.shape is not None:
        text += "[" + ", ".join(str(d) for d in var.shape) + "]"
    for attr, word in VAR_FLAGS:
        if getattr(var, attr):
            text += " " + word
    return text


def _slots_text(slots):
    parts = []
    for slot, names in slots.items():
        value = _name(names[0]) if len(names) == 1 else \
            "[" + ", ".join(_name(n) for n in names) + "]"
        parts.append(f"{_name(slot)}={value}")
    return ", ".join(parts)


def _op_text(op):
    outs = op.outputs
    if list(outs) == ["Out"] and len(outs["Out"]) == 1:
        text = _name(outs["Out"][0])
    else:
        text = "{" + _slots_text(outs) + "}"
    text += f" = {_name(op.type)}({_slots_text(op.inputs)})"
    if op.attrs:
        text += " {" + ", ".join(f"{_name(k)}={_value(v)}" for k, v in op.attrs.items()) + "}"
    if op.role != "forward":
        text += " @" + op.role
    if op.role_var:
        text += " [" + ", ".join(f"{_name(p)} -> {_name(g)}" for p, g in op.role_var) + "]"
    return text


def _value(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # shortest round-tripping form; 'inf', '-inf', 'nan' included
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, BlockRef):
        return f"block({v.idx})"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise ProgramError(f"attribute value {v!r} of type {type(v).__name__} has no text form")
