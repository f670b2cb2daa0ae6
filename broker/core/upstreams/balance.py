"""nginx's balancing methods over one upstream's peers, each `(peers, key, now) -> Peer |
None`; None is nginx's NGX_BUSY: no peer is usable.  The caller counts the pick (`take`).

- round_robin (ngx_http_upstream_get_round_robin_peer): a group of one server takes it
  unless it is down or full, failures ignored; otherwise smooth weighted round robin over
  the primaries, and over the backups only when no primary is usable.
- least_conn (ngx_http_upstream_least_conn_module.c): the usable peer with the fewest
  conns per weight, compared crosswise (a.conns * b.weight < b.conns * a.weight), the
  first in order on a tie; if others tie with it, a second pass runs smooth weighted
  round robin over the tied peers from it on.  Backups as in round robin.
- ip_hash, hash: a hash of the key picks a primary by walking them in order with
  `hash % total_weight`, down peers included so the map does not move; an unusable
  pick tries the next hash, and after 21 picks (nginx: `tries > 20`) round robin
  decides.  A group of fewer than two servers, or no key, is round robin.
- hash consistent: the first ring point at or after crc32(key) names a server string;
  smooth weighted round robin among the usable peers with that string (one, unless two
  urls share a host:port); none usable: the next point, 21 points at most, then round
  robin.
- random (ngx_http_upstream_random_module.c): `rand(total_weight)` over cumulative
  weights, found by binary search; an unusable draw draws again, 21 at most, then round
  robin.  random two: draws until a second usable peer different from the first, and
  keeps the one with fewer conns per weight, ties to the second draw.

nginx's `rand` is ngx_random() (random(3)), whose sequence a test cannot share, so it is
a parameter: any `Callable[[int], int]` giving a uniform integer below its argument.

A call moved to the next server (next.py) is picked with the attempt's tried peers taken
as down (group.py `pick(..., tried)`): nginx skips a peer in its `tried` bitmap at the
same test as a down one.  The hash methods' resumption (hp->hash and hp->rehash,
iphp->hash, rp->tries kept across one request's picks) is not kept: a move walks the
sequence again from its start, passing the tried peers.
"""
from __future__ import annotations

import bisect
import itertools
from typing import Callable, Iterator, Sequence

from .hashing import Ring, ip_hash_steps, ip_key, memcached_steps
from .peer import Peer, swrr

HASH_TRIES = 21         # nginx: `if (++tries > 20) return get_rr_peer(...)`, from tries = 0

Rand = Callable[[int], int]


class Peers:
    """What nginx keeps per upstream (ngx_http_upstream_rr_peers_t and the modules'
    configuration): primaries and backups in order, and what the methods precompute."""
    __slots__ = ("primary", "backup", "single", "total_weight", "by_server", "ring", "starts",
                 "rand")

    def __init__(self, peers: Sequence[Peer], rand: Rand, consistent: bool = False) -> None:
        self.primary = [peer for peer in peers if not peer.backup]
        self.backup = [peer for peer in peers if peer.backup]
        self.single = len(peers) == 1       # peers->single: one primary and no backup
        self.total_weight = sum(peer.weight for peer in self.primary)
        self.by_server: dict[str, list[Peer]] = {}
        for peer in self.primary:
            self.by_server.setdefault(peer.server, []).append(peer)
        self.ring = Ring([(p.server, p.weight) for p in self.primary]) if consistent else None
        self.starts = list(itertools.accumulate((p.weight for p in self.primary), initial=0))[:-1]
        self.rand = rand

    def walk(self, value: int) -> Peer:
        """The primary that `value % total_weight` falls on, walking weights in order."""
        w = value % self.total_weight
        for peer in self.primary:
            if w < peer.weight:
                return peer
            w -= peer.weight
        raise AssertionError("unreachable: w < total_weight")

    def draw(self) -> Peer:
        """ngx_http_upstream_peek_random_peer: a primary with odds by weight."""
        x = self.rand(self.total_weight)
        return self.primary[bisect.bisect_right(self.starts, x) - 1]


