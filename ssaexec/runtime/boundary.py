"""The run-time boundary: a value that enters a step must match what the program declares.

Policy. Kernels trust the shapes a program declares (a batch norm reads its running
statistics as ``[C]``, a layer norm its weight as the normalised shape; some native
kernels read out of bounds when that is false), and ``validate()`` only checks the
declarations against each other. So every value that comes into a step from outside
the program's own kernels is checked against the declaration (the ``VarDesc``) of the
program being run, before any kernel sees it. The routes, and where each is checked:

==================  ==============================================================
route               checked by (the source the error names)
==================  ==============================================================
feed                ``feed.to_tensor`` ("feed")
startup program     ``ParallelExecutor`` before it broadcasts its persistables
                    ("the startup program", with the op that wrote the value)
parameter file      ``frontends.paddle.from_paddle`` as it decodes one, always
                    against the program it is loaded with ("parameter file PATH")
checkpoint          ``checkpoint.load_checkpoint`` before it writes a scope
                    ("checkpoint PATH")
``set_var``         ``ParallelExecutor.set_var`` ("set_var")
the scope           ``Scope.set_var``, or another program run in the same scope
                    (``Executor.run(startup)`` then ``run(main)``): an executor's
                    ``EntryCheck`` before a step ("the scope")
==================  ==============================================================

The rule (``check_value``), for a var the program declares:

* the value is a dense (strided) ``torch.Tensor``, and on the meta device only where
  the place is (``place.MetaPlace``, a test stand-in);
* its dtype is the declared dtype;
* with a declared shape, its rank is the declared rank and every declared dimension
  other than -1 (a batch, or any size) equals its size;
* at a step, it lies on the device of the place that reads it.

``VarDesc`` declares no finiteness, so values are not checked for NaN or infinity.
A mismatch is a ``FeedError`` for a feed and a ``ProgramError`` otherwise, naming the
var, what the program declares, what the value is and where it came from.

Once per load. The named routes check once, as the values arrive. ``Scope.set_var``
knows no program, so each scope carries a stamp (``Scope.version``, unique across
scopes) that ``set_var`` renews, and every step run in a scope renews it once more
when it ends (``Scope.touch``: its kernels' writes are entering values for *other*
programs). An executor's ``EntryCheck`` records the stamps of its scopes after its
own successful step, and before a step checks the vars its program reads before
writing them (``entering_vars``) only when a stamp differs: a step whose scopes
nobody else wrote compares a few integers and checks nothing. Values a step's own
kernels write are not entering values: validation and the kernel guards answer for
them. Writing ``Scope.vars`` directly bypasses the stamp; it is the runtime's, not an
API.

Cost, and trusted programs. ``bench/boundary_check.py`` times it beside a step, on two
CPU places: a load's check costs about 1-2 us per entering var and place (0.3 to 0.6 ms
for ``small_resnet``'s 167 vars, 0.4-0.6 % of one of its steps; 0.03-0.13 ms for
``from_torch`` and MLP programs, 1-4 % of one step), and a step that finds its stamps
unchanged pays about 1 us. A program ssaexec built in this process
(``ProgramDesc.trusted``) is checked all the same: a load happens once, not per step, so
skipping it would save nothing measurable, and its values can still come from a file.
"""

import torch

from ..core.dtypes import DTYPES
from ..core.errors import FeedError, ProgramError

__all__ = ["check_value", "check_values", "check_movable", "entering_vars", "startup_source", "EntryCheck",
           "FEED", "SCOPE", "SET_VAR"]

FEED = "feed"
SCOPE = "the scope (Scope.set_var, or another program run in it)"
SET_VAR = "set_var"


def _problem(var, value, device, moves):
    """What is wrong with ``value`` for ``var`` (a phrase), or None."""
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    if value.layout is not torch.strided:
        return f"has layout {str(value.layout).replace('torch.', '')}, not a dense tensor"
    if value.dtype is not DTYPES[var.dtype]:
        actual = str(value.dtype).replace("torch.", "")
        return f"has dtype {actual} but the program declares {var.dtype} (shape {var.shape})"
    shape = var.shape
    if shape is not None and (len(shape) != value.dim() or any(
            d >= 0 and d != s for d, s in zip(shape, value.shape))):
        hint = "-1 is any size; " if -1 in shape else ""
        return (f"has shape {list(value.shape)} but the program declares {shape} "
                f"({hint}dtype {var.dtype})")
    return _device_problem(value, device, moves)


def _device_problem(value, device, moves):
    here = value.device
    if moves:  # copied to ``device`` next: anything but meta can be
        if here.type == "meta" and (device is None or device.type != "meta"):
            return "is on the meta device: it holds no values to copy"
    elif device is not None and here != device:
        return f"is on {here} but the program reads it on {device}"
    return None


def _raise(name, problem, source):
    if source == FEED:
        raise FeedError(f"feed {name!r} {problem}")
    raise ProgramError(f"var {name!r} from {source} {problem}")


