#!/usr/bin/env python3
"""The torch version matrix (``make test-matrix``; docs/torch_versions.md).

For each cell (Python, torch) of ``CELLS``: a virtualenv ``.venv-matrix/py<py>-<torch>``
made from the package index (torch as pip finds it: the CPU wheel on local disk where
there is one, else the CUDA wheel from the index, which runs on CPU), with ssaexec
installed editable with its test extras; then ``pytest -m "not slow"`` and the
transformers zoo (tests/frontends/torch/test_zoo.py, marked slow, so run by name), both on pytest-xdist
workers as ``make test`` runs them (a venv without pytest-xdist that pip cannot reach: in
one process). It prints one line a
cell: Python, torch, passed, failed, seconds, and exits 1 when any cell failed.

Policy:

* a venv is made once (its ``.installed`` stamp) and reused; torch and its CUDA
  libraries are downloaded once into a shared wheelhouse (``MATRIX_WHEELS``, default
  ``~/.cache/ssaexec-matrix-wheels``; pip's own HTTP cache stores nothing behind this
  workplace's proxy) and installed from there with ``--no-index``, so a second checkout,
  a CI run or the other Python's cell installs from disk (the CUDA libraries' wheels
  are ``py3-none``: one copy serves Python 3.11 and 3.12);
* the cells are the supported range's ends and the pinned version, plus the GPU
  machines' exact pair (Python 3.12, torch 2.11.0);
* ``--cells 3.11-2.11.0,...`` picks cells; ``--fast`` leaves the zoo out;
  ``--install-only`` makes the venvs and runs nothing.
"""

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CELLS = [("3.11", "2.11.0"), ("3.11", "2.13.0"), ("3.11", "2.14.1"), ("3.12", "2.11.0")]
WHEELS = os.environ.get("MATRIX_WHEELS",
                        str(pathlib.Path.home() / ".cache" / "ssaexec-matrix-wheels"))
# the extras the test suite needs (pyproject.toml's optional dependencies)
EXTRAS = ".[test,bench,paddle]"


def venv_of(py, torch_version):
    return ROOT / ".venv-matrix" / f"py{py}-{torch_version}"


def interpreter(py):
    """A ``python<py>`` that runs: on PATH (a pyenv shim may refuse one that is not the
    active version), else pyenv's build of it, else None."""
    cands = [f"python{py}"] + sorted(str(p) for p in
                                     (pathlib.Path.home() / ".pyenv" / "versions").glob(
                                         f"{py}.*/bin/python{py}")) + [f"/usr/bin/python{py}"]
    for c in cands:
        try:
            if subprocess.run([c, "-c", "pass"], capture_output=True).returncode == 0:
                return c
        except OSError:
            continue
    return None


def install(py, torch_version, quiet=True):
    """Make the cell's venv (once); returns its python."""
    venv = venv_of(py, torch_version)
    stamp = venv / ".installed"
    python = venv / "bin" / "python"
    if stamp.exists():
        return python
    q = ["-q"] if quiet else []
    pip = [str(python), "-m", "pip", "install", *q]
    base = interpreter(py)
    if base is None:
        raise SystemExit(f"test-matrix: no Python {py} here (python{py}); install it or pick "
                         "other cells with --cells")
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    # torch from the wheelhouse; what it lacks is downloaded into it first
    offline = pip + ["--no-index", "--find-links", WHEELS, f"torch=={torch_version}"]
    if subprocess.run(offline, capture_output=True).returncode != 0:
        pathlib.Path(WHEELS).mkdir(parents=True, exist_ok=True)
        subprocess.run([str(python), "-m", "pip", "download", *q, "-d", WHEELS,
                        f"torch=={torch_version}"], check=True)
        subprocess.run(offline, check=True)
    subprocess.run(pip + ["-e", EXTRAS], check=True, cwd=ROOT)
    stamp.touch()
    return python


def _count(text, word):
    m = re.search(rf"(\d+) {word}", text)
    return int(m.group(1)) if m else 0


# as the Makefile's test targets: a pytest-xdist worker per core (at most 4), each test
# file on one worker, the tests marked `processes` one at a time (tests/conftest.py)
XDIST = ["-n", "auto", "--maxprocesses", "4", "--dist", "loadfile"]


def has_xdist(python):
    """Whether the cell's venv has pytest-xdist. A venv made before it joined the test
    extras gets it now when pip can reach it; offline it stays without, and its suite runs
    in one process as before."""
    probe = [str(python), "-c", "import xdist"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return True
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--retries", "0", "--timeout",
                    "15", "pytest-xdist>=3.5"], capture_output=True)
    return subprocess.run(probe, capture_output=True).returncode == 0


def pytest(python, args, log):
    """``(passed, failed)`` of one pytest run (errors count as failed); its output goes to
    ``log`` as it runs."""
    with open(log, "a") as out:
        out.write(f"$ {python} -m pytest {' '.join(args)}\n")
        out.flush()
        start = out.tell()
        proc = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    with open(log) as f:
        f.seek(start)
        lines = f.read().strip().splitlines()
    tail = lines[-1] if lines else ""
    passed, failed = _count(tail, "passed"), _count(tail, "failed") + _count(tail, "error")
    if proc.returncode not in (0, 1) and not failed:
        failed = 1  # pytest itself failed (exit 2-4): count it
    return passed, failed


def run_cell(py, torch_version, zoo):
    t0 = time.perf_counter()
    python = install(py, torch_version)
    log = ROOT / ".venv-matrix" / f"py{py}-{torch_version}.log"
    log.write_text("")
    xdist = XDIST if has_xdist(python) else []
    passed, failed = pytest(python, [*xdist, "-m", "not slow"], log)
    if zoo:
        p, f = pytest(python, [*xdist, "tests/frontends/torch/test_zoo.py"], log)
        passed, failed = passed + p, failed + f
    return passed, failed, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", help="comma-separated py-torch pairs, e.g. 3.11-2.11.0")
    ap.add_argument("--fast", action="store_true", help="leave the zoo out")
    ap.add_argument("--install-only", action="store_true", help="make the venvs only")
    a = ap.parse_args(argv)
    cells = CELLS if not a.cells else [tuple(c.split("-", 1)) for c in a.cells.split(",")]
    if a.install_only:
        for py, tv in cells:
            print(f"python {py} torch {tv}: {install(py, tv)}", flush=True)
        return 0
    rows = []
    for py, tv in cells:
        passed, failed, secs = run_cell(py, tv, zoo=not a.fast)
        line = (f"python {py:5}  torch {tv:7}  passed {passed:5}  failed {failed:3}  "
                f"seconds {secs:6.0f}")
        print(line, flush=True)
        rows.append((passed, failed))
    print(f"test-matrix: {sum(1 for _, f in rows if not f)} of {len(rows)} cells green "
          f"(logs: .venv-matrix/py<python>-<torch>.log)")
    # the plain closing line a CI log reader counts
    print(f"{sum(p for p, _ in rows)} passed, {sum(f for _, f in rows)} failed")
    return 1 if any(f for _, f in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
