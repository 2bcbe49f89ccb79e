"""Old name of the benchmark harness, now the package ``ssaexec.bench``.

Kept for callers of ``ssaexec.benchmark`` (``ssaexec bench`` in ``ssaexec/cli.py``);
``python -m ssaexec.benchmark`` runs the harness as before.
"""

import sys

from .bench import (MODES, PRESETS, SCHEMA, add_arguments, load_twins,  # noqa: F401
                    machine_description, main, run, torch_optimizer)

__all__ = ["main", "add_arguments", "run", "PRESETS", "MODES", "SCHEMA", "load_twins",
           "torch_optimizer", "machine_description"]

if __name__ == "__main__":
    sys.exit(main())
