"""Kernel guards, value family: integer arguments that index host memory.

Registered into ``ssaexec.ops.guards`` (policy, invariants, the machinery) on import.
"""

from .guards import SIZE, VALUE, _dim, _fail, _guard, _ints, _numel, _shape


@_guard("aten._fft_r2c.default", trusts=[VALUE],
        note="dim holds distinct dimensions of self (the kernel indexes its shape with "
             "them); normalization 0, 1 or 2")
def _fft(op, self, dim, normalization):
    seen = set()
    for d in _ints(dim):
        seen.add(_dim(op, "dim", d, self.dim()))
    if len(seen) != len(_ints(dim)) or not seen:
        _fail(op, f"argument 'dim' is {list(dim)}: distinct dimensions, at least one")
    if normalization not in (0, 1, 2):
        _fail(op, f"argument 'normalization' is {normalization}, not 0, 1 or 2")


@_guard("aten._fft_c2r.default", trusts=[VALUE, SIZE],
        note="as _fft_r2c, and last_dim_size positive with the result within the limit")
def _fft_c2r(op, self, dim, normalization, last_dim_size):
    _fft(op, self, dim, normalization)
    if last_dim_size < 1:
        _fail(op, f"argument 'last_dim_size' is {last_dim_size}")
    last = _dim(op, "dim", _ints(dim)[-1], self.dim())
    shape = _shape(self)
    shape[last] = last_dim_size
    _numel(op, shape, f"its result {shape}")
