"""Benchmark harness: images/sec of one model trained in several modes, in one run.

``python bench/images_per_sec.py`` (= ``ssaexec bench`` = ``make bench``) trains
the same model, from the same initial weights, on the same synthetic batch in

* ``seq``: the sequential ``Executor`` on one place;
* ``ssaexec``: ``ParallelExecutor`` on 1..N places (CPU places or CUDA devices), as users
  get it (the default compiler: ``"auto"``, tiered, where Inductor can run);
  ``ssaexec-none``: the same with ``compiler=None``;
* ``torch-eager``: the ``torch.nn`` twin of the model (``bench/torch_models.py``)
  in a plain training loop;
* ``torch-ddp``: the twin under ``DistributedDataParallel``, one process per place;
* ``ssaexec-from-torch`` (``--from-torch``): the twin converted by
  ``ssaexec.frontends.torch.from_torch`` and run by ``ParallelExecutor``;
* ``ssaexec-nproc`` (``--nproc P``): ssaexec as ``P`` processes under torchrun;
* ``ssaexec-inductor`` and ``ssaexec-inductor-nproc``: the same two with each segment
  compiled by Inductor (``compiler="inductor"``); ``torch-compile`` and
  ``torch-compile-ddp`` are their peers,

and prints a table (images/sec, speedup over 1 place, scaling efficiency, peak
memory), the time to 1, 100 and 1000 steps with each mode's compile included, a headline
against torch.compile and DDP, writes a JSON file with every raw timing and the machine, and a PNG
plot of images/sec against places.

The package, one concept a module:

* ``models``: settings -> program, torch twin, initial weights, optimizer, data;
* ``runners``: one trainer per in-process peer, and how a trainer is timed;
* ``ddp``: the ``torch-ddp`` peer (one process per place);
* ``worker``: worker processes, the line protocol, the torchrun worker;
* ``report``: figures per run, comparisons, table, plot, machine description;
* ``time_to_steps``: time to N steps, compile included (measured, or estimated beyond the
  steps run), and what a tiered runner did (``bench/time_to_steps.py`` too);
* ``cli``: options, settings, the plan, the run (``add_arguments``, ``run``, ``main``);
* ``zero_peers``: ZeRO against FSDP2, each side a group of gloo processes
  (``bench/zero_vs_fsdp.py``, ``bench/zero_memory.py``);
* ``place_memory``: tensor bytes by kind in each place's scope, at every op of a step.
"""

from .cli import MODES, PRESETS, SCHEMA, add_arguments, main, run
from .workloads import load_twins, torch_optimizer
from .results import machine_description

__all__ = ["main", "add_arguments", "run", "PRESETS", "MODES", "SCHEMA", "load_twins",
           "torch_optimizer", "machine_description"]
