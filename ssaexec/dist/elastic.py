"""A failed process of an elastic run ends with one line: who was lost, and where it resumes.

Under ``torchrun --max-restarts`` a process whose step fails should neither hang nor leave
a page of traceback from every rank: it should exit at once, say which ranks stopped
answering and which checkpoint the restart will resume from, and let torchrun restart the
workers (on fewer nodes, if one is gone for good).

``guard(checkpoints)`` wraps the training loop. On a ``DistributedError`` (a peer died, or
stopped answering within the group's timeout) or any other exception of a step it:

1. holds a **roll call** on the rendezvous store (torchrun's ``MASTER_ADDR:MASTER_PORT``):
   each surviving process writes its rank under a key of this run of the group and waits
   up to ``grace`` seconds for the others; the ranks that never answer are the lost ones.
   The survivors fail together: a process that detects the failure has already torn its
   group down (``ParallelExecutor`` aborts on a failed step), which closes its sockets and
   fails its peers' collectives too. A process that cannot reach the store itself (its
   own link is cut, or the store's node is gone) says so;
2. prints one line to stderr, e.g. ``ssaexec: rank 1 of 6 stopped at step 17: rank(s) 4,
   5 lost (no answer within 3 s); last checkpoint /ck/step-00000015.safetensors (step 15)``;
3. ends the process with status 1 at once (``os._exit``: no atexit teardown of a process
   group whose peers are gone, which can block).

torchrun's agent stops the other workers of a machine with SIGTERM when one of them
fails; inside the guard (main thread) that SIGTERM also ends in one line, then status 143.
A process that finds the store unreachable also ends its own torchrun agent (SIGTERM, then
SIGKILL after 1 s), which would otherwise block in a store call on the dead link for as
long as TCP keeps retransmitting (about 15 minutes) and could not rejoin anyway.

Entering the guard is a collective: rank 0's token, broadcast, names this run of the
group in the store (a restarted group gets a new one, so an old round's answers never
count).
"""

import contextlib
import datetime
import os
import secrets
import signal
import sys
import threading
import time

from . import world as distributed
from ..core.errors import DistributedError

__all__ = ["guard", "roll_call", "DEFAULT_GRACE"]

DEFAULT_GRACE = 3.0


class _Group:
    """What the roll call needs, taken while the group still works."""

    __slots__ = ("store", "token", "rank", "world", "where")

    def __init__(self, grace):
        self.rank, self.world = distributed.rank(), distributed.world_size()
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        self.where = f"{host}:{port}"
        self.store = self.token = None
        if self.world == 1 or not host or not port:
            return
        token = secrets.token_hex(8) if self.rank == 0 else None
        self.token = distributed.collective().gather_objects(token, "the roll-call token")[0]
        import torch.distributed as dist
        try:
            self.store = dist.TCPStore(host, int(port), is_master=False,
                                       timeout=datetime.timedelta(seconds=grace),
                                       wait_for_workers=False)
        except Exception:  # noqa: BLE001 - no roll call then; the failure line says so
            self.store = None


def roll_call(group, grace=DEFAULT_GRACE):
    """Answer the roll call and wait up to ``grace`` s for the others.

    Returns the sorted ranks that did not answer, or None when the store cannot be
    reached (this process is the one cut off, or the store's node is lost).
    """
    if group.store is None:
        return None
    # a store call on a cut link can block past the store's own timeout (``check`` has
    # none): the call runs in a daemon thread, and no answer in time means no store
    answer = []
    t = threading.Thread(target=lambda: answer.append(_answer(group, grace)), daemon=True,
                         name="ssaexec-roll-call")
    t.start()
    t.join(grace + 0.5)
    return answer[0] if answer else None


def _answer(group, grace):
    prefix = f"ssaexec/roll-call/{group.token}/"
    try:
        group.store.set(prefix + str(group.rank), "1")
        missing = [r for r in range(group.world) if r != group.rank]
        deadline = time.monotonic() + grace
        while missing:
            missing = [r for r in missing if not group.store.check([prefix + str(r)])]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # polling a store: there is no event to wait on across hosts
        return missing
    except Exception:  # noqa: BLE001 - the store does not answer us
        return None


