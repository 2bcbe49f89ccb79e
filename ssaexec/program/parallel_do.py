"""``ParallelDo``: build a ``parallel_do`` op (seed 000), and its backward.

::

    with se.layers.ParallelDo(se.cpu_places(2)) as pd:
        x_ = pd.read_input(x)              # split along the batch, one slice per place
        y_ = pd.read_input(y)
        cost = se.layers.square_error_cost(se.layers.fc(x_, size=1), y_)
        pd.write_output(cost)              # concatenated back in place order
    cost = pd()
    loss = se.layers.mean(cost)            # single-place ops mix with the parallel part

Layers called inside the ``with`` append to a new sub-block of the current block;
their parameters are declared in the global block as usual, so the startup program
initialises one copy that every place reads (``Parameters`` of the op: every outer
name the block reads but does not split). On leaving the ``with``, one
``parallel_do`` op is appended to the outer block. The block may not write outer
names: values leave it through ``write_output`` only (so places never race on a
shared var; layers that update running statistics, such as ``batch_norm``, cannot
be used inside).

Backward. ``append_backward`` makes the ``parallel_do_grad`` op through the generic
grad-op path, then ``make_grad_block`` gives it a sub-block of its own (a child of
the outer block): ``append_grad_ops`` carries each output's gradient (read by its
outer name ``Y@GRAD``, split like the output) back through the forward block's ops
to the op's inputs and parameters. Every parameter's final grad op carries
``role_var``, so the places' SSA graph all-reduces it right where it is made (the
seed's improved version: all-reduce inside ``parallel_do_grad``, the optimizer
outside, parameters never copied back). Forward-block locals the grad block reads
(activations) are declared again in the grad block as fed values (``is_data``:
the op feeds them) and travel from the forward op as ``Saved`` vars, one per
(name, place).

Background prefetch (seed: "prefetch the input onto different devices in a
separate background thread"): ``read_input(x, prefetch=True)`` on a data var
declares one data var per place, ``X@PLACE@K``, which the op passes to place ``K``
as the block's ``X@PLACE`` without splitting or copying; ``se.data.prefetch.PrefetchLoader``
splits each batch and copies the slices to the places' devices in a background thread.
"""

import contextlib
import copy

from ..core.errors import ProgramError
from ..ops.parallel_do import places_attr
from ..core.place import Place, parse_places
from .backward import append_grad_ops, register_block_grad
from .blocks import SubBlockBuilder, outer_io
from .desc import EMPTY_VAR, BlockRef, register_test_rewrite

__all__ = ["ParallelDo", "make_grad_block", "place_input_name"]


def place_input_name(name, k=None):
    """The data var holding place ``k``'s prefetched slice of ``name`` (``X@PLACE@K``), or
    with no ``k`` the name the block reads it by (``X@PLACE``)."""
    return f"{name}@PLACE" if k is None else f"{name}@PLACE@{k}"


def _places(places):
    if isinstance(places, int):
        return parse_places(f"cpu:{places}")
    if isinstance(places, str):
        return parse_places(places)
    places = list(places)
    if not places or not all(isinstance(p, Place) for p in places):
        raise ProgramError(f"ParallelDo needs a non-empty list of places (se.cpu_places(2)), a "
                           f"count or a spec like 'cpu:2', got {places!r}")
    if len(set(places)) != len(places):
        raise ProgramError(f"ParallelDo places must be distinct, got {[str(p) for p in places]}")
    return places


