"""``OpCall``: one program op bound to its kernel, ready to run against a scope.

Compiled once per (op, place) so the hot path does no registry lookups and no
attribute defaulting: it gathers input tensors by name, calls the kernel and
binds the outputs. Shared by the sequential ``Executor`` and the SSA graph's
computation handles, so both run ops identically. Failures become ``OpError``
naming the op, its index, the place and the input shapes, with the cause chained.

A control op's sub-blocks run through its ``BlockContext``: ``run_block`` here, op
by op; ``run_places`` (``parallel_do``: a sub-block's SSA graph on several places)
through the *block runner* its creator passed in (``runtime.parallel_block.run_places``,
given by the executors). That runner builds graphs and compiled runners, which call
ops through this module, so it is injected from above, never imported here: this
module stays the bottom of the runtime. Without one, ``run_places`` raises.
"""

import torch

from ..core.errors import OpError, ProgramError, SSAExecError
from ..core.limits import _LIMITS, check_result, depth_problem
from ..ops.init import DEVICE_KERNELS
from ..ops.registry import get_op_def
from ..program.desc import EMPTY_VAR
from .rng import needs_step_seed, op_seed, seeded

__all__ = ["OpCall", "BlockContext"]


class BlockContext:
    """What a control op's kernel gets: its ``op``, ``run_block(idx, env)`` and ``run_places``.

    ``scope_of()`` returns the scope the op runs against (looked up per call: a
    compiled runner rebinds its scopes between steps). ``block_runner`` is the
    injected ``run_places(program, idx, envs, places, keep, outer, outer_place)``
    (module docstring), or None.
    """

    __slots__ = ("op", "run_block", "scope_of", "place", "program", "block_runner")

    def __init__(self, op, run_block, scope_of=None, place=None, program=None,
                 block_runner=None):
        self.op = op
        self.run_block = run_block
        self.scope_of = scope_of
        self.place = place
        self.program = program
        self.block_runner = block_runner

    def run_places(self, idx, envs, places, keep):
        """Run block ``idx`` once per place, side by side (the injected block runner).

        ``envs[k]`` holds place ``k``'s own values; other names are read from the
        op's scope. Returns, per place, ``{name: value}`` for the names in ``keep``.
        """
        if self.block_runner is None:
            raise SSAExecError(f"op '{self.op.type}' runs a sub-block on several places, but "
                               "its runner was given no block runner: pass run_places="
                               "ssaexec.runtime.parallel_block.run_places to the runner")
        return self.block_runner(self.program, idx, envs, places, keep, self.scope_of(),
                                 self.place)


class _EnvScope:
    # A scope view for sub-blocks: reads env first, then the outer scope; writes env.
    # ``depth``: how many sub-block runs it is nested in (bounded by max_block_depth).
    # ``fanout``: places running side by side (enclosing parallel_do runs).
    __slots__ = ("env", "outer", "depth", "fanout")

    def __init__(self, env, outer):
        self.env, self.outer = env, outer
        self.depth = getattr(outer, "depth", 0) + 1
        self.fanout = getattr(outer, "fanout", 1)

    def find_var(self, name):
        t = self.env.get(name)
        return t if t is not None else self.outer.find_var(name)

    def set_var(self, name, tensor):
        self.env[name] = tensor


