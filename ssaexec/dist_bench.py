"""Old name of the benchmark's torchrun worker, now ``ssaexec.bench.worker``.

``torchrun --standalone --nproc-per-node P -m ssaexec.dist_bench`` still runs it.
"""

from .bench.worker import serve_torchrun as main

__all__ = ["main"]

if __name__ == "__main__":
    main()
