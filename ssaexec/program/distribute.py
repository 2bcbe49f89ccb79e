"""PlaceableBlock, DistributedBlock and the parameter-server transpile (seed 002).

The user marks the optimizer as a block that may run elsewhere::

    params_grads = se.append_backward(loss)
    with se.layers.PlaceableBlock(inputs=params_grads, outputs=[w, b]):
        se.optimizer.SGD(learning_rate=0.01).apply_gradients(params_grads)

which appends one ``placeable_block`` op owning the block; run as it is, the program
trains as before (the op runs its block in place). ``se.transpile(program,
trainers=T, pservers=P)`` then works on blocks, not ops: the *dependency analysis*
(``dependencies``) finds what the placeable block reads that the rest of block 0
writes (the gradients: sent) and what it writes that block 0 reads (the
parameters: received back), and the program is split into

* the **trainer program**: block 0 with the ``placeable_block`` op replaced, where it
  stood, by ``split`` ops for the gradients of split parameters, one ``send`` op per
  server (its gradient pieces), one ``recv`` op per server (its parameter pieces)
  and ``concat`` ops rebuilding split parameters; the optimizer block is gone;
* **P parameter-server programs**: each holds a *DistributedBlock*, a copy of the
  placeable block with the update ops of the parameter pieces the server owns
  (renamed ``NAME.blockK``), and every op of the block that belongs to no one
  parameter (a learning-rate schedule, the step counter, with their sub-blocks),
  which each server runs for itself; a ``listen_and_serv`` op in block 0 runs it
  for the trainers (``ops.remote``).

Placement. A parameter of at least ``split_threshold`` elements (and at least P
rows) is split along dim 0 into P pieces, piece K on server K, with the optimizer
state of its shape split alike and the rest (Adam's beta powers) copied per piece.
Smaller parameters stay whole and go round-robin, largest first. Both kinds of
updates are elementwise, so a piece's update is exactly that slice of the whole.

Sparse gradients (an embedding's, ``ops.sparse``) travel as rows: the trainer cuts
them by rows like any gradient, ``send`` posts each piece's row count, rows and
values, and a server gathers the trainers' rows (``listen_and_serv``'s ``sparse``)
and updates only those rows.

Startup programs. The trainers' is the original one, without the optimizer state
they no longer need; a server's initialises the full vars it holds a piece of (the
initialisers carry their seeds, so every process draws the same values) and keeps
its piece (``split``/``assign``). Process ranks: trainers ``0..T-1``, servers
``T..T+P-1``.
"""

import copy
import json
import os

from ..core.errors import ProgramError
from ..ops.parallel_do import split_sizes
from .blocks import SubBlockBuilder, copy_op, outer_io, prune_blocks
from .desc import EMPTY_VAR, BlockRef, Program

__all__ = ["PlaceableBlock", "dependencies", "DistributeTranspiler", "DistributedPrograms",
           "transpile"]

MODES = ("sync", "async")


def _names(values):
    out = []
    for v in values or ():
        if isinstance(v, (list, tuple)):
            out.extend(_names(v))
        else:
            out.append(v if isinstance(v, str) else v.name)
    return list(dict.fromkeys(out))


class PlaceableBlock(SubBlockBuilder):
    """Mark the ops appended inside the ``with`` as a block that may run elsewhere.

    Parameters
    ----------
    inputs, outputs : list of VarDesc, str or (param, grad) pairs, optional
        What the block is meant to read and write (the seed's ``input``/``output``);
        checked against what it does, and kept as the op's ``inputs``/``outputs``
        attributes. The op's slots hold the full analysis (``program.blocks.outer_io``).
    """

    kind = "placeable_block"

    def __init__(self, inputs=None, outputs=None, name=None):
        super().__init__(name)
        self.inputs, self.outputs = _names(inputs), _names(outputs)

    def block_guard(self):
        """``with pb.block_guard():``, the seed's ``with remote_block.block():``."""
        return self

    def _append_op(self):
        reads, writes = outer_io(self.program, self.block)
        for kind, declared, actual in (("reads", self.inputs, set(reads) | set(writes)),
                                       ("writes", self.outputs, set(writes))):
            extra = [n for n in declared if n not in actual]
            if extra:
                raise ProgramError(f"{self.name}: declared to {kind[:-1]} {extra[0]!r}, but "
                                   f"the block never {kind} it")
        self.op = self._parent.append_op(
            "placeable_block", {"X": reads}, {"Out": writes},
            {"sub_block": BlockRef(self.block.idx), "inputs": self.inputs,
             "outputs": self.outputs}, role="optimize")


