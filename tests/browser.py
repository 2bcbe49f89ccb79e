"""Headless Chromium for the explorer tests: find it, dump a page's DOM, take a screenshot.

Debian's ``chromium`` package (``make chromium`` installs it as root with apt-get).
No driver, no websocket: ``--dump-dom`` prints the DOM once the page has loaded and its
timers ran (``--virtual-time-budget``), and the explorer's ``#selftest`` hook writes its
results into the DOM first. Tests that need it skip with ``HINT`` when it is absent.
"""

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["find_chromium", "HINT", "dump_dom", "screenshot", "selftest"]

HINT = ("headless Chromium not found: run 'make chromium' (installs Debian's chromium "
        "package as root), or apt-get install chromium; or set $SSAEXEC_CHROMIUM")
TIMEOUT = 90
_SELFTEST = re.compile(r'<pre id="selftest">(\{.*?\})</pre>', re.S)


def find_chromium():
    """Path of a Chromium binary, or None (``$SSAEXEC_CHROMIUM`` overrides the search)."""
    override = os.environ.get("SSAEXEC_CHROMIUM")
    if override:
        return shutil.which(override) or (override if os.access(override, os.X_OK) else None)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args, width, height):
    exe = find_chromium()
    if exe is None:
        raise RuntimeError(HINT)
    with tempfile.TemporaryDirectory(prefix="ssaexec-chromium-") as profile:
        cmd = [exe, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
               "--disable-extensions", "--disable-background-networking",
               "--hide-scrollbars", f"--user-data-dir={profile}",
               f"--window-size={width},{height}", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"chromium failed with status {proc.returncode}: {' | '.join(tail)}")
    return proc.stdout


def dump_dom(page, fragment="", width=1400, height=900, budget_ms=10000):
    """The DOM of ``page`` (a file) after its scripts ran, as HTML text."""
    url = Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    return _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], width, height)


def screenshot(page, png, fragment="", width=1400, height=900, budget_ms=5000):
    """Write a PNG screenshot of ``page`` to ``png``."""
    url = Path(page).resolve().as_uri() + (f"#{fragment}" if fragment else "")
    _run([f"--virtual-time-budget={budget_ms}", f"--screenshot={Path(png).resolve()}", url],
         width, height)
    return png


def selftest(page, **params):
    """Run the explorer's ``#selftest`` in ``page``; return its results (a dict)."""
    fragment = "&".join(["selftest"] + [f"{k}={v}" for k, v in params.items()])
    dom = dump_dom(page, fragment)
    m = _SELFTEST.search(dom)
    if m is None:
        raise AssertionError("the page wrote no self-test results (a script error?)")
    return json.loads(html.unescape(m.group(1)))
