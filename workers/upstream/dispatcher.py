"""A dispatcher: makes the broker's cloud-task calls over HTTP and reports each outcome.

The dispatcher is a front of kind "dispatcher" with one session (conn 1) over a link,
which owns Hello/Welcome, heartbeats, batching and reconnects (protocol/links/mailbox.py:
a BrokerLink over ZeroMQ or a LocalLink beside the broker).  After Welcome it OPENs and
T_SUBSCRIBEs with its slots; the broker pushes `R.T_CALL`s while it has free slots, each
becomes an asyncio task that POSTs the task's params to its function's URL, and the
task's T_OUTCOME frees the slot again (protocol/schema/ops.py, "Cloud tasks").  A call to
a plain url goes through one aiohttp ClientSession, whose keep-alive pool holds at most
`slots` connections; a call on an upstream's server through that upstream's own pool,
kept by its keepalive, keepalive_timeout and keepalive_requests as nginx keeps
its upstream connections (keepalive.py).

An outcome says whether the function may have run, because that decides whether the
broker may call it again (broker/core/tasks/store.py says what it does with each kind):

    2xx, body within max_result             success  the body is the result (below)
    2xx with a bigger body                  fatal    it ran: the task fails, no retry
    any other status                        failure  redirects are not followed; a 429
                                                     or 503 may say when to retry
    no connection made (refused, DNS)       failure  the request never left
    timeout; connection lost mid-call       unknown  the function may have run
    aborted (R.T_ABORT, below)              unknown  the request may have reached it

A task cancelled while its call runs is cancelled by the broker at once, which pushes
R.T_ABORT (schema 8): the call's asyncio task is cancelled, and so its aiohttp request,
whose connection is closed, not put back in the pool (the host sees it close).  The call
is reported all the same (that report frees its slot), and the broker reads it only to
say whether the function may have run (possiblyExecuted).

The broker counts a dispatcher's *free* slots: T_SUBSCRIBE sets the count and each
T_OUTCOME adds one (broker/core/tasks/commands.py, `t_subscribe` / `t_outcome`).  So calls keep
running while the broker is away, their reports wait in `resend`, and the next Welcome
subscribes with the slots that neither a running call nor a report about to be resent
will free, then resends them (the broker ignores a report on a call it no longer waits
for).  A report sent is kept in `unacked` until the broker's T_NOTED says it arrived;
losing the broker moves the unacked ones to `resend`, so a report is never lost with a
dropped connection.  Our SessionState lists the calls we make or have reports on: a
broker restarted with its binlog gives them back to us instead of calling them again.
Stopping, close() subscribes as stopping so outcomes bring no new calls, and lets
running calls finish for a grace period.

A result is kept as JSON, decided by the response's Content-Type: a JSON body
(application/json or any +json type) is its value as sent; a text body (text/*, a type
naming a charset, XML and the like, or any other type that is valid UTF-8) is decoded by
its charset (UTF-8 unless it names another) and kept as a JSON string; bytes (an image,
audio, a PDF, an archive, or a body that is not UTF-8) are kept as {"base64": "..."}
with their Content-Type in the task's resultHeaders, never garbled into text; an empty
body is no result.  A body
claiming to be JSON that does not parse is kept as text.

A request task's call (broker/core/tasks/model/requests.py) comes with an ext: its method and
headers, sent as given, to the URL the broker made of the function's URL, the task's
path and query, sent byte for byte (yarl, encoded=True).  The response headers a task
keeps (its Content-Type, and those its function's `result_headers` lists) go back in
T_OUTCOME's ext.

A failed call's report says whether its request may have been sent (aiohttp's trace
hook on_request_headers_sent: until it fires nothing of the request left), so that the
broker may move it to the next server of its upstream within its attempt, even when its
task is atMostOnce (broker/core/upstreams/next.py); a T_CALL that is such a move says
its number (Call.move), and its report echoes it.

A call to a server of an upstream that resolves its name (broker/core/upstreams/spec.py
`resolve`) has an address in its url and the name in its ext (Call.host): the connection
goes to the address, and the request says the name as Host and, over TLS, as the server
name (SNI) its certificate is checked against, as nginx's proxy_pass to a resolved
upstream does with `proxy_set_header Host` and `proxy_ssl_name`.
The broker may give this dispatcher servers to probe for its upstreams' active health
checks (R.T_CHECKS, schema 8): workers/upstream/health_checks.py runs them on their own timers and
each result goes back as T_CHECKED; losing the broker stops them (it gives them out
again, to us or another dispatcher, when we come back), and so does stopping.

Every call carries X-Zstalk-Task-Id and X-Zstalk-Attempt and, when the dispatcher has a
signing key (given, else $ZSTALK_SIGNING_KEY or the file $ZSTALK_SIGNING_KEY_FILE names),
X-Zstalk-Signature, stamped when the call is sent: v1 over the time, the task id and
the body, v2 over the method, the path and the query too (workers/signing.py).  Without a key calls go unsigned, and a function host that
verifies signatures refuses them (401: a failure, retried by the task's policy).
"""
from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import logging
import time
from datetime import timezone