# --- the dependency analysis ----------------------------------------------------------------
def _op_io(program, op):
    reads = [n for n in op.input_names() if n != EMPTY_VAR]
    writes = list(op.output_names())
    for sub in op.sub_blocks():
        r, w = outer_io(program, program.block(sub))
        reads += r
        writes += w
    return reads, writes


def _placeable(program):
    ops = [op for op in program.global_block().ops if op.type == "placeable_block"]
    if len(ops) != 1:
        raise ProgramError(f"transpile needs exactly one PlaceableBlock in block 0 (the "
                           f"optimizer, se.layers.PlaceableBlock), found {len(ops)}")
    return ops[0]


def dependencies(program):
    """The seed's table: per block, what it reads from and writes to the other.

    Returns
    -------
    list of dict
        ``{"block": idx, "inputs": [...], "outputs": [...]}`` for block 0 (without
        the placeable block) and for the placeable block.
    """
    pop = _placeable(program)
    b_reads, b_writes = outer_io(program, program.block(pop.attrs["sub_block"].idx))
    r0, w0 = [], []
    for op in program.global_block().ops:
        if op is not pop:
            r, w = _op_io(program, op)
            r0 += r
            w0 += w
    r0, w0 = set(r0), set(w0)
    return [{"block": 0, "inputs": [n for n in b_writes if n in r0],
             "outputs": [n for n in b_reads if n in w0]},
            {"block": pop.attrs["sub_block"].idx, "inputs": [n for n in b_reads if n in w0],
             "outputs": [n for n in b_writes if n in r0]}]


# --- placement --------------------------------------------------------------------------------
class _Piece:
    __slots__ = ("unit", "index", "server", "rename", "rows")

    def __init__(self, unit, index, server, rename, rows):
        self.unit, self.index, self.server = unit, index, server
        self.rename, self.rows = rename, rows

    def name(self, n):
        return self.rename.get(n, n)


class _Unit:
    """One parameter: its gradient, its update ops, its own optimizer state, its pieces."""

    __slots__ = ("param", "grad", "ops", "state", "pieces", "sections")

    def __init__(self, param, grad):
        self.param, self.grad = param, grad
        self.ops, self.state, self.pieces, self.sections = [], [], [], None


def _touched(op):
    return [n for n in op.input_names() + op.output_names() if n != EMPTY_VAR]


def _units(program, block):
    """(units by parameter, shared op indices) of the placeable ``block``."""
    units, owner, shared = {}, {}, []
    for i, op in enumerate(block.ops):
        if op.role_var and not op.sub_blocks():
            p, g = op.role_var[0]
            unit = units.setdefault(p, _Unit(p, g))
            unit.ops.append(i)
            owner[i] = unit
        else:
            shared.append(i)
    uses = {}
    for i, op in enumerate(block.ops):
        for n in _touched(op):
            uses.setdefault(n, set()).add(owner[i].param if i in owner else "@shared")
    for unit in units.values():
        mine = {n for i in unit.ops for n in _touched(block.ops[i])}
        for n in (unit.param, unit.grad):
            if uses.get(n, set()) - {unit.param}:
                raise ProgramError(f"transpile: {n!r} is used by the update of another "
                                   "parameter or by a shared op of the placeable block; each "
                                   "parameter's update must be its own")
        unit.state = [n for n in dict.fromkeys(
            n for i in unit.ops for n in _touched(block.ops[i]))
            if n not in (unit.param, unit.grad) and uses[n] == {unit.param}
            and n in mine and block.find_var(n) is not None and n not in block.vars]
    return units, shared


def _place(program, units, pservers, split_threshold):
    g0 = program.global_block()
    whole = []
    for unit in units.values():
        var = g0.var(unit.param)
        if var.shape and var.numel >= split_threshold and var.shape[0] >= pservers > 1:
            unit.sections = split_sizes(var.shape[0], pservers)
            for k in range(pservers):
                rename = {unit.param: f"{unit.param}.block{k}", unit.grad: f"{unit.grad}.block{k}"}
                for s in unit.state:
                    rename[s] = f"{s}.block{k}"
                unit.pieces.append(_Piece(unit, k, k, rename, unit.sections[k]))
        else:
            whole.append(unit)
    # round-robin by size, largest first
    whole.sort(key=lambda u: -(g0.var(u.param).numel or 0))
    for i, unit in enumerate(whole):
        unit.pieces.append(_Piece(unit, None, i % pservers, {}, None))


