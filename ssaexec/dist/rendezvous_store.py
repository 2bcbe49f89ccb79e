"""The store a worker group meets in when torchrun shares its own (a fresh one per group).

Why. Since torch 2.5, torchrun's c10d rendezvous shares one TCPStore between the agents and
the workers (``TORCHELASTIC_USE_AGENT_STORE=True``), and in torch 2.13 that server lives as
long as the agent: a restarted worker group (``--max-restarts``, or a node lost or joined)
meets in the store its dead predecessors wrote to. Process-group set-up reads each peer's
address from keys it expects to be fresh, finds the previous group's, and fails ("Gloo
connectFullMesh failed ... Connection refused"; pytorch/pytorch#135712, #167288). No key
prefix fixes it from inside the workers: ``TORCHELASTIC_RESTART_COUNT`` differs between
nodes after a membership change.

Policy. When the agent's store is shared, rank 0 starts a TCPStore server of its own
(on rank 0's machine, which is ``MASTER_ADDR``: the agent that hosts the shared store is
the one whose workers start at global rank 0) on a free port, writes a random nonce into
it, and publishes ``port:nonce`` in the shared store. Every other rank reads that record,
connects, and checks the nonce. A record left by an earlier group names a server that
died with its process (the connection is refused) or one without that nonce, so the rank
reads again until the current record appears, within the group's timeout. The new group
then sets up in a store nobody used before. Without a shared agent store (``python``
alone, torchrun with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, a static rendezvous),
torch's own ``env://`` set-up is used unchanged.
"""

import datetime
import os
import secrets
import socket
import time

from ..core.errors import DistributedError

__all__ = ["agent_store_is_shared", "fresh_store"]

_RECORD = "ssaexec/worker-store"
_NONCE = "ssaexec/nonce"


def agent_store_is_shared():
    """True when torchrun handed the workers its own, long-lived store."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def fresh_store(rank, world, timeout):
    """A store for this group alone (see the module docstring); ``timeout`` in seconds."""
    import torch.distributed as dist
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    td = datetime.timedelta(seconds=timeout)
    shared = dist.TCPStore(host, port, is_master=False, timeout=td)
    if rank == 0:
        own = dist.TCPStore("0.0.0.0", 0, world_size=world, is_master=True, timeout=td,
                            wait_for_workers=False)
        nonce = secrets.token_hex(8)
        own.set(_NONCE, nonce)
        shared.set(_RECORD, f"{own.port}:{nonce}")
        return own
    deadline = time.monotonic() + timeout
    while True:
        record = shared.get(_RECORD).decode()  # waits (up to timeout) for a first record
        own_port, nonce = record.split(":")
        if _listening(host, int(own_port)):  # else an earlier group's server, gone with it
            try:
                own = dist.TCPStore(host, int(own_port), is_master=False,
                                    timeout=datetime.timedelta(seconds=2))
                if own.get(_NONCE).decode() == nonce:
                    own.set_timeout(td)
                    return own
            except Exception:  # noqa: BLE001 - a server, but not this group's
                pass
        if time.monotonic() >= deadline:
            raise DistributedError(f"rank {rank} of {world}: rank 0 published no store for "
                                   f"this group at {host}:{port} within {timeout:g} s")
        time.sleep(0.05)  # rank 0 has not published yet: the store has no event to wait on


def _listening(host, port):
    # a plain connect: refused at once by a dead server, where a TCPStore client would
    # retry (and log each try) until its timeout
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False
