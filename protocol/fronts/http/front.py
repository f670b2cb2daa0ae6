"""The HTTP front: the cloud-task API as HTTP/JSON on aiohttp.web, over one broker session.

How it works: the front holds ONE broker session (conn 1), opened on every Welcome (a
duplicate OPEN changes nothing at the broker).  Each request is parsed into a typed
value, becomes exactly one op on that session, and waits for its reply.  The broker
answers a session's ops in the order they were sent, so the front keeps a FIFO of
futures: `on_replies` resolves them oldest first, whichever request they belong to.

    POST   /v1/tasks              {"function", "params"?, "options"?}  -> T_ENQUEUE -> 201
                                  ("request" in place of params: the broker checks it)
    POST   /v1/tasks              [up to MAX_BATCH of those]        -> T_ENQUEUEs -> 200
    GET    /v1/tasks?function=&status=&limit=&after=                  -> T_LIST    -> 200
    GET    /v1/tasks/{uniqueId}                                          -> T_INFO    -> 200
    GET    /v1/tasks/{uniqueId}/events   its place as it changes (text/event-stream), for
                                  whoever may read it: T_INFO, then T_POSITIONS once a
                                  second for every stream: protocol/fronts/http/streams.py
    DELETE /v1/tasks/{uniqueId}   cancel, or leave the waiting room  -> T_CANCEL  -> 200
    GET    /v1/openapi.json      this API's OpenAPI document (protocol/fronts/http/openapi.py)   -> 200
    /v1/schedules[/{name}]       cron schedules: protocol/fronts/http/schedules.py
    GET    /v1/functions?q=&sort=name|activity&after=&limit=         -> V_FUNCTIONS -> 200
    GET    /v1/functions/{name}   a function's queue, limits, pause  -> T_FUNCTION  -> 200
    PATCH  /v1/functions/{name}   {"paused": bool}, an operator's    -> T_FUNCTION_PAUSE -> 200
    POST   /v1/tasks/{uniqueId}/retry   a failed or cancelled task   -> T_RETRY   -> 200
    /v1/tubes[/{tube}[/kick]], /v1/jobs/{id}, /v1/counters   an operator's views of the
                                  beanstalk and counter families: protocol/fronts/http/views.py
    GET    /v1/dashboard[/events]  the whole broker, once or every second: dashboard.py
    POST   /v1/tasks/{uniqueId}/done   the waiting room: protocol/fronts/http/room.py
    GET    /v1/passes/verify           (passes, done, the gateway's check)
    GET    /room/{function}, /room/static/{name}   its waiting page: protocol/fronts/http/page.py
    OPTIONS /v1/tasks, /v1/tasks/{uniqueId}[/done]   CORS preflights, for the origins the
                                  functions allow: protocol/fronts/http/cors.py

The broker owns the rules (which functions exist, what the options mean, statuses):
it answers `R.T_TASK` with a TaskInfo dict (an enqueue's: only the 201's fields,
ENQUEUED_FIELDS), or `R.T_ERROR` with an error code and
message, which STATUS maps to the HTTP status to send.  The front checks only the shape of
a request body (a JSON object with known keys of the right types) and makes the random
uniqueId the broker core cannot (`secrets.token_hex(16)`; the broker prefers
options.uniqueId).  `params` is re-encoded as compact JSON: that is the body the
dispatcher later POSTs to the function.

Errors are data: every refusal is `{"error": CODE, "message": TEXT}` with the status
named in `CODES`, including aiohttp's own (unknown path 404, wrong method 405), which a
middleware turns into JSON.  A body over the broker's `max_body_bytes` (Settings: the
config's [api] max_body, taken again on SIGHUP) is 413, read no further than one byte
past it; one that has not all come within the body timeout is 408, and the
connection closed (protocol/fronts/http/site.py has that and the other limits: TLS, the header
timeout, the connection limit).  With a master key, cancel, listing and the functions
need `Authorization: Bearer <key>` (missing 401, wrong 403).  Enqueue and reading
a task tell the broker whether the request had the key (`keyed`), and the broker's [api]
policy decides: by default enqueue needs it and reading a task by its id does not, as in
LeanCloud's Cloud Queue, where a client may query by uniqueId (`public_enqueue`,
`private_results` change that).  A wrong key is refused everywhere.  The OpenAPI
document needs no key.

A task's own token (protocol/schema/tokens.py) is made here, one per task enqueued,
answered once in the 201 (each item of an array's 200), and sent to the broker only as
its SHA-256 in the op's ext: the broker, its binlog and its replicas never see a token,
and a dump of them gives nobody a task.  `Authorization: Bearer zt1_...` (anything but
the master key that starts so) reads the task (T_INFO) and cancels or leaves it
(T_CANCEL) with no master key: the front sends the digest and the broker compares it
with the task's own, a wrong one or another task's 403.  It does not open done or
verify, which take the pass.

Losing the broker (`on_lost`) or being fenced fails every request in flight with 503:
the link throws away what it had sent, so no reply will come for them.  Requests made
while the link waits for a broker are held by the link (sent after Welcome, or answered
INTERNAL_ERROR after its hold time: 503 too).
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import hmac
import json
import logging
import secrets
import socket
import time
from typing import Any
from urllib.parse import quote

from aiohttp import web

from .api import (CODES, ENQUEUED_FIELDS, RETRY_AFTER_S, Enqueue, Problem, function_json,
                  loads_strict, parse_enqueue, parse_listing, refuse, reply_problem,
                  schedule_json, task_json)
from .schedules import parse_page, parse_pause, parse_paused, parse_schedule
from .cors import ROUTES as CORS_ROUTES, Cors, note
from .access import (KEYLESS_LOCAL, MASTER, SAFE_METHODS, VIEWER, Keys, keyless_refusal,
                     viewer_from_env)
from .dashboard import Dashboard
from .ui import Ui
from .page import Pages
from .room import Room
from .streams import Streams
from .views import Views, parse_ranked
from .pass_check import find_pass
from .site import GuardedSite, close_after_408
from ...network.files import stream_capacity
from ...network.listen import HttpLimits
from ...links import open_link
from ...links.owner import READY, LinkOwner
from ...schema import Op, R, SessionState, Settings, Welcome
from ...schema.task_info import ENQUEUED_TOKEN
from ...schema.task_messages import MAX_GROUP_HEADER_CHARS, TaskEnqueue
from ...schema.tasks import client_net
from ...schema.tokens import digest, is_token, make_tokens

log = logging.getLogger("zstalk.http")
#: whether the request being handled (each has its own task, so its own context) sent an
#: op to the broker; one that did not was answered by the front itself (/metrics)
_ASKED: contextvars.ContextVar[bool] = contextvars.ContextVar("zstalk_http_asked", default=False)

CONN = 1                    # the front's one broker session
#: how long close() lets requests in flight finish before failing them
SHUTDOWN_GRACE_S = 5.0

_OPEN, _CLOSE = Op.OPEN, Op.CLOSE
_T_INFO, _T_CANCEL = Op.T_INFO, Op.T_CANCEL
_T_LIST = Op.T_LIST
_T_FUNCTION = Op.T_FUNCTION
_T_DONE = Op.T_DONE
_T_FUNCTION_PAUSE, _T_RETRY = Op.T_FUNCTION_PAUSE, Op.T_RETRY
_T_POSITIONS = Op.T_POSITIONS
_T_SCHEDULE_INFO, _T_UNSCHEDULE = Op.T_SCHEDULE_INFO, Op.T_UNSCHEDULE


def problem_response(problem: Problem) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
    if problem.code in RETRY_AFTER_S:
        headers = {"Retry-After": str(RETRY_AFTER_S[problem.code])}
    return web.json_response({"error": problem.code, "message": problem.message},
                             status=problem.status, headers=headers)


NEEDS_KEY = refuse(401, "this needs Authorization: Bearer <master key>")


def enqueue_op(task: Enqueue, keyed: bool, client: dict | None = None,
               uid: str | None = None, token: str | None = None) -> tuple:
    """The op for one task, with the random uniqueId the broker uses unless the options
    name one (`uid`, else one made here); `client`: who sent it (`client_of`); `token`:
    the task's own, of which the broker gets only the digest."""
    client = client or {}
    return TaskEnqueue(task.function, task.params, task.options, uid or secrets.token_hex(16),
                       keyed, task.request, task.online, client.get("client"),
                       client.get("forwarded"), client.get("headers"),
                       None if token is None else digest(token)).op(CONN)


