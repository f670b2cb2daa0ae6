"""A front's link to its broker, whichever way it runs: the address chooses the transport.

This room holds the links and what they share: the owner's side of a link (owner.py), the
in-process mailbox (mailbox.py), the ZeroMQ link (zeromq.py) and what its failed
handshakes mean (handshakes.py); `open_link`, below, picks one.

`local:NAME` is a broker actor in this process (mailbox.py: no socket, no encoding), in the
way ZeroMQ's `inproc://` names a socket in the same context; `tcp://…` and `ipc://…` are
a broker across ZeroMQ (zeromq.py, which loads zmq only then); a comma-separated list of
those names the instances of one journal, and the link follows whichever leads.  Both
links take the same calls from their owner and call it back the same way (owner.py), so a
front, a worker pool or a dispatcher never knows where its broker runs.

`relink` moves an owner from its link to another broker: the fronts of a `zstalk serve
--journal` instance that stood by, following the leader across ZeroMQ, go to the broker
beside them when their own instance takes over (broker/run/following.py).
"""
from __future__ import annotations

from ..schema import SILENT_OPS
from .mailbox import LOCAL_PREFIX, local_link
from .owner import CONNECTING


def open_link(address: str, kind: str, owner, hold_s: float = 5.0, **kwargs):
    """The link to the broker at `address`: in this process (`local:`) or over ZeroMQ."""
    if address.startswith(LOCAL_PREFIX):
        if "," in address:
            raise ValueError(f"{address}: a local: broker is the only one in its list")
        return local_link(address, kind, owner)
    from .zeromq import BrokerLink
    return BrokerLink(address, kind, owner, hold_s=hold_s, **kwargs)


def relink(owner, address: str, hold_s: float = 5.0) -> None:
    """Move `owner` from its link to a new one at `address`, as a link that lost its broker
    goes to the next (zeromq.py): what the old broker was sent and had not answered when
    it was lost is the owner's to fail (`on_lost`: INTERNAL_ERROR, a 503), never replayed;
    what was held since, or not sent yet, goes to the new one, once; the sessions
    re-register as after a restart (the state_id travels: a journal's outlives its
    leaders).  The owner's `link` is the new one from then on."""
    old = owner.link
    unsent = old.take_unsent()
    lost = old.state is not CONNECTING
    old.close()
    if lost:            # it was welcomed: what it awaits was sent (or is this turn's)
        unsent = [op for op in unsent if op[0] in SILENT_OPS]
        owner.on_lost()
    new = open_link(address, old.kind, owner, hold_s=hold_s)
    for op in unsent:
        new.submit(op)
    new.state_id, new.stats = old.state_id, old.stats     # (held: counted once, by the old)
    owner.link = new
    new.start()
