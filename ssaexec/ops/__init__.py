"""Operators: the registry (a leaf) and the kernels, registered on import.

Importing any ``ssaexec.ops.<module>`` runs this first, so every built-in op type is
registered before anyone looks one up.
"""

from . import registry  # noqa: F401  (first: the kernel modules register into it)
from . import amp, control, init, loss, lr, math, metrics, nn, optim, tensor  # noqa: F401
from . import remote, parallel_do, sparse  # noqa: F401
from . import aten  # noqa: F401  (registers the aten.* family)
# the kernel guards by family; here, not in ops.guards, which they import (no cycle)
from . import guards_index, guards_shape, guards_value, guards_size  # noqa: F401