def random_ids(n: int) -> list[str]:
    """n random 128-bit uniqueIds (hex) from one read of the system's CSPRNG: one read
    for an array of tasks, not one each (a getrandom() per task was a tenth of the
    front's CPU on arrays)."""
    pool = secrets.token_hex(16 * n)
    return [pool[i:i + 32] for i in range(0, 32 * n, 32)]


def client_of(request: web.Request, group_headers: list | None = ()) -> dict:
    """The enqueuer's address, and the first X-Forwarded-For hop (the broker takes it
    only when [api] trust_forwarded says so): the key of ip_hash and clientIp upstreams;
    and the values of the `group_headers` (Settings) it has, for group_by = "header:"
    (None: they are not known yet, every header goes, as a request the link holds until
    a broker welcomes it may be for a function grouped by any)."""
    out: dict = {}
    if request.remote:
        out["client"] = request.remote
    forwarded = request.headers.get("X-Forwarded-For", "").split(",")[0].strip()
    if forwarded:
        out["forwarded"] = forwarded[:64]
    if group_headers is None:
        group_headers = [name.lower() for name in request.headers]
    if group_headers:
        said = {name: request.headers[name][:MAX_GROUP_HEADER_CHARS]
                for name in group_headers if name in request.headers}
        if said:
            out["headers"] = said
    return out


