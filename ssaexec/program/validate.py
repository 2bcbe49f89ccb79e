"""Static checks of a program: ``validate_program`` raises ``ProgramError`` on the first problem.

Every message starts ``block B, op I (TYPE): `` (or ``block B: `` for block-level
problems), names the var or slot at fault and ends with a hint. Checks, per op in
program order (a sub-block is checked right after the checks of the op that owns
it, before that op's outputs count as written):

1. the op type is registered;
2. sub-block references (``BlockRef`` attrs) point at an existing block other
   than 0 and the op's own block, whose ``parent_idx`` is the op's block;
3. slots: required ones present, no unknown ones, a non-duplicable slot holds
   exactly one name (an optional slot may also be an empty list: absent);
4. attrs: known names, right types (``registry.check_attr``), required ones set,
   per-dimension lists within ``max_rank`` (``program.bounds``), and the op's own
   rule when it has one (``OpDef.check``: parallel_do's places);
5. every var named by the op is declared in its block or an ancestor;
6. data flow: a read is fine when the var is persistable or data, or was written
   earlier in program order (for a sub-block: earlier in it, or in an ancestor
   block before the owning op). A var that no op anywhere writes is reported as
   "never written", one written only later as "use before definition";
7. a count attribute (``split``'s ``num``, ``aten.unbind`` ...) makes as many
   results as the op names, and no more than the dimension it splits holds
   (``program.bounds``), checked before any kernel runs; then shape/dtype
   inference (``registry.infer_outputs``) succeeds on the declared input shapes
   and agrees with the declared outputs (-1 and unknown shapes match anything);
8. an op of role ``loss`` is the loss-gradient seed: a ``fill_constant``
   writing one ``X@GRAD`` var (the graph builder swaps that op for its seed).

Untrusted programs (docs/security.md): step 1 resolves ``aten.*`` types only
through the operator policy (``ssaexec.ops.policy``), step 4 applies its
attribute rules (and step 5 checks that an ATen op's ``@sym`` entries name
existing input dimensions), declared shapes and inferred outputs must stay within
``max_tensor_elements`` and ``max_rank`` (``ssaexec.core.limits``, -1 counted as 1), blocks may nest
at most ``max_block_depth`` deep (checked first, before any walk over blocks),
and inference runs on meta tensors only: validating never allocates a real tensor.
An op read from a file with lines carries its position (``OpDesc.pos``); its
errors then read ``block B, op I (TYPE) at FILE:LINE:COL: ``.

Cost: linear in the size of the program, however deep or wide the blocks nest
(issue 46: a rank-2000 var once cost 240 s, ``split`` with ``num=2**21`` 66 s; the
rank and count bounds above come before the kernels whose cost they bound):
names are resolved once per op (``_resolve_owners``), the set of written vars is
shared by the whole walk (a sub-block's writes are undone when it ends), and
sub-blocks are walked with an explicit stack, not Python recursion.

``EMPTY_VAR`` (``"@EMPTY@"``) may stand in any slot for "not produced/absent";
such an op skips inference. Writes are tracked per (declaring block, name) so a
sub-block var shadowing a parent var is a different var. A sub-block's writes
to outer vars become visible only through the owning op's outputs, which is
what the executor guarantees. Blocks no op refers to are checked last with
every write of their ancestors visible (lenient: nothing says when they run).
"""

from ..core.errors import ProgramError
from ..core.limits import depth_problem, shape_problem
from ..ops.policy import op_problem
from ..ops.registry import EMPTY_VAR, REQUIRED, check_attr, get_op_def, infer_outputs
from .bounds import count_problem, rank_attr_problem
from .elements import GRAD_SUFFIX

__all__ = ["validate_program"]


