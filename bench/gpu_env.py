"""Which interpreter ``make gpu-check`` runs on: the project's ``.venv`` or the machine's own.

A GPU machine as it comes has a Python with a CUDA torch (and maybe cupy) and no
network, so ``make install`` (which pip-installs the pinned torch into ``.venv``) would
fail there, or spend the machine's minutes downloading. ``make gpu-check`` asks this
script first and prints ``system`` (run bench/gpu_check.py on ``$(PYTHON)`` as it is,
ssaexec from the checkout, nothing installed) or ``venv`` (make ``.venv`` as usual),
with the reason on stderr.

Policy (``decide``), first rule that applies:

1. ``NO_VENV=1`` -> system; ``NO_VENV=0`` -> venv (the documented switch);
2. ``.venv`` already has a python -> venv (a developer's machine);
3. the interpreter has a CUDA build of torch (``torch.version.cuda``) and no package
   index can be reached (``PIP_NO_INDEX`` set, or no connection to the index within
   3 s) -> system;
4. else venv.

Standard library only, and the probe of torch runs in a subprocess, so a broken torch
says so instead of failing this script.
"""

import os
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

PROBE = ("import torch; print(torch.__version__); print(torch.version.cuda or ''); "
         "print(int(torch.cuda.is_available()))")


def decide(no_venv, venv_exists, torch_cuda, index_reachable):
    """``(mode, why)``: ``mode`` is ``"system"`` or ``"venv"`` (the module docstring's rules).

    ``no_venv`` is the ``NO_VENV`` switch (``""``, ``"0"`` or ``"1"``), ``venv_exists``
    whether ``.venv`` has a python, ``torch_cuda`` the interpreter's ``torch.version.cuda``
    (None: no torch, or a CPU build), ``index_reachable`` whether pip can reach an index.
    """
    if no_venv not in ("", "0", "1"):
        raise ValueError(f"NO_VENV must be 1, 0 or empty, got {no_venv!r}")
    if no_venv == "1":
        return "system", "NO_VENV=1: the interpreter as it is"
    if no_venv == "0":
        return "venv", "NO_VENV=0: the project's .venv"
    if venv_exists:
        return "venv", ".venv exists"
    if torch_cuda and not index_reachable:
        return "system", (f"no .venv, the interpreter has a CUDA {torch_cuda} torch, and no "
                          "package index is reachable: a GPU machine as it comes")
    if not torch_cuda:
        return "venv", "the interpreter has no CUDA torch"
    return "venv", "a package index is reachable: make .venv"


def probe_torch(python):
    """``(version, cuda, gpu)`` of ``python``'s torch, or None when it has none."""
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    lines = out.stdout.split("\n")
    return lines[0], lines[1] or None, lines[2] == "1"


def index_reachable(timeout=3.0):
    """Whether pip could reach its index: False under ``PIP_NO_INDEX``, else whether a TCP
    connection to the index host (``PIP_INDEX_URL``, default PyPI) opens in ``timeout`` s."""
    if os.environ.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on"):
        return False
    url = urllib.parse.urlparse(os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple")
    if url.scheme == "file":
        return Path(url.path).exists()
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    venv = Path(argv[0] if argv else ".venv")
    python = argv[1] if len(argv) > 1 else sys.executable
    no_venv = os.environ.get("NO_VENV", "")
    venv_exists = (venv / "bin" / "python").exists()
    torch_info = None if no_venv or venv_exists else probe_torch(python)
    cuda = torch_info[1] if torch_info else None
    reachable = index_reachable() if cuda and not no_venv and not venv_exists else True
    try:
        mode, why = decide(no_venv, venv_exists, cuda, reachable)
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    print(f"gpu-check: {mode} python ({why})", file=sys.stderr)
    print(mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
