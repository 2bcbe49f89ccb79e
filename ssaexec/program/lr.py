"""Learning-rate schedules, computed inside the program (``se.optimizer.lr``).

A schedule given as ``learning_rate=`` to an optimizer adds, to the optimizer's ops:

* the persistable step counter ``@LR.step`` (float64, starts at 0; one per program,
  shared by every schedule in it), which the ``lr_schedule`` op reads and the last
  optimize op of the step increments;
* one ``lr_schedule`` op (``ssaexec.ops.lr``) writing the optimizer's persistable
  learning-rate var before its updates.

So the rate is a function of the step counter evaluated on every place, the same in
every process, saved in checkpoints with the counter, and replayed by CUDA graphs.
The rules follow ``torch.optim.lr_scheduler`` (StepLR, MultiStepLR, ExponentialLR,
CosineAnnealingLR, LambdaLR) and Paddle's ``LinearWarmup``/``PiecewiseDecay``: step
``t`` (the number of optimizer steps already taken) uses ``rate(t)``, as a torch loop
``optimizer.step(); scheduler.step()`` does.
"""

from ..core.errors import ProgramError
from . import initializer as init
from .builder import create_persistable, default_main_program, default_startup_program

__all__ = ["LRSchedule", "StepDecay", "MultiStepDecay", "ExponentialDecay", "CosineAnnealing",
           "LinearWarmup", "PiecewiseDecay", "LambdaDecay", "STEP_VAR"]

STEP_VAR = "@LR.step"


def _positive(name, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ProgramError(f"{name} must be a positive number, got {value!r}")
    return value


class LRSchedule:
    """Base of the schedules: ``base_lr`` and the attributes of one ``lr_schedule`` op."""

    kind = None

    def __init__(self, learning_rate):
        self.base_lr = float(_positive("learning_rate", learning_rate))

    def attrs(self):
        """The ``lr_schedule`` attributes of this rule (``kind`` and ``base_lr`` aside)."""
        return {}

    def build(self, lr_var, offset=0):
        """Append the ops computing ``lr_var`` to the default programs; return them."""
        main = default_main_program()
        block = main.current_block()  # block 0, or the optimizer's PlaceableBlock
        step = step_counter()
        inputs = {"Step": [step]}
        inputs.update(self._inputs(offset))
        attrs = dict(self.attrs(), kind=self.kind, base_lr=self.base_lr, dtype=lr_var.dtype,
                     offset=int(offset))
        return [block.append_op("lr_schedule", inputs, {"LearningRate": [lr_var.name]}, attrs,
                                role="optimize")]

    def _inputs(self, offset):
        return {}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.attrs().items())
        return f"{type(self).__name__}(learning_rate={self.base_lr!r}{', ' if args else ''}{args})"


def step_counter():
    """The name of the program's step counter, declared (and initialised) on first use."""
    main = default_main_program()
    if main.global_block().find_var(STEP_VAR) is None:
        create_persistable(STEP_VAR, [], "float64", init.Constant(0.0))
    return STEP_VAR


def end_of_step():
    """Append the step counter's increment (after the step's updates), once per program."""
    block = default_main_program().current_block()
    for op in block.ops:
        if op.type == "scale" and op.output("Out") == [STEP_VAR]:
            block.remove_op(op)  # keep one increment, at the very end
    block.append_op("scale", {"X": [STEP_VAR]}, {"Out": [STEP_VAR]},
                    {"scale": 1.0, "bias": 1.0}, role="optimize")


class StepDecay(LRSchedule):
    """``lr * gamma ** (t // step_size)`` (``torch.optim.lr_scheduler.StepLR``)."""

    kind = "step"

    def __init__(self, learning_rate, step_size, gamma=0.1):
        super().__init__(learning_rate)
        self.step_size = int(_positive("step_size", step_size))
        self.gamma = float(gamma)

    def attrs(self):
        return {"step_size": self.step_size, "gamma": self.gamma}