def validate_program(program):
    """Check ``program``; raise ``ProgramError`` describing the first problem found.

    Parameters
    ----------
    program : ProgramDesc

    Returns
    -------
    None

    Raises
    ------
    ProgramError
        Naming block index, op index, op type (and ``SOURCE:LINE:COL`` of the op
        when it was read from a file with lines) and the var or slot at fault, with
        a hint.
    """
    depth = _check_block_tree(program)
    _Validator(program, depth).run()


def _check_block_tree(program):
    """The nesting depth of every block; ``ProgramError`` on a bad or too deep block tree."""
    # Parents must come first; that keeps ancestor walks finite before anything else runs,
    # and the depth bound keeps every recursive walk over blocks (here, in the graph
    # builder, in the executors) far from Python's recursion limit.
    depth = []
    for i, block in enumerate(program.blocks):
        if block.idx != i:
            raise ProgramError(f"block {i}: its idx is {block.idx}; hint: blocks must be "
                               "numbered by their position in program.blocks")
        ok = block.parent_idx == -1 if i == 0 else 0 <= block.parent_idx < i
        if not ok:
            want = "-1" if i == 0 else f"an earlier block (0..{i - 1})"
            raise ProgramError(f"block {i}: parent_idx is {block.parent_idx}, expected {want}; "
                               "hint: create sub-blocks with program.create_block(parent_idx)")
        depth.append(0 if i == 0 else depth[block.parent_idx] + 1)
        problem = depth_problem(depth[i], f"block {i}")
        if problem:
            raise ProgramError(problem)
    return depth


