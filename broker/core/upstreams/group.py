"""The runtime of one upstream group: choose a server for a call, hear how the call
ended, pause a server, and say when a server will be usable again.

    group = UpstreamGroup(spec)
    peer = group.pick(key, now)          # a Peer (its conns + 1), or None
    peer = group.pick(key, now, tried)   # a move: a server the attempt has not tried
    if peer is None:
        why = group.unavailable(now)     # every server down, or busy until why.until
    ...
    group.done(peer, failed, now)        # conns - 1 and nginx's failure accounting
    group.release(peer)                  # conns - 1 only: an aborted call
    group.pause(peer, until)             # a 429/503 with Retry-After: skip it until then
    group.checked(peer, ok, now)         # an active health check's result (health.py)

zstalk has one state owner, so every dispatcher shares this one view of every server:
what open-source nginx has only with a `zone`, each worker otherwise keeping its own.
The state is not durable (a restart starts every server fresh); a reload keeps each
server's state while its url as written stays in the upstream (`reload`), and starts the
slow start (peer.py) of a server it adds to an upstream or brings back from `down`.
With a `health_check`, each server carries its check state (health.Check): a server
new to the group starts healthy, or unhealthy if the check is `mandatory`; a reload
that removes the check makes every server healthy.

A server with `resolve` (spec.py) is one peer per address of its name, as nginx's
`server ... resolve` is: `resolved(url, addresses, now)` is the broker's lookup of the
name (made off the core, broker/resolver.py), and the group it returns has a peer per
address, in the order of the addresses (sorted by the caller, so a hash map does not
move with the resolver's order), each a copy of the server's parameters.  An address
that stays keeps its peer's state; a new one starts fresh, in slow start unless it is
the name's first lookup (the broker's start, like a server of the config file); one
that went leaves the picks at once, its calls in flight ending on it (`draining`, shown
until they have).  A lookup that found nothing keeps the last set (the caller warns).
Until its first lookup the name is one peer at its url as written, which the HTTP
client resolves itself, as a server without `resolve` is.

Pure: no clock, socket or thread; `now` is monotonic seconds, a parameter.  nginx's
sources for each rule are cited in peer.py (state, failures) and balance.py (methods).
"""
from __future__ import annotations

import random
from typing import Iterable, Mapping, NamedTuple

from .balance import Peers, Rand, method
from .next import tries
from .peer import Peer
from .spec import ServerSpec, UpstreamSpec
from .unavailable import BUSY, NO_LIVE_UPSTREAMS, Unavailable

#: where a group keeps a peer's state: (the url as written of a resolved name's peer or
#: "", its url): two names at one address are two peers, each its name's
Ident = tuple[str, str]

class PeerView(NamedTuple):
    """One server as an operator sees it."""
    url: str
    state: str                  # usable | failed | paused | full | unhealthy | down
    backup: bool
    conns: int
    fails: int
    usable_at: float | None     # when time alone makes it usable (now if it is)
    ramp_until: float | None = None     # in slow start (peer.py) until then; None: not
    share: float = 1.0          # ... with this part of its weight now
    name: str = ""              # a resolved name's peer: the url as written (`url`: its
    #                             address's)
    up: bool | None = None      # active health checks: healthy or not (None: no checks)
    last_check: float | None = None     # ... when the last result came (None: never)
    check_error: str | None = None      # ... why the last one failed (None: it passed)


