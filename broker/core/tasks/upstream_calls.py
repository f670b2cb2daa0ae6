"""Calls of functions on an upstream: the broker picks the server of every call, so every
dispatcher shares one view of every server (broker/core/upstreams/: nginx's methods and
failure accounting, pure).

The task store asks this at three points:

* `pick(task, spec, now)` when it is about to hand a task out: a Peer (the call goes to
  its url + the function's path), or an `Unavailable`: BUSY (every server failed, at
  max_conns or paused: the function is held back until `until`, or until a call on the
  upstream ends) or NO_LIVE_UPSTREAMS (every server is down: the attempt fails).
* `done(task, outcome_failed, error, now)` when the call ends: nginx's accounting, with
  what counts as a failure decided by the function's `next_upstream` (`failed`).
* `pause(task, until)` for a 429 / 503 with Retry-After: that server only.

The hash key of a task is taken at enqueue (`balance_key`): its uniqueId, a top-level
field of its params, or its client's address (`client_ip`, also ip_hash's key); a task
without one is balanced by round robin, as nginx does with an empty key.
"""
from __future__ import annotations

import json
import random
from typing import Iterable

from ..upstreams import NO_LIVE_UPSTREAMS, Peer, Unavailable, UpstreamGroup, reload_groups
from ..upstreams.spec import UpstreamSpec

ERROR_CHARS = 200           # a server's last error, as shown


class UpstreamCalls:
    def __init__(self, specs: Iterable[UpstreamSpec] = (), rand=random.randrange) -> None:
        self.rand = rand
        self.groups: dict[str, UpstreamGroup] = {s.name: UpstreamGroup(s, rand) for s in specs}
        self.last_error: dict[tuple[str, str], str] = {}    # (upstream, url) -> last error

    def reload(self, specs: Iterable[UpstreamSpec]) -> None:
        """SIGHUP: a server keeps its state while (upstream, url as written) stays."""
        self.groups = reload_groups(self.groups, specs, self.rand)
        kept = {(name, peer.url) for name, g in self.groups.items() for peer in g.peers}
        self.last_error = {k: v for k, v in self.last_error.items() if k in kept}

    # -- at enqueue ----------------------------------------------------------------------
    def balance_key(self, upstream: str | None, uid: str, params: bytes,
                    client_ip: str | None) -> str | None:
        """What the task's calls are hashed by (None: round robin)."""
        group = self.groups.get(upstream) if upstream else None
        if group is None:
            return None
        spec = group.spec
        if spec.balance == "ip_hash" or spec.key == "clientIp":
            return client_ip
        if spec.key == "uniqueId":
            return uid
        if spec.key and spec.key.startswith("params."):
            return _param(params, spec.key[len("params."):])
        return None

    # -- calls ---------------------------------------------------------------------------
    def pick(self, upstream: str, key: str | None, now: float) -> Peer | Unavailable:
        group = self.groups.get(upstream)
        if group is None:       # (gone from the config: as if every server were down)
            return Unavailable(NO_LIVE_UPSTREAMS, None)
        peer = group.pick(key, now)
        return peer if peer is not None else group.unavailable(now)

    def done(self, upstream: str, peer: Peer, failed: bool, error: str | None,
             now: float) -> None:
        group = self.groups.get(upstream)
        if group is not None and peer in group.peers:
            group.done(peer, failed, now)
        else:
            peer.conns = max(0, peer.conns - 1)     # (a server reloaded away meanwhile)
        if error:
            self.last_error[upstream, peer.url] = error[:ERROR_CHARS]

    def pause(self, upstream: str, peer: Peer, until: float) -> None:
        group = self.groups.get(upstream)
        if group is not None:
            group.pause(peer, until)

    # -- looking -------------------------------------------------------------------------
    def servers(self, upstream: str, now: float, wall_offset: float) -> list[dict]:
        """Each server of `upstream` as GET /v1/functions/{name} shows it."""
        group = self.groups.get(upstream)
        if group is None:
            return []
        out = []
        for view in group.view(now):
            server = {"url": view.url, "state": view.state, "inFlight": view.conns,
                      "fails": view.fails}
            if view.backup:
                server["backup"] = True
            if view.state in ("failed", "paused") and view.usable_at is not None:
                server["usableAt"] = view.usable_at + wall_offset
            error = self.last_error.get((upstream, view.url))
            if error:
                server["lastError"] = error
            out.append(server)
        return out


def failed(next_upstream: frozenset, kind: str, status_code: int | None) -> bool:
    """Whether a call's end counts against its server (nginx's proxy_next_upstream): no
    connection or no answer always (`error`, `timeout`), a status only if listed."""
    if kind in ("declined", "fatal", "success"):
        return False
    if status_code is None:
        return True
    return f"http_{status_code}" in next_upstream


def _param(params: bytes, name: str) -> str | None:
    """A top-level field of a task's JSON params, as text (None: absent, or not a scalar)."""
    try:
        doc = json.loads(params)
    except (ValueError, RecursionError):
        return None
    value = doc.get(name) if isinstance(doc, dict) else None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(value)
    return None