def _fmt_specs(in_specs):
    parts = []
    for slot, specs in in_specs.items():
        shown = [f"{list(sh) if sh is not None else '?'} {dt}" for sh, dt in specs]
        parts.append(f"{slot}=" + (shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"))
    return ", ".join(parts) or "no inputs"


def _where(bi, oi, op):
    pos = op.pos
    at = f" at {pos[0]}:{pos[1]}:{pos[2]}" if pos is not None else ""
    return f"block {bi}, op {oi} ({op.type}){at}"


class _Validator:
    """One validation; linear in the size of the program.

    ``owners[b][i]`` maps every var name op ``i`` of block ``b`` names to the block
    declaring it (None: undeclared), resolved once in a walk over the block tree
    with a stack of declarations per name, so no lookup walks the ancestors.
    ``written`` is one set for the whole walk: a sub-block's writes are logged in
    ``undo`` and taken back when it ends, instead of copying the set per sub-block.
    """

    __slots__ = ("program", "depth", "owners", "all_written", "visited", "written", "undo",
                 "lenient", "inferred")

    def __init__(self, program, depth):
        self.program = program
        self.depth = depth
        self.owners = _resolve_owners(program)
        # every (declaring block, name) some op writes, to tell "never written" apart
        self.all_written = set()
        for block, owners in zip(program.blocks, self.owners, strict=True):
            for op, own in zip(block.ops, owners, strict=True):
                for name in op.output_names():
                    if own[name] is not None:
                        self.all_written.add((own[name], name))
        self.visited = set()
        self.written = set()
        self.undo = []
        # blocks no op refers to see every write of their ancestors: owners nested less
        # than ``lenient`` deep count as written (0 while walking from block 0)
        self.lenient = 0
        self.inferred = {}  # see _infer

    def run(self):
        self._walk(0)
        for block in self.program.blocks[1:]:
            if block.idx not in self.visited:
                self.written.clear()
                self.undo.clear()
                self.lenient = self.depth[block.idx]
                self._walk(block.idx)

    def _walk(self, root):
        # an explicit stack of block checks: a sub-block is checked when its owning op
        # yields it, and no Python recursion grows with the nesting
        stack = [self._block(root)]
        while stack:
            sub = next(stack[-1], None)
            if sub is None:
                stack.pop()
            else:
                stack.append(self._block(sub))

    def _is_written(self, key):
        return key in self.written or (
            key[0] is not None and self.depth[key[0]] < self.lenient and key in self.all_written)

    def _var(self, own, name):
        owner = own.get(name)
        return None if owner is None else self.program.blocks[owner].vars[name]

    def _block(self, bi):
        """Check block ``bi`` (a generator: yields the sub-blocks to check in between)."""
        self.visited.add(bi)
        block = self.program.blocks[bi]
        mark = len(self.undo)
        for var in block.vars.values():
            problem = shape_problem(var.shape, f"var {var.name!r}: shape")
            if problem:
                raise ProgramError(f"block {bi}: {problem}")
        for oi, (op, own) in enumerate(zip(block.ops, self.owners[bi], strict=True)):
            where = _where(bi, oi, op)
            op_def = self._op_def(op, where)
            subs = self._sub_blocks(op, bi, where)
            self._slots(op, op_def, where)
            self._role(op, where)
            self._attrs(op, op_def, where)
            self._declared(block, op, own, where)
            self._sym_dims(op, own, where)
            self._reads(op, own, where)
            for sub in subs:
                if sub not in self.visited:
                    yield sub
            self._infer(op, own, op_def, where)
            for name in op.output_names():
                key = (own[name], name)
                if key not in self.written:
                    self.written.add(key)
                    self.undo.append(key)
        # this block's writes are invisible to its parent: take them back
        while len(self.undo) > mark:
            self.written.discard(self.undo.pop())

    # -- 1. op type
    def _op_def(self, op, where):
        try:
            return get_op_def(op.type)
        except ProgramError as e:
            msg = str(e)
            sep = " " if msg.endswith("?") else "; "
            raise ProgramError(f"{where}: {msg}{sep}hint: see "
                               "ssaexec.ops.registry.registered_ops()") from None

    # -- 3b. the 'loss' role: the graph builder replaces that op by its loss-gradient seed,
    # so any other op under it would silently not run
    def _role(self, op, where):
        if op.role != "loss":
            return
        outs = op.output_names()
        if op.type != "fill_constant" or len(outs) != 1 or not outs[0].endswith(GRAD_SUFFIX):
            raise ProgramError(
                f"{where}: role 'loss' marks the loss-gradient seed (a fill_constant writing "
                f"one 'LOSS@GRAD' var), but this op writes {outs}; hint: give it the role of "
                "the pass it belongs to (forward, backward or optimize)")

    # -- 2. sub-blocks
    def _sub_blocks(self, op, bi, where):
        subs = op.sub_blocks()
        n = len(self.program.blocks)
        for idx in subs:
            if not 0 <= idx < n:
                problem = f"refers to block {idx}, but the program has {n} blocks"
            elif idx == 0:
                problem = "refers to block 0 (the global block) as its sub-block"
            elif idx == bi:
                problem = f"refers to its own block {bi} as its sub-block"
            elif self.program.blocks[idx].parent_idx != bi:
                problem = (f"refers to block {idx}, whose parent is block "
                           f"{self.program.blocks[idx].parent_idx}, not block {bi}")
            else:
                continue
            raise ProgramError(f"{where}: {problem}; hint: create the sub-block with "
                               f"program.create_block(parent_idx={bi}) and pass BlockRef(its idx)")
        return subs

    # -- 3. slots
    def _slots(self, op, op_def, where):
        for kind, given, declared in (("input", op.inputs, op_def.inputs),
                                      ("output", op.outputs, op_def.outputs)):
            known = {s.name: s for s in declared}
            for slot in given:
                if slot not in known:
                    raise ProgramError(
                        f"{where}: unknown {kind} slot {slot!r}; hint: {op.type} has {kind} "
                        f"slots {', '.join(known) or 'none'}")
            for s in declared:
                names = given.get(s.name)
                if names is None:
                    if s.optional:
                        continue
                    raise ProgramError(f"{where}: missing required {kind} slot {s.name!r}; "
                                       f"hint: pass {s.name}=<var name>")
                if not s.duplicable and len(names) != 1 and not (s.optional and not names):
                    raise ProgramError(
                        f"{where}: {kind} slot {s.name!r} holds {len(names)} vars {names}, "
                        f"but it takes exactly one; hint: only duplicable slots take lists")

    # -- 4. attrs
    def _attrs(self, op, op_def, where):
        for name, value in op.attrs.items():
            problem = check_attr(op_def, name, value)
            if problem:
                raise ProgramError(f"{where}: {problem}; hint: see the attrs of "
                                   f"get_op_def({op.type!r})")
        bad = op_problem(op.type, op.attrs, op.inputs) or rank_attr_problem(op.attrs)
        if bad is not None:
            raise ProgramError(f"{where}: {bad[1]}")
        for name, (kind, default) in op_def.attrs.items():
            if default is REQUIRED and name not in op.attrs:
                raise ProgramError(f"{where}: missing required attribute {name!r} ({kind}); "
                                   f"hint: pass attrs={{{name!r}: ...}}")
        if op_def.check is not None:
            problem = op_def.check(op_def.full_attrs(op.attrs))
            if problem:
                raise ProgramError(f"{where}: {problem}")

    # -- 5. declarations
    def _declared(self, block, op, own, where):
        for kind, slots in (("input", op.inputs), ("output", op.outputs)):
            for slot, names in slots.items():
                for name in names:
                    if name != EMPTY_VAR and own[name] is None:
                        raise ProgramError(
                            f"{where}: {kind} slot {slot!r} names var {name!r}, which is not "
                            f"declared in block {block.idx} or its ancestors; hint: declare "
                            f"it with block.create_var({name!r}, shape, dtype)")

    def _sym_dims(self, op, own, where):
        # An ATen op's @sym entries [symbol, k, d] read dimension d of input X[k] at run
        # time: it must exist (the form and k were checked with the operator policy).
        binds = op.attrs.get("@sym") if op.type.startswith("aten.") else None
        if not isinstance(binds, list):
            return
        xs = op.inputs.get("X") or []
        for entry in binds:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[1], int)
                    and isinstance(entry[2], int) and 0 <= entry[1] < len(xs)):
                continue
            var = self._var(own, xs[entry[1]])
            if var is not None and var.shape is not None and entry[2] >= len(var.shape):
                raise ProgramError(
                    f"{where}: attribute '@sym' entry {entry} reads dimension {entry[2]} of "
                    f"{xs[entry[1]]!r}, which has {len(var.shape)}; hint: bind each symbol to "
                    "an existing dimension of an input")

    # -- 6. data flow
    def _reads(self, op, own, where):
        for slot, names in op.inputs.items():
            for name in names:
                if name == EMPTY_VAR:
                    continue
                var = self._var(own, name)
                key = (own[name], name)
                if var.persistable or var.is_data or self._is_written(key):
                    continue
                if key not in self.all_written:
                    raise ProgramError(
                        f"{where}: input slot {slot!r} reads var {name!r}, which no op ever "
                        f"writes (never written); hint: mark it is_data=True to feed it, "
                        f"persistable=True to initialise it in a startup program, or add the "
                        f"op that produces it")
                raise ProgramError(
                    f"{where}: input slot {slot!r} reads var {name!r} before any op writes it "
                    f"(use before definition); hint: move this op after the op that "
                    f"produces {name!r}")

    # -- 7. shapes and dtypes
    def _infer(self, op, own, op_def, where):
        in_specs = {}
        for slot, names in op.inputs.items():
            if EMPTY_VAR in names:
                return  # an absent entry in a slot: nothing sound to infer from
            if names:
                in_specs[slot] = [(v.shape, v.dtype) for v in (self._var(own, n) for n in names)]
        # a count attribute bounds the results before any kernel makes them (program.bounds)
        problem = count_problem(op.type, op.attrs,
                                {s: [sh for sh, _ in specs] for s, specs in in_specs.items()},
                                op.outputs)
        if problem:
            raise ProgramError(f"{where}: {problem}")
        # inference depends on the type, the attrs, the input specs and which outputs are
        # wanted, nothing else: a program repeats the same few (its layers), and a meta
        # kernel run costs ~100 us, so each distinct one runs once per validation
        key = (op.type, repr(op.attrs), repr(in_specs),
               tuple((slot, tuple(n != EMPTY_VAR for n in names))
                     for slot, names in op.outputs.items()))
        try:
            result = self.inferred.get(key)
            if result is None:
                result = self.inferred[key] = infer_outputs(op_def, op, in_specs) or {}
        except ProgramError as e:  # the attrs break a rule (a size expression, a limit)
            raise ProgramError(f"{where}: {e}") from None
        except Exception as e:  # any kernel failure on meta tensors is an incompatibility
            attrs = repr(op.attrs)
            attrs = attrs if len(attrs) <= 200 else attrs[:197] + "..."
            raise ProgramError(
                f"{where}: shape inference failed for inputs {_fmt_specs(in_specs)}: "
                f"{type(e).__name__}: {str(e).rstrip('.')}; hint: check the declared input "
                f"shapes and the attrs {attrs} (-1 dims are probed as 5 and 7)") from e
        for slot, specs in result.items():
            names = op.outputs.get(slot, [])
            if specs is None or not names:
                continue
            if len(specs) != len(names):
                raise ProgramError(
                    f"{where}: output slot {slot!r} lists {len(names)} vars {names} but the "
                    f"op produces {len(specs)}; hint: list one var per produced value")
            for name, spec in zip(names, specs, strict=True):
                if spec is not None and spec[0] is not None:
                    problem = shape_problem(spec[0], f"output slot {slot!r} ({name})")
                    if problem:
                        raise ProgramError(f"{where}: {problem}")
                if name != EMPTY_VAR and spec is not None:
                    self._compare(own, slot, name, spec, in_specs, where)

    def _compare(self, own, slot, name, spec, in_specs, where):
        shape, dtype = spec
        var = self._var(own, name)
        if dtype is not None and var.dtype != dtype:
            raise ProgramError(
                f"{where}: output slot {slot!r} var {name!r} is declared {var.dtype} but the op "
                f"produces {dtype} (inputs {_fmt_specs(in_specs)}); hint: declare {name!r} "
                f"with dtype={dtype!r}")
        if shape is None or var.shape is None:
            return
        if len(shape) != len(var.shape) or any(
                a != b and a != -1 and b != -1 for a, b in zip(shape, var.shape, strict=True)):
            raise ProgramError(
                f"{where}: output slot {slot!r} var {name!r} is declared with shape "
                f"{var.shape} but the op produces {list(shape)} (inputs "
                f"{_fmt_specs(in_specs)}); hint: fix the declared shape (-1 matches any size)")


def _resolve_owners(program):
    """Per block, per op: {var name: index of the block declaring it, or None}.

    One walk over the block tree (parents before children, an explicit stack), with
    a stack of declaring blocks per name: the top is the nearest declaration, so
    resolving a name costs O(1) however deep the block sits.
    """
    blocks = program.blocks
    children = [[] for _ in blocks]
    for block in blocks[1:]:
        children[block.parent_idx].append(block.idx)
    owners = [None] * len(blocks)
    declared = {}  # name -> stack of declaring block indices, innermost last
    stack = [(0, True)]
    while stack:
        bi, entering = stack.pop()
        block = blocks[bi]
        if not entering:
            for name in block.vars:
                decl = declared[name]
                decl.pop()
                if not decl:
                    del declared[name]
            continue
        for name in block.vars:
            declared.setdefault(name, []).append(bi)
        per_op = []
        for op in block.ops:
            own = {}
            for names in (*op.inputs.values(), *op.outputs.values()):
                for name in names:
                    decl = declared.get(name)
                    own[name] = decl[-1] if decl else None
            per_op.append(own)
        owners[bi] = per_op
        stack.append((bi, False))
        stack.extend((c, True) for c in reversed(children[bi]))
    return owners
