"""Rendezvous ports for tests that start processes, safe when tests run side by side.

Picking a port with ``bind(("127.0.0.1", 0))`` and closing it races: before the started
processes bind it, the kernel may hand the same port to another test running at the same
time (a pytest-xdist worker, or a second pytest beside this one), or to an outgoing
connection, since both draw from the ephemeral range. So ``free_port()`` takes ports from a
block of its own below the ephemeral range: one block per xdist worker
(``PYTEST_XDIST_WORKER``), starting at an offset from the process id so that two pytest
runs beside each other seldom meet, and it skips any port that something else holds (a
plain bind, no ``SO_REUSEADDR``, so a port still in TIME_WAIT is skipped too). Where the
ephemeral range reaches down into the blocks, it falls back to the kernel's choice.
"""

import itertools
import os
import socket

_BASE = 20000
_BLOCK = 1000
_BLOCKS = 12  # 20000..31999: below Linux's default ephemeral range, 32768..60999
_next = itertools.count(os.getpid() % _BLOCK)


def _worker_block():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; absent without
    return int(worker[2:]) + 1 if worker[2:].isdigit() else 0


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port():
    """A TCP port on 127.0.0.1 that nothing holds and no other worker of this run hands out."""
    base = _BASE + (_worker_block() % _BLOCKS) * _BLOCK
    if _ephemeral_low() >= _BASE + _BLOCKS * _BLOCK:
        for _ in range(_BLOCK):
            port = base + next(_next) % _BLOCK
            if _bindable(port):
                return port
    with socket.socket() as s:  # no block of our own here: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
