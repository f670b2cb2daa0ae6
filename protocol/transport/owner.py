"""What a front gives its link to the broker, and the link states both kinds of link share.

A link (an in-process `mailbox.LocalLink` or a ZeroMQ `link.BrokerLink`) calls its owner
back on the event loop with the schema's messages: replies to the ops it submitted, a
Welcome, the loss of its broker, a fence.  The owner tells it, for a re-registration,
what its sessions are.  A link is CONNECTING (Hello sent, no Welcome yet) or READY;
a BrokerLink has states of its own beyond these (link.py).
"""
from __future__ import annotations

from ..schema import SessionState, Welcome

CONNECTING, READY = "connecting", "ready"


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
