"""Optimizers: ``minimize(loss)`` appends the backward pass and one update op per parameter.

The learning rate is a persistable scalar var (so a schedule can change it
between runs without rebuilding): a number, or a schedule from ``se.optimizer.lr``
(``ssaexec.program.lr``) computed inside the program from a step counter; accumulators (velocity, moments, beta powers)
are persistable vars named after their parameter and initialised in the startup
program. Update rules match ``torch.optim`` (see ``ssaexec.ops.optim``).
"""

from ..core.errors import ProgramError
from . import initializer as init
from . import lr
from .backward import append_backward
from .builder import create_persistable, default_main_program, default_startup_program, \
    program_guard

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamW", "lr"]


class Optimizer:
    """Base class: subclasses set ``type`` and implement ``_append_update``."""

    type = None

    def __init__(self, learning_rate, weight_decay=0.0):
        self.schedule = learning_rate if isinstance(learning_rate, lr.LRSchedule) else None
        if self.schedule is not None:
            learning_rate = self.schedule.base_lr
        if not isinstance(learning_rate, (int, float)) or isinstance(learning_rate, bool) or \
                learning_rate <= 0:
            raise ProgramError(f"{type(self).__name__}: learning_rate must be a positive number "
                               f"or a schedule from se.optimizer.lr, got {learning_rate!r}")
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay)
        self.lr_var = None

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        """Append backward and optimizer ops for ``loss``.

        Returns
        -------
        (list of OpDesc, list of (VarDesc, VarDesc))
            The update ops and the (parameter, gradient) pairs.
        """
        main = default_main_program()
        startup = startup_program or default_startup_program()
        with program_guard(main, startup):
            params_grads = append_backward(loss, parameter_list, no_grad_set)
            if not params_grads:
                raise ProgramError(f"minimize: no trainable parameter reaches the loss "
                                   f"{getattr(loss, 'name', loss)!r}")
        return self.apply_gradients(params_grads, startup), params_grads

    def apply_gradients(self, params_grads, startup_program=None):
        """Append one update op per (parameter, gradient) pair to the default main program.

        For programs whose gradients come from elsewhere (the torch importer's
        captured backward); ``minimize`` is ``append_backward`` plus this.

        Returns
        -------
        list of OpDesc
            The update ops, in ``params_grads`` order.
        """
        main = default_main_program()
        startup = startup_program or default_startup_program()
        if not params_grads:
            raise ProgramError("apply_gradients: no (parameter, gradient) pairs")
        with program_guard(main, startup):
            dtype = params_grads[0][0].dtype
            self.lr_var = create_persistable(main.unique_name("learning_rate"), [], dtype,
                                             init.Constant(self.learning_rate))
            if self.schedule is not None:
                self.schedule.build(self.lr_var)
            # the current block: block 0, or a PlaceableBlock (program.distribute)
            ops = [self._append_update(main.current_block(), p, g) for p, g in params_grads]
            if self.schedule is not None:
                lr.end_of_step()
            return ops

    def _accumulator(self, param, kind, value, shape=None):
        main = default_main_program()
        return create_persistable(main.unique_name(f"{param.name}_{kind}"),
                                  param.shape if shape is None else shape, param.dtype,
                                  init.Constant(value))

    def _append_update(self, block, param, grad):
        raise NotImplementedError


class SGD(Optimizer):
    """Plain stochastic gradient descent."""

    type = "sgd"

    def _append_update(self, block, p, g):
        return block.append_op(
            "sgd", {"Param": [p.name], "Grad": [g.name], "LearningRate": [self.lr_var.name]},
            {"ParamOut": [p.name]}, {"weight_decay": self.weight_decay}, role="optimize",
            role_var=[(p.name, g.name)])


class Momentum(Optimizer):
    """SGD with momentum ``momentum`` (heavy ball, or Nesterov with ``use_nesterov``)."""

    type = "momentum"

    def __init__(self, learning_rate, momentum=0.9, use_nesterov=False, weight_decay=0.0):
        super().__init__(learning_rate, weight_decay)
        self.momentum = float(momentum)
        self.use_nesterov = bool(use_nesterov)

    def _append_update(self, block, p, g):
        v = self._accumulator(p, "velocity", 0.0)
        return block.append_op(
            "momentum", {"Param": [p.name], "Grad": [g.name], "Velocity": [v.name],
                         "LearningRate": [self.lr_var.name]},
            {"ParamOut": [p.name], "VelocityOut": [v.name]},
            {"mu": self.momentum, "use_nesterov": self.use_nesterov,
             "weight_decay": self.weight_decay}, role="optimize", role_var=[(p.name, g.name)])


class Adam(Optimizer):
    """Adam with bias correction; L2 ``weight_decay`` added to the gradient."""

    type = "adam"
    decoupled = False

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.0, lazy_mode=False):
        super().__init__(learning_rate, weight_decay)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        # a sparse gradient updates the moments of its rows only (ops.sparse)
        self.lazy_mode = bool(lazy_mode)

    def _append_update(self, block, p, g):
        m1 = self._accumulator(p, "moment1", 0.0)
        m2 = self._accumulator(p, "moment2", 0.0)
        b1 = self._accumulator(p, "beta1_pow", 1.0, shape=[])
        b2 = self._accumulator(p, "beta2_pow", 1.0, shape=[])
        return block.append_op(
            "adam", {"Param": [p.name], "Grad": [g.name], "LearningRate": [self.lr_var.name],
                     "Moment1": [m1.name], "Moment2": [m2.name], "Beta1Pow": [b1.name],
                     "Beta2Pow": [b2.name]},
            {"ParamOut": [p.name], "Moment1Out": [m1.name], "Moment2Out": [m2.name],
             "Beta1PowOut": [b1.name], "Beta2PowOut": [b2.name]},
            dict({"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon,
                  "weight_decay": self.weight_decay, "decoupled": self.decoupled},
                 **({"lazy_mode": True} if self.lazy_mode else {})),
            role="optimize", role_var=[(p.name, g.name)])


class AdamW(Adam):
    """Adam with decoupled weight decay (default 0.01, as torch.optim.AdamW)."""

    decoupled = True

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.01, lazy_mode=False):
        super().__init__(learning_rate, beta1, beta2, epsilon, weight_decay, lazy_mode)