import aiohttp
import yarl

from ...protocol.links import open_link
from ...protocol.links.owner import LinkOwner
from ...protocol.schema import Op, R, SessionState, Welcome
from ...protocol.schema.outcome import Outcome
from ...protocol.schema.task_messages import Call
from .. import signing
from .keepalive import Pools, session
from .health_checks import HealthChecker

log = logging.getLogger("zstalk.dispatcher")

CONN = 1
GOODBYE_LINGER_MS = 200
SUCCESS, FAILURE, UNKNOWN, FATAL, DECLINED = ("success", "failure", "unknown", "fatal",
                                              "declined")
#: how long close() lets running calls finish before cancelling them
CLOSE_GRACE_S = 10.0
#: a longer Retry-After is taken as this: it is the function's wish, not a reason to park
#: a task for years (and the value must fit the wire's 64-bit ints)
RETRY_AFTER_MAX_MS = 24 * 3600 * 1000
#: (a call's connect timeout is CONNECT_TIMEOUT_MS unless its function's `connect_timeout`
#: says otherwise; the broker sends it in the call's ext only then: task_messages.Call)
#: raised before the request left this process: the function surely did not run
_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.InvalidURL)


class Dispatcher(LinkOwner):
    kind = "dispatcher"

    def __init__(self, broker: str, slots: int = 64, link=None,
                 signing_key: bytes | None = None) -> None:
        """Made on the running loop (the link belongs to it); `link` replaces the real one
        in tests.  `signing_key` None: the one this process's environment names, if any."""
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self.broker = broker
        self.slots = slots
        self.signing_key = signing.signing_key(signing_key)
        self.calls: dict[asyncio.Task, tuple[str, int]] = {}    # running: (uid, attempt)
        self.aborting: set[asyncio.Task] = set()    # calls R.T_ABORT cancelled
        self.unacked: dict[tuple[str, int], tuple] = {}     # (uid, attempt) -> sent report
        self.resend: list[tuple] = []   # reports to send after the next Welcome
        self.opened = False             # the broker has our session, as far as we know
        self.ready = False              # the link has had Welcome and not lost it since
        self.closing = False
        self.http: aiohttp.ClientSession | None = None
        self.pools = Pools(slots, [_SENT_TRACE])     # an upstream's calls (keepalive.py)
        self.checks = HealthChecker(self._checked)      # the servers we probe (R.T_CHECKS)
        self.link = link if link is not None else open_link(broker, self.kind, self)

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        if self.signing_key is None:
            log.info("dispatcher: calls are not signed (no %s or %s)",
                     signing.ENV_KEY, signing.ENV_KEY_FILE)
        self.link.start()

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop: take no new calls (subscribe as stopping: the broker keeps our slots at 0),
        let the running ones finish and report for up to `grace_s`, then cancel what is
        left (closing our session makes the broker count those unknown: they may have
        reached their functions).  A call pushed meanwhile is declined, not made."""
        self.closing = True
        await self.checks.close()
        if self.ready:
            self.link.submit((Op.T_SUBSCRIBE, CONN, 0, True))
            self.link.flush_now()
        if self.calls:
            await asyncio.wait(set(self.calls), timeout=grace_s)
        for task in self.calls:
            task.cancel()
        await asyncio.gather(*self.calls, return_exceptions=True)
        if self.ready:
            self.link.submit((Op.CLOSE, CONN))
            self.link.flush_now()
        if self.http is not None:
            await self.http.close()
        await self.pools.close()
        self.link.close(linger_ms=GOODBYE_LINGER_MS)

    def samples(self) -> list:
        """/metrics (protocol/codecs/prometheus.py METRICS, role dispatcher)."""
        from ...protocol.codecs.prometheus import Sample
        return [Sample("zstalk_dispatcher_calls_in_flight", (), len(self.calls)),
                Sample("zstalk_dispatcher_reports_pending", (),
                       len(self.unacked) + len(self.resend))]

    # -- LinkOwner ---------------------------------------------------------------------
    def on_replies(self, items: list) -> None:
        for item in items:
            if item[1] == R.T_NOTED:        # that report arrived
                self.unacked.pop((item[2], item[3]), None)
            elif item[1] == R.T_ABORT:      # that call's task was cancelled
                self._abort(item[2], item[3])
            elif item[1] == R.T_CHECKS:     # the servers to probe from now on
                if not self.closing:
                    self.checks.assign(item[2])
            elif item[1] != R.T_CALL:       # an error: the report stays, sent again later
                continue
            elif self.closing:      # pushed before our stopping reached the broker
                self._report((Op.T_OUTCOME, CONN, item[2], item[3],
                              *Outcome(DECLINED, error="the dispatcher is stopping").fields()))
            else:
                self._start_call(*item[2:7], item[7] if len(item) > 7 else None)

    def on_welcome(self, w: Welcome) -> None:
        if not (w.restored and self.opened):
            self.link.submit((Op.OPEN, CONN))
        self.opened = self.ready = True
        resend, self.resend = self.resend, []
        free = 0 if self.closing else max(0, self.slots - len(self.calls) - len(resend))
        self.link.submit((Op.T_SUBSCRIBE, CONN, free, self.closing))
        for op in resend:
            self._report(op)
        log.info("dispatcher subscribed: %d slots free of %d", free, self.slots)

    def on_lost(self) -> None:
        """Calls keep running; their reports, and those not yet NOTED, wait in `resend`
        for the next Welcome."""
        self.ready = False
        self.checks.stop()
        self.resend[:0] = self.unacked.values()
        self.unacked.clear()

    def on_fenced(self) -> None:
        """The broker closed our session (its calls count as unknown there): the next
        Welcome opens a new one, where reports on the old calls still free their slots."""
        self.on_lost()
        self.opened = False

    def session_states(self) -> list[SessionState]:
        """Our session, with the calls we make or have reports on: [uid, attempt]."""
        if not self.opened:
            return []
        claims = [[uid, attempt] for uid, attempt in self.calls.values()]
        claims += [[op[2], op[3]] for op in (*self.unacked.values(), *self.resend)]
        return [SessionState(CONN, "", [], [], claims)]

    def _checked(self, upstream: str, url: str, ok: bool, error: str | None) -> None:
        """A probe's result, to the broker (lost with the link: the next probe says it)."""
        if self.ready:
            self.link.submit((Op.T_CHECKED, CONN, upstream, url, ok, error))

    # -- calls -------------------------------------------------------------------------
    def _start_call(self, uid: str, attempt: int, url: str, params: bytes,
                    timeout_ms: int, ext: dict | None = None) -> None:
        task = asyncio.get_running_loop().create_task(
            self._run_call(uid, attempt, url, params, timeout_ms, Call.of(ext)))
        self.calls[task] = (uid, attempt)
        task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task) -> None:
        call = self.calls.pop(task, None)
        if task in self.aborting and call is not None:
            # aborted before it began (its T_CALL and T_ABORT came together): no request
            # left, and `_run_call` never ran to report it
            self.aborting.discard(task)
            self._report((Op.T_OUTCOME, CONN, *call, *Outcome(
                DECLINED, error="aborted before the call began").fields()))

    def _abort(self, uid: str, attempt: int) -> None:
        """Abort call `attempt` of task `uid` (R.T_ABORT: the task was cancelled while it
        ran): cancelling its asyncio task cancels the aiohttp request, which closes its
        connection (the host sees it go); `_run_call` then reports it.  A call already
        over is left alone (its report is on its way)."""
        for task, call in self.calls.items():
            if call == (uid, attempt):
                self.aborting.add(task)
                task.cancel()
                return

    async def _run_call(self, uid: str, attempt: int, url: str, params: bytes,
                        timeout_ms: int, call: "Call") -> None:
        try:
            outcome = await self._call(uid, attempt, url, params, timeout_ms, call)
        except asyncio.CancelledError:
            if asyncio.current_task() not in self.aborting:
                raise                       # (close() after its grace: no report)
            self.aborting.discard(asyncio.current_task())
            # the broker has cancelled the task and reads this only for possiblyExecuted:
            # the request may have reached the host ("" : no fault of the host's)
            outcome = Outcome(UNKNOWN, error="aborted: the task was cancelled during the "
                              "call", failure="")
        except Exception as exc:    # a bug here or in aiohttp: the request may have left
            log.exception("call %s (attempt %d) to %s failed unexpectedly", uid, attempt, url)
            outcome = Outcome(UNKNOWN, error=f"the dispatcher failed during the call: {exc!r}")
        if call.move:                   # (which server's call of the attempt this was)
            outcome = outcome._replace(move=call.move)
        if outcome.error is not None:   # (a reason phrase may hold undecodable bytes)
            outcome = outcome._replace(error=outcome.error.encode(
                "utf-8", "backslashreplace").decode("utf-8"))
        # no longer a running call: a Welcome between now and the done callback must
        # count it once, as a report to resend
        self.calls.pop(asyncio.current_task(), None)
        self._report((Op.T_OUTCOME, CONN, uid, attempt, *outcome.fields()))

    def _report(self, report: tuple) -> None:
        """Send a report now, kept until the broker notes it; or after the next Welcome."""
        if self.ready:
            self.unacked[report[2], report[3]] = report
            self.link.submit(report)
        else:
            self.resend.append(report)

    async def _call(self, uid: str, attempt: int, url: str, params: bytes,
                    timeout_ms: int, call: "Call") -> Outcome:
        """The call's outcome; only errors no outcome describes are raised.  A failure
        says how, "error" or "timeout" (an upstream's server is judged by it:
        broker/core/tasks), and whether its request may have been sent (`sent`)."""
        sent = _Sent()
        try:
            return await self._send(uid, attempt, url, params, timeout_ms, call, sent)
        except aiohttp.ConnectionTimeoutError:
            return Outcome(FAILURE, error=f"could not connect to {url} within "
                           f"{call.connect_timeout_ms} ms", failure="timeout", sent=False)
        except _NOT_SENT as exc:
            return Outcome(FAILURE, error=f"could not connect to {url}: {_say(exc)}",
                           failure="error", sent=False)
        except asyncio.TimeoutError:    # ServerTimeoutError is one too: before ClientError
            return Outcome(UNKNOWN, error=f"no answer from {url} within {timeout_ms} ms",
                           failure="timeout", sent=sent.headers)
        except aiohttp.ClientError as exc:
            return Outcome(UNKNOWN, error=f"the connection to {url} failed after the "
                                          f"request was sent: {_say(exc)}", failure="error",
                           sent=sent.headers)

    async def _send(self, uid: str, attempt: int, url: str, params: bytes,
                    timeout_ms: int, call: "Call", sent: "_Sent") -> Outcome:
        # a request task's URL was checked by the broker and is sent byte for byte (so its
        # signature covers what the function host sees); a plain one as yarl makes it
        target = yarl.URL(url, encoded=call.request)
        headers = dict(call.headers) if call.request else {"Content-Type": "application/json"}
        headers.update({"X-Zstalk-Task-Id": uid, "X-Zstalk-Attempt": str(attempt)})
        if self.signing_key is not None:
            headers[signing.HEADER] = signing.sign(
                self.signing_key, uid, params, time.time(), call.method, target.raw_path,
                target.raw_query_string)
        if self.link.settings.private_results:      # only the key reads task info: the
            headers[signing.EXPOSE_HEADER] = "1"    # function's errors may show in it
        tls_name = None
        if call.host is not None:       # (an address its upstream resolved the name to)
            headers["Host"] = call.host
            if target.scheme == "https":
                tls_name = _name_of(call.host)
        timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000,
                                        sock_connect=call.connect_timeout_ms / 1000)
        pool = None if call.pool is None else await self.pools.take(call.pool)
        try:
            async with (self._session() if pool is None else pool.session).request(
                    call.method, target, data=params or None,
                    headers=headers, timeout=timeout, allow_redirects=False,
                    trace_request_ctx=sent, server_hostname=tls_name) as resp:
                if 200 <= resp.status < 300:
                    return await self._success(resp, call)
                return _refused(resp, time.time())
        finally:
            if pool is not None:
                await self.pools.done(pool)

    def _session(self) -> aiohttp.ClientSession:
        """One keep-alive pool for every call to a plain url, made on first use (on the
        running loop)."""
        if self.http is None:
            self.http = session(aiohttp.TCPConnector(limit=self.slots), [_SENT_TRACE])
        return self.http

    async def _success(self, resp: aiohttp.ClientResponse, call: "Call") -> Outcome:
        """The body is the result, unless it is over the limit, as sent or as kept (text
        kept as a JSON string can grow): then it is read no further than one byte past
        it (a Content-Length over it is not read at all)."""
        limit = self.link.settings.max_result_bytes     # the broker's (its config's)
        if resp.content_length is None or resp.content_length <= limit:
            body = await _read_up_to(resp.content, limit + 1)
            if len(body) <= limit:
                declared = resp.headers.get("Content-Type")
                result = body_as_result(body, resp.content_type if declared else None,
                                     resp.charset)
                if result is None or len(result) <= limit:
                    return Outcome(SUCCESS, resp.status, result,
                                   result_headers=_kept_headers(resp, call, result))
        return Outcome(FATAL, resp.status, error=f"HTTP {resp.status}, but the result is "
                       f"over the {limit}-byte limit ([functions] max_result)")


