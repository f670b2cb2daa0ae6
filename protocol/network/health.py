"""Health probes: `GET /healthz` (liveness) and `GET /readyz` (readiness) over plain HTTP/1.1,
and `GET /metrics` (Prometheus' text format) beside them.

`--health-port PORT` puts this tiny server on the process's own loop, beside its actor, so
it needs nothing aiohttp brings and a broker still starts fast.  The request is parsed
sans-IO (`HealthRequest.receive_data` -> `next_request`): only the request line counts,
the headers are read and ignored up to a blank line; a request line over MAX_LINE bytes,
a head over MAX_HEAD, or one not complete within READ_TIMEOUT_S closes the connection.
Every answer is text, `200 ok` or `503 <reason>`, with Connection: close.

`/metrics` answers what the process's `metrics()` renders (its own state, read now: see
broker/metrics.py), on this same loop, or what its `gather()` collects from other
processes (a supervisor's children: broker/run/probes.py); with a token (--metrics-token-file) it needs
`Authorization: Bearer <token>` (401 without one, 403 for a wrong one: tube and function
names are chosen by clients, so they may be worth keeping to the monitoring system).

Liveness: a callback re-armed every BEAT_S records when the loop last ran it; the
process is dead when that is older than `stall_s` (generous: binlog writes run on the
loop and a slow disk must not restart the broker).  A loop stalled for good cannot answer
at all, so the probe's own timeout catches that; the 503 covers a loop that comes back
from a long stall with the probe's request waiting.  Readiness is a function the process
gives (`link_ready` for a front, the dispatcher or a worker pool; a broker opens the port
only once ready): None when ready, else the reason.  A worker pool with several processes
adds its children's state (workers/probes.py).

`GET /leader` says whether this process is the broker that leads (a broker on a NATS
journal: one instance leads, the others stand by, docs/ha.md): a function the process
gives, as readiness is; 200 on the leader (and on a broker without a journal, the only
one), 503 with the reason elsewhere (a standby, a deposed broker, a process that is no
broker).
"""
from __future__ import annotations

import asyncio
import hmac
import math
import os
import time
from typing import Awaitable, Callable, NamedTuple

from .listen import HealthOptions, bind_tcp

MAX_LINE = 1024          # bytes of a request line
MAX_HEAD = 8192          # bytes of the request line and headers together
READ_TIMEOUT_S = 2.0     # for the whole request head
BEAT_S = 1.0
STALL_S = HealthOptions().stall_s
PATHS = ("/healthz", "/readyz", "/leader")
#: /leader on a process that is no broker
NOT_A_BROKER = "not a broker"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Request(NamedTuple):
    method: str
    path: str
    authorization: str | None = None


class BadRequest(Exception):
    """A request line that is not `METHOD TARGET HTTP/1.x`: answered 400."""


class TooLong(Exception):
    """A request line or head over its bound: the connection closes unanswered."""