def stream_client(request: web.Request, settings: Settings) -> str | None:
    """The client address an event stream counts against (streams.PER_CLIENT): as the
    waiting room counts it, the first X-Forwarded-For hop when the broker's [api]
    trust_forwarded says so (Settings), else the peer; None without one (a unix socket)."""
    said = client_of(request, ())
    return client_net((said.get("forwarded") if settings.trust_forwarded else None)
                      or said.get("client"))


def reply_response(reply: tuple, status: int = 200) -> web.Response:
    """The broker's reply to one request: its TaskInfo, or its error."""
    if reply[1] == R.T_TASK:
        return web.json_response(task_json(reply[2]), status=status)
    return problem_response(reply_problem(reply))


def schedule_response(reply: tuple, status: int = 200) -> web.Response:
    if reply[1] == R.T_SCHEDULE:
        return web.json_response(schedule_json(reply[2]), status=status)
    return problem_response(reply_problem(reply))


# -- auth ----------------------------------------------------------------------------------
def task_token(request: web.Request, master_key: bytes | None) -> bytes | None:
    """The digest of the task token the request presents as its bearer credential (None:
    it presents none, or the master key, which wins should it start as a token does)."""
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not is_token(credential):
        return None
    if master_key is not None and hmac.compare_digest(
            credential.encode("utf-8", "surrogatepass"), master_key):
        return None
    return digest(credential)


def check_key(request: web.Request, keys: Keys) -> Problem | None:
    """None if the request may act (RFC 6750 bearer token: the master key; or the
    dashboard's master cookie with X-Zstalk-Action, access.py), else the refusal."""
    who = keys.who(request.method, request.headers, time.time())
    if who == MASTER:
        return None
    if who == VIEWER:
        return refuse(403, "the viewer key reads the dashboard (/v1/dashboard) and the "
                      "tubes, counters and peers; this needs the master key"
                      if request.method in SAFE_METHODS else
                      "the viewer key only looks; acting needs the master key")
    return who if isinstance(who, Problem) else NEEDS_KEY


def keyed(request: web.Request, keys: Keys) -> bool | Problem:
    """True: the request has the master key (or none is configured); False: it has none,
    or the viewer's (the broker's [api] policy decides); a wrong key is refused (403)."""
    who = keys.who(request.method, request.headers, time.time())
    return who if isinstance(who, Problem) else who == MASTER


def viewing(request: web.Request, keys: Keys) -> bool | Problem:
    """True: the master key or the viewer key (counts may be shown); a wrong key: 403."""
    who = keys.who(request.method, request.headers, time.time())
    return who if isinstance(who, Problem) else who in (MASTER, VIEWER)


def check_json(request: web.Request) -> Problem | None:
    """A body must say it is JSON: a browser sends no other type cross-site without
    asking first (CORS), so no web page can enqueue through a user's local zstalk."""
    if request.content_type != "application/json":
        return Problem(415, "unsupported_media_type",
                       "send the body as Content-Type: application/json")
    return None


