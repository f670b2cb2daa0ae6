"""One server's runtime state and nginx's rules on it: when it may be picked, what a pick
does to it, what the end of a call does, and smooth weighted round robin over a list.

The fields are nginx's `ngx_http_upstream_rr_peer_t` (ngx_http_upstream_round_robin.h):
weight, effective_weight, current_weight, conns, fails, accessed, checked.  Every
balancer skips a peer that is `down`, failed (max_fails > 0, fails >= max_fails, and
fail_timeout has not passed since `checked`), or at max_conns.  zstalk adds `paused_until`
(a 429/503 with Retry-After): skipped the same way, kept apart from the failure state;
and `up`, False while the upstream's active health checks find the server unhealthy
(health.py, nginx Plus's health_check): skipped like `down`, its check state in `check`.

Failure accounting (ngx_http_upstream_free_round_robin_peer_locked):
- a failed call: fails += 1, accessed = checked = now, and effective_weight falls by
  weight // max_fails (at least 0); balancers add it back one per pass (`swrr`);
- a good call: fails = 0 only if a pick has moved `checked` past `accessed` since the
  last failure; a pick moves it when fail_timeout has passed since `checked` (`take`):
  that pick is the one probe of a failed peer, and a failed probe shuts it again;
- a group of one server never counts failures (`peers->single`): fails reset, always.

Slow start (nginx Plus's `slow_start=time`, which open-source nginx lacks): a server
"recovers its weight from zero to a nominal value" over that time after it becomes
usable again, so a server back from a failure, or just added, is not handed its full
share at once.  It ramps (`ramp_up`) when the probe of a failed server succeeds (its
fails were at max_fails), and, group.py, when a reload adds it or brings it back from
`down`; never for a group of one (nginx Plus ignores it there) and not at the broker's
start.  Its weight at `now` (`weight_at`, and the effective weight smooth weighted round
robin adds, `step`) is scaled by the time gone over the ramp, from zero linearly, never
quite zero (MIN_SHARE: a server at weight 0 would tie with everything in least_conn's
crosswise products).  The ramp is in floats, so current weights may carry fractions.

Time is zstalk's monotonic seconds, a float.  nginx compares whole seconds (ngx_time())
with `now - checked <= fail_timeout`, so its window lasts fail_timeout to fail_timeout + 1
seconds; here a failed peer is shut for exactly fail_timeout and usable again at
`checked + fail_timeout`, the time `usable_at` reports.
"""
from __future__ import annotations

import math
from typing import Sequence

from .spec import ServerSpec

NEVER = -math.inf       # nginx's zeroed `checked`/`accessed`: the first pick probes
#: the least share of its weight a server in slow start has (the ramp starts here)
MIN_SHARE = 0.01