class DistributedPrograms:
    """What ``transpile`` makes: the trainer's and every server's programs (module docstring).

    ``trainer``/``trainer_startup`` run on ranks ``0..T-1``; ``trainer_exit`` (one
    ``send(stop=True)`` per server) tells the servers a trainer is done;
    ``pservers[k]``/``pserver_startups[k]`` run on rank ``T + k``.
    """

    __slots__ = ("trainers", "mode", "trainer", "trainer_startup", "trainer_exit", "pservers",
                 "pserver_startups", "placement", "table")

    def __init__(self, trainers, mode):
        self.trainers, self.mode = trainers, mode
        self.trainer = self.trainer_startup = self.trainer_exit = None
        self.pservers, self.pserver_startups = [], []
        self.placement = {}  # server -> [(param piece, rows or None)]
        self.table = []

    @property
    def world_size(self):
        return self.trainers + len(self.pservers)

    def role(self, rank):
        """``("trainer", i)`` or ``("pserver", k)`` of process ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ProgramError(f"rank {rank} is not in the layout of {self.trainers} trainers "
                               f"and {len(self.pservers)} servers")
        return ("trainer", rank) if rank < self.trainers else ("pserver", rank - self.trainers)

    def programs(self, rank):
        """(main, startup) of process ``rank``."""
        role, i = self.role(rank)
        if role == "trainer":
            return self.trainer, self.trainer_startup
        return self.pservers[i], self.pserver_startups[i]

    def files(self):
        """{file stem: program}: every program, as ``save`` names them."""
        out = {"trainer": self.trainer, "trainer.startup": self.trainer_startup,
               "trainer.exit": self.trainer_exit}
        for k, (main, startup) in enumerate(zip(self.pservers, self.pserver_startups,
                                                strict=True)):
            out[f"pserver{k}"] = main
            out[f"pserver{k}.startup"] = startup
        return out

    def save(self, directory, suffix=".json"):
        """Write every program (``trainer.json``, ``pserver0.json``, ``*.startup.json``,
        ``trainer.exit.json``) and ``layout.json`` into ``directory``; return the paths."""
        from .io import save_program
        os.makedirs(directory, exist_ok=True)
        paths = []
        for stem, prog in self.files().items():
            path = os.path.join(directory, stem + suffix)
            save_program(prog, path)
            paths.append(path)
        path = os.path.join(directory, "layout.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.layout(), f, indent=1)
        return paths + [path]

    def layout(self):
        """Ranks, roles, mode, placement and the dependency table, as plain data."""
        return {"trainers": self.trainers, "pservers": len(self.pservers), "mode": self.mode,
                "ranks": {r: "%s%d" % self.role(r) for r in range(self.world_size)},
                "placement": {f"pserver{k}": [{"var": n, "rows": rows} for n, rows in v]
                              for k, v in self.placement.items()},
                "dependencies": self.table}

    def __repr__(self):
        return (f"<DistributedPrograms trainers={self.trainers} pservers={len(self.pservers)} "
                f"mode={self.mode}>")


class DistributeTranspiler:
    """Split a program with a PlaceableBlock into trainer and parameter-server programs.

    Parameters
    ----------
    trainers, pservers : int
        Number of trainer and server processes.
    mode : {"sync", "async"}
        ``sync``: a barrier per step, the servers average the trainers' gradients
        (numerically data parallelism); ``async``: each trainer's gradient is applied
        as it arrives.
    split_threshold : int
        Parameters of at least this many elements are split across the servers.
    timeout : float
        Seconds any exchange may wait before the peer is reported dead or stuck.
    """

    def __init__(self, trainers, pservers, mode="sync", split_threshold=8192, timeout=60.0):
        if trainers < 1 or pservers < 1:
            raise ProgramError(f"transpile needs trainers >= 1 and pservers >= 1, got "
                               f"{trainers} and {pservers}")
        if mode not in MODES:
            raise ProgramError(f"transpile mode must be one of {MODES}, got {mode!r}")
        self.trainers, self.pservers, self.mode = int(trainers), int(pservers), mode
        self.split_threshold, self.timeout = int(split_threshold), float(timeout)
        self._sparse = set()

    def transpile(self, program, startup=None):
        """Return the ``DistributedPrograms`` of ``program`` (and its ``startup``)."""
        startup = startup if startup is not None else Program(program.random_seed)
        pop = _placeable(program)
        block = program.block(pop.attrs["sub_block"].idx)
        table = dependencies(program)
        units, shared = _units(program, block)
        sent, received = table[1]["inputs"], table[1]["outputs"]
        grads = {u.grad: u for u in units.values()}
        for n in sent:
            if n not in grads:
                raise ProgramError(f"transpile: the placeable block reads {n!r}, which the "
                                   "trainer computes but which is no parameter's gradient; "
                                   "only gradients are sent to the servers")
        for n in received:
            if n not in units:
                raise ProgramError(f"transpile: the placeable block writes {n!r}, which the "
                                   "trainer reads but which is no updated parameter")
        _place(program, units, self.pservers, self.split_threshold)
        self._sparse = _sparse_grads(program)
        order = [u for u in units.values()]
        out = DistributedPrograms(self.trainers, self.mode)
        out.table = table
        for k in range(self.pservers):
            pieces = [p for u in order for p in u.pieces if p.server == k]
            out.placement[k] = [(p.name(p.unit.param), p.rows) for p in pieces]
            main, st = self._server(program, startup, block, shared, pieces)
            out.pservers.append(main)
            out.pserver_startups.append(st)
        out.trainer = self._trainer(program, pop, order)
        out.trainer_startup = _prune_startup(startup, out.trainer)
        out.trainer_exit = Program(program.random_seed)
        for k in range(self.pservers):
            out.trainer_exit.global_block().append_op(
                "send", {}, {}, {"peer": self.trainers + k, "timeout": self.timeout,
                                 "stop": True})
        return out

    # --- the trainer ----------------------------------------------------------------------
    def _trainer(self, program, pop, units):
        tp = program.clone()
        g0 = tp.global_block()
        at = next(i for i, op in enumerate(g0.ops) if op.type == "placeable_block")
        ops = []
        for u in units:
            if u.sections:
                for piece in u.pieces:
                    _declare(g0, piece.name(u.grad), g0.var(u.grad), piece.rows)
                ops.append(_op("split", {"X": [u.grad]},
                               {"Out": [p.name(u.grad) for p in u.pieces]},
                               {"sections": list(u.sections), "axis": 0}, "backward"))
        tokens = []
        for k in range(self.pservers):
            pieces = [p for u in units for p in u.pieces if p.server == k]
            if not pieces:
                continue
            tok = g0.create_var(f"@SEND.token.{k}", [], "int64", stop_gradient=True).name
            tokens.append(tok)
            rows = [j for j, p in enumerate(pieces) if p.unit.grad in self._sparse]
            ops.append(_op("send", {"X": [p.name(p.unit.grad) for p in pieces]},
                           {"Token": [tok]}, {"peer": self.trainers + k,
                                              "timeout": self.timeout, "sparse": rows},
                           "optimize"))
        for k in range(self.pservers):
            pieces = [p for u in units for p in u.pieces if p.server == k]
            if not pieces:
                continue
            names, shapes, dtypes = [], [], []
            for p in pieces:
                var = g0.var(p.unit.param)
                name = p.name(p.unit.param)
                if p.rows is not None:
                    _declare(g0, name, var, p.rows, persistable=False)
                names.append(name)
                shapes.append(_shape(var, p.rows))
                dtypes.append(var.dtype)
            ops.append(_op("recv", {"Token": tokens}, {"Out": names},
                           {"peer": self.trainers + k, "timeout": self.timeout,
                            "shapes": shapes, "dtypes": dtypes}, "optimize"))
        for u in units:
            if u.sections:
                ops.append(_op("concat", {"X": [p.name(u.param) for p in u.pieces]},
                               {"Out": [u.param]}, {"axis": 0}, "optimize"))
        g0.replace_op(g0.ops[at], ops)
        prune_blocks(tp)
        _drop_unused_vars(tp)
        return tp

    # --- a server ---------------------------------------------------------------------------
    def _server(self, program, startup, block, shared, pieces):
        g_src = program.global_block()
        prog = Program(program.random_seed)
        g0 = prog.global_block()
        sub = prog.create_block(parent_idx=0)  # the DistributedBlock
        mine = {}
        for p in pieces:
            for i in p.unit.ops:
                mine.setdefault(i, []).append(p)
        shared = set(shared)
        with prog.switch_block(sub.idx):  # copy_op nests sub-blocks under it
            for i, op in enumerate(block.ops):
                if i in shared:
                    sub.add_op(copy_op(op, prog, program))
                for p in mine.get(i, ()):
                    sub.add_op(copy_op(op, prog, program, p.rename))
        for p in pieces:
            u = p.unit
            _declare(sub, p.name(u.grad), g_src.var(u.grad), p.rows, is_data=True)
            _declare(g0, p.name(u.param), g_src.var(u.param), p.rows)
            for s in u.state:
                var = g_src.var(s)
                same = p.rows is not None and var.shape == g_src.var(u.param).shape
                _declare(g0, p.name(s), var, p.rows if same else None)
        reads, writes = outer_io(prog, sub)
        for n in reads + writes:
            if g0.find_var(n) is None:
                g0.add_var(copy.copy(g_src.var(n)))
        g0.append_op("listen_and_serv", {"X": reads}, {"Out": writes},
                     {"sub_block": BlockRef(sub.idx),
                      "grads": [p.name(p.unit.grad) for p in pieces],
                      "params": [p.name(p.unit.param) for p in pieces],
                      "trainers": list(range(self.trainers)), "mode": self.mode,
                      "fan_in": self.trainers if self.mode == "sync" else 1,
                      "timeout": self.timeout,
                      "sparse": [p.name(p.unit.grad) for p in pieces
                                 if p.unit.grad in self._sparse]}, role="optimize")
        return prog, _server_startup(startup, prog, pieces, g_src)


def _sparse_grads(program):
    """Gradients block 0 makes sparse (``ops.sparse``): they travel as rows."""
    out = set()
    for op in program.global_block().ops:
        if op.role == "backward" and (op.attrs.get("is_sparse") is True or (
                op.type == "sum" and set(op.input_names()) <= out)):
            out.update(op.output_names())
    return out


def _op(type, inputs, outputs, attrs, role):
    from .desc import OpDesc
    return OpDesc(type, inputs, outputs, attrs, role)


def _shape(var, rows):
    return list(var.shape) if rows is None else [rows] + list(var.shape[1:])


def _declare(block, name, like, rows, persistable=None, is_data=False):
    var = copy.copy(like)
    var.name = name
    var.shape = _shape(like, rows)
    if persistable is not None:
        var.persistable = persistable
        var.is_parameter = var.is_parameter and persistable
    if is_data:
        var.is_data, var.persistable, var.is_parameter, var.stop_gradient = True, False, False, True
    if name not in block.vars:
        block.add_var(var)
    return var


def _writers(startup, names):
    g = startup.global_block()
    return [op for op in g.ops if set(op.output_names()) & set(names)]


def _server_startup(startup, prog, pieces, g_src):
    """The startup of a server: the full vars it holds pieces of, initialised as in the
    original startup (same seeds, same values), then cut to its pieces."""
    st = Program(startup.random_seed)
    sg = st.global_block()
    src = startup.global_block()
    cut = {}  # full name -> [(piece name, rows or None, index)]
    for p in pieces:
        u = p.unit
        for n in [u.param] + u.state:
            same = p.rows is not None and g_src.var(n).shape == g_src.var(u.param).shape
            cut.setdefault(n, []).append((p.name(n), p.rows if same else None,
                                          p.index if same else None, u.sections))
    whole = [n for n, v in prog.global_block().vars.items()
             if v.persistable and n not in {pn for lst in cut.values() for pn, *_ in lst}]
    needed = list(cut) + whole
    for op in _writers(startup, needed):
        sg.add_op(copy.deepcopy(op))
        for n in op.output_names():
            if n not in sg.vars and src.find_var(n) is not None:
                var = copy.copy(src.var(n))
                if n in cut and any(pn != n for pn, *_ in cut[n]):
                    var.persistable = False  # only the pieces are kept
                sg.add_var(var)
    for n, lst in cut.items():
        full = src.find_var(n) or g_src.var(n)
        for piece, rows, index, sections in lst:
            if piece == n:
                continue
            _declare(sg, piece, full, rows)
            if rows is None:
                sg.append_op("assign", {"X": [n]}, {"Out": [piece]})
            else:
                outs = [EMPTY_VAR] * len(sections)
                outs[index] = piece
                sg.append_op("split", {"X": [n]}, {"Out": outs},
                             {"sections": list(sections), "axis": 0})
    return st


def _prune_startup(startup, main):
    """``startup`` without the ops that initialise vars ``main`` never reads."""
    st = startup.clone()
    used = {n for b in main.blocks for op in b.ops for n in op.input_names()}
    g = st.global_block()
    g.ops = [op for op in g.ops if set(op.output_names()) & used]
    for n in [n for n in g.vars if n not in used]:
        g.remove_var(n)
    return st


def _drop_unused_vars(program):
    used = {n for b in program.blocks for op in b.ops
            for n in op.input_names() + op.output_names()}
    g = program.global_block()
    for n in [n for n, v in g.vars.items() if n not in used and not v.is_data]:
        g.remove_var(n)


def transpile(program, trainers, pservers, startup=None, mode="sync", split_threshold=8192,
              timeout=60.0):
    """Split ``program`` for ``trainers`` trainers and ``pservers`` parameter servers.

    See ``DistributeTranspiler``; returns ``DistributedPrograms``.
    """
    return DistributeTranspiler(trainers, pservers, mode, split_threshold,
                                timeout).transpile(program, startup)
