"""Mixed precision decided at build time: a program rewrite that makes every cast explicit.

``amp_program(program, "bf16")`` returns a copy of ``program`` in which each op runs in
the precision autocast would pick, with ``cast`` ops inserted where a value changes
type. Both executors and every tool (``ssaexec dump``, ``viz``, ``stats``) then see and
run the same plain program: nothing about precision is decided at run time.

Policy (the lists below, by op type; a grad op ``T_grad`` follows ``T``; imported ATen
ops ``aten.<name>.<overload>`` are listed by ``<name>``):

* **low** (``LOW``): matrix products and convolutions. Floating inputs are cast to the
  low type, so the op and its results are low precision.
* **fp32** (``FP32``): reductions, softmax, layer norm, exp/log and losses. Floating
  inputs are cast to float32. Batch norm is not one of them: as under CUDA autocast,
  it runs on its input's type (its statistics and parameters stay fp32).
* everything else runs on whatever its inputs are, with torch's type promotion
  (``bf16 + fp32`` is fp32), as autocast does.

Invariants:

* parameters, optimizer state and every other persistable keep their declared
  dtype (fp32 master weights): an op whose result would change a persistable's type
  writes a temporary that is cast back;
* each optimizer op receives its gradient in its parameter's dtype;
* a parameter's gradient is all-reduced in fp32 (``allreduce="fp32"``, the default:
  the op producing the final gradient writes a low temporary, cast to the gradient
  var) or in the low type (``allreduce="low"``: half the bytes; cast to fp32 right
  before the optimizer op);
* the declared dtype of every non-persistable var is the dtype its producer makes
  (found with the registry's shape/dtype inference), so ``validate()`` passes;
* one cast per (var version, target type): two low ops reading the same fp32 value
  share the cast.

fp16 adds dynamic loss scaling (bf16 has fp32's range and needs none): the loss
gradient seed is multiplied by ``@AMP.loss_scale``; after the gradients are complete
(and all-reduced), ``amp_unscale`` divides them by the scale and sets
``@AMP.found_inf``; every optimizer op skips its update when it is set
(``SkipUpdate``); ``amp_update_scale`` ends the step (halve after an overflow, double
after ``growth_interval`` clean steps) and counts ``@AMP.skipped_steps``. The state
vars are persistables that the executors create with ``LOSS_SCALE_STATE``'s values
when the scope lacks them. Everything stays on the device: no host sync.

Sub-blocks (``conditional_block``) are left as they are; they read the outer values in
whatever type those now have.
"""

from ..core.dtypes import DTYPES
from ..core.errors import ProgramError
from ..ops.registry import EMPTY_VAR, get_op_def, infer_outputs
from .desc import OpDesc

__all__ = ["LOW", "FP32", "AMP_DTYPES", "amp_class", "amp_program", "LOSS_SCALE_STATE"]

AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}

LOW = frozenset({
    "mul", "matmul", "conv2d",
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear",
    "aten.convolution", "aten.convolution_backward", "aten.addbmm", "aten.addmv", "aten.mv",
})
# batch norm is in neither list, as in CUDA autocast: it runs on its input's type (the
# kernel keeps its statistics in fp32). In FP32 it made every conv-BN-ReLU block keep an
# fp32 copy of each activation: 2.55x eager's memory on ResNet-50 (first GPU run).
FP32 = frozenset({
    "softmax", "log_softmax", "softmax_with_cross_entropy", "cross_entropy",
    "square_error_cost", "mean", "reduce_sum", "reduce_mean", "layer_norm",
    "exp", "log",
    "aten._softmax", "aten._log_softmax", "aten._softmax_backward_data",
    "aten._log_softmax_backward_data", "aten.native_layer_norm",
    "aten.native_layer_norm_backward", "aten.nll_loss_forward", "aten.nll_loss_backward",
    "aten.mse_loss", "aten.mse_loss_backward", "aten.exp", "aten.log", "aten.pow", "aten.sum", "aten.mean",
    "aten.var_mean", "aten.rsqrt", "aten.cumsum", "aten.prod", "aten.linalg_vector_norm",
})
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
# grad ops on mixed types whose result types are certain, so no cast makes them sure:
# batch norm's backward returns X@GRAD in X's type and the parameters' gradients in
# Scale's (fp32) on every supported torch (a cast there copied each activation gradient)
_TYPED_GRADS = frozenset({"batch_norm_grad"})

SCALE, TRACKER, SKIPPED, FOUND_INF = ("@AMP.loss_scale", "@AMP.growth_tracker",
                                      "@AMP.skipped_steps", "@AMP.found_inf")