class OpCall:
    """A compiled op: kernel, input/output names per slot and completed attributes.

    ``run_places``: the block runner a control op's ``BlockContext`` gets (module
    docstring); the ops of its sub-blocks get it too.
    """

    __slots__ = ("op", "op_def", "index", "attrs", "in_slots", "out_slots", "wanted", "kernel",
                 "mode", "creates", "program", "device", "label", "step_seeded", "run_places")

    def __init__(self, op, index=None, program=None, device=None, run_places=None):
        self.op = op
        self.op_def = od = get_op_def(op.type)
        self.index = index
        self.attrs = od.full_attrs(op.attrs)
        self.in_slots = tuple((s.name, tuple(op.input(s.name)), s.duplicable)
                              for s in od.inputs if s.name in op.inputs)
        self.out_slots = tuple((s.name, tuple(op.output(s.name)), s.duplicable)
                               for s in od.outputs if s.name in op.outputs)
        self.wanted = {s: [n != EMPTY_VAR for n in names] for s, names, _ in self.out_slots}
        self.kernel = od.kernel_for(program)  # a program file's ATen ops run guarded
        creates = not any(names for _, names, _ in self.in_slots)
        bind = DEVICE_KERNELS.get(op.type) if creates else None
        if od.is_control:
            self.mode = "control"
        elif od.wants_mask:
            self.mode = "grad"
        elif creates and od.overload is not None:
            self.mode = "factory"  # an ATen op with no tensor input: made on ``device``
        else:
            self.mode = "plain"
        if bind is not None:
            # fill_constant, assign_value, assign_bytes: made on the place's device by a
            # kernel bound to this op and place (a constant's device copy is kept there)
            self.kernel = bind(device)
        # another hand-written op with no tensor input (uniform_random ...) builds on the
        # CPU, its kernel taking no device: its results are moved to the place, a
        # host-to-device copy (initialisers: the startup program, run once)
        self.creates = creates and self.mode != "factory" and bind is None
        self.program = program
        self.device = device
        self.label = f"op #{index} '{op.type}'" if index is not None else f"op '{op.type}'"
        self.step_seeded = needs_step_seed(od, op)
        self.run_places = run_places

    def run(self, scope, place=None, step=None, place_idx=0):
        """Run against ``scope`` (anything with find_var/set_var).

        ``step`` and ``place_idx`` seed a random op (``runtime.rng``); without
        ``step`` it draws from torch's global generator.
        """
        if self.step_seeded and step is not None:
            seed = op_seed(self.program.random_seed if self.program is not None else 0,
                           self.index or 0, place_idx, step)
            with seeded(seed, self.device if self.device is not None else "cpu"):
                return self._run(scope, place)
        return self._run(scope, place)

    def _run(self, scope, place):
        ins = {}
        find = scope.find_var
        for slot, names, dup in self.in_slots:
            if dup:
                vals = [find(n) for n in names]
                if None in vals:
                    self._missing(names[vals.index(None)], place)
                ins[slot] = vals
            else:
                v = find(names[0])
                if v is None:
                    self._missing(names[0], place)
                ins[slot] = v
        try:
            if self.mode == "plain":
                outs = self.kernel(ins, self.attrs)
            elif self.mode == "factory":
                outs = self.kernel(ins, self.attrs, self.device)
            elif self.mode == "grad":
                outs = self.kernel(ins, self.attrs, self.wanted)
            else:
                outs = self.kernel(ins, self.attrs, self.context(lambda: scope, place))
        except SSAExecError:
            raise
        except Exception as e:
            raise self.error(e, ins, place) from e
        if not isinstance(outs, dict):
            where = f" on {place}" if place is not None else ""
            raise OpError(f"While executing {self.label}{where}: the kernel returned "
                          f"{type(outs).__name__} instead of its output slots (a dict of slot "
                          "-> tensor)", self.op.type, place)
        setv = scope.set_var
        move = self.creates and self.device is not None and self.device.type != "cpu"
        # sizes no static check bounded (no declared shape, -1 dims a batch-dependent op
        # multiplies) are bounded here, before the value reaches the next op: one numel()
        # per result on the hot path, the message only when over
        limit = _LIMITS["max_tensor_elements"]
        for slot, names, dup in self.out_slots:
            val = outs.get(slot)
            if val is None:
                continue
            for n, v in (zip(names, val, strict=True) if dup else ((names[0], val),)):
                if n == EMPTY_VAR or v is None:
                    continue
                if move:
                    v = v.to(self.device)
                if isinstance(v, torch.Tensor) and v.numel() > limit:
                    check_result(v, n, self.label if place is None else f"{self.label} on {place}")
                setv(n, v)

    def context(self, scope_of, place=None):
        """The ``BlockContext`` of this control op running against ``scope_of()``."""
        return BlockContext(self.op, lambda idx, env: self._run_block(idx, env, scope_of(), place),
                            scope_of, place, self.program, self.run_places)

    def _run_block(self, idx, env, scope, place):
        block = self.program.block(idx)
        view = _EnvScope(env, scope)
        # validation bounds the nesting; this bounds the recursion of programs run
        # without it (each level is a few Python frames)
        problem = depth_problem(view.depth, f"sub-block {idx} of {self.label}")
        if problem:
            raise ProgramError(problem)
        for i, op in enumerate(block.ops):
            OpCall(op, i, self.program, self.device, self.run_places).run(view, place)
        return env

    def _missing(self, name, place):
        where = f" on {place}" if place is not None else ""
        raise OpError(f"While executing {self.label}{where}: input var {name!r} has no value "
                      "(not fed, not initialised by the startup program, or freed)",
                      self.op.type, place)

    def error(self, exc, ins, place):
        """The ``OpError`` for ``exc`` raised by this op's kernel."""
        shapes = {}
        for k, v in ins.items():
            if isinstance(v, torch.Tensor):
                shapes[k] = list(v.shape)
            elif isinstance(v, list):
                shapes[k] = [list(t.shape) if isinstance(t, torch.Tensor) else None for t in v]
        where = f" on {place}" if place is not None else ""
        return OpError(f"While executing {self.label}{where} with input shapes {shapes}: "
                       f"{type(exc).__name__}: {exc}", self.op.type, place, shapes)
