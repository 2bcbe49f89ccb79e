"""``python -m ssaexec``: the ``ssaexec`` command line (see ``ssaexec.cli``)."""

import sys

from .cli import main

sys.exit(main())