# persistable loss-scaling state: name -> (dtype, initial value)
LOSS_SCALE_STATE = {SCALE: ("float32", 2.0 ** 16), TRACKER: ("int32", 0),
                    SKIPPED: ("int64", 0)}


def amp_class(op_type):
    """``"low"``, ``"fp32"`` or None (run as the inputs are) for ``op_type``."""
    base = op_type[:-len("_grad")] if op_type.endswith("_grad") else op_type
    if base.startswith("aten."):
        base = ".".join(base.split(".")[:2])
    if base in LOW:
        return "low"
    if base in FP32:
        return "fp32"
    return None


def amp_program(program, amp, allreduce="fp32", growth_interval=2000):
    """A copy of ``program`` with explicit casts for mixed precision (module docstring).

    Parameters
    ----------
    program : Program
        The main program (forward, backward and optimizer ops).
    amp : {"bf16", "fp16"}
        The low-precision type.
    allreduce : {"fp32", "low"}
        The type parameter gradients are all-reduced in.
    growth_interval : int
        fp16: clean steps before the loss scale doubles.

    Returns
    -------
    Program
    """
    if amp not in AMP_DTYPES:
        raise ProgramError(f"amp must be one of {sorted(AMP_DTYPES)}, got {amp!r}")
    if allreduce not in ("fp32", "low"):
        raise ProgramError(f"amp allreduce must be 'fp32' or 'low', got {allreduce!r}")
    new = _Rewrite(program.clone(), AMP_DTYPES[amp], allreduce).run()
    if amp == "fp16":
        _add_loss_scaling(new.global_block(), growth_interval)
    return new


def _add_loss_scaling(block, growth_interval):
    ops = block.ops
    seeds = [op for op in ops if op.role == "loss"]
    opt = [op for op in ops if op.role == "optimize" and "SkipUpdate" in
           {s.name for s in get_op_def(op.type).inputs}]
    if not seeds or not opt:
        return
    for name, (dtype, _) in LOSS_SCALE_STATE.items():
        block.create_var(name, shape=[], dtype=dtype, persistable=True)
    block.create_var(FOUND_INF, shape=[], dtype="float32")
    # the seed: loss@GRAD = seed * scale
    for seed in seeds:
        (grad,) = seed.output_names()
        var = block.var(grad)
        raw = grad + "@AMP.unscaled"
        block.create_var(raw, shape=var.shape, dtype=var.dtype)
        for slot, names in list(seed.outputs.items()):
            block.set_output(seed, slot, [raw if n == grad else n for n in names])
        block.insert_op(ops.index(seed) + 1,
                        OpDesc("elementwise_mul", {"X": [raw], "Y": [SCALE]}, {"Out": [grad]},
                               {"axis": -1}, role="backward"))
    # the gradients' casts first, then one unscale, then the updates (skippable)
    first = min(ops.index(op) for op in ops if op.role == "optimize")
    moved = [op for op in ops[first:] if op.role == "optimize" and op.type == "cast"]
    for op in moved:
        block.remove_op(op)
    for k, op in enumerate(moved):
        block.insert_op(first + k, op)
    grads = list(dict.fromkeys(op.input("Grad")[0] for op in opt))
    block.insert_op(first + len(moved),
                    OpDesc("amp_unscale", {"Grads": grads, "Scale": [SCALE]},
                           {"GradsOut": grads, "FoundInf": [FOUND_INF]}, role="optimize"))
    for op in opt:
        block.set_input(op, "SkipUpdate", [FOUND_INF])
    block.append_op("amp_update_scale",
                    {"Scale": [SCALE], "GrowthTracker": [TRACKER], "FoundInf": [FOUND_INF],
                     "SkippedSteps": [SKIPPED]},
                    {"ScaleOut": [SCALE], "GrowthTrackerOut": [TRACKER],
                     "SkippedStepsOut": [SKIPPED]},
                    {"growth_interval": int(growth_interval)}, role="optimize")


