"""A dispatcher's connection pool per upstream, kept as nginx keeps its upstream
connections (ngx_http_upstream_keepalive_module: `keepalive`, `keepalive_timeout`,
`keepalive_requests`).

Each T_CALL on an upstream's server names the upstream and its settings (task_messages
Call.pool), and its call goes through that upstream's pool: an aiohttp ClientSession over
a connector of its own (`Pools.session`), so one upstream's idle connections neither
count against nor close another's.  Calls to a plain url keep the dispatcher's shared
pool (dispatcher.py).

aiohttp's connector keeps idle connections for `keepalive_timeout` (its cleanup runs that
often, so one may idle up to twice as long before it is closed), but has neither of
nginx's two other limits, which `Connector` adds:

- `keepalive N`, "the maximum number of idle keepalive connections to upstream servers
  that are preserved in the cache of each worker process.  When this number is exceeded,
  the least recently used connections are closed": after each release, the idle
  connections of every server of the upstream together are cut back to N, oldest first
  (aiohttp keeps them per host in FIFO deques: the head of each is its least recently
  used).  0 is a connection per call, as nginx without `keepalive` (`force_close`, which
  also says `Connection: close`).
- `keepalive_requests N`, "the maximum number of requests that can be served through one
  keepalive connection.  After the maximum number of requests is made, the connection is
  closed": aiohttp does not count a connection's requests, so `connect` counts them per
  connection (its protocol object, one per TCP connection) when a request takes it, and
  the Nth says `Connection: close` (RFC 9112 section 9.6: the server closes after its
  answer) and is closed on release whatever the server does.  The count of a connection
  that closed another way is dropped once the counts outnumber the open connections.

Those two reach into aiohttp's connector (`_release`, `_conns`: aiohttp >= 3.14, as
pyproject.toml asks); tests/workers/test_keepalive.py runs them against a server that
counts requests per TCP connection.

A reload that changes an upstream's settings makes a new pool for its next calls; the old
one is closed when its last call ends (`done`).  Pools are kept per upstream name, so
their number is that of the upstreams the broker has named (each closes its idle
connections after its timeout); close() closes them all.
"""
from __future__ import annotations

import aiohttp
from aiohttp import hdrs

Settings = tuple    # (upstream, keepalive, keepalive_timeout_ms, keepalive_requests)


def session(connector: aiohttp.BaseConnector, trace_configs: list) -> aiohttp.ClientSession:
    """A dispatcher's session over `connector` (on the running loop)."""
    return aiohttp.ClientSession(connector=connector, trace_configs=trace_configs,
                                 cookie_jar=aiohttp.DummyCookieJar())   # (one task's cookies
    #                                                                    are not another's)


class Connector(aiohttp.TCPConnector):
    """aiohttp's TCP connector with nginx's `keepalive` and `keepalive_requests`."""

    def __init__(self, idle: int, requests: int, **options) -> None:
        super().__init__(**options)
        self.idle = idle
        self.requests = requests
        self.carried: dict[object, int] = {}    # connection (protocol) -> requests so far

    async def connect(self, req, traces, timeout):
        conn = await super().connect(req, traces, timeout)
        protocol = conn.protocol
        carried = self.carried.get(protocol, 0) + 1
        if carried >= self.requests:
            self.carried.pop(protocol, None)    # (its last: closed on release)
            req.headers[hdrs.CONNECTION] = "close"
        else:
            if len(self.carried) > 2 * (self.limit or 1) + self.idle:
                self.carried = {p: n for p, n in self.carried.items() if p.is_connected()}
            self.carried[protocol] = carried
        return conn

    def _release(self, key, protocol, *args, should_close: bool = False, **kwargs) -> None:
        spent = protocol not in self.carried
        super()._release(key, protocol, *args, should_close=should_close or spent, **kwargs)
        idle = [conns for conns in self._conns.values() if conns]
        while sum(map(len, idle)) > self.idle:
            oldest = min(idle, key=lambda conns: conns[0][1])
            gone, _ = oldest.popleft()
            self.carried.pop(gone, None)
            gone.close()
            idle = [conns for conns in idle if conns]


class Pool:
    """One upstream's session and the calls running through it."""
    __slots__ = ("settings", "session", "calls", "retired")

    def __init__(self, settings: Settings, slots: int, trace_configs: list) -> None:
        _, idle, timeout_ms, requests = settings
        options = {"force_close": True} if idle == 0 else {"keepalive_timeout": timeout_ms / 1000}
        self.settings = settings
        self.session = session(Connector(idle, requests, limit=slots, **options),
                               trace_configs)
        self.calls = 0
        self.retired = False


class Pools:
    """A dispatcher's pools by upstream name."""

    def __init__(self, slots: int, trace_configs: list) -> None:
        self.slots = slots
        self.trace_configs = trace_configs
        self.by_name: dict[str, Pool] = {}
        self.closing: set[Pool] = set()     # replaced, closed when their last call ends

    async def take(self, settings: Settings) -> Pool:
        """The pool for a call with these settings (made on the running loop), its call
        counted until `done`."""
        pool = self.by_name.get(settings[0])
        if pool is None or pool.settings != settings:
            if pool is not None:            # (a reload changed the settings)
                pool.retired = True
                if pool.calls:
                    self.closing.add(pool)
                else:
                    await pool.session.close()
            pool = self.by_name[settings[0]] = Pool(settings, self.slots, self.trace_configs)
        pool.calls += 1
        return pool

    async def done(self, pool: Pool) -> None:
        pool.calls -= 1
        if pool.retired and not pool.calls:
            self.closing.discard(pool)
            await pool.session.close()

    async def close(self) -> None:
        for pool in (*self.by_name.values(), *self.closing):
            await pool.session.close()
        self.by_name.clear()
        self.closing.clear()
