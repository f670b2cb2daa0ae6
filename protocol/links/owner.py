"""What a front gives its link to the broker, and the link states both kinds of link share.

A link (an in-process `mailbox.LocalLink` or a ZeroMQ `link.BrokerLink`) calls its owner
back on the event loop with the schema's messages: replies to the ops it submitted, a
Welcome, the loss of its broker, a fence.  The owner tells it, for a re-registration,
what its sessions are.  A link is CONNECTING (Hello sent, no Welcome yet) or READY;
a BrokerLink has states of its own beyond these (zeromq.py).

Both kinds keep a `LinkStats` for their front's /metrics: ops held while no broker
answered, held ops failed when their time ran out, and the round trip to the broker,
sampled (a BrokerLink's on its heartbeat, a LocalLink's once per PROBE_S), not timed per
batch: a clock read per batch would show in the benchmarks.
"""
from __future__ import annotations

from ..codecs.prometheus import LATENCY_BUCKETS, Histogram
from ..schema import SessionState, Welcome

CONNECTING, READY = "connecting", "ready"
PROBE_S = 1.0


class LinkStats:
    """`armed` is set now and then; the next batch sent then that the broker answers at
    once (not only a waiting reserve) is timed (`sent_at`) to the replies that follow
    it."""
    __slots__ = ("held", "failed", "round_trip", "armed", "sent_at")

    def __init__(self) -> None:
        self.held = 0               # ops held while the link was not READY
        self.failed = 0             # held ops answered INTERNAL_ERROR (hold_s ran out, full)
        self.round_trip = Histogram(LATENCY_BUCKETS)
        self.armed = False
        self.sent_at: float | None = None


class LinkOwner:
    """What a front supplies to its link (all called on the event loop)."""
    def on_replies(self, items: list) -> None: ...
    def on_welcome(self, welcome: Welcome) -> None: ...
    def on_lost(self) -> None: ...
    def on_fenced(self) -> None: ...
    def session_states(self) -> list[SessionState]: ...
    # optional: on_stopped() -> list[tuple], after a graceful stop (schema.Stopping): as
    # on_lost, except that every op the broker left unanswered never ran; it returns the
    # ones already sent, in order, for the next broker (the beanstalk front's resend them)
