"""The hosts of plain urls: nginx's failure accounting on the host a function's `url`
names, so that while it refuses connections or times out its tasks wait in place instead
of failing.

A deliberate difference from nginx, whose upstream of one server never counts failures
(`peers->single`, peer.py): a plain url is an upstream of one server here whose
accounting is on.  The host is (scheme, host, port) with the scheme's default port
filled in, so `http://a/f` and `http://a:80/g` share one state, as do every function
under one base_url; each function judges that shared state by its own `max_fails` and
`fail_timeout` (FunctionSpec; max_fails 0 leaves the function out of all this: it
neither counts nor is held back).

The rules are peer.py's, on the three counters that matter without weights (fails,
accessed, checked), from ngx_http_upstream_free_round_robin_peer / get_peer:

* a pick when fail_timeout has passed since `checked` moves `checked` to now: while the
  host is shut that pick is its one probe, and every other pick waits another
  fail_timeout (`pick` says until when);
* a failed call (what the function's next_upstream counts: errors, timeouts, the
  statuses it lists) adds one to `fails` and sets accessed = checked = now;
* a good call resets `fails` only if a pick moved `checked` past `accessed` since the
  last failure: a call that started before the failure proves nothing.

A host whose `fails` is 0 behaves exactly as a host never seen (its `checked` matters
only once it failed, and a failure sets it), so only failing hosts are kept (`failing`):
a healthy broker spends one truth test per hand-out here, and the memory is bounded by
the hosts that fail.  Not durable: a restart starts every host fresh.

Pure: `now` is monotonic seconds, a parameter; nothing here reads a clock or a socket.
"""
from __future__ import annotations

import math

from ..model.spec import FunctionSpec

#: nginx's zeroed `checked`/`accessed`, as upstreams/peer.py has it (not imported: the
#: balancing code loads only with upstreams, off zstalkd's start path)
NEVER = -math.inf

_DEFAULT_PORT = {"http": 80, "https": 443}


class Host:
    """One failing host: nginx's counters of a peer (peer.py), those failures use."""
    __slots__ = ("fails", "accessed", "checked")

    def __init__(self) -> None:
        self.fails = 0
        self.accessed = self.checked = NEVER

    def __repr__(self) -> str:
        return f"Host(fails={self.fails}, accessed={self.accessed}, checked={self.checked})"


class Hosts:
    __slots__ = ("failing", "_origins")

    def __init__(self) -> None:
        self.failing: dict[str, Host] = {}      # origin -> its state, while fails > 0
        self._origins: dict[str, str] = {}      # url -> its origin (one per function url)

    def origin(self, url: str) -> str:
        """`scheme://host:port` of `url`, the default port written out."""
        origin = self._origins.get(url)
        if origin is None:
            from urllib.parse import urlsplit   # (off the start path: a host's first failure)
            parts = urlsplit(url)
            port = parts.port or _DEFAULT_PORT.get(parts.scheme, 0)
            host = parts.hostname or ""
            if ":" in host:                         # an IPv6 address
                host = f"[{host}]"
            origin = f"{parts.scheme}://{host}:{port}"
            if len(self._origins) > 100_000:        # (urls come from the config: a bound
                self._origins.clear()               # for a base_url of many names)
            self._origins[url] = origin
        return origin

    def pick(self, spec: FunctionSpec, now: float) -> float | None:
        """A call of `spec` is about to go to its host: None if it may (and then, on a
        failing host, it is the probe), else when the host may be picked again."""
        host = self.failing.get(self.origin(spec.url))
        if host is None:
            return None
        reopens = host.checked + spec.fail_timeout_s
        if now >= reopens:
            host.checked = now                      # the probe
            return None
        if host.fails < spec.max_fails:
            return None
        return reopens

    def done(self, spec: FunctionSpec, failed: bool, now: float) -> str | None:
        """A call of `spec` on its host ended (`failed`: as its next_upstream counts);
        the host's origin if it was failing and is no longer (the functions it held back
        may go again), else None."""
        origin = self.origin(spec.url)
        host = self.failing.get(origin)
        if failed:
            if host is None:
                host = self.failing[origin] = Host()
            host.fails += 1
            host.accessed = host.checked = now
            return None
        if host is None or not host.accessed < host.checked:
            return None
        del self.failing[origin]                    # fails = 0: as if never seen
        return origin

    def usable_at(self, spec: FunctionSpec, now: float) -> float | None:
        """When `spec` may call its host (None: now, as far as failures go), unchanged."""
        host = self.failing.get(self.origin(spec.url))
        if host is None or host.fails < spec.max_fails:
            return None
        reopens = host.checked + spec.fail_timeout_s
        return reopens if now < reopens else None

    def view(self, spec: FunctionSpec, now: float, wall_offset: float) -> dict | None:
        """The host of `spec` as GET /v1/functions/{name} shows it while it fails (None:
        it does not, or the function does not count failures): its origin, its state by
        this function's max_fails ("failed": shut, "usable": failures below max_fails or
        its probe due), its fails and, shut, when its probe may go (wall-clock)."""
        if not spec.max_fails or spec.upstream is not None:
            return None
        origin = self.origin(spec.url)
        host = self.failing.get(origin)
        if host is None:
            return None
        until = self.usable_at(spec, now)
        out = {"url": origin, "state": "usable" if until is None else "failed",
               "fails": host.fails}
        if until is not None:
            out["usableAt"] = until + wall_offset
        return out
