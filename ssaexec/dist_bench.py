"""Old name of the benchmark's torchrun worker, now ``ssaexec.bench.worker``.

``torchrun --standalone --nproc-per-node P -m ssaexec.dist_bench`` still runs it.
``_die_with_parent`` stays for ``tests/dist_worker.py`` until it imports
``ssaexec.bench.worker.die_with_parent``.
"""

from .bench.worker import die_with_parent as _die_with_parent  # noqa: F401
from .bench.worker import serve_torchrun as main

__all__ = ["main"]

if __name__ == "__main__":
    main()