class _Sent:
    """A call's trace context: whether its request's headers were written (from then on
    the function may have run)."""
    __slots__ = ("headers",)

    def __init__(self) -> None:
        self.headers = False


async def _headers_sent(session, context, params) -> None:
    if isinstance(context.trace_request_ctx, _Sent):
        context.trace_request_ctx.headers = True


_SENT_TRACE = aiohttp.TraceConfig()
_SENT_TRACE.on_request_headers_sent.append(_headers_sent)
_SENT_TRACE.freeze()


def _kept_headers(resp: aiohttp.ClientResponse, call: Call, result: bytes | None) -> dict | None:
    """The response headers the task keeps (its Content-Type, and those
    its function's result_headers lists) for a request task or a function that lists
    some, and a binary result's Content-Type always (it says what the bytes are)."""
    binary = result is not None and result.startswith(b'{"base64":')
    if not (call.request or call.keep or binary):
        return None
    kept = {}
    for name in ("Content-Type", *call.keep):
        values = resp.headers.getall(name, ())
        if values:
            kept[name] = ", ".join(values)
    return kept or None


#: content types kept as text although not text/*: they are text by definition
_TEXT_TYPES = frozenset({"application/xml", "application/javascript", "application/ecmascript",
                         "application/x-www-form-urlencoded", "application/sql",
                         "application/graphql", "application/x-ndjson", "application/yaml"})


