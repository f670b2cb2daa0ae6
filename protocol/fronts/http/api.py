"""The cloud-task API's requests and answers as data, with no HTTP server in sight.

A request body or query is parsed into a typed value here (`Enqueue`, a listing's
arguments) or refused with a `Problem` (an HTTP status, an error code, a message), and a
broker reply is turned into the JSON the API shows (TaskInfo times as RFC 3339, a
function's result as JSON or text).  STATUS is the one table of the API's refusals: every
error code, the front's own and the broker's T_ERROR ones, with the status it is
answered with.  The aiohttp handlers (front.py) only move bytes between these and the
broker; the OpenAPI document (openapi.py) reads its bounds from the constants here.
"""
from __future__ import annotations

import datetime
import json
import logging
import math
from typing import Any, NamedTuple

from ...schema import R, encodable
from ...schema.task_info import ENQUEUED, TIMES
from .schedules import SCHEDULE_TIMES

log = logging.getLogger("zstalk.http")

PAGE_LIMIT = 100            # tasks in a listing page unless `limit` says otherwise


#: every error code, the front's own and the broker's (its T_ERROR replies), with the
#: HTTP status it is answered with: the one table of the API's refusals
STATUS = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "unknown_function": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "duplicate": 409,
    "not_cancellable": 409,
    "not_retryable": 409,
    "reserved": 409,
    "not_admitted": 409,
    "too_large": 413,
    "unsupported_media_type": 415,
    "too_many_waiting": 429,
    "too_many_groups": 429,
    "line_full": 429,
    "too_many_streams": 429,
    "too_many_logins": 429,
    "internal": 500,
    "unavailable": 503,
    "streams_full": 503,
    "draining": 503,
    "out_of_memory": 503,
    "out_of_space": 503,
}


#: codes answered with Retry-After (seconds): the broker out of reach (lost, a failover
#: under way, the hold time run out) is back within seconds, or another instance leads;
#: a full line (max_waiting) has a place again as soon as one visitor is admitted or
#: leaves, which nobody can foretell: a few seconds, so a page polls without hammering
#: an event stream refused for the caps (streams.py) may be tried again a little later
RETRY_AFTER_S = {"unavailable": 1, "line_full": 5, "too_many_streams": 10, "streams_full": 10,
                 "too_many_logins": 60}


#: the code of each status the front answers on its own
CODES = {status: code for code, status in reversed(STATUS.items())}


ENQUEUE_KEYS = ("function", "type", "params", "request", "options")


MAX_BATCH = 1000            # tasks in one POST /v1/tasks array


ENQUEUED_FIELDS = ENQUEUED      # the 201 body (protocol/schema/task_info.py), and a token


TIME_FIELDS = TIMES             # TaskInfo's times, wall-clock seconds from the broker


class Problem(NamedTuple):
    """A refusal: the HTTP status and JSON error to answer (as broker/core/tasks/store.py TaskError)."""
    status: int
    code: str
    message: str


def refuse(status: int, message: str) -> Problem:
    return Problem(status, CODES[status], message)


class Enqueue(NamedTuple):
    """A checked POST /v1/tasks body."""
    function: str
    params: bytes               # compact JSON, the body the function will be POSTed
    options: dict | None        # checked by the broker (broker/core/tasks/store.py parse_options)
    request: dict | None = None     # a request task's, checked by the broker (requests.py)
    online: bool = False            # "type": "online": the waiting room (room.py)