def _line(group, step, lost, grace, checkpoints, exc):
    who = f"rank {group.rank} of {group.world}"
    at = f" at step {step}" if step is not None else ""
    if lost is None and group.world > 1:
        what = (f"the rendezvous store at {group.where} does not answer (this node is cut "
                "off, or the store's node is lost)")
    elif lost:
        what = f"rank(s) {', '.join(map(str, lost))} lost (no answer within {grace:g} s)"
    elif isinstance(exc, _Stopped):
        what = str(exc)
    else:
        first = str(exc).splitlines()[0] if str(exc) else ""
        what = f"{type(exc).__name__}: {first}"
    # the folder, not this rank's memory: rank 0 may have died before or after a rename
    steps = checkpoints.steps() if checkpoints is not None else []
    if steps:
        last = f"last checkpoint {checkpoints.path(steps[-1])} (step {steps[-1]})"
    elif checkpoints is not None:
        last = "no checkpoint yet (a restart begins at step 0)"
    else:
        last = "no checkpoints kept"
    return f"ssaexec: {who} stopped{at}: {what}; {last}"


class _Guard:
    __slots__ = ("checkpoints", "grace", "group", "step")

    def __init__(self, checkpoints, grace):
        self.checkpoints, self.grace = checkpoints, grace
        self.group = _Group(grace)
        self.step = None  # the step in progress, for the line (``guard().step = k``)

    @property
    def token(self):
        """Names this run of the group (rank 0's, the same on every rank; "local" alone)."""
        return self.group.token or "local"


@contextlib.contextmanager
def guard(checkpoints=None, grace=DEFAULT_GRACE, exit=True):
    """Run the training loop; on a failed step, roll call, one line, exit status 1.

    Parameters
    ----------
    checkpoints : resume.Checkpoints, optional
        Its folder's newest complete checkpoint is named in the line.
    grace : float
        Seconds the roll call waits for the other survivors.
    exit : bool
        False: re-raise after the line instead of ending the process (for tests).

    Yields an object whose ``step`` the loop may set (the step in progress), for the line.
    """
    g = _Guard(checkpoints, grace)
    previous = _on_sigterm(g) if exit else None
    try:
        yield g
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        lost = roll_call(g.group, grace) if isinstance(e, DistributedError) else []
        _say(_line(g.group, g.step, lost, grace, checkpoints, e))
        if not exit:
            raise
        if lost is None and g.group.world > 1:
            _end_agent()
        sys.stdout.flush()
        os._exit(1)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _end_agent():
    # Cut off from the rendezvous store, this machine's torchrun agent blocks in a store
    # call that TCP abandons only after its retransmission limit (about 15 minutes by
    # default): it can neither rejoin nor leave. The run goes on without this machine, so
    # end the agent (SIGTERM: it stops its workers and exits) rather than leave it hung.
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return
    if os.environ.get("TORCHELASTIC_RUN_ID") and ("torchrun" in parent or
                                                  "torch.distributed.run" in parent):
        _say(f"ssaexec: rank {distributed.rank()}: ending this machine's torchrun (pid "
             f"{ppid}): cut off from the rendezvous, it cannot rejoin")
        # SIGTERM first; blocked inside a C++ store call its handler never runs, so SIGKILL
        try:
            os.kill(ppid, signal.SIGTERM)
            deadline = time.monotonic() + 1.0
            while os.getppid() == ppid and time.monotonic() < deadline:
                time.sleep(0.05)  # waiting for another process to die: no event to wait on
            if os.getppid() == ppid:
                os.kill(ppid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _say(line):
    # one write of the whole line: several ranks share a log, and print() writes the
    # text and the newline apart
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _Stopped(Exception):
    """What the line says of a SIGTERM."""

    def __str__(self):
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            return "torchrun stopped this worker (SIGTERM: a worker of this machine failed)"
        return "stopped by SIGTERM"


def _on_sigterm(g):
    # torchrun's agent stops every worker of its machine with SIGTERM when one fails; the
    # line then says so (and which step and checkpoint), instead of a silent death
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        _say(_line(g.group, g.step, [], g.grace, g.checkpoints, _Stopped()))
        os._exit(128 + signal.SIGTERM)
    return signal.signal(signal.SIGTERM, stop)
