"""Random ops draw from per-op, per-place, per-step seeds.

Policy. A random op that transforms tensors (dropout, ``aten.native_dropout``,
``aten.bernoulli`` ...: ``OpDef.is_random`` with at least one tensor input and
no fixed ``seed`` attribute of its own) must not draw from torch's global
generator in whatever order the scheduler's threads happen to reach it: its
masks would change with the number of threads. Instead each call runs with the
default generator of its device seeded by ``op_seed(program seed, op index,
place index, step)`` (a SplitMix64 mix, as JAX splits keys; ``step`` is the
runner's step count, which ``ParallelExecutor`` sets to its own run count ``runs``
before each step, so a resumed checkpoint draws the masks the uninterrupted run would
have drawn), under one lock,
and the generator's previous state is restored afterwards, so the caller's own
random stream is untouched. Results are then identical for any thread count
and between the compiled and the readable path.

Random initialisers (no tensor input) keep their documented behaviour: a
non-zero ``seed`` attribute picks a private generator, zero uses torch's global
one as the user seeded it.

Compiled graphs (``runtime.inductor``) keep this policy: each drawing ATen call
of a traced graph becomes ``ssaexec::seeded_call``, an op opaque to the
compiler whose seed is a graph input, and which runs the same ATen call under
``seeded`` with the same seed. So a compiled step draws the same masks as the
compiled path, and the rest of the graph still fuses around the draw.

A tensor-transforming op with a fixed ``seed`` draws the same numbers every call
(``ops.nn.fixed_uniform``): they are drawn once per (seed, shape, device), by a
generator made for that draw, and the tensor is kept and shared (read-only).
So no generator is made or seeded inside a step: a CUDA graph captured after
the first step reads the kept tensor (a generator made during capture is not
registered with the graph and fails it; one registered would advance every
replay, and a fixed seed means the same mask every step).
"""

import contextlib
import hashlib
import threading

import torch

from ..core.compat import custom_op

__all__ = ["op_seed", "seeded", "needs_step_seed", "seeded_call", "register_call"]

_MASK = (1 << 64) - 1
_LOCK = threading.Lock()


def _mix(x):
    # SplitMix64's finaliser: consecutive inputs give unrelated outputs
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def op_seed(program_seed, op_index, place_idx, step):
    """The seed of one random op call (a non-negative 63-bit integer)."""
    h = _mix(int(program_seed) & _MASK)
    for part in (op_index, place_idx, step):
        h = _mix(h ^ (int(part) & _MASK))
    return h >> 1


def needs_step_seed(op_def, op):
    """Whether ``op`` draws through ``seeded`` (see the module docstring)."""
    if not op_def.is_random or not any(op.input_names()):
        return False
    return not op.attrs.get("seed")


@contextlib.contextmanager
def seeded(seed, device):
    """Run the body with ``device``'s default generator seeded by ``seed``, then restore it."""
    device = torch.device(device)
    with _LOCK:
        if device.type == "cuda":
            idx = device.index if device.index is not None else torch.cuda.current_device()
            gen = torch.cuda.default_generators[idx]
        else:
            gen = torch.default_generator
        state = gen.get_state()
        gen.manual_seed(seed)
        try:
            yield
        finally:
            gen.set_state(state)


# --- compiled graphs -------------------------------------------------------------------------
# call key -> (ATen overload, args and kwargs with tensors as _Slot(k), device): what a
# ``seeded_call`` node runs. A key is a hash of what it maps to, so the same call gets the
# same key in every process (the graphs that name it hit Inductor's on-disk cache), and a
# graph loaded from that cache finds its calls once this process has traced it.
_CALLS = {}


class _Slot:
    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k

    def __repr__(self):
        return f"_Slot({self.k})"


def register_call(func, args, kwargs, device):
    """Key a drawing ATen call for ``seeded_call``; returns (key, its tensor arguments)."""
    tensors = []

    def slot(a):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            return _Slot(len(tensors) - 1)
        if isinstance(a, (list, tuple)):
            return type(a)(slot(x) for x in a)
        return a

    template = (tuple(slot(a) for a in args), {k: slot(v) for k, v in sorted(kwargs.items())})
    text = repr((str(func), template, str(device)))
    key = "call_" + hashlib.sha256(text.encode()).hexdigest()[:20]
    _CALLS[key] = (func, template, str(device))
    return key, tensors


def _call(key, tensors):
    func, (args, kwargs), device = _CALLS[key]

    def fill(a):
        if isinstance(a, _Slot):
            return tensors[a.k]
        if isinstance(a, (list, tuple)):
            return type(a)(fill(x) for x in a)
        return a

    args, kwargs = tuple(fill(a) for a in args), {k: fill(v) for k, v in kwargs.items()}
    if func._schema.is_mutable:
        # an in-place draw (``bernoulli_``) on a copy: the op's result is a new tensor,
        # and the draw only reads the shape of what it overwrites
        args = (args[0].clone(),) + args[1:]
    return func, args, kwargs, device


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


@custom_op("ssaexec::seeded_call", mutates_args=())
def seeded_call(key: str, seed: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the drawing ATen call ``key`` (``register_call``) under ``seeded(seed)``."""
    func, args, kwargs, device = _call(key, tensors)
    with seeded(int(seed), device):
        return [t.clone() if any(t is a for a in tensors) else t
                for t in _as_list(func(*args, **kwargs))]


@seeded_call.register_fake
def _(key, seed, tensors):
    func, args, kwargs, _ = _call(key, tensors)
    return _as_list(func(*args, **kwargs))