def round_robin(peers: Peers, key: str | None, now: float) -> Peer | None:
    if peers.single:
        only = peers.primary[0]
        return only if only.usable(now, single=True) else None
    return swrr(peers.primary, now) or swrr(peers.backup, now)


def _fewest(peers: Sequence[Peer], now: float) -> Peer | None:
    """ngx_http_upstream_get_least_conn_peer over one list (primaries or backups); a peer
    in slow start weighs its conns by its weight as ramped (peer.py `weight_at`)."""
    best, start, tied, best_w = None, 0, False, 1.0
    for i, peer in enumerate(peers):
        if not peer.usable(now):
            continue
        w = peer.weight_at(now)
        if best is None or peer.conns * best_w < best.conns * w:
            best, start, tied, best_w = peer, i, False, w
        elif peer.conns * best_w == best.conns * w:
            tied = True
    if best is None or not tied:
        return best         # no tie: the weights are left alone
    first, first_w, total = best, best_w, 0     # smooth weighted round robin over the
    for peer in peers[start:]:                  # tied, from the first on
        if peer.conns * first_w != first.conns * peer.weight_at(now) or not peer.usable(now):
            continue
        total += peer.step(now)
        if peer.current_weight > best.current_weight:
            best = peer
    best.current_weight -= total
    return best


def least_conn(peers: Peers, key: str | None, now: float) -> Peer | None:
    if peers.single:
        return round_robin(peers, key, now)
    return _fewest(peers.primary, now) or _fewest(peers.backup, now)


def _first_usable(peers: Peers, candidates: Iterator[Peer], now: float) -> Peer | None:
    """The first usable of HASH_TRIES candidates, else round robin's choice."""
    for peer in itertools.islice(candidates, HASH_TRIES):
        if peer is not None and peer.usable(now):
            return peer
    return round_robin(peers, None, now)


def ip_hash(peers: Peers, key: str | None, now: float) -> Peer | None:
    """`key` is the client's address; without one (zstalk: a schedule fire), round robin."""
    if key is None or len(peers.primary) < 2:
        return round_robin(peers, key, now)
    return _first_usable(peers, map(peers.walk, ip_hash_steps(ip_key(key))), now)


def hash_key(peers: Peers, key: str | None, now: float) -> Peer | None:
    if not key or len(peers.primary) < 2:
        return round_robin(peers, key, now)
    return _first_usable(peers, map(peers.walk, memcached_steps(key.encode())), now)


def consistent_hash(peers: Peers, key: str | None, now: float) -> Peer | None:
    if not key or peers.single:
        return round_robin(peers, key, now)
    ring = peers.ring
    assert ring is not None
    start = ring.find(key.encode())
    owners = (swrr(peers.by_server[ring.server_at(start + i)], now) for i in itertools.count())
    return _first_usable(peers, owners, now)


def random_one(peers: Peers, key: str | None, now: float) -> Peer | None:
    if len(peers.primary) < 2:
        return round_robin(peers, key, now)
    return _first_usable(peers, (peers.draw() for _ in itertools.count()), now)


def random_two(peers: Peers, key: str | None, now: float) -> Peer | None:
    """ngx_http_upstream_get_random2_peer: every draw but the deciding one is a try."""
    if len(peers.primary) < 2:
        return round_robin(peers, key, now)
    first = None
    for _ in range(HASH_TRIES):
        peer = peers.draw()
        if peer is first or not peer.usable(now):
            continue
        if first is None:
            first = peer
            continue
        return first if peer.conns * first.weight > first.conns * peer.weight else peer
    return round_robin(peers, key, now)


Method = Callable[[Peers, "str | None", float], "Peer | None"]


def method(balance: str, consistent: bool = False, two: bool = False) -> Method:
    """The function for a spec's balance (and its `consistent`/`two` arguments)."""
    if balance == "hash":
        return consistent_hash if consistent else hash_key
    if balance == "random":
        return random_two if two else random_one
    return {"round_robin": round_robin, "least_conn": least_conn, "ip_hash": ip_hash}[balance]