def check_value(var, value, source, device=None, moves=False):
    """Return ``value`` when it fits ``var`` (module docstring), else raise.

    Parameters
    ----------
    var : VarDesc
        The declaration in the program being run.
    value : object
        What is about to be bound to ``var``.
    source : str
        Where the value came from: ``FEED`` (a ``FeedError``), or a phrase such as
        ``"checkpoint run.safetensors"`` (a ``ProgramError``).
    device : torch.device, optional
        The device of the place that reads it (None: not known here).
    moves : bool
        The caller copies the value to ``device`` next: it may be on any device the
        copy can read (not meta, unless ``device`` is). False: it must be on ``device``.
    """
    problem = _problem(var, value, device, moves)
    if problem is not None:
        _raise(var.name, problem, source)
    return value


def check_movable(name, value, device, source):
    """Raise unless ``value`` can be copied to ``device`` (a feed about to be bound)."""
    problem = _device_problem(value, device, True)
    if problem is not None:
        _raise(name, problem, source)
    return value


def check_values(declared, values, source, device=None, moves=True):
    """``check_value`` of every ``values`` entry (name -> value) that ``declared``
    (name -> VarDesc, or a block's ``vars``) declares; the others are not checked here.
    By default the values are copied to their places next (``moves``)."""
    for name, value in values.items():
        var = declared.get(name)
        if var is not None:
            check_value(var, value, source, device, moves)
    return values


def entering_vars(program):
    """The vars of ``program``'s global block that an op reads before any op writes
    them, in program order: the values a step takes from its scope. A control op reads
    what its sub-blocks read of the outer scope too (a sub-block falls back to it)."""
    block = program.global_block()
    written, seen, out = set(), set(), []
    for op in block.ops:
        for n in _reads(program, op):
            if n not in written and n not in seen:
                seen.add(n)
                var = block.vars.get(n)
                if var is not None:
                    out.append(var)
        written.update(op.output_names())
    return tuple(out)


def _reads(program, op):
    """``op``'s input names, and those its sub-blocks read but do not declare."""
    subs = op.sub_blocks()
    if not subs:
        return op.input_names()
    names = list(op.input_names())
    stack, visited = list(subs), set()
    while stack:  # a loop, not recursion: nesting depth is the program's to choose
        idx = stack.pop()
        if idx in visited or not 0 <= idx < len(program.blocks):
            continue
        visited.add(idx)
        sub = program.blocks[idx]
        for inner in sub.ops:
            names.extend(n for n in inner.input_names() if n not in sub.vars)
            stack.extend(inner.sub_blocks())
    return names


def startup_source(startup, name):
    """The source of ``name``'s value after ``startup`` ran: the op that wrote it last,
    with its file position when it was read from a file."""
    if startup is None:
        return "the scope given to the executor"
    ops = startup.global_block().ops
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if name in op.output_names():
            pos = op.pos
            at = f" at {pos[0]}:{pos[1]}:{pos[2]}" if pos is not None else ""
            return f"the startup program (op #{i} '{op.type}'{at})"
    return "the scope given to the executor (the startup program does not write it)"


def _stamps(scopes):
    out = []
    for scope in scopes:
        while scope is not None:
            out.append(scope.version)
            scope = scope.parent
    return tuple(out)


class EntryCheck:
    """One executor's check of what its steps read from their scopes (module docstring).

    ``before`` checks the entering vars of the step's programs in every scope unless
    no stamp changed since ``after`` recorded them; ``after`` renews the scopes'
    stamps and, for a step that succeeded, records them.
    """

    __slots__ = ("_key", "_vars", "_seen")

    def __init__(self):
        self._key = None    # ((id, version) of each program): what _vars was made from
        self._vars = ()
        self._seen = None   # the scopes' stamps after the last good step (None: check)

    def _entering(self, programs):
        key = tuple((id(p), p._version) for p in programs)
        if key != self._key:
            merged = {}
            for p in programs:
                for var in entering_vars(p):
                    merged.setdefault(var.name, var)
            self._key, self._vars, self._seen = key, tuple(merged.values()), None
        return self._vars

    def before(self, programs, scopes, places, skip=()):
        """Check the values ``programs`` will read in ``scopes`` (one per place), except
        the names in ``skip`` (fed this step: the feed was checked)."""
        entering = self._entering(programs)
        if self._seen is not None and _stamps(scopes) == self._seen:
            return
        for scope, place in zip(scopes, places, strict=True):
            device = place.device
            for var in entering:
                if var.name in skip:
                    continue
                value = scope.find_var(var.name)
                if value is not None:
                    check_value(var, value, SCOPE, device)

    def after(self, scopes, ok):
        """End of a step: renew the stamps; record them when the step succeeded."""
        for scope in scopes:
            scope.touch()
        self._seen = _stamps(scopes) if ok else None

    def trust(self, programs, scopes):
        """Record ``scopes`` as checked for ``programs`` (their values were just checked
        on the way in, as a startup program's are)."""
        self._entering(programs)
        self._seen = _stamps(scopes)
