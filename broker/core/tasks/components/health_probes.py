"""Who probes which server for the upstreams' active health checks, and what a probe's
result does (broker/core/upstreams/health.py holds the rules; this holds the broker's
state of them).

Each checked server (an upstream with a `health_check`, a server not `down`) is given to
ONE live dispatcher (`health.assign`: kept while that dispatcher lives, spread by
count), never to several: the probes a server gets do not grow with the dispatchers.
`assign(probers)` runs when the dispatchers or the config change and answers, for each
dispatcher whose list changed, its new list: commands.py pushes it as R.T_CHECKS (the
dispatcher then probes those, and only those, on its own timer).  With no dispatcher
nothing is assigned and no probe runs: every server keeps its state.

Every interval is stretched by one factor when the checks together would probe more
than MAX_PROBES_PER_S times a second (`factor`, which the broker's start line states).

`checked(prober, upstream, url, ok, error, now)` takes a probe's result, only from the
dispatcher the server is assigned to (a report from one it was taken from, still in
flight, is dropped: the state moves by one prober's probes), and says whether it made
the server healthy again (calls may go to it: feed the dispatchers).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Iterable

from .upstream_calls import SERVER_ERROR_CHARS

if TYPE_CHECKING:
    from .upstream_calls import UpstreamCalls


class HealthProbes:
    def __init__(self, upstream: UpstreamCalls) -> None:
        self.upstream = upstream
        self.holder: dict[tuple[str, str], Hashable] = {}   # (upstream, url) -> dispatcher
        self.sent: dict[Hashable, list] = {}    # dispatcher -> the checks it was last sent
        self.factor = 1.0

    def servers(self) -> list[tuple[str, str]]:
        """The checked servers, (upstream, url) in config order."""
        return [(name, peer.url) for name, group in self.upstream.groups.items()
                if group.spec.health_check is not None
                for peer in group.peers if not peer.down]

    def assign(self, probers: Iterable[Hashable]) -> dict[Hashable, list]:
        """Assign every checked server to one of `probers` (live dispatchers that take
        checks); the new lists of those whose lists changed, [] for one that had checks
        and is no prober now (stopping, or gone: the caller sends to those still here)."""
        from ...upstreams.health import MAX_PROBES_PER_S, assign, stretch
        probers = list(probers)
        servers = self.servers()
        groups = self.upstream.groups
        self.factor = stretch([groups[name].spec.health_check.interval_s
                               for name, _ in servers], MAX_PROBES_PER_S)
        self.holder = assign(servers, probers, self.holder)
        lists: dict[Hashable, list] = {p: [] for p in (*self.sent, *probers)}
        for name, url in servers:       # (each list in config order; none: no prober left)
            holder = self.holder.get((name, url))
            if holder is not None:
                lists[holder].append(self._check(name, url))
        changed = {p: checks for p, checks in lists.items() if self.sent.get(p, []) != checks}
        self.sent = {p: checks for p, checks in lists.items() if checks}
        return changed

    def _check(self, name: str, url: str) -> list:
        """One server's entry in R.T_CHECKS."""
        health = self.upstream.groups[name].spec.health_check
        return [name, url, health.path, round(health.interval_s * self.factor * 1000),
                round(health.timeout_s * 1000), [list(r) for r in health.status]]

    def checked(self, prober: Hashable, name, url, ok, error, now: float) -> bool:
        """A probe's result from `prober`: True if it made the server healthy again."""
        if type(name) is not str or type(url) is not str or self.holder.get((name, url)) != prober:
            return False
        group = self.upstream.groups.get(name)
        peer = next((p for p in group.peers if p.url == url), None) if group else None
        if peer is None:
            return False
        return group.checked(peer, ok is True, now,
                             error[:SERVER_ERROR_CHARS] if type(error) is str else None)