class MultiStepDecay(LRSchedule):
    """``lr * gamma ** (milestones passed)`` (``MultiStepLR``)."""

    kind = "multistep"

    def __init__(self, learning_rate, milestones, gamma=0.1):
        super().__init__(learning_rate)
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = float(gamma)

    def attrs(self):
        return {"milestones": self.milestones, "gamma": self.gamma}


class ExponentialDecay(LRSchedule):
    """``lr * gamma ** t`` (``ExponentialLR``)."""

    kind = "exponential"

    def __init__(self, learning_rate, gamma):
        super().__init__(learning_rate)
        self.gamma = float(_positive("gamma", gamma))

    def attrs(self):
        return {"gamma": self.gamma}


class CosineAnnealing(LRSchedule):
    """``eta_min + (lr - eta_min) * (1 + cos(pi * t / T_max)) / 2`` (``CosineAnnealingLR``)."""

    kind = "cosine"

    def __init__(self, learning_rate, T_max, eta_min=0.0):
        super().__init__(learning_rate)
        self.T_max = int(_positive("T_max", T_max))
        self.eta_min = float(eta_min)

    def attrs(self):
        return {"T_max": self.T_max, "eta_min": self.eta_min}


class PiecewiseDecay(LRSchedule):
    """``values[k]`` for the ``k`` boundaries passed (Paddle's ``PiecewiseDecay``)."""

    kind = "piecewise"

    def __init__(self, boundaries, values):
        if len(values) != len(boundaries) + 1:
            raise ProgramError(f"PiecewiseDecay needs one more value than boundaries, got "
                               f"{len(boundaries)} boundaries and {len(values)} values")
        super().__init__(max(values))
        self.boundaries = [int(b) for b in boundaries]
        self.values = [float(v) for v in values]

    def attrs(self):
        return {"boundaries": self.boundaries, "values": self.values}


class LambdaDecay(LRSchedule):
    """``lr * lr_lambda(t)`` (``LambdaLR``), tabulated for ``steps`` steps when built.

    A program holds data, never code: ``lr_lambda`` is called for ``t = 0 .. steps-1``
    now and the table is stored in a persistable; later steps keep the last value.
    """

    kind = "table"

    def __init__(self, learning_rate, lr_lambda, steps):
        super().__init__(learning_rate)
        steps = int(_positive("steps", steps))
        self.values = [float(lr_lambda(t)) for t in range(steps)]

    def _inputs(self, offset):
        main = default_main_program()
        name = main.unique_name("@LR.table")
        var = create_persistable(name, [len(self.values)], "float64", init.Constant(0.0))
        startup = default_startup_program().global_block()
        startup.remove_op(startup.ops[-1])  # the table's values instead of the constant
        startup.append_op("assign_value", outputs={"Out": [var.name]},
                          attrs={"shape": [len(self.values)], "dtype": "float64",
                                 "values": self.values})
        return {"Table": [var.name]}


class LinearWarmup(LRSchedule):
    """Paddle's ``LinearWarmup``: ``start_lr`` to ``end_lr`` over ``warmup_steps``, then
    ``learning_rate`` (a number, or a schedule that starts counting after the warm-up)."""

    kind = "warmup"

    def __init__(self, learning_rate, warmup_steps, start_lr, end_lr):
        self.after = learning_rate if isinstance(learning_rate, LRSchedule) else None
        super().__init__(end_lr if self.after is not None else learning_rate)
        self.warmup_steps = int(_positive("warmup_steps", warmup_steps))
        self.start_lr, self.end_lr = float(start_lr), float(end_lr)
        if self.after is None:
            self.end_lr = float(end_lr)

    def attrs(self):
        return {"warmup_steps": self.warmup_steps, "start_lr": self.start_lr,
                "end_lr": self.end_lr if self.after is not None else self.base_lr}

    def build(self, lr_var, offset=0):
        ops = []
        after = None
        if self.after is not None:
            main = default_main_program()
            after = main.global_block().create_var(main.unique_name("@LR.after"), shape=[],
                                                   dtype=lr_var.dtype)
            ops += self.after.build(after, offset + self.warmup_steps)
        ops += super().build(lr_var, offset)
        if after is not None:
            main.current_block().set_input(ops[-1], "After", [after.name])
        return ops
