"""Active health checks (nginx Plus's `health_check`), pure: an upstream's check as
configured, each server's check state, who probes which server, and the bound on probes.

nginx Plus's `health_check` (ngx_http_upstream_hc_module, "Active health checks" in its
admin guide) sends a request to every server of an upstream each `interval`; a server
that fails `fails` checks in a row is unhealthy, skipped by every pick as if `down`,
until it passes `passes` in a row; a check passes on a status in `status` (nginx's
`match` block; by default 2xx and 3xx) within `timeout`.  A server added with
`mandatory` stays unhealthy until its first check passes; otherwise it starts healthy.
A server that passes again after failing starts its `slow_start` (peer.py: `ramp_up`),
as nginx Plus documents.  zstalk has no `match` body tests: status ranges only.

zstalk's broker makes no HTTP call itself: it gives each checked server to ONE live
dispatcher (`assign`, spread evenly), which probes it on its own timer (GET server url + path, a
`User-Agent: zstalk-health-check/...`) and reports each result; the broker's state
(`Check`, on the Peer, so every dispatcher's picks see it at once) moves by the report
(`Check.report`).  A dispatcher that goes hands its servers to the others; with no live
dispatcher no probes run and every server keeps its state.  Probes over all upstreams
are bounded (`MAX_PROBES_PER_S`): configs that would probe faster get their intervals
stretched by one factor (`stretch`), which the broker's start line says.

The state is not durable, as a server's failure state is not: a restart starts every
server healthy (or, mandatory, unhealthy until it passes).
"""
from __future__ import annotations

from typing import Hashable, Iterable, Mapping, NamedTuple

#: probes per second over every upstream together, at most (say in the start line)
MAX_PROBES_PER_S = 100
#: the least interval and timeout a check may have (a probe per server per 100 ms)
MIN_INTERVAL_S = 0.1
NEVER = None        # (a server not checked yet: no last check)


class HealthSpec(NamedTuple):
    """An upstream's `health_check = { ... }` with nginx Plus's defaults."""
    path: str = "/"
    interval_s: float = 5.0
    fails: int = 1
    passes: int = 1
    status: tuple[tuple[int, int], ...] = ((200, 399),)   # inclusive ranges
    timeout_s: float = 5.0
    mandatory: bool = False


def status_ranges(values: object) -> tuple[tuple[int, int], ...] | None:
    """["200-399", 404] as inclusive ranges, or None if a value is not a status or range."""
    if not isinstance(values, (list, tuple)) or not values:
        return None
    out = []
    for value in values:
        if type(value) is int:
            lo = hi = value
        elif isinstance(value, str) and value.replace("-", "", 1).isdigit():
            first, _, last = value.partition("-")
            lo, hi = int(first), int(last or first)
        else:
            return None
        if not 100 <= lo <= hi <= 599:
            return None
        out.append((lo, hi))
    return tuple(out)


def health_errors(spec: HealthSpec) -> list[tuple[str, str]]:
    """Why `spec` cannot be used, as (key, why) with keys as `health_check.KEY` ([] if it
    can; spec.py makes them SpecErrors: this module does not import it, which imports
    this one)."""
    errors = []
    if not isinstance(spec.path, str) or not spec.path.startswith("/"):
        errors.append(("health_check.path", "must be a path starting with /"))
    for name, value in (("interval", spec.interval_s), ("timeout", spec.timeout_s)):
        if type(value) not in (int, float) or not MIN_INTERVAL_S <= value < float("inf"):
            errors.append((f"health_check.{name}",
                                    f"must be a duration of at least {MIN_INTERVAL_S:g}s"))
    for name in ("fails", "passes"):
        value = getattr(spec, name)
        if type(value) is not int or value < 1:
            errors.append((f"health_check.{name}", "must be an integer of at least 1"))
    if spec.status is None:
        errors.append(("health_check.status", "must list statuses or ranges "
                                "like [\"200-399\", 404], each within 100-599"))
    if type(spec.mandatory) is not bool:
        errors.append(("health_check.mandatory", "must be true or false"))
    return errors


class Check:
    """One server's check state: healthy or not, the passes or fails in a row, the last
    check (monotonic seconds) and what it said."""
    __slots__ = ("up", "fails", "passes", "last_check", "last_error")

    def __init__(self, up: bool) -> None:
        self.up = up
        self.fails = self.passes = 0
        self.last_check: float | None = NEVER
        self.last_error: str | None = None

    def report(self, ok: bool, spec: HealthSpec, now: float, error: str | None = None) -> bool:
        """A probe's result: True when it turned the server healthy again (slow start)."""
        self.last_check, self.last_error = now, None if ok else error
        if not ok:
            self.passes, self.fails = 0, self.fails + 1
            if self.fails >= spec.fails:
                self.up = False
            return False
        self.fails, self.passes = 0, self.passes + 1
        if not self.up and self.passes >= spec.passes:
            self.up = True
            return True
        return False


def assign(servers: Iterable[Hashable], dispatchers: Iterable[Hashable],
           before: Mapping[Hashable, Hashable]) -> dict:
    """Which dispatcher probes each server: one each, spread evenly (no dispatcher holds
    more than its share, the ceiling of servers / dispatchers).  A server stays where it
    was while that dispatcher lives and is within its share; the others (new, a leaving
    dispatcher's, or over a share after a dispatcher joined) go one at a time to the one
    with fewest, ties to the earlier.  No dispatcher: {} (no probes run)."""
    live = list(dict.fromkeys(dispatchers))
    if not live:
        return {}
    servers = list(servers)
    share = -(-len(servers) // len(live))
    load = dict.fromkeys(live, 0)
    out, orphans = {}, []
    for server in servers:
        holder = before.get(server)
        if holder in load and load[holder] < share:
            out[server] = holder
            load[holder] += 1
        else:
            orphans.append(server)
    for server in orphans:
        holder = min(live, key=load.__getitem__)
        out[server] = holder
        load[holder] += 1
    return out


def stretch(intervals_s: Iterable[float], bound: float = MAX_PROBES_PER_S) -> float:
    """The factor (at least 1) every interval is multiplied by so that one probe per
    interval per server stays within `bound` per second altogether."""
    rate = sum(1.0 / interval for interval in intervals_s)
    return max(1.0, rate / bound)


def counted(n: int, noun: str) -> str:
    """`n` `noun`s as a line says it: 1 server, 2 servers."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe(specs: Iterable) -> str | None:
    """What the broker's start line says of the health checks of upstreams `specs`
    (UpstreamSpecs), or None if none has any: servers, the bound and any stretch."""
    intervals, upstreams = [], 0
    for spec in specs:
        if spec.health_check is not None:
            upstreams += 1
            intervals += [spec.health_check.interval_s for s in spec.servers if not s.down]
    if not upstreams:
        return None
    factor = stretch(intervals)
    line = (f"health checks: {counted(len(intervals), 'server')} of "
            f"{counted(upstreams, 'upstream')}, each probed by one dispatcher, at most "
            f"{MAX_PROBES_PER_S} probes/s")
    if factor > 1:
        asked = sum(1 / i for i in intervals)
        line += (f" (the configs ask {asked:.0f}/s: every interval is stretched "
                 f"{factor:.2f} times)")
    return line