#: types whose bodies are bytes, whatever they hold
_BINARY_FAMILIES = frozenset({"image", "audio", "video", "font", "model"})
_BINARY_TYPES = frozenset({"application/pdf", "application/zip", "application/gzip",
                           "application/x-gzip", "application/x-tar", "application/x-bzip2",
                           "application/x-7z-compressed", "application/wasm",
                           "application/protobuf", "application/x-protobuf",
                           "application/msword", "application/x-msgpack", "application/cbor"})


def body_as_result(body: bytes, content_type: str | None, charset: str | None) -> bytes | None:
    """A 2xx body as the JSON the task keeps (see the module's docstring).  `content_type`
    None: the response declared none."""
    if not body:
        return None
    content_type = content_type or ""
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            json.loads(body, parse_constant=_not_json, parse_float=_finite)
            return body
        except (ValueError, RecursionError):
            pass
    elif _binary(body, content_type, charset):
        return b'{"base64":"' + base64.b64encode(body) + b'"}'
    try:
        text = body.decode(charset or "utf-8", "replace")
    except LookupError:             # a charset Python does not know
        text = body.decode("utf-8", "replace")
    return json.dumps(text, ensure_ascii=False).encode()


def _binary(body: bytes, content_type: str, charset: str | None) -> bool:
    """Bytes that are not text: a type that is bytes by definition (an image, a PDF, an
    archive), or, unless the type is text or names a charset, a body that is not UTF-8
    (application/octet-stream, aiohttp's and Express's default for bytes, often holds
    plain text: kept as text when it decodes, as before)."""
    if charset or content_type.startswith("text/") or content_type in _TEXT_TYPES \
            or content_type.endswith("+xml"):
        return False
    if content_type.split("/")[0] in _BINARY_FAMILIES or content_type in _BINARY_TYPES \
            or content_type.startswith("application/vnd."):
        return True
    try:
        body.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):     # 1e400: no float holds it
        raise ValueError(f"{text} is too large a number")
    return value