class UpstreamGroup:
    """One upstream: its spec, its peers in config order and the method that picks."""

    def __init__(self, spec: UpstreamSpec, rand: Rand = random.randrange,
                 keep: Mapping[Ident, Peer] | None = None, now: float | None = None,
                 addresses: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """`spec` must have passed `validate`.  `keep`: peers by `ident` to carry over (a
        reload at `now`: a server added or back from down starts its slow start).
        `addresses`: the last lookup of each resolved name, by its url as written."""
        keep = keep or {}
        self.spec = spec
        self.rand = rand
        self.addresses = {server.url: addresses[server.url] for server in spec.servers
                          if server.resolve and addresses and server.url in addresses}
        self.peers = tuple(self._peer(one, keep, now) for server in spec.servers
                           for one in self._expand(server))
        self.draining: list[Peer] = []      # gone from the peers with calls in flight
        self._attach_checks(spec.health_check)
        self._set = Peers(self.peers, rand, consistent=spec.consistent)
        self._method = method(spec.balance, spec.consistent, spec.two)
        # a group of one server (nginx's peers->single) is picked the same way whatever
        # its method: that server unless it is down, full or paused, failures ignored
        self._only = self.peers[0] if self._set.single else None

    def _expand(self, server: ServerSpec) -> list[ServerSpec]:
        """A server's peers: one per address of a resolved name, else itself."""
        addresses = self.addresses.get(server.url) if server.resolve else None
        return [server.at(address) for address in addresses] if addresses else [server]

    @staticmethod
    def _peer(server: ServerSpec, keep: Mapping[Ident, Peer], now: float | None) -> Peer:
        peer = keep.get(ident(server))
        back = peer is None or peer.down and not server.down
        if peer is None:
            peer = Peer(server)
        else:
            peer.respec(server)
        if back and now is not None and not server.down:
            peer.ramp_up(now)
        return peer

    def _attach_checks(self, health) -> None:
        """Give each peer its check state (a new one: healthy unless `mandatory`), or,
        with no checks, none: healthy."""
        if health is None:
            for peer in self.peers:
                peer.up, peer.check = True, None
            return
        from .health import Check
        for peer in self.peers:
            if peer.check is None:
                peer.check = Check(up=not health.mandatory)
                peer.up = peer.check.up

    def checked(self, peer: Peer, ok: bool, now: float, error: str | None = None) -> bool:
        """An active health check of `peer` passed (`ok`) or failed; True when it made the
        server healthy again, which starts its slow start (not for a group of one)."""
        health = self.spec.health_check
        if health is None or peer.check is None:
            return False
        back = peer.check.report(ok, health, now, error)
        peer.up = peer.check.up
        if back and not self._set.single:
            peer.ramp_up(now)
        return back

    def pick(self, key: str | None, now: float, tried: Iterable[Peer] = ()) -> Peer | None:
        """The server for a call (its conns + 1), or None when none is usable.  `key`:
        the hash key, or the client's address for ip_hash; ignored by the others.
        `tried`: the servers the attempt already tried (a move, next.py), skipped as
        nginx skips its `tried` bitmap's peers: exactly where it skips a down one, so
        each method takes them as down for this pick (a hash walk keeps its map)."""
        if tried:
            return self._pick_untried(key, now, tried)
        only = self._only
        if only is not None:
            peer = only if only.usable(now, single=True) else None
        else:
            peer = self._method(self._set, key, now)
        if peer is not None:
            peer.take(now, self._set.single)
        return peer

    def _pick_untried(self, key: str | None, now: float, tried: Iterable[Peer]) -> Peer | None:
        """`pick` with the tried peers down for its length.  (nginx's hash methods resume
        their sequence where the attempt's first pick stopped; this one starts it again
        and passes the tried: the same server unless a peer the first pick skipped has
        become usable since.)"""
        marked = [peer for peer in tried if not peer.down]
        for peer in marked:
            peer.down = True
        try:
            return self.pick(key, now)
        finally:
            for peer in marked:
                peer.down = False

    def tries(self, limit: int) -> int:
        """How many servers one attempt may try (next.py: nginx's `peer.tries`)."""
        return 1 if self._set.single else tries(self.peers, limit)

    def done(self, peer: Peer, failed: bool, now: float) -> None:
        """A call on `peer` ended; `failed` as nginx's next_upstream counts failures
        (the caller decides: errors and timeouts, and the statuses it lists)."""
        peer.free(failed, now, self._set.single)

    def release(self, peer: Peer) -> None:
        """A call on `peer` was aborted (its task cancelled): one call fewer, nothing
        counted.  (nginx frees an aborted request's peer as a success, which may reset its
        fails; an abort says nothing of the server, so zstalk counts neither way.)"""
        peer.conns = max(0, peer.conns - 1)

    def pause(self, peer: Peer, until: float) -> None:
        """Skip `peer` until `until` (zstalk's, for Retry-After; not a failure).  Of two
        answers in flight together, the later end wins."""
        peer.paused_until = max(peer.paused_until, until)

    def next_usable(self, now: float) -> float | None:
        """The earliest time a server is usable by time alone: `now` if one is; None if
        none will be without a call ending (at max_conns) or ever (down)."""
        times = [t for peer in self.peers if (t := peer.usable_at(now, self._set.single)) is not None]
        return min(times, default=None)

    def unavailable(self, now: float) -> Unavailable:
        """Why `pick` gave None at `now`: every server down or unhealthy is nginx's "no
        live upstreams" (a health check, not time, brings one back)."""
        if all(peer.down or not peer.up for peer in self.peers):
            return Unavailable(NO_LIVE_UPSTREAMS, None)
        return Unavailable(BUSY, self.next_usable(now))

    def view(self, now: float) -> list[PeerView]:
        """Every server's state, in config order."""
        single = self._set.single
        return [PeerView(p.url, _state(p, now, single), p.backup, p.conns, p.fails,
                         p.usable_at(now, single), *_ramp(p, now, single), p.spec.written,
                         *((p.up, p.check.last_check, p.check.last_error) if p.check is not None
                           else ()))
                for p in self.peers] + [
                PeerView(p.url, "draining", p.backup, p.conns, p.fails, None,
                         name=p.spec.written) for p in self.draining if p.conns > 0]

    def reload(self, spec: UpstreamSpec, now: float | None = None) -> UpstreamGroup:
        """This upstream under a new spec (SIGHUP at `now`): a server whose url as
        written is in both keeps its state (and a resolved name its last lookup); the
        others start fresh, in slow start."""
        return self._rebuild(spec, now, self.addresses)

    def resolved(self, url: str, addresses: Iterable[str], now: float) -> UpstreamGroup:
        """This upstream after a lookup of the resolved name `url` found `addresses`
        (self when nothing changed: none found, the same set, or no such server now)."""
        addresses = tuple(addresses)
        if not addresses or self.addresses.get(url) == addresses or not any(
                server.url == url and server.resolve for server in self.spec.servers):
            return self
        first = url not in self.addresses       # (no slow start: as at the broker's start)
        return self._rebuild(self.spec, None if first else now,
                             {**self.addresses, url: addresses})

    def _rebuild(self, spec: UpstreamSpec, now: float | None,
                 addresses: Mapping[str, tuple[str, ...]]) -> UpstreamGroup:
        group = UpstreamGroup(spec, self.rand, {ident(p.spec): p for p in self.peers}, now,
                              addresses)
        kept = set(map(id, group.peers))
        group.draining = [p for p in (*self.peers, *self.draining)
                          if p.conns > 0 and id(p) not in kept]
        return group

    def names(self) -> list[ServerSpec]:
        """The servers whose names the broker looks up (`resolve`)."""
        return [server for server in self.spec.servers if server.resolve]


def ident(server: ServerSpec) -> Ident:
    """Where a group keeps the state of the peer of `server` (a peer's own spec)."""
    return server.written, server.url


def _ramp(peer: Peer, now: float, single: bool) -> tuple[float | None, float]:
    """A view's slow start: until when, and the share of its weight now."""
    if now < peer.ramp_until and not single:
        return peer.ramp_until, peer.share(now)
    return None, 1.0


def _state(peer: Peer, now: float, single: bool) -> str:
    if peer.down:
        return "down"
    if not peer.up:
        return "unhealthy"
    if not single and peer.failed(now):
        return "failed"
    if now < peer.paused_until:
        return "paused"
    return "full" if peer.full() else "usable"


def reload_groups(groups: Mapping[str, UpstreamGroup], specs: Iterable[UpstreamSpec],
                  rand: Rand = random.randrange,
                  now: float | None = None) -> dict[str, UpstreamGroup]:
    """The groups for a reloaded config (at `now`): an upstream that stays keeps its
    servers' state by (upstream name, url as written), and the servers it gains start
    slow; a new upstream starts fresh, at full weight; a removed one is gone."""
    return {spec.name: groups[spec.name].reload(spec, now) if spec.name in groups
            else UpstreamGroup(spec, rand) for spec in specs}