class HealthRequest:
    """Sans-IO: bytes in, `(method, path)` out once the request head is complete."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def receive_data(self, data: bytes) -> None:
        self.buffer += data

    def next_request(self) -> Request | None:
        """The request once its head is complete; None: more data needed.
        Raises BadRequest or TooLong."""
        end_line = self.buffer.find(b"\n")
        if end_line < 0:
            if len(self.buffer) > MAX_LINE:
                raise TooLong("request line")
            return None
        if end_line > MAX_LINE:
            raise TooLong("request line")
        end_head = self.buffer.find(b"\r\n\r\n")
        if end_head < 0:
            end_head = self.buffer.find(b"\n\n")
        if end_head < 0:
            if len(self.buffer) > MAX_HEAD:
                raise TooLong("request head")
            return None
        method, path = parse_request_line(bytes(self.buffer[:end_line]))
        return Request(method, path, _authorization(bytes(self.buffer[end_line:end_head])))


def _authorization(head: bytes) -> str | None:
    for line in head.split(b"\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            return value.strip().decode("latin-1")
    return None


def parse_request_line(line: bytes) -> tuple[str, str]:
    parts = line.rstrip(b"\r").split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
        raise BadRequest(line[:80])
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(line[:80]) from None
    return method, target.split("?", 1)[0]


def response(status: int, text: str | bytes, head_only: bool = False,
             content_type: str = "text/plain; charset=utf-8") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
              404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}[status]
    body = text if isinstance(text, bytes) else (text + "\n").encode()
    extra = "WWW-Authenticate: Bearer\r\n" if status == 401 else ""
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head if head_only else head + body


def health_state(last_beat: float, now: float, stall_s: float) -> str | None:
    """None while the loop turns; else why not ("loop stalled N s")."""
    stalled = now - last_beat
    return f"loop stalled {stalled:.0f} s" if stalled > stall_s else None


def link_state(state: str, down_since: float | None, now: float, hold_s: float) -> str | None:
    """A remote front's or dispatcher's readiness from its link: None while READY or while
    it has waited for a broker for less than its hold time (commands are held that long);
    never before its first Welcome (`down_since` -inf)."""
    if state == "ready" or down_since is None:
        return None
    if down_since == -math.inf:
        return "no broker yet"
    down = now - down_since
    return f"no broker for {down:.0f} s" if down >= hold_s else None


def link_ready(link, hold_s: float | None = None) -> Callable[[], str | None]:
    """The readiness function of an actor with a BrokerLink (protocol/links/zeromq.py); `hold_s`
    instead of the link's own hold time (a worker pool's link holds acks forever)."""
    hold_s = link.hold_s if hold_s is None else hold_s
    return lambda: link_state(link.state, getattr(link, "down_since", None),
                              time.monotonic(), hold_s)


def metrics_refusal(request: Request, token: str | None, served: bool) -> bytes | None:
    """GET /metrics refused (no metrics here, a wrong method, a missing or wrong bearer
    token), or None: answer it."""
    if not served:
        return response(404, "not found")
    if request.method not in ("GET", "HEAD"):
        return response(405, "GET only")
    if token is not None:
        scheme, _, given = (request.authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return response(401, "this needs Authorization: Bearer <metrics token>")
        if not hmac.compare_digest(given.strip().encode("latin-1"), token.encode("latin-1")):
            return response(403, "wrong metrics token")
    return None


def answer_metrics(request: Request, token: str | None,
                   metrics: Callable[[], bytes] | None) -> bytes:
    """GET /metrics: the exposition, once the bearer token (if any) is right."""
    refused = metrics_refusal(request, token, metrics is not None)
    if refused is not None:
        return refused
    return response(200, metrics(), request.method == "HEAD", METRICS_TYPE)


def answer(method: str, path: str, live: str | None, ready: str | None,
           leader: str | None = NOT_A_BROKER) -> bytes:
    """/healthz: `live`; /readyz: `live` or `ready`; /leader: `leader` (a broker on a
    journal leads, or why not: a standby, deposed; docs/ha.md): 200 ok, or 503 why."""
    if path not in PATHS:
        return response(404, "not found")
    if method not in ("GET", "HEAD"):
        return response(405, "GET only")
    problem = live if path == "/healthz" else leader if path == "/leader" else live or ready
    return response(503, problem, method == "HEAD") if problem else \
        response(200, "ok", method == "HEAD")


class HealthBindError(Exception):
    """The health port cannot be bound; the message names it (the process exits 111)."""


class HealthServer:
    """The probes on the running loop: `await start(host, port)`, `close()`.  `alive`:
    liveness beyond this loop's (a worker pool's processes), None or why not."""

    def __init__(self, ready: Callable[[], str | None] = lambda: None,
                 stall_s: float = STALL_S,
                 alive: Callable[[], str | None] = lambda: None,
                 metrics: Callable[[], bytes] | None = None,
                 token: str | None = None,
                 gather: Callable[[], Awaitable[bytes]] | None = None,
                 leader: Callable[[], str | None] = lambda: NOT_A_BROKER) -> None:
        self.ready = ready
        self.leader = leader            # () -> None on the leader, else why not (/leader)
        self.stall_s = stall_s
        self.alive = alive
        self.metrics = metrics          # () -> the exposition; None: no /metrics
        self.token = token
        self.gather = gather            # async () -> the exposition (a supervisor's)
        self.last_beat = time.monotonic()
        self.sock = None
        self.server: asyncio.AbstractServer | None = None
        self._beat_handle: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._beat()
        self.sock = bind_tcp(host, port)
        self.server = await loop.create_server(lambda: _ProbeProtocol(self), sock=self.sock)

    def _beat(self) -> None:
        self.last_beat = time.monotonic()
        self._beat_handle = asyncio.get_running_loop().call_later(BEAT_S, self._beat)

    def live(self) -> str | None:
        return health_state(self.last_beat, time.monotonic(), self.stall_s) or self.alive()

    def release_in_child(self) -> None:
        """In a process forked from this one: close our copy of the listening socket, so
        the port is free once its owner exits, touching nothing of the loop (its epoll
        instance is the parent's too)."""
        if self.sock is not None:
            os.close(self.sock.detach())

    def close(self) -> None:
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        if self.server is not None:
            self.server.close()


class _ProbeProtocol(asyncio.Protocol):
    def __init__(self, health: HealthServer) -> None:
        self.health = health
        self.parser = HealthRequest()
        self.transport = None
        self.timer = None
        self.gathering = False      # a /metrics answer is being gathered

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(READ_TIMEOUT_S, transport.close)

    def connection_lost(self, exc) -> None:
        self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing() or self.gathering:
            return
        self.parser.receive_data(data)
        try:
            request = self.parser.next_request()
        except TooLong:
            self.transport.close()
            return
        except BadRequest:
            self._reply(response(400, "bad request"))
            return
        if request is None:
            return
        health = self.health
        if request.path == "/metrics" and health.gather is not None:
            self._gather(request)
            return
        if request.path == "/metrics":
            self._reply(answer_metrics(request, health.token, health.metrics))
            return
        live = health.live()
        self._reply(answer(request.method, request.path, live,
                           None if live else health.ready(), health.leader()))

    def _gather(self, request: Request) -> None:
        refused = metrics_refusal(request, self.health.token, True)
        if refused is not None:
            self._reply(refused)
            return
        self.timer.cancel()         # (the gathering has its own time limits)
        self.gathering = True

        async def answer_later() -> None:
            body = await self.health.gather()
            if self.transport is not None and not self.transport.is_closing():
                self._reply(response(200, body, request.method == "HEAD", METRICS_TYPE))
        asyncio.ensure_future(answer_later())

    def _reply(self, data: bytes) -> None:
        self.transport.write(data)
        self.transport.close()


async def start_health(opts: HealthOptions | None,
                       ready: Callable[[], str | None] = lambda: None,
                       alive: Callable[[], str | None] = lambda: None,
                       metrics: Callable[[], bytes] | None = None,
                       leader: Callable[[], str | None] = lambda: NOT_A_BROKER,
                       ) -> HealthServer | None:
    """The probes (and /metrics) on the running loop, if a port was given; None otherwise.
    Raises HealthBindError."""
    if opts is None or not opts.port:
        return None
    health = HealthServer(ready, opts.stall_s, alive, metrics, opts.metrics_token,
                          leader=leader)
    try:
        await health.start(opts.host, opts.port)
    except OSError as exc:
        health.close()
        raise HealthBindError(f"bind health port {opts.host}:{opts.port}: "
                              f"{exc.strerror or exc}") from None
    return health