class _Rewrite:
    def __init__(self, program, low, allreduce):
        self.program = program
        self.block = program.global_block()
        self.low = low
        self.allreduce = allreduce
        self.dtype = {n: v.dtype for n, v in self.block.vars.items()}  # run-time dtypes
        self.casts = {}  # (name, dtype) -> name of the cast value, until name is rewritten
        self.param_of_grad = {g: p for op in self.block.ops for p, g in op.role_var}

    def run(self):
        i = 0
        while i < len(self.block.ops):
            op = self.block.ops[i]
            cls = amp_class(op.type)
            target = {"low": self.low, "fp32": "float32"}.get(cls)
            before = len(self.block.ops)
            if target is not None:
                self._cast_inputs(i, op, target, lambda slot: True)
            if op.role == "optimize" and "Grad" in op.inputs and "Param" in op.inputs:
                want = self.dtype.get(op.input("Param")[0])
                self._cast_inputs(i, op, want, lambda slot: slot == "Grad")
            i += len(self.block.ops) - before  # casts went in before the op
            floats = {self.dtype.get(n) for n in op.input_names()} & _FLOATS
            # A grad kernel on mixed types may return a gradient in the promoted type (a
            # bias grad summed from an fp32 Out@GRAD for a bf16 X). Inference assumes a
            # gradient has its forward var's type: make that true with an explicit cast.
            unsure = (cls is None and op.type.endswith("_grad") and len(floats) > 1
                      and op.type not in _TYPED_GRADS)
            self._infer(op)
            i += 1 + self._fix_outputs(i, op, unsure)
        return self.program

    # --- inputs -----------------------------------------------------------------------
    def _cast_inputs(self, i, op, target, slot_ok):
        for slot, names in list(op.inputs.items()):
            if not slot_ok(slot):
                continue
            new = []
            for n in names:
                have = self.dtype.get(n)
                if n == EMPTY_VAR or have not in _FLOATS or have == target or target is None:
                    new.append(n)
                    continue
                new.append(self._cast(i, n, target, op.role))
            self.block.set_input(op, slot, new)

    def _cast(self, i, name, target, role):
        key = (name, target)
        have = self.casts.get(key)
        if have is not None:
            return have
        out = self._temp(name, target)
        var = self.block.var(name)
        self.block.create_var(out, shape=var.shape, dtype=target)
        self.block.insert_op(i, OpDesc("cast", {"X": [name]}, {"Out": [out]},
                                       {"out_dtype": target},
                                       role="backward" if role == "loss" else role))
        self.dtype[out] = target
        self.casts[key] = out
        return out

    def _temp(self, name, dtype):
        base = f"{name}@AMP.{dtype}"
        out, k = base, 0
        while self.block.has_var(out):
            k += 1
            out = f"{base}.{k}"
        return out

    # --- outputs ----------------------------------------------------------------------
    def _infer(self, op):
        try:
            op_def = get_op_def(op.type)
            specs = {slot: [(self.block.var(n).shape, self.dtype[n]) for n in names]
                     for slot, names in op.inputs.items()
                     if all(n in self.dtype for n in names)}
            result = infer_outputs(op_def, op, specs) or {}
        except Exception:  # noqa: BLE001 - an op we cannot infer keeps its declared types
            result = {}
        for slot, names in op.outputs.items():
            got = result.get(slot) or []
            for j, n in enumerate(names):
                if n == EMPTY_VAR:
                    continue
                for key in [k for k in self.casts if k[0] == n]:
                    del self.casts[key]  # a new version: earlier casts are stale
                spec = got[j] if j < len(got) else None
                if spec is not None and spec[1] in DTYPES:
                    self.dtype[n] = spec[1]

    def _fix_outputs(self, i, op, unsure=False):
        """Cast back what must keep its type; return the number of ops inserted after.

        ``unsure``: the kernel's result types are not certain; cast every floating result
        to the type inference gives it."""
        inserted = 0
        for slot, names in list(op.outputs.items()):
            names = list(names)  # the slot as rewritten, set on the op once it is done
            for j, n in enumerate(names):
                if n == EMPTY_VAR:
                    continue
                var = self.block.var(n)
                made = self.dtype.get(n, var.dtype)
                param = self.param_of_grad.get(n)
                if param is not None and self._is_final_grad(op, n):
                    keep = self.dtype[param] if self.allreduce == "fp32" else None
                elif var.persistable:
                    keep = var.dtype
                else:
                    keep = None
                if unsure and keep is None and made in _FLOATS:
                    keep = made
                elif keep is None or keep == made:
                    if not var.persistable:
                        self.block.update_var(n, dtype=made)
                    continue
                # write a temporary in the made type, cast it into the var
                tmp = self._temp(n, made)
                self.block.create_var(tmp, shape=var.shape, dtype=made)
                names[j] = tmp
                self.dtype[tmp] = made
                self.dtype[n] = keep
                self.block.update_var(n, dtype=keep)
                cast = OpDesc("cast", {"X": [tmp]}, {"Out": [n]}, {"out_dtype": keep},
                              role=op.role)
                self.block.insert_op(i + 1 + inserted, cast)
                inserted += 1
                if (param, n) in op.role_var:
                    # the cast now makes the final gradient: the all-reduce follows it
                    self.block.remove_role_var(op, param, n)
                    self.block.add_role_var(cast, param, n)
            if names != op.outputs[slot]:
                self.block.set_output(op, slot, names)
        return inserted

    @staticmethod
    def _is_final_grad(op, name):
        return any(g == name for _, g in op.role_var)