def check_host(request: web.Request, master_key: bytes | None) -> Problem | None:
    """Without a master key the API is for this machine only: a Host header naming
    anything but loopback is refused (a DNS-rebinding page would name its own host)."""
    if master_key is not None:
        return None
    try:
        host = (request.url.host or "").lower()
    except ValueError:
        host = ""
    if host in ("localhost", "::1") or host.startswith("127."):
        return None
    return refuse(403, "without a master key this API answers only Host: localhost or a "
                       "loopback address")


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes | Problem:
    """The request's body; 413 once it is known to be over `limit` bytes (a
    Content-Length over it is not read at all), 408 if it is not all there within
    `timeout_s`."""
    too_large = refuse(413, f"the body is over {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        return too_large
    if request.content.is_eof():        # (all of it came with the headers, as most do:
        body = await request.content.read()     # no timer to arm and cancel)
        return too_large if len(body) > limit else body
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await request.content.read(min(1 << 16, limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    return too_large
    except TimeoutError:
        return refuse(408, f"the body did not arrive within {timeout_s:g} s")
    return b"".join(chunks)


# -- aiohttp's own errors as JSON ----------------------------------------------------------
_HTTP_MESSAGES = {
    404: lambda request, exc: f"no such resource: {request.path}",
    405: lambda request, exc: (f"{request.method} is not allowed here; allowed: "
                               f"{', '.join(sorted(exc.allowed_methods))}"),
}


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's HTTPExceptions (no route, wrong method, body too big), a body that
    cannot be decoded, and anything unforeseen come out as `{"error", "message"}` like
    the front's own refusals."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = _HTTP_MESSAGES.get(exc.status, lambda r, e: e.reason)(request, exc)
        response = problem_response(
            Problem(exc.status, CODES.get(exc.status, "http_error"), message))
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except web.RequestPayloadError as exc:     # e.g. Content-Encoding: gzip, but it is not
        reason = getattr(exc.__cause__, "message", None) or str(exc)
        return problem_response(refuse(400, f"the body could not be read: {reason}"))
    except ConnectionError:                 # the client left mid-body: nobody to answer
        log.debug("HTTP front: %s %s: the client went away", request.method, request.path)
        return problem_response(refuse(400, "the connection was lost"))
    except Exception:
        log.exception("HTTP front: %s %s failed", request.method, request.path)
        return problem_response(refuse(500, "internal error"))


# -- the front -----------------------------------------------------------------------------
class HttpFront(LinkOwner):
    kind = "http"

    def __init__(self, broker: str, master_key: str | None = None, link=None,
                 limits: HttpLimits = HttpLimits(), tls=None, hold_s: float = 5.0,
                 pass_key_file: str | None = None, viewer_key: str | None = None) -> None:
        self.master_key = master_key.encode() if master_key else None
        self.keys = Keys(self.master_key, viewer_key.encode() if viewer_key else viewer_from_env())
        self.room = Room(pass_key_file)
        self.pages = Pages()        # the waiting pages (page.py)
        self.cors = Cors(lambda: self.link.settings)
        self.limits = limits
        self.tls = tls              # an ssl.SSLContext: serve HTTPS
        # (reply future, op) of each op sent or held, in order: replies come in that order
        self.waiting: collections.deque[tuple[asyncio.Future, tuple]] = collections.deque()
        self.opened = False
        self.welcomed = False       # a broker's Settings came (the link's are not defaults)
        self.runner: web.AppRunner | None = None
        self.openapi_body = b""     # (built with the app)
        self.commands = 0           # requests, and those answered without the broker
        self.own_replies = 0        # (for /metrics: base.front_samples)
        self.link = link if link is not None else open_link(broker, self.kind, self, hold_s=hold_s)
        max_streams, self.streams_said = stream_capacity(limits.max_streams,
                                                         limits.max_connections)
        self.streams = Streams(lambda ids: self.call((_T_POSITIONS, CONN, ids)),
                               lambda: self.link.state is READY, self.room.with_pass,
                               max_streams)

    # -- serving -------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.counted, close_after_408, self.cors.middleware,
                                           json_errors, self.loopback_only])
        app.router.add_post("/v1/tasks", self.enqueue)
        app.router.add_get("/v1/tasks", self.listing)
        app.router.add_get("/v1/tasks/{uniqueId}", self.info)
        app.router.add_get("/v1/tasks/{uniqueId}/events", self.events)
        app.router.add_delete("/v1/tasks/{uniqueId}", self.cancel)
        app.router.add_post("/v1/tasks/{uniqueId}/done", self.done)
        app.router.add_get("/v1/passes/verify", self.passes_verify)
        app.router.add_get("/room/static/{name}", self.room_static)
        app.router.add_get("/room/{function}", self.room_page)
        for path in CORS_ROUTES:
            app.router.add_route("OPTIONS", path, self.cors.preflight)
        app.router.add_post("/v1/schedules", self.schedule)
        app.router.add_get("/v1/schedules", self.schedules)
        app.router.add_get("/v1/schedules/{name}", self.schedule_info)
        app.router.add_patch("/v1/schedules/{name}", self.pause_schedule)
        app.router.add_delete("/v1/schedules/{name}", self.unschedule)
        app.router.add_get("/v1/functions", self.functions)
        app.router.add_get("/v1/functions/{name}", self.function)
        app.router.add_patch("/v1/functions/{name}", self.pause_function)
        app.router.add_post("/v1/tasks/{uniqueId}/retry", self.retry)
        Views(CONN, self.call, lambda r: check_key(r, self.keys),
              lambda r: keyed(r, self.keys), self._json_body,
              problem_response).add_routes(app)     # (tubes, jobs, counters: views.py)
        Dashboard(CONN, self.call, lambda r: viewing(r, self.keys), problem_response, self.streams,
                  lambda r: stream_client(r, self.link.settings),
                  time.monotonic).add_routes(app)  # (the dashboard: dashboard.py)
        Ui(self.keys, lambda r: self._json_body(r, keyed=False), problem_response).add_routes(app)
        from .openapi import PATH, document  # (loaded with the app, not before)
        self.openapi_body = json.dumps(document()).encode()
        app.router.add_get(PATH, self.openapi)
        return app

    @web.middleware
    async def counted(self, request: web.Request, handler) -> web.StreamResponse:
        self.commands += 1
        _ASKED.set(False)
        try:
            return await handler(request)
        finally:
            if not _ASKED.get():
                self.own_replies += 1

    def connections(self) -> int:
        server = self.runner.server if self.runner is not None else None
        return len(server.connections) if server is not None else 0

    def samples(self) -> list:
        """/metrics (base.front_samples)."""
        from ..base import front_samples
        return front_samples(self)

    @web.middleware
    async def loopback_only(self, request: web.Request, handler) -> web.StreamResponse:
        denied = check_host(request, self.master_key) or (
            request.path.startswith(KEYLESS_LOCAL) and keyless_refusal(
                self.master_key, request.remote, request.headers))
        return problem_response(denied) if denied else await handler(request)

    async def start(self, sockets: list[socket.socket]) -> None:
        """Reach the broker and serve on listening sockets bound by the caller."""
        self.link.start()
        self.runner = web.AppRunner(self.app(), shutdown_timeout=SHUTDOWN_GRACE_S,
                                    keepalive_timeout=self.limits.header_timeout_s)
        await self.runner.setup()
        for sock in sockets:
            await GuardedSite(self.runner, sock, self.limits, self.tls,
                              self.streams.streaming).start()
        self.streams.start()

    async def close(self) -> None:
        """Stop taking requests, give those in flight the grace period, end the session."""
        await self.streams.close()          # (their clients reconnect to another front)
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        self._fail_waiting("the front is closing")
        if self.opened:
            self.link.submit((_CLOSE, CONN))
            self.link.flush_now()
            self.opened = False
        self.link.close()

    # -- handlers: parse, one op, format -------------------------------------------------
    async def enqueue(self, request: web.Request) -> web.Response:
        key = keyed(request, self.keys)
        denied = key if isinstance(key, Problem) else check_json(request)
        if denied:
            return problem_response(denied)
        body = await read_body(request, self.link.settings.max_body_bytes,
                               self.limits.body_timeout_s)
        if isinstance(body, Problem):
            return problem_response(body)
        task = parse_enqueue(body)
        if key is False and not self.link.settings.public_enqueue:
            # (online tasks: the broker decides by the function's `online`)
            task = ([t if isinstance(t, Problem) or t.online else NEEDS_KEY for t in task]
                    if isinstance(task, list) else
                    task if isinstance(task, Problem) or task.online else NEEDS_KEY)
        if isinstance(task, Problem):
            return problem_response(task)
        tasks = task if isinstance(task, list) else [task]
        note(request, *(t.function for t in tasks if isinstance(t, Enqueue)))
        # (before a broker's Settings came, which headers a function groups by is not known)
        client = client_of(request, self.link.settings.group_headers if self.welcomed else None)
        if isinstance(task, list):
            return web.json_response(await self.enqueue_many(task, key, client))
        [token] = make_tokens(1)
        reply = await self.call(enqueue_op(task, key, client, token=token))
        if reply[1] != R.T_TASK:
            return problem_response(reply_problem(reply))
        body = self.enqueued(reply[2], task.function, token)
        return web.json_response(body, status=201, headers={
            "Location": f"/v1/tasks/{quote(body['uniqueId'], safe='')}"})

    def enqueued(self, info: dict, function: str, token: str) -> dict:
        """The 201's body: the broker's ENQUEUED fields (an online task admitted at once
        with its pass, as a GET would show it), and the task's own token."""
        body = {k: info[k] for k in ENQUEUED_FIELDS if k in info}
        if "passExpiresAt" in body:
            body = self.room.with_pass({**body, "function": function})
            del body["function"]
        body = task_json(body)
        body[ENQUEUED_TOKEN.name] = token
        return body

    def enqueued_item(self, info: dict, function: str, token: str) -> dict:
        """An array's item for a task enqueued: its HTTP status, then the 201's fields
        (`enqueued`: the pass of an online task admitted at once too), but for the
        task's status (the item's `status` is the HTTP one); waitNum 0 when it is not
        queued, as items always said, unless its line is a pre-line (no place yet)."""
        body = self.enqueued(info, function, token)
        del body["status"]
        item = {"status": 201, **body}
        if "waitNum" not in item and "phase" not in item:
            item["waitNum"] = 0
        return item

    async def enqueue_many(self, tasks: list[Enqueue | Problem], key: bool,
                           client: dict | None = None) -> list[dict]:
        """Every well-formed task's op leaves in this loop turn (one Batch: one broker
        round trip); each item's result is `{"status": HTTP status, ...its body}`."""
        loop = asyncio.get_running_loop()
        ids, tokens = random_ids(len(tasks)), make_tokens(len(tasks))
        calls = [task if isinstance(task, Problem)
                 else self.send(enqueue_op(task, key, client, uid, token), loop)
                 for task, uid, token in zip(tasks, ids, tokens)]
        results = []
        for task, call, token in zip(tasks, calls, tokens):
            if isinstance(call, Problem):
                results.append({"status": call.status, "error": call.code,
                                "message": call.message})
                continue
            reply = await call
            if reply[1] == R.T_TASK:
                results.append(self.enqueued_item(reply[2], task.function, token))
            else:
                problem = reply_problem(reply)
                results.append({"status": problem.status, "error": problem.code,
                                "message": problem.message})
        return results

    async def listing(self, request: web.Request) -> web.Response:
        """A page of tasks for operators (the master key), oldest first; `next` is the
        `after` of the following page (null: no more)."""
        denied = check_key(request, self.keys)
        if denied:
            return problem_response(denied)
        query = parse_listing(request.query)
        if isinstance(query, Problem):
            return problem_response(query)
        reply = await self.call((_T_LIST, CONN, *query))
        if reply[1] != R.T_LIST:
            return problem_response(reply_problem(reply))
        return web.json_response({"tasks": [task_json(info) for info in reply[2]],
                                  "next": None if reply[3] is None else str(reply[3])})

    async def info(self, request: web.Request) -> web.Response:
        reply = await self.read(request)
        if isinstance(reply, Problem):
            return problem_response(reply)
        if reply[1] == R.T_TASK:
            note(request, reply[2]["function"])
            reply = (*reply[:2], self.room.with_pass(reply[2]))
        return reply_response(reply)

    async def read(self, request: web.Request) -> tuple | Problem:
        """The broker's answer to reading the request's task, as the request may: with
        the task's own token (the broker compares), the master key, or none where the
        [api] policy lets a read by id alone; or the refusal."""
        uid, token = request.match_info["uniqueId"], task_token(request, self.master_key)
        if token is not None:
            return await self.call((_T_INFO, CONN, uid, False, token))
        key = keyed(request, self.keys)
        if key is False and self.link.settings.private_results:
            key = refuse(401, "this needs Authorization: Bearer <master key>")
        if isinstance(key, Problem):
            return key
        return await self.call((_T_INFO, CONN, uid, key))

    async def events(self, request: web.Request) -> web.StreamResponse:
        """A task's event stream (streams.py): for whoever may read the task, within the
        front's caps; the read is its first place."""
        client = stream_client(request, self.link.settings)
        refused = self.streams.take(client)
        if refused is not None:
            return problem_response(refused)
        handed = False
        try:
            reply = await self.read(request)
            if isinstance(reply, Problem):
                return problem_response(reply)
            if reply[1] != R.T_TASK:
                return problem_response(reply_problem(reply))
            note(request, reply[2]["function"])
            handed = True
            return await self.streams.serve(request, reply[2]["uniqueId"], reply[2], client,
                                            lambda response: self.cors.apply(request, response))
        finally:
            if not handed:
                self.streams.give_back(client)

    async def done(self, request: web.Request) -> web.Response:
        uid = request.match_info["uniqueId"]
        token = find_pass(request.headers)
        if token and token.startswith("zp1."):      # a pass, not a (wrong) master key
            denied = self.room.done_refusal(request, uid, False)
        else:
            key = keyed(request, self.keys)
            denied = key if isinstance(key, Problem) else self.room.done_refusal(
                request, uid, key is True and self.master_key is not None)
        if denied:
            return problem_response(denied)
        reply = await self.call((_T_DONE, CONN, uid))
        if reply[1] == R.T_TASK:
            note(request, reply[2]["function"])
        return reply_response(reply)

    async def passes_verify(self, request: web.Request) -> web.Response:
        # the broker is asked only while the link is READY: one stopping (SIGTERM: HOLDING,
        # then LOST) or gone would have the question held for the next broker, hold_s per
        # request; meanwhile the pass's signature and expiry decide at once (room.py)
        return await self.room.verify(request, self.link.state is READY, lambda uid: self.call(
            (_T_INFO, CONN, uid, True)))

    async def room_page(self, request: web.Request) -> web.Response:
        """The waiting page of a function the public may join (page.py; Settings.rooms)."""
        made = self.pages.response(self.link.settings.rooms, request)
        return problem_response(made) if isinstance(made, Problem) else made

    async def room_static(self, request: web.Request) -> web.Response:
        made = self.pages.static_response(request)
        return problem_response(made) if isinstance(made, Problem) else made

    async def cancel(self, request: web.Request) -> web.Response:
        """Cancel a task, or leave the waiting room: with the master key, or with the
        task's own token (that task only)."""
        uid, token = request.match_info["uniqueId"], task_token(request, self.master_key)
        if token is None:
            denied = check_key(request, self.keys)
            if denied:
                return problem_response(denied)
        reply = await self.call((_T_CANCEL, CONN, uid) if token is None
                                else (_T_CANCEL, CONN, uid, token))
        if reply[1] == R.T_TASK:
            note(request, reply[2]["function"])
        return reply_response(reply)

    # -- schedules (protocol/fronts/http/schedules.py): the master key for all -------------------
    async def schedule(self, request: web.Request) -> web.Response:
        doc = await self._json_body(request)
        if isinstance(doc, Problem):
            return problem_response(doc)
        op = parse_schedule(doc, CONN)
        if isinstance(op, str):
            return problem_response(refuse(400, op))
        response = schedule_response(await self.call(op), 201)
        if response.status == 201:
            response.headers["Location"] = f"/v1/schedules/{quote(op[2], safe='')}"
        return response

    async def schedules(self, request: web.Request) -> web.Response:
        denied = check_key(request, self.keys)
        op = denied or parse_page(request.query, CONN)
        if isinstance(op, (Problem, str)):
            return problem_response(op if isinstance(op, Problem) else refuse(400, op))
        reply = await self.call(op)
        if reply[1] != R.T_SCHEDULES:
            return problem_response(reply_problem(reply))
        return web.json_response({"schedules": [schedule_json(i) for i in reply[2]],
                                  "next": reply[3]})

    async def functions(self, request: web.Request) -> web.Response:
        """A page of functions' queues, limits and pauses, by name or busiest first, those
        whose name holds `q` among all of them, as /v1/tubes pages the tubes (the master
        key)."""
        denied = check_key(request, self.keys)
        query = denied or parse_ranked(request.query)
        if isinstance(query, (Problem, str)):
            return problem_response(query if isinstance(query, Problem) else refuse(400, query))
        reply = await self.call((Op.V_FUNCTIONS, CONN, *query))
        if reply[1] != R.V_PAGE:
            return problem_response(reply_problem(reply))
        return web.json_response({"functions": [function_json(i) for i in reply[2]],
                                  "next": reply[3]})

    async def function(self, request: web.Request) -> web.Response:
        denied = check_key(request, self.keys)
        if denied:
            return problem_response(denied)
        reply = await self.call((_T_FUNCTION, CONN, request.match_info["name"]))
        if reply[1] != R.T_FUNCTION:
            return problem_response(reply_problem(reply))
        return web.json_response(function_json(reply[2]))

    async def pause_function(self, request: web.Request) -> web.Response:
        """An operator's pause of a function, or its end (the master key): durable, beside
        the server-driven pausedUntil; the answer is the function as GET shows it."""
        doc = await self._json_body(request)
        if isinstance(doc, Problem):
            return problem_response(doc)
        paused = parse_paused(doc)
        if isinstance(paused, str):
            return problem_response(refuse(400, paused))
        reply = await self.call((_T_FUNCTION_PAUSE, CONN, request.match_info["name"], paused))
        if reply[1] != R.T_FUNCTION:
            return problem_response(reply_problem(reply))
        return web.json_response(function_json(reply[2]))

    async def retry(self, request: web.Request) -> web.Response:
        """A failed or cancelled task queued again, its attempts from the start (the
        master key; any other status 409)."""
        denied = check_key(request, self.keys)
        if denied:
            return problem_response(denied)
        reply = await self.call((_T_RETRY, CONN, request.match_info["uniqueId"]))
        if reply[1] == R.T_TASK:
            note(request, reply[2]["function"])
        return reply_response(reply)

    async def schedule_info(self, request: web.Request) -> web.Response:
        return await self._named_schedule(request, _T_SCHEDULE_INFO)

    async def pause_schedule(self, request: web.Request) -> web.Response:
        doc = await self._json_body(request)
        if isinstance(doc, Problem):
            return problem_response(doc)
        op = parse_pause(doc, CONN, request.match_info["name"])
        if isinstance(op, str):
            return problem_response(refuse(400, op))
        return schedule_response(await self.call(op))

    async def unschedule(self, request: web.Request) -> web.Response:
        return await self._named_schedule(request, _T_UNSCHEDULE)

    async def _named_schedule(self, request: web.Request, opcode: int) -> web.Response:
        """GET or DELETE /v1/schedules/{name}: keyed, the name the only argument."""
        denied = check_key(request, self.keys)
        if denied:
            return problem_response(denied)
        return schedule_response(await self.call((opcode, CONN, request.match_info["name"])))

    async def _json_body(self, request: web.Request, keyed: bool = True) -> Any:
        """A keyed JSON request's body (any JSON request's: keyed False), decoded; or the
        refusal."""
        denied = (keyed and check_key(request, self.keys)) or check_json(request)
        if denied:
            return denied
        body = await read_body(request, self.link.settings.max_body_bytes,
                               self.limits.body_timeout_s)
        if isinstance(body, Problem):
            return body
        try:
            return loads_strict(body)
        except ValueError as exc:
            return refuse(400, f"the body is not valid JSON: {exc}")

    async def openapi(self, request: web.Request) -> web.Response:
        """The API's OpenAPI document: no key, as it changes nothing and tells no secret."""
        return web.Response(body=self.openapi_body, content_type="application/json")

    async def call(self, op: tuple) -> tuple:
        """Send one op on the session and wait for its reply (replies come in op order)."""
        return await self.send(op, asyncio.get_running_loop())

    def send(self, op: tuple, loop) -> asyncio.Future:
        """Send one op now; the future gets its reply."""
        future = loop.create_future()
        _ASKED.set(True)
        # waiting first: a submit that fills a batch sends it and reads the socket, and a
        # reply to this very op may be among what it reads
        entry = (future, op)
        self.waiting.append(entry)
        try:
            self.link.submit(op)
        except BaseException:
            if entry in self.waiting:
                self.waiting.remove(entry)
            raise
        return future

    def _fail_waiting(self, message: str) -> None:
        waiting, self.waiting = self.waiting, collections.deque()
        unavailable = (CONN, R.T_ERROR, "unavailable", message)
        for future, _ in waiting:
            if not future.done():
                future.set_result(unavailable)

    # -- LinkOwner -----------------------------------------------------------------------
    def on_replies(self, items: list) -> None:
        for item in items:
            if item[0] != CONN or not self.waiting:
                log.warning("HTTP front: a broker reply nobody waits for: %r", item[:2])
                continue
            future, _ = self.waiting.popleft()
            if not future.done():       # the request was cancelled: its reply is dropped
                future.set_result(item)

    def on_welcome(self, w: Welcome) -> None:
        self.link.submit((_OPEN, CONN))     # before the requests the link held
        self.opened = self.welcomed = True

    def on_lost(self) -> None:
        self._fail_waiting("lost the broker; the request may or may not have taken effect")

    def on_stopped(self) -> list[tuple]:
        """After a graceful stop no request is lost: those it left unanswered never ran, so
        they go to the next broker (protocol/links/zeromq.py), and their requests wait on."""
        return [op for _, op in self.waiting]

    def on_fenced(self) -> None:
        self.opened = False     # the broker dropped our session
        self._fail_waiting("the broker dropped this front; try again")

    def session_states(self) -> list[SessionState]:
        return [SessionState(CONN, "", [], [])] if self.opened else []
