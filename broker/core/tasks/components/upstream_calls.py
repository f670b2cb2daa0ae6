"""Calls of functions on an upstream: the broker picks the server of every call, so every
dispatcher shares one view of every server (broker/core/upstreams/: nginx's methods and
failure accounting, pure).

The task store asks this at three points:

* `pick(task, spec, now)` when it is about to hand a task out: a Peer (the call goes to
  its url + the function's path), or an `Unavailable`: BUSY (every server failed, at
  max_conns or paused: the function is held back until `until`, or until a call on the
  upstream ends) or NO_LIVE_UPSTREAMS (every server is down: the attempt fails).
* `done(upstream, peer, failed, error, now)` when the call ends: nginx's accounting, with
  what counts as a failure decided by the function's `next_upstream` (`failed`); it
  gives the functions a full upstream held back, to be offered again (`ended`).
* `pause(task, until)` for a 429 / 503 with Retry-After: that server only.

A server with `resolve` is one peer per address of its name (upstreams/group.py); the
broker looks the names (`names`) up off the core and hands each answer to `resolved`.

An upstream may also have a `concurrency` and a `rate` of its own (zstalk's, not
nginx's), which every function on it shares beside its own: `full` and `opens_at` say
whether one more call may start, `started` and `ended` count them, and the functions a
full upstream held back (`waiting`) are offered again when a call on it ends.

The hash key of a task is taken at enqueue (`balance_key`, for the upstreams in
`keyed`): its uniqueId, a top-level field of its params, or its client's address
(`client_ip`, also ip_hash's key); a task without one is balanced by round robin, as
nginx does with an empty key.
"""
from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Iterable

from ...upstreams.unavailable import NO_LIVE_UPSTREAMS, Unavailable
from .limits import Gate

if TYPE_CHECKING:
    from ...upstreams.group import UpstreamGroup
    from ...upstreams.peer import Peer
    from ...upstreams.spec import ServerSpec, UpstreamSpec

SERVER_ERROR_CHARS = 200    # a server's last error, as shown


