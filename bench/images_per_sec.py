"""Images/sec of one model in every training mode: ``python bench/images_per_sec.py --help``.

A thin wrapper around ``ssaexec.harness`` (also ``ssaexec bench`` and ``make bench``);
see docs/benchmarks.md for the figures and how to reproduce them.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ssaexec.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
