"""Several "machines" on this one: Linux network namespaces joined by a bridge.

``Cluster(n)`` makes ``n`` node namespaces and one switch namespace. Each node has an
``eth0`` (one end of a veth pair) with the address ``10.77.0.<i+1>/24`` and its own
loopback; the other ends sit on a bridge inside the switch namespace. Nothing is created
in, or reachable from, the caller's namespace: the addresses exist only inside the
cluster. ``cut(i)`` takes node ``i``'s link down (its cable pulled), ``run(i, cmd)``
starts a process inside node ``i`` in a session of its own.

``close()`` kills every process left in the namespaces and deletes them; it runs even
when the test fails (use the object as a context manager). Namespaces are named
``ssxt<pid>-...``, and ones left by a test process that no longer exists (killed before
its teardown) are deleted on the next start.

Needs root (``ip netns``); ``available()`` says why not when it cannot be done.
"""

import os
import re
import signal
import subprocess

SUBNET = "10.77.0"
_PREFIX = "ssxt"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def available():
    """None when namespaces can be made here, else a one-line reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        probe = f"{_PREFIX}{os.getpid()}-probe"
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"ip netns add failed: {r.stderr.strip() or r.stdout.strip()}"
        _ip("netns", "del", probe, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"no usable 'ip' command: {e}"
    return None


def _stale():
    # namespaces of test processes that died before their teardown
    out = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({_PREFIX}(\d+)-\S+)", out, re.M):
        ns, pid = name
        if not os.path.exists(f"/proc/{pid}"):
            yield ns


class Cluster:
    """``n`` node namespaces on one bridge (see the module docstring)."""

    def __init__(self, n):
        for ns in _stale():
            _kill_all(ns)
            _ip("netns", "del", ns, check=False)
        tag = f"{_PREFIX}{os.getpid()}-{id(self) % 100000}"
        self.switch = f"{tag}-sw"
        self.nodes = [f"{tag}-n{i}" for i in range(n)]
        self.procs = []
        self._made = []
        try:
            self._add(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.nodes):
                self._add(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                    f"p{i}", "netns", self.switch)
                _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise

    def _add(self, ns):
        _ip("netns", "add", ns)
        self._made.append(ns)

    @staticmethod
    def addr(i):
        """Node ``i``'s address (only inside the cluster)."""
        return f"{SUBNET}.{i + 1}"

    def run(self, i, cmd, log, env=None, cwd=None):
        """Start ``cmd`` in node ``i`` (a session of its own), output to the file ``log``."""
        with open(log, "ab") as f:
            p = subprocess.Popen(["ip", "netns", "exec", self.nodes[i], *cmd], stdout=f,
                                 stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def cut(self, i):
        """Pull node ``i``'s cable: its switch port goes down, nothing passes either way."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "down")

    def kill_node(self, i):
        """SIGKILL every process inside node ``i`` (the machine loses power)."""
        _kill_all(self.nodes[i])

    def close(self):
        for ns in reversed(self._made):
            _kill_all(ns)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _kill_all(ns):
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