def _refused(resp: aiohttp.ClientResponse, now: float) -> Outcome:
    """A status that is not 2xx: the function answered no (a redirect is not followed)."""
    error = f"HTTP {resp.status} {resp.reason or ''}".rstrip()
    said = resp.headers.get(signing.ERROR_HEADER)
    if said:                            # the Functions helper's (cloud.py): type: message
        error += f": {said[:signing.FUNCTION_ERROR_CHARS]}"
    if 300 <= resp.status < 400:
        error += f" to {resp.headers.get('Location')} (redirects are not followed)"
    wait_ms = (retry_after_ms(resp.headers.get("Retry-After"), now)
               if resp.status in (429, 503) else -1)
    return Outcome(FAILURE, resp.status, error=error, retry_after_ms=wait_ms)


def retry_after_ms(value: str | None, now: float) -> int:
    """How long a Retry-After header asks to wait (RFC 9110 §10.2.3: delta-seconds or an
    HTTP-date, compared with `now`, the wall clock); -1 when absent or unparsable (the
    broker then backs off by itself: broker/core/tasks/components/limits.py)."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():
        # (digits too many for int() to take are a very long wait all the same)
        ms = int(value) * 1000 if len(value) < 16 else RETRY_AFTER_MAX_MS
    else:
        ms = _ms_until(value, now)
    return min(ms, RETRY_AFTER_MAX_MS)


def _ms_until(http_date: str, now: float) -> int:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError, OverflowError):
        return -1
    if when.tzinfo is None:         # "-0000": UTC with no claim about local time
        when = when.replace(tzinfo=timezone.utc)
    return max(0, int((when.timestamp() - now) * 1000))


async def _read_up_to(stream: aiohttp.StreamReader, n: int) -> bytes:
    """The first `n` bytes of a body, or all of it if shorter."""
    chunks, size = [], 0
    while size < n:
        chunk = await stream.read(n - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _name_of(host: str) -> str:
    """A Host's name without its port (a resolved server's name is never an address)."""
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


def _say(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