class Peer:
    """A server of an upstream group: its spec and nginx's per-peer counters."""
    __slots__ = ("spec", "url", "server", "weight", "max_fails", "fail_timeout_s", "max_conns",
                 "down", "backup", "current_weight", "effective_weight", "conns", "fails",
                 "accessed", "checked", "paused_until", "conn_cap", "fail_cap", "slow_start_s",
                 "ramp_from", "ramp_until", "up", "check")

    def __init__(self, spec: ServerSpec) -> None:
        self.current_weight = 0
        self.conns = 0
        self.fails = 0
        self.accessed = self.checked = NEVER
        self.paused_until = NEVER
        self.ramp_from = self.ramp_until = NEVER    # (no ramp: the full weight)
        self.effective_weight = spec.weight
        self.up = True          # active health checks (health.py) say it is healthy
        self.check = None       # ... and their state (a health.Check), if the upstream has them
        self.respec(spec)

    def respec(self, spec: ServerSpec) -> None:
        """Take a new spec (a reload), keeping the counters; a lower weight caps the
        effective weight at once."""
        self.spec, self.url, self.server = spec, spec.url, spec.server
        self.weight, self.max_fails = spec.weight, spec.max_fails
        self.fail_timeout_s, self.max_conns = spec.fail_timeout_s, spec.max_conns
        self.down, self.backup = spec.down, spec.backup
        self.effective_weight = min(self.effective_weight, self.weight)
        self.slow_start_s = spec.slow_start_s
        self.ramp_until = self.ramp_from + spec.slow_start_s   # (a ramp under way: its new end)
        # max_conns and max_fails with 0 ("no limit") as infinity: `usable`, which every
        # pick asks of every peer, is then one expression
        self.conn_cap = spec.max_conns or math.inf
        self.fail_cap = spec.max_fails or math.inf

    def __repr__(self) -> str:
        return (f"Peer({self.url!r}, conns={self.conns}, fails={self.fails}, "
                f"current={self.current_weight}, effective={self.effective_weight})")

    def failed(self, now: float) -> bool:
        """Shut by max_fails: fails reached it and fail_timeout has not passed since checked."""
        return self.fails >= self.fail_cap and now < self.checked + self.fail_timeout_s

    def full(self) -> bool:
        return self.conns >= self.conn_cap

    def usable(self, now: float, single: bool = False) -> bool:
        """nginx's skip test (a group of one ignores failures), plus zstalk's pause:
        `full` and `failed` written out (this runs for every peer on every pick).
        A server its active health checks found unhealthy (`up` False) is skipped like
        `down`, by every method and for a group of one too, as nginx Plus does."""
        return (not self.down and self.up and self.conns < self.conn_cap and now >= self.paused_until
                and (single or self.fails < self.fail_cap
                     or now >= self.checked + self.fail_timeout_s))

    def usable_at(self, now: float, single: bool = False) -> float | None:
        """When time alone makes the peer usable: `now` if it is, None if time cannot
        (down, unhealthy, or at max_conns: only the end of a call, or a passed health
        check, frees it)."""
        if self.down or not self.up or self.full():
            return None
        failed_until = NEVER if single or not self.failed(now) else self.checked + self.fail_timeout_s
        return max(now, failed_until, self.paused_until)

    def take(self, now: float, single: bool = False) -> None:
        """A pick: one more call in flight, and the probe once fail_timeout has passed
        since `checked` (nginx skips the probe for a group of one: it never fails)."""
        self.conns += 1
        if not single and now >= self.checked + self.fail_timeout_s:
            self.checked = now

    def ramp_up(self, now: float) -> None:
        """Slow start: the weight ramps from MIN_SHARE of it at `now` to all of it."""
        self.ramp_from, self.ramp_until = now, now + self.slow_start_s

    def share(self, now: float) -> float:
        """The part of its weight slow start gives the server at `now` (1: all)."""
        if now >= self.ramp_until:
            return 1.0
        return max(MIN_SHARE, (now - self.ramp_from) / self.slow_start_s)

    def weight_at(self, now: float) -> float:
        """Its weight as least_conn weighs its conns: `weight`, scaled while it ramps."""
        return self.weight if now >= self.ramp_until else self.weight * self.share(now)

    def step(self, now: float) -> float:
        """One pass of smooth weighted round robin over the peer: its current weight
        grows by its effective weight (scaled while it ramps), which recovers by one
        towards its weight; what it grew by (the pass's total counts it)."""
        grown = self.effective_weight
        if now < self.ramp_until:
            grown *= self.share(now)
        self.current_weight += grown
        if self.effective_weight < self.weight:
            self.effective_weight += 1
        return grown

    def free(self, failed: bool, now: float, single: bool = False) -> None:
        """The end of a call: nginx's free_round_robin_peer."""
        self.conns -= 1
        if single:
            self.fails = 0
        elif failed:
            self.fails += 1
            self.accessed = self.checked = now
            if self.max_fails:
                self.effective_weight = max(0, self.effective_weight - self.weight // self.max_fails)
        elif self.accessed < self.checked:
            if self.fails >= self.fail_cap:     # (the probe of a failed server: it recovers)
                self.ramp_up(now)
            self.fails = 0


def swrr(peers: Sequence[Peer], now: float) -> Peer | None:
    """Smooth weighted round robin over the usable peers (ngx_http_upstream_get_peer):
    each adds its effective weight to its current weight and recovers one effective
    weight; the highest current weight wins, ties to the earlier peer; the winner gives
    back the total.  A peer in slow start adds its effective weight scaled (`step`)."""
    best, total = None, 0
    for peer in peers:
        if not peer.usable(now):
            continue
        total += peer.step(now)
        if best is None or peer.current_weight > best.current_weight:
            best = peer
    if best is not None:
        best.current_weight -= total
    return best