# -- parsing -------------------------------------------------------------------------------
def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def loads_strict(data: bytes) -> Any:
    """JSON as RFC 8259 has it (no NaN or Infinity, which could not be re-encoded as JSON).
    Raises ValueError, for nesting too deep as well."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):           # 1e400: a float cannot hold it, and Infinity is no JSON
        raise ValueError(f"{text} is too large a number")
    return value


def parse_enqueue(body: bytes) -> Enqueue | list[Enqueue | Problem] | Problem:
    """The body of POST /v1/tasks: one task, or an array of them (each checked on its
    own: a bad item refuses that item only), or why the whole body is refused."""
    try:
        doc = loads_strict(body)
    except ValueError as exc:
        return refuse(400, f"the body is not valid JSON: {exc}")
    if isinstance(doc, list):
        if len(doc) > MAX_BATCH:
            return refuse(400, f"{len(doc)} tasks in one request; at most {MAX_BATCH}")
        return [parse_task(item) for item in doc]
    return parse_task(doc)


def parse_task(doc: Any) -> Enqueue | Problem:
    """One task object of POST /v1/tasks."""
    if not isinstance(doc, dict):
        return refuse(400, f"a task must be a JSON object, not {_json_type(doc)}")
    unknown = [key for key in doc if key not in ENQUEUE_KEYS]
    if unknown:
        return refuse(400, f"unknown field {unknown[0]!r}; fields are {', '.join(ENQUEUE_KEYS)}")
    function, options = doc.get("function"), doc.get("options")
    if not isinstance(function, str):
        return refuse(400, "function must be a string" if "function" in doc
                      else "function is required")
    if options is not None and not isinstance(options, dict):
        return refuse(400, f"options must be an object, not {_json_type(options)}")
    kind = doc.get("type", "offline")
    if kind not in ("offline", "online"):
        return refuse(400, "type must be \"offline\" (the default) or \"online\"")
    if kind == "online":
        if doc.get("request") is not None:
            return refuse(400, "an online task is admitted, not called: it has no request")
        if not encodable((function, options)):
            return refuse(400, "numbers must fit in 64 bits and text must be valid Unicode")
        params = json.dumps(doc.get("params"), separators=(",", ":")).encode()
        return Enqueue(function, params, options, None, True)
    request = doc.get("request")
    if request is not None:
        if doc.get("params") is not None:
            return refuse(400, "a task has params or a request, not both")
        if not isinstance(request, dict):
            return refuse(400, f"request must be an object, not {_json_type(request)}")
        if not encodable((function, options, request)):
            return refuse(400, "numbers must fit in 64 bits and text must be valid Unicode")
        return Enqueue(function, b"", options, request)
    params = json.dumps(doc.get("params"), separators=(",", ":")).encode()
    if not encodable((function, options)):
        return refuse(400, "numbers must fit in 64 bits and text must be valid Unicode")
    return Enqueue(function, params, options)


def parse_listing(query) -> tuple | Problem:
    """GET /v1/tasks's query: (function, status, limit, after); the broker checks status
    and the limit's range."""
    unknown = [key for key in query if key not in ("function", "status", "limit", "after")]
    if unknown:
        return refuse(400, f"unknown parameter {unknown[0]!r}")
    try:
        limit = int(query.get("limit", PAGE_LIMIT))
        after = int(query.get("after", 0))
    except ValueError:
        return refuse(400, "limit and after must be integers (after: a page's next)")
    return (query.get("function"), query.get("status"), limit, after)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# -- formatting ----------------------------------------------------------------------------
def rfc3339(seconds: float) -> str:
    """Wall-clock seconds as RFC 3339 UTC with milliseconds: 2026-11-24T20:30:00.123Z."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def stored_json(result: bytes) -> Any:
    """A function's response body: its JSON value when it is JSON, else its text."""
    try:
        return loads_strict(result)
    except ValueError:
        return bytes(result).decode("utf-8", "replace")


def task_json(info: dict) -> dict:
    """A broker TaskInfo as the API shows it (times as RFC 3339, the result as JSON)."""
    out = dict(info)
    for name in TIME_FIELDS:
        if out.get(name) is not None:
            out[name] = rfc3339(out[name])
    if isinstance(out.get("result"), (bytes, bytearray)):
        out["result"] = stored_json(out["result"])
    return out


def schedule_json(info: dict) -> dict:
    """A broker schedule info as the API shows it."""
    out = dict(info)
    for name in SCHEDULE_TIMES:
        if out.get(name) is not None:
            out[name] = rfc3339(out[name])
    out["params"] = stored_json(out["params"])
    return out


def function_json(info: dict) -> dict:
    """A broker function stats dict as the API shows it (pausedUntil, and a server's or a
    host's usableAt, and a server's slow start and last health check, in RFC 3339)."""
    out = dict(info)
    for name in ("pausedUntil", "opensAt"):
        if out.get(name) is not None:
            out[name] = rfc3339(out[name])
    if isinstance(out.get("lastDraw"), dict):
        out["lastDraw"] = {**out["lastDraw"], "opensAt": rfc3339(out["lastDraw"]["opensAt"])}
    if out.get("servers"):
        out["servers"] = [_server(s) for s in out["servers"]]
    host = out.get("host")
    if host and "usableAt" in host:
        out["host"] = {**host, "usableAt": rfc3339(host["usableAt"])}
    return out


def _server(server: dict) -> dict:
    """An upstream server's times in RFC 3339 (its health's last check too)."""
    out = {**server, **{k: rfc3339(server[k]) for k in ("usableAt", "slowStartUntil")
                        if k in server}}
    health = server.get("health")
    if isinstance(health, dict) and health.get("lastCheck") is not None:
        out["health"] = {**health, "lastCheck": rfc3339(health["lastCheck"])}
    return out


def reply_problem(reply: tuple) -> Problem:
    """A broker reply that is not a TaskInfo, as the refusal to answer with."""
    if reply[1] == R.T_ERROR:
        code, message = reply[2:4]
        if code not in STATUS:
            log.warning("a broker error code with no status: %r", code)
        return Problem(STATUS.get(code, 500), code, message)
    if reply[1] == R.INTERNAL_ERROR:    # held by the link past its hold time
        return refuse(503, "the broker did not answer in time")
    log.warning("unexpected broker reply %r", reply[1:2])
    return refuse(500, "unexpected reply from the broker")
