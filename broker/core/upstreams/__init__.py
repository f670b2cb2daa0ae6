"""Upstream groups balanced exactly as nginx balances them (issue 30), pure: the spec and
its validation (spec.py), nginx's hash functions (hashing.py), a server's state and
failure accounting (peer.py), the balancing methods (balance.py), one group's runtime
(group.py): `pick(key, now)`, `done(peer, failed, now)`, `pause(peer, until)`, why
a pick gave no server (unavailable.py), and whether a failed call moves on (next.py).

The names below load with their module on first use: a broker whose config has no
upstream answers its first command without the balancing code (zstalkd's start path).
"""
from __future__ import annotations

#: each public name and the module it is imported from, on first use
_LAZY = {"BUSY": ".unavailable", "NO_LIVE_UPSTREAMS": ".unavailable",
         "Unavailable": ".unavailable", "PeerView": ".group", "UpstreamGroup": ".group",
         "reload_groups": ".group", "Peer": ".peer", "BALANCES": ".spec",
         "ServerSpec": ".spec", "SpecError": ".spec", "UpstreamSpec": ".spec",
         "validate": ".spec", "may_move": ".next",
         "failure_class": ".next"}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
