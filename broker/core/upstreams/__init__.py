"""Upstream groups balanced exactly as nginx balances them (issue 30), pure: the spec and
its validation (spec.py), nginx's hash functions (hashing.py), a server's state and
failure accounting (peer.py), the balancing methods (balance.py), and one group's
runtime (group.py): `pick(key, now)`, `done(peer, failed, now)`, `pause(peer, until)`.
"""
from .group import BUSY, NO_LIVE_UPSTREAMS, PeerView, Unavailable, UpstreamGroup, reload_groups
from .peer import Peer
from .spec import BALANCES, ServerSpec, SpecError, UpstreamSpec, validate

__all__ = [
    "BALANCES", "BUSY", "NO_LIVE_UPSTREAMS", "Peer", "PeerView", "ServerSpec", "SpecError",
    "Unavailable", "UpstreamGroup", "UpstreamSpec", "reload_groups", "validate",
]