class UpstreamCalls:
    def __init__(self, specs: Iterable[UpstreamSpec] = (), rand=random.randrange,
                 started_at: float = float("-inf")) -> None:
        self.rand = rand
        self.started_at = started_at        # (gates get no burst credit from before it)
        specs = list(specs)
        self.groups: dict[str, UpstreamGroup] = {}
        if specs:       # (the balancing code loads only for a config that has upstreams)
            from ...upstreams.group import UpstreamGroup
            self.groups = {s.name: UpstreamGroup(s, rand) for s in specs}
        # the upstreams with a concurrency or a rate of their own: only they are counted
        # (a call on another costs no lookup for them)
        self.limited = {s.name: s for s in specs if s.concurrency or s.rate}
        self.keyed = _keyed(specs)          # ... and those whose calls are hashed by a key
        self.last_error: dict[tuple[str, str], str] = {}    # (upstream, url) -> last error
        self.running: dict[str, int] = {}   # upstream -> calls in flight on it
        self.gates: dict[str, Gate] = {}    # upstream -> its own rate
        self.waiting: dict[str, set[str]] = {}  # upstream -> functions it held back (full)

    def reload(self, specs: Iterable[UpstreamSpec], now: float | None = None) -> None:
        """SIGHUP (at `now`): a server keeps its state while (upstream, url as written)
        stays, one added starts slow (peer.py); a rate keeps its TAT."""
        specs = list(specs)
        if specs or self.groups:
            from ...upstreams.group import reload_groups
            self.groups = reload_groups(self.groups, specs, self.rand, now)
        self.limited = {s.name: s for s in specs if s.concurrency or s.rate}
        self.keyed = _keyed(specs)
        for spec in specs:
            gate = self.gates.get(spec.name)
            if gate is not None:
                gate.configure(spec.per_s / spec.rate if spec.rate else 0.0, spec.burst)
        self._forget_errors()

    def _forget_errors(self) -> None:
        """Drop the last errors of servers no upstream has now."""
        kept = {(name, peer.url) for name, g in self.groups.items() for peer in g.peers}
        self.last_error = {k: v for k, v in self.last_error.items() if k in kept}

    # -- resolved names -------------------------------------------------------------------
    def names(self) -> list[tuple[str, ServerSpec]]:
        """(upstream, server) of every server whose name the broker looks up."""
        return [(name, server) for name, group in self.groups.items()
                for server in group.names()]

    def resolved(self, upstream: str, url: str, addresses: Iterable[str], now: float) -> bool:
        """A lookup of the name of `upstream`'s server `url` found `addresses` (sorted;
        none: the last set stays); whether the peers changed."""
        group = self.groups.get(upstream)
        if group is None:
            return False
        new = group.resolved(url, addresses, now)
        if new is group:
            return False
        self.groups[upstream] = new
        self._forget_errors()           # (of addresses gone: DNS churn must not grow it)
        return True

    def pool(self, upstream: str) -> tuple | None:
        """A call's "pool" (task_messages.Call): the upstream and its keep-alive settings."""
        group = self.groups.get(upstream)
        if group is None:
            return None
        spec = group.spec
        return (upstream, spec.keepalive, round(spec.keepalive_timeout_s * 1000),
                spec.keepalive_requests)

    # -- at enqueue ----------------------------------------------------------------------
    def balance_key(self, upstream: str | None, uid: str, params: bytes,
                    client_ip: str | None) -> str | None:
        """What the task's calls are hashed by (None: round robin; or an upstream that
        hashes nothing, which `keyed` says without the call)."""
        group = self.groups.get(upstream) if upstream in self.keyed else None
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
             now: float) -> set[str] | tuple:
        """A call on `peer` ended: nginx's accounting, and the upstream's own count; the
        functions its concurrency held back (`ended`)."""
        group = self.groups.get(upstream)
        if group is not None and peer in group.peers:
            group.done(peer, failed, now)
        else:
            peer.conns = max(0, peer.conns - 1)     # (a server reloaded away meanwhile)
        if error:
            self.last_error[upstream, peer.url] = error[:SERVER_ERROR_CHARS]
        return self.ended(upstream)

    def pause(self, upstream: str, peer: Peer, until: float) -> None:
        group = self.groups.get(upstream)
        if group is not None:
            group.pause(peer, until)

    # -- the upstream's own limits ----------------------------------------------------------
    def full(self, upstream: str) -> bool:
        spec = self.limited.get(upstream)
        return spec is not None and bool(spec.concurrency) and (
            self.running.get(upstream, 0) >= spec.concurrency)

    def opens_at(self, upstream: str, now: float) -> float:
        """When the upstream's rate lets its next call start (0.0: no rate)."""
        if upstream not in self.limited:
            return 0.0
        gate = self._gate(upstream, now)
        return gate.opens_at() if gate is not None else 0.0

    def started(self, upstream: str, now: float) -> None:
        if upstream not in self.limited:
            return
        self.running[upstream] = self.running.get(upstream, 0) + 1
        gate = self._gate(upstream, now)
        if gate is not None:
            gate.start(now)

    def ended(self, upstream: str) -> set[str] | tuple:
        """A call on `upstream` ended: the functions its concurrency held back."""
        if upstream not in self.running:
            return self.waiting.pop(upstream, ()) if self.waiting else ()
        left = self.running.get(upstream, 0) - 1
        if left > 0:
            self.running[upstream] = left
        else:
            self.running.pop(upstream, None)
        return self.waiting.pop(upstream, ())

    def _gate(self, upstream: str, now: float) -> Gate | None:
        gate = self.gates.get(upstream)
        if gate is None:
            group = self.groups.get(upstream)
            if group is None or not group.spec.rate:
                return None
            spec = group.spec
            interval = spec.per_s / spec.rate
            gate = self.gates[upstream] = Gate(interval, spec.burst, now,
                                               tat=self.started_at + interval * spec.burst)
        return gate

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
            if view.name:                       # (a resolved name's peer: its address)
                server["name"] = view.name
            if view.backup:
                server["backup"] = True
            if view.state in ("failed", "paused") and view.usable_at is not None:
                server["usableAt"] = view.usable_at + wall_offset
            if view.ramp_until is not None:     # (slow start: its weight now, and until)
                server["weightShare"] = round(view.share, 3)
                server["slowStartUntil"] = view.ramp_until + wall_offset
            if view.up is not None:     # (active health checks: the last result's)
                server["health"] = {"status": "up" if view.up else "down", "lastCheck":
                                    None if view.last_check is None
                                    else view.last_check + wall_offset}
                if view.check_error:
                    server["health"]["error"] = view.check_error
            error = self.last_error.get((upstream, view.url))
            if error:
                server["lastError"] = error
            out.append(server)
        return out


def _keyed(specs: Iterable[UpstreamSpec]) -> frozenset[str]:
    """The upstreams whose calls are hashed by a key taken at enqueue."""
    return frozenset(s.name for s in specs if s.balance in ("ip_hash", "hash"))


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
        try:
            value.encode()
        except UnicodeEncodeError:          # (a lone surrogate: no key, round robin)
            return None
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return json.dumps(value)
    return None