class ParallelDo(SubBlockBuilder):
    """A sub-block run data-parallel over ``places`` (module docstring).

    Parameters
    ----------
    places : list of Place, int or str
        The places (``se.cpu_places(2)``), a number of CPU places, or a spec
        (``"cpu:4"``, ``"cuda:0,1"``).
    name : str, optional
        Prefix of the outer vars' names (default ``parallel_do_N``).
    """

    kind = "parallel_do"

    def __init__(self, places, name=None):
        super().__init__(name)
        self.places = _places(places)
        self.inputs = []
        self.prefetched = {}  # input name -> per-place data var names
        self.outputs = []
        self._outer = []

    @contextlib.contextmanager
    def do(self):
        """``with pd.do():``, the seed's spelling of ``with pd:``."""
        with self:
            yield self

    def _check_inside(self, what):
        if self.block is None or self.op is not None or \
                self.program.current_block() is not self.block:
            raise ProgramError(f"ParallelDo.{what} must be called inside its 'with' block")

    def read_input(self, var, prefetch=False):
        """Split outer var ``var`` along dim 0 over the places; returns the var to use inside.

        With ``prefetch`` (a data var only), the places' slices are fed as the data vars
        ``X@PLACE@K`` (``se.data.prefetch.PrefetchLoader`` makes them in the background).
        """
        self._check_inside("read_input")
        name = var if isinstance(var, str) else var.name
        outer = self._parent.find_var(name)
        if outer is None:
            raise ProgramError(f"ParallelDo.read_input: {name!r} is not declared outside the "
                               "block; read_input takes a var of the enclosing program")
        if not outer.shape:
            raise ProgramError(f"ParallelDo.read_input: {name!r} has shape {outer.shape}; "
                               "only vars with a batch dimension can be split")
        if name in self.inputs:
            return outer
        if name in self.prefetched:
            return self.block.vars[place_input_name(name)]
        if not prefetch:
            self.inputs.append(name)
            return outer
        if not outer.is_data:
            raise ProgramError(f"ParallelDo.read_input(prefetch=True): {name!r} is not a "
                               "data var; only fed inputs can be prefetched")
        gb = self.program.global_block()
        local = place_input_name(name)
        names = []
        for k in range(len(self.places)):
            n = place_input_name(name, k)
            if n not in gb.vars:
                gb.create_var(n, outer.shape, outer.dtype, is_data=True, stop_gradient=True)
            names.append(n)
        self.prefetched[name] = names
        # the block reads its own name, fed by the op with the place's prefetched slice
        return self.block.create_var(local, outer.shape, outer.dtype, is_data=True,
                                     stop_gradient=True)

    def write_output(self, var):
        """Merge ``var`` (made inside the block) over the places: rows concatenated in
        place order, or one row per place for a 0-d var."""
        self._check_inside("write_output")
        name = var if isinstance(var, str) else var.name
        if name not in self.block.vars:
            raise ProgramError(f"ParallelDo.write_output: {name!r} is not made inside the "
                               "block; write_output takes a var computed in it")
        if name not in self.outputs:
            self.outputs.append(name)

    def _append_op(self):
        if not self.outputs:
            raise ProgramError(f"{self.name}: the block writes no output; call "
                               "pd.write_output(var) inside it")
        reads, writes = outer_io(self.program, self.block)
        if writes:
            name = writes[0]
            op_type = next((op.type for b in self.program.blocks[self.block.idx:]
                            for op in b.ops if name in op.output_names()), "?")
            raise ProgramError(f"{self.name}: op {op_type!r} inside the block writes {name!r}, "
                               "which is declared outside it; places would race on it. Only "
                               "write_output brings values out of a parallel_do block")
        split = set(self.inputs) | set(self.prefetched)
        params = [n for n in reads if n not in split]
        for names in self.prefetched.values():
            params.extend(names)
        n = len(self.places)
        stacked, outer = [], []
        for name in self.outputs:
            inner = self.block.vars[name]
            if self._parent.find_var(name) is not None:
                raise ProgramError(f"{self.name}: output {name!r} is already declared outside "
                                   "the block")
            shape = inner.shape
            if shape is not None and len(shape) == 0:
                stacked.append(name)
                shape = [n]
            elif shape is not None and shape[0] >= 0:
                shape = [shape[0] * n] + shape[1:]
            outer.append(self._parent.create_var(name, shape, inner.dtype,
                                                 stop_gradient=inner.stop_gradient))
        attrs = {"sub_block": BlockRef(self.block.idx), "places": places_attr(self.places),
                 "saved": [], "stacked": stacked}
        if self.prefetched:
            attrs["prefetched"] = [place_input_name(x) for x in self.prefetched]
        self.op = self._parent.append_op(
            "parallel_do", {"Inputs": list(self.inputs), "Parameters": params},
            {"Outputs": list(self.outputs)}, attrs)
        self._outer = outer

    def __call__(self):
        """The merged outputs in the outer block: one var, or a list for several."""
        if self.op is None:
            raise ProgramError("ParallelDo(): leave the 'with' block first")
        return self._outer[0] if len(self._outer) == 1 else list(self._outer)


def make_grad_block(block, op, grad_op):
    """Give ``grad_op`` (a ``parallel_do_grad`` just made) its sub-block (module docstring)."""
    program = block.program
    fwd = program.block(op.attrs["sub_block"].idx)
    out_grads = [g for g in grad_op.input("Outputs@GRAD") if g != EMPTY_VAR]
    seeds = [g[: -len("@GRAD")] for g in out_grads]
    _check_seeds(op, fwd, seeds)

    def wanted(slot):
        return [n for n, g in zip(op.input(slot), grad_op.output(slot + "@GRAD"), strict=True)
                if g != EMPTY_VAR]

    params = wanted("Parameters")
    gblock = program.create_block(parent_idx=block.idx)
    append_grad_ops(fwd, gblock, list(fwd.ops), seeds, wanted("Inputs") + params, params)
    reads, _ = outer_io(program, gblock)
    local = [n for n in reads if n in fwd.vars]
    prefetched = set(op.attrs.get("prefetched", ()))  # the grad op gets them as the forward
    saved = [n for n in local if n not in prefetched]
    n = len(op.attrs["places"])
    saved_vars = []
    for name in local:
        var = copy.copy(fwd.vars[name])
        var.is_data, var.stop_gradient = True, True  # fed by the op, per place
        gblock.add_var(var)
    for name in saved:
        var = fwd.vars[name]
        for k in range(n):
            sname = f"{name}@SAVED@{k}"
            block.create_var(sname, var.shape, var.dtype, stop_gradient=True)
            saved_vars.append(sname)
    block.set_attr(op, "saved", list(saved))
    block.set_output(op, "Saved", list(saved_vars))
    block.set_attr(grad_op, "saved", list(saved))
    block.set_attr(grad_op, "sub_block", BlockRef(gblock.idx))
    block.set_input(grad_op, "Saved", list(saved_vars))
    if out_grads:
        block.set_input(grad_op, "Outputs@GRAD", out_grads)


def _check_seeds(op, fwd, seeds):
    seeds = set(seeds)
    for inner in fwd.ops:
        hit = seeds.intersection(inner.input_names())
        if hit:
            raise ProgramError(f"parallel_do: output {sorted(hit)[0]!r} is also read inside the "
                               "block, so its gradient would mix two sources; write_output a "
                               "copy instead (se.layers.assign)")


register_block_grad("parallel_do", make_grad_block)


@register_test_rewrite
def _drop_saved(program):
    # a forward-only clone has no parallel_do_grad: keep no activations for it
    for block in program.blocks:
        for op in block.ops:
            if op.type == "parallel_do" and op.attrs.get("saved"):
                block.set_attr(op, "saved", [])
                block.set_output(op, "Saved", None)
