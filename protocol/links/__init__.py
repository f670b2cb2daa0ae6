"""A front's link to its broker, whichever way it runs: the address chooses the transport.

This room holds the links and what they share: the owner's side of a link (owner.py), the
in-process mailbox (mailbox.py), the ZeroMQ link (zeromq.py) and what its failed
handshakes mean (handshakes.py); `open_link`, below, picks one.

`local:NAME` is a broker actor in this process (mailbox.py: no socket, no encoding), in the
way ZeroMQ's `inproc://` names a socket in the same context; `tcp://…` and `ipc://…` are
a broker across ZeroMQ (zeromq.py, which loads zmq only then).  Both links take the same
calls from their owner and call it back the same way (owner.py), so a front, a worker
pool or a dispatcher never knows where its broker runs.
"""
from __future__ import annotations

from .mailbox import LOCAL_PREFIX, local_link


def open_link(address: str, kind: str, owner, hold_s: float = 5.0, **kwargs):
    """The link to the broker at `address`: in this process (`local:`) or over ZeroMQ."""
    if address.startswith(LOCAL_PREFIX):
        return local_link(address, kind, owner)
    from .zeromq import BrokerLink
    return BrokerLink(address, kind, owner, hold_s=hold_s, **kwargs)
