"""ssaexec: an SSA-graph out-of-order executor for data-parallel training on PyTorch.

Describe a program with the builder (``se.layers``, ``se.optimizer``), run it
with ``se.Executor`` (sequential reference) or ``se.ParallelExecutor`` (one
replica per place, gradients all-reduced, ops scheduled as soon as ready).
"""

import sys as _sys

from .core.errors import (
    DistributedError, FeedError, GraphError, OpError, ProgramError, SSAExecError
)
from .program.desc import BlockDesc, BlockRef, OpDesc, Program, ProgramDesc, VarDesc
from .program.builder import default_main_program, default_startup_program, program_guard
from .program import layers, initializer, optimizer
from .program.backward import append_backward
from .program.distribute import transpile
from .core.place import CPUPlace, CUDAPlace, cpu_places, cuda_places, parse_places
from .runtime.scope import Scope, global_scope, scope_guard
from .execution.executor import Executor
from .core.strategy import BuildStrategy, ExecutionStrategy
from .graph.ssa import SSAGraph
from .graph.build import build_ssa_graph
from .execution.parallel_executor import ParallelExecutor
from .data.loader import DataLoader
from .data.prefetch import PrefetchLoader
from .state.checkpoint import load_checkpoint, save_checkpoint, save_parameters
from .state.resume import Checkpoints
from .state.dcp import export_dcp
from .dist.sampler import EpochSampler
from .frontends.torch import from_torch, from_torch_eval, write_back
from .frontends.paddle import from_paddle
from .dist import world as distributed, elastic

# the public modules keep their documented import paths (``import ssaexec.distributed``);
# aliases, not files: no module sits at the top of the package but the entry points
for _name, _module in (("distributed", distributed), ("elastic", elastic)):
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module

__version__ = "0.1.0"

__all__ = [
    "SSAExecError", "ProgramError", "OpError", "FeedError", "GraphError", "DistributedError",
    "Program", "ProgramDesc", "BlockDesc", "VarDesc", "OpDesc", "BlockRef",
    "default_main_program", "default_startup_program", "program_guard",
    "layers", "initializer", "optimizer", "append_backward", "transpile",
    "CPUPlace", "CUDAPlace", "cpu_places", "cuda_places", "parse_places",
    "Scope", "global_scope", "scope_guard", "Executor", "BuildStrategy", "ExecutionStrategy",
    "SSAGraph", "build_ssa_graph", "ParallelExecutor", "save_program", "load_program",
    "DataLoader", "PrefetchLoader", "distributed", "from_torch", "from_paddle", "from_torch_eval", "write_back",
    "save_checkpoint", "load_checkpoint", "save_parameters", "Checkpoints", "EpochSampler",
    "export_dcp",
    "elastic", "simulate",
]


def __getattr__(name):
    # Modules written by later layers are imported lazily so `import ssaexec` stays light.
    if name in ("save_program", "load_program"):
        from .program import io
        return getattr(io, name)
    if name == "simulate":  # the scaling simulator (ssaexec.sim, docs/simulator.md)
        from .sim import simulate
        return simulate
    raise AttributeError(f"module 'ssaexec' has no attribute {name!r}")
