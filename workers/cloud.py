"""The Python SDK for cloud tasks: clients of the HTTP task API, and a function host.

A client enqueues calls, reads their outcome and cancels them (protocol/fronts/http/front.py
has the API; options are named as there, or in snake_case: unique_id=, keep_result=):

    from zstalk.workers.cloud import TaskClient

    tasks = TaskClient("http://127.0.0.1:8080", master_key="s3cret")
    task = tasks.enqueue("closeOrder", {"id": 1234}, delay=1000, attempts=3)
    info = tasks.get_task_info(task["uniqueId"])     # "queued", ... "success"
    print(info.get("result"))                         # the function's return value
    tasks.cancel(task["uniqueId"], token=task["token"])   # its own token: no key needed
    tasks.enqueue_request("report", "GET", "/daily", query={"day": "2026-11-26"})

AsyncTaskClient has the same methods as coroutines, on one aiohttp ClientSession:

    from zstalk.workers.cloud import AsyncTaskClient

    async def close_later(order_id: int) -> str:
        async with AsyncTaskClient("http://127.0.0.1:8080") as tasks:
            task = await tasks.enqueue("closeOrder", {"id": order_id}, delay=60000)
            return task["uniqueId"]

A function host answers the dispatcher's calls (LeanCloud's `Cloud.define`): POST
/{name} with the params as a JSON body; what the function returns is the task's result,
what it raises fails the call (500), which the task's retry policy handles:

    from zstalk.workers.cloud import Functions

    functions = Functions()         # signing key: $ZSTALK_SIGNING_KEY, if set

    @functions.define("closeOrder")
    def close_order(params):        # or `async def`; a plain def runs in a thread
        return {"closed": params["id"]}

    functions.run(port=3000)        # or functions.app(): an aiohttp web.Application

Errors are data on the wire and one exception here: every refusal of the API, and a
server that cannot be reached (status 0), raises TaskApiError(status, code, message);
a batch (`enqueue_many`) answers each item on its own, so a refused item is a result
with its status, not an exception.  With a signing key, Functions refuses (401) every
call whose X-Zstalk-Signature does not verify (workers/signing.py): its v2 when it has
one, which covers the method, path and query as received, so behind a proxy that
rewrites paths override `check_signature` to verify v1 only; without a key it verifies
nothing.
"""
from __future__ import annotations

import asyncio
import base64
import http.client
import inspect
import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any, Callable
from urllib.parse import quote

import aiohttp
from aiohttp import web

from . import signing

log = logging.getLogger("zstalk.functions")

TASKS = "/v1/tasks"
DEFAULT_URL = "http://127.0.0.1:8080"


class TaskApiError(Exception):
    """The task API refused a request (`status`, and its JSON `code` and `message`), or
    could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, code, message)     # (so that it pickles)
        self.status, self.code, self.message = status, code, message

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


# -- requests and answers, shared by both clients -------------------------------------------
def task_body(function: str, params: Any = None, options: dict | None = None) -> dict:
    """One task as POST /v1/tasks takes it (options by their API names or in snake_case)."""
    doc = {"function": function, "params": params}
    if options:
        doc["options"] = api_options(options)
    return doc


def request_task_body(function: str, method: str, path: str = "", query: dict | None = None,
                      headers: dict | None = None, body: Any = None,
                      options: dict | None = None) -> dict:
    """A request task as POST /v1/tasks takes it: `body` bytes travel as {"base64"}, a
    string as text, anything else as JSON (None: no body)."""
    request: dict[str, Any] = {"method": method, "path": path}
    if query:
        request["query"] = query
    if headers:
        request["headers"] = headers
    if isinstance(body, (bytes, bytearray, memoryview)):
        body = {"base64": base64.b64encode(bytes(body)).decode()}
    if body is not None:
        request["body"] = body
    doc: dict[str, Any] = {"function": function, "request": request}
    if options:
        doc["options"] = api_options(options)
    return doc


def api_options(options: dict) -> dict:
    """`unique_id` as `uniqueId`; names already in camelCase pass unchanged."""
    out = {}
    for name, value in options.items():
        head, *rest = name.split("_")
        camel = head + "".join(word[:1].upper() + word[1:] for word in rest)
        if camel in out:
            raise TypeError(f"option {camel} given twice (as {name} too)")
        out[camel] = value
    return out


def task_path(unique_id: str) -> str:
    return f"{TASKS}/{quote(unique_id, safe='')}"


def function_path(name: str) -> str:
    return f"/v1/functions/{quote(name, safe='')}"


def answer(status: int, body: bytes) -> Any:
    """The JSON body of a 2xx, or the API's refusal raised as TaskApiError."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if 200 <= status < 300:
        return doc
    if isinstance(doc, dict) and "error" in doc:
        raise TaskApiError(status, str(doc["error"]), str(doc.get("message", "")))
    text = body[:200].decode("utf-8", "replace")    # not the API's (a proxy, say)
    raise TaskApiError(status, "http_error", text or f"HTTP {status}")


def unreachable(method: str, url: str, exc: BaseException) -> TaskApiError:
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return TaskApiError(0, "unreachable", f"{method} {url} failed: {reason}")


def timed_out(method: str, url: str, timeout: float) -> TaskApiError:
    return TaskApiError(0, "timeout", f"no answer to {method} {url} within {timeout:g} s; "
                                      "it may or may not have taken effect")


# -- the clients -----------------------------------------------------------------------------
class TaskClient:
    """The task API over urllib: blocking, one connection per request."""

    def __init__(self, base_url: str = DEFAULT_URL, master_key: str | None = None,
                 timeout: float = 10) -> None:
        self.base_url = base_url.rstrip("/")
        self.master_key = master_key
        self.timeout = timeout

    def enqueue(self, function: str, params: Any = None, **options) -> dict:
        """The 201 body: {"uniqueId", "status", "createdAt", "token", and queued "waitNum",
        "waitTime"?} (`token`: the task's own, for `get_task_info` and `cancel`).
        `options` by their API names or in snake_case (`level=2`, `queue_timeout=60000`)."""
        return self._request("POST", TASKS, task_body(function, params, options))

    def enqueue_request(self, function: str, method: str, path: str = "", *,
                        query: dict | None = None, headers: dict | None = None,
                        body: Any = None, **options) -> dict:
        """A request task (the master key): `method` to the function's URL + `path`, with
        `query`, `headers` (the allowed ones) and `body` (bytes, text or JSON); the 201
        body as `enqueue`'s."""
        return self._request("POST", TASKS, request_task_body(
            function, method, path, query, headers, body, options))

    def function_stats(self, name: str) -> dict:
        """A function's queue, limits and pause (GET /v1/functions/{name}: the master key)."""
        return self._request("GET", function_path(name))

    def enqueue_many(self, tasks: list[dict]) -> list[dict]:
        """Items {"function", "params"?, "options"?}; one result per item, in order:
        {"status": 201, "uniqueId", "waitNum", "createdAt", "token"} or {"status": 4xx,
        "error", "message"}."""
        return self._request("POST", TASKS, tasks)

    def get_task_info(self, unique_id: str, token: str | None = None) -> dict:
        """The task's info; `token`: the task's own (its enqueue's "token"), sent instead
        of the master key."""
        return self._request("GET", task_path(unique_id), token=token)

    def cancel(self, unique_id: str, token: str | None = None) -> dict:
        """Cancel the task (or leave the waiting room), with the master key or its own
        `token`."""
        return self._request("DELETE", task_path(unique_id), token=token)

    def _request(self, method: str, path: str, doc: Any = None,
                 token: str | None = None) -> Any:
        data = None if doc is None else json.dumps(doc).encode()
        return answer(*self._send(method, self.base_url + path, data, token))

    def _send(self, method: str, url: str, data: bytes | None,
              token: str | None = None) -> tuple[int, bytes]:
        """The status and body of any answer; no answer raises TaskApiError (status 0)."""
        request = urllib.request.Request(url, data, _headers(token or self.master_key),
                                         method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:   # a status urllib does not like: an answer
            with err:
                return err.code, err.read()
        except TimeoutError:
            raise timed_out(method, url, self.timeout) from None
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                raise timed_out(method, url, self.timeout) from None
            raise unreachable(method, url, err.reason) from None
        except (OSError, http.client.HTTPException) as exc:     # broke after connecting
            raise unreachable(method, url, exc) from None


class AsyncTaskClient:
    """The task API on one aiohttp ClientSession (keep-alive), made on first use; close()
    it, or use `async with`."""

    def __init__(self, base_url: str = DEFAULT_URL, master_key: str | None = None,
                 timeout: float = 10) -> None:
        self.base_url = base_url.rstrip("/")
        self.master_key = master_key
        self.timeout = timeout
        self.http: aiohttp.ClientSession | None = None

    async def enqueue(self, function: str, params: Any = None, **options) -> dict:
        return await self._request("POST", TASKS, task_body(function, params, options))

    async def enqueue_request(self, function: str, method: str, path: str = "", *,
                              query: dict | None = None, headers: dict | None = None,
                              body: Any = None, **options) -> dict:
        return await self._request("POST", TASKS, request_task_body(
            function, method, path, query, headers, body, options))

    async def enqueue_many(self, tasks: list[dict]) -> list[dict]:
        return await self._request("POST", TASKS, tasks)

    async def get_task_info(self, unique_id: str, token: str | None = None) -> dict:
        return await self._request("GET", task_path(unique_id), token=token)

    async def function_stats(self, name: str) -> dict:
        return await self._request("GET", function_path(name))

    async def cancel(self, unique_id: str, token: str | None = None) -> dict:
        return await self._request("DELETE", task_path(unique_id), token=token)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None

    async def __aenter__(self) -> "AsyncTaskClient":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def _request(self, method: str, path: str, doc: Any = None,
                       token: str | None = None) -> Any:
        url = self.base_url + path
        data = None if doc is None else json.dumps(doc).encode()
        headers = _headers(token or self.master_key)
        try:
            async with self._session().request(method, url, data=data,
                                               headers=headers) as resp:
                return answer(resp.status, await resp.read())
        except asyncio.TimeoutError:    # ServerTimeoutError is one too: before ClientError
            raise timed_out(method, url, self.timeout) from None
        except aiohttp.ClientError as exc:
            raise unreachable(method, url, exc) from None

    def _session(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self.http


def _headers(bearer: str | None) -> dict[str, str]:
    """A request's headers; `bearer`: the master key, or a task's own token."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    return headers


# -- the function host -----------------------------------------------------------------------
class Functions:
    """Python callables served to the dispatcher: POST /{name} calls the one defined as
    `name` with the JSON body and answers its return value as JSON.

        200  the return value as JSON (or the aiohttp Response the function returned)
        400  the body is not JSON
        401  a signing key is set and the call's signature does not verify
        404  no function of that name
        500  the function raised, or returned what JSON cannot say ("function_failed")

    A signature is checked before anything else, so an unsigned caller learns nothing,
    not even which functions exist.

    What a function raised stays here (logged with its traceback), and the task shows
    only `HTTP 500`: task info can be read by its id without a key, and an exception's
    message may hold secrets.  With `expose_errors=True`, or when the broker keeps task
    info private ([api] private_results: its dispatcher then asks, X-Zstalk-Expose-Errors),
    the exception's type and message (never a traceback, at most 1 KiB) go back in the
    X-Zstalk-Error header and the body, and the task's `error` shows them."""

    def __init__(self, signing_key: str | bytes | None = None,
                 window_s: float = signing.WINDOW_S, expose_errors: bool = False,
                 require_v2: bool = False) -> None:
        """`require_v2`: refuse calls signed v1 only (once every dispatcher is this
        version or later), so a captured call cannot be sent again to another path."""
        self.signing_key = signing.signing_key(signing_key)
        self.window_s = window_s
        self.expose_errors = expose_errors
        self.require_v2 = require_v2
        self.functions: dict[str, Callable[[Any], Any]] = {}

    def define(self, name: str | None = None) -> Callable:
        """Decorator: register a callable taking the params (`def` or `async def`) under
        `name` (default: its own __name__)."""
        if callable(name):              # @functions.define, without parentheses
            return self.define()(name)

        def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            called = name or fn.__name__
            if not called or "/" in called:
                raise ValueError(f"a function name is one URL path segment, not {called!r}")
            self.functions[called] = fn
            return fn
        return register

    def app(self) -> web.Application:
        if self.signing_key is None:
            log.warning("functions: calls are not verified (no signing key; set %s)",
                        signing.ENV_KEY)
        app = web.Application()
        app.router.add_post("/{name}", self.handle)
        return app

    def run(self, host: str = "127.0.0.1", port: int = 3000) -> None:
        web.run_app(self.app(), host=host, port=port)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        denied = self.check_signature(request, body)
        if denied:
            return _refusal(401, "unauthorized", denied)
        name = request.match_info["name"]
        fn = self.functions.get(name)
        if fn is None:
            return _refusal(404, "not_found", f"no function {name!r} is defined here")
        try:
            params = json.loads(body) if body else None
        except ValueError as exc:
            return _refusal(400, "bad_request", f"the body is not JSON: {exc}")
        expose = self.expose_errors or request.headers.get(signing.EXPOSE_HEADER) == "1"
        return await self.call(name, fn, params, expose)

    def check_signature(self, request: web.Request, body: bytes) -> str | None:
        """None if the call may run, else why not.  The request line is checked (v2)
        when the signature covers it: the method, and the path and query exactly as on
        the wire (aiohttp's parser keeps them raw in rel_url; request.path is decoded)."""
        if self.signing_key is None:
            return None
        url = request.rel_url
        return signing.verify(self.signing_key, request.headers.get(signing.HEADER),
                              request.headers.get("X-Zstalk-Task-Id", ""), body,
                              time.time(), self.window_s, method=request.method,
                              path=url.raw_path, query=url.raw_query_string,
                              require_v2=self.require_v2)

    async def call(self, name: str, fn: Callable[[Any], Any], params: Any,
                   expose: bool = False) -> web.StreamResponse:
        try:
            result = await _run(fn, params)
            if isinstance(result, web.StreamResponse):
                return result
            return web.Response(text=json.dumps(result, allow_nan=False),
                                content_type="application/json")
        except Exception as exc:
            log.exception("function %s failed", name)
            if not expose:
                return _refusal(500, "function_failed", "the function raised (its type and "
                                "message: Functions(expose_errors=True))")
            said = exception_text(exc)
            response = _refusal(500, "function_failed", said)
            response.headers[signing.ERROR_HEADER] = said
            return response


def exception_text(exc: BaseException) -> str:
    """`Type: message`, on one line of printable ASCII (a header value), at most
    signing.FUNCTION_ERROR_CHARS long; no traceback."""
    text = f"{type(exc).__name__}: {exc}".encode("ascii", "backslashreplace").decode()
    text = "".join(c if c.isprintable() else " " for c in text)
    return text[:signing.FUNCTION_ERROR_CHARS]


async def _run(fn: Callable[[Any], Any], params: Any) -> Any:
    """Call `fn`: an `async def` on the loop, a plain def in a thread (it may block)."""
    if inspect.iscoroutinefunction(fn):
        result = await fn(params)
    else:
        result = await asyncio.to_thread(fn, params)
    if inspect.isawaitable(result):     # a plain def that returned a coroutine
        result = await result
    return result


def _refusal(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status)
