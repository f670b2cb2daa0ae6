"""Request tasks: a task that carries its own method, path, query, headers and body.

A plain task's params are POSTed as JSON to its function's URL.  A request task (the
API's top-level `"request"`, master key only) says what to send instead:

    {"method": "GET", "path": "/daily", "query": {"day": "2026-11-26"},
     "headers": {"Accept": "application/pdf"}, "body": null}

`parse` checks that object against its function (broker side, so every front and every
config agrees) and makes a `Request` and the body's bytes, or refuses it with a
TaskError whose message names the field.  What it allows, and why:

* `method`: GET, POST, PUT, PATCH or DELETE (POST when absent).
* `path`: appended to the function's URL path.  It has no scheme or host, so a task
  cannot send its call anywhere but its function (no SSRF); and it may not climb out of
  the function's path or smuggle another request: `..`, `//`, `\\`, a percent-encoded
  `.` or `/`, CR or LF, `?` or `#` are refused, as is any character RFC 3986 does not
  allow in a path (percent-encode it) and a `%` not followed by two hex digits.
* `query`: names to strings or lists of strings, sent in the order given, each
  percent-encoded (RFC 3986, spaces as %20).
* `headers`: an allow-list, matched without regard to case: SAFE_HEADERS and those the
  function's `request_headers` lists (the config refuses names a request may never set:
  hop-by-hop and framing headers, Host, and zstalk's own X-Zstalk-*).  Values are
  printable ASCII.
* `body`: null (none), a string (sent as UTF-8 text), `{"base64": "..."}` (bytes), or
  any other JSON value (sent as JSON).  Unless the headers name a Content-Type, it is
  text/plain; charset=utf-8, application/octet-stream or application/json accordingly.

The task keeps the body as its params (so its size counts, and the binlog keeps it as
a plain task's) and the Request beside it; a dispatcher is handed the call's URL (the
function's, the path and the query), the method and the headers (`call_ext`).
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, NamedTuple

from .....protocol.schema.task_messages import Call
from .....protocol.schema.tasks import (CONNECT_TIMEOUT_MS, FORBIDDEN_HEADERS, MAX_HEADER_VALUE,
                                        MAX_HEADERS, MAX_TARGET, METHODS, OWN_PREFIX,
                                        REQUEST_FIELDS, SAFE_HEADERS)

FIELDS = REQUEST_FIELDS

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")         # RFC 9110 §5.6.2
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")  # RFC 3986 pchar and "/"
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_VALUE = re.compile(r"[\t\x20-\x7e]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: what a path may not hold, each with the words that refuse it (checked in this order)
_PATH_REFUSALS = (
    (("\r", "\n"), "a line break"),
    (("?",), "'?' (put the query in query)"),
    (("#",), "'#'"),
    (("\\",), "'\\'"),
    (("..",), "'..'"),
    (("//",), "'//'"),
    (("%2e", "%2E", "%2f", "%2F"), "a percent-encoded '.' or '/'"),
)


class Request(NamedTuple):
    """What a request task sends beside its body (the task's params)."""
    method: str
    path: str                           # "" or "/...", as checked: appended to the URL
    query: str                          # encoded, without "?" ("" for none)
    headers: tuple[tuple[str, str], ...]

    def fields(self) -> list:
        """As the binlog keeps it (format 4's optional map, key "request")."""
        return [self.method, self.path, self.query, [list(h) for h in self.headers]]

    @classmethod
    def from_fields(cls, fields: Any) -> "Request | None":
        """The binlog's list back (None if it is not one: the task is then plain)."""
        if (not isinstance(fields, list) or len(fields) != 4
                or not all(type(f) is str for f in fields[:3])
                or not isinstance(fields[3], list)):
            return None
        headers = tuple((h[0], h[1]) for h in fields[3]
                        if isinstance(h, list) and len(h) == 2
                        and type(h[0]) is str and type(h[1]) is str)
        return cls(fields[0], fields[1], fields[2], headers)

    def size(self) -> int:
        """Bytes held for it beyond the body (memory accounting)."""
        return len(self.path) + len(self.query) + sum(len(k) + len(v) for k, v in self.headers)


def is_token(name: Any) -> bool:
    """Whether `name` can be a header's name (RFC 9110 token)."""
    return type(name) is str and _TOKEN.fullmatch(name) is not None


def header_problem(name: Any) -> str | None:
    """Why a function's config may not let requests set header `name`, if so."""
    if not is_token(name):
        return f"{name!r} is not a header name"
    lower = name.lower()
    if lower in FORBIDDEN_HEADERS or lower.startswith(OWN_PREFIX):
        return f"{name} is never a request's to set"
    return None


def parse(doc: Any, allowed: tuple[str, ...] = ()) -> tuple[Request, bytes] | str:
    """A request object checked (see the module's text): the Request and its body, or
    the sentence that refuses it.  `allowed`: the function's request_headers."""
    if not isinstance(doc, dict):
        return "request must be an object"
    unknown = [key for key in doc if key not in FIELDS]
    if unknown:
        return f"unknown request field {unknown[0]!r}; fields are {', '.join(FIELDS)}"
    method = doc.get("method", "POST")
    if method not in METHODS:
        return f"request method must be one of {', '.join(METHODS)}"
    path = _path(doc.get("path", ""))
    query = _query(doc.get("query"))
    body = _body(doc.get("body"))
    for checked in (path, query, body):
        if isinstance(checked, Refusal):
            return checked.why
    if len(path) + len(query) > MAX_TARGET:
        return f"request path and query must be at most {MAX_TARGET} bytes"
    data, content_type = body
    headers = _headers(doc.get("headers"), allowed, content_type)
    if isinstance(headers, Refusal):
        return headers.why
    return Request(method, path, query, headers), data


class Refusal(NamedTuple):
    why: str


def _path(path: Any) -> str | Refusal:
    if type(path) is not str:
        return Refusal("request path must be a string")
    problem = path_problem(path)
    return path if problem is None else Refusal(f"request path {problem}")


def path_problem(path: str) -> str | None:
    """Why `path` may not be appended to a URL (see the module's text), if so."""
    if path and not path.startswith("/"):
        return "must start with '/' (or be empty)"
    for needles, words in _PATH_REFUSALS:
        if any(n in path for n in needles):
            return f"must not hold {words}"
    if not _PATH_CHARS.fullmatch(path) or _BAD_PERCENT.search(path):
        return ("may hold only the characters RFC 3986 allows in a path, and '%' only "
                "before two hex digits: percent-encode the rest")
    from urllib.parse import unquote_to_bytes     # (here: not on zstalkd's start path)
    try:            # what a lenient server decodes must not climb out either
        decoded = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return "must percent-encode UTF-8 only"
    if ".." in decoded or "\\" in decoded or _CONTROL.search(decoded):
        return "must not hold '..', '\\' or control characters, encoded or not"
    return None


def _query(query: Any) -> str | Refusal:
    if query is None:
        return ""
    if not isinstance(query, dict):
        return Refusal("request query must be an object of strings or lists of strings")
    from urllib.parse import quote      # (here: not on zstalkd's start path)
    pairs = []
    for name, value in query.items():
        if type(name) is not str:
            return Refusal("request query names must be strings")
        values = value if isinstance(value, list) else [value]
        if not name or not all(type(v) is str for v in values):
            return Refusal(f"request query {name!r} must be a string or a list of strings"
                           if name else "request query names must not be empty")
        pairs += [f"{quote(name, safe='')}={quote(v, safe='')}" for v in values]
    return "&".join(pairs)


def _body(body: Any) -> tuple[bytes, str | None] | Refusal:
    """The bytes to send and their default Content-Type."""
    if body is None:
        return b"", None
    if type(body) is str:
        return body.encode(), "text/plain; charset=utf-8"
    if isinstance(body, dict) and list(body) == ["base64"]:
        try:
            return base64.b64decode(body["base64"], validate=True), "application/octet-stream"
        except (binascii.Error, TypeError, ValueError):
            return Refusal("request body base64 is not valid base64")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), \
        "application/json"


def _headers(headers: Any, allowed: tuple[str, ...],
             content_type: str | None) -> tuple[tuple[str, str], ...] | Refusal:
    if headers is None:
        headers = {}
    if not isinstance(headers, dict):
        return Refusal("request headers must be an object of strings")
    if len(headers) > MAX_HEADERS:
        return Refusal(f"at most {MAX_HEADERS} request headers")
    names = {n.lower(): n for n in (*SAFE_HEADERS, *allowed)}
    out = []
    for name, value in headers.items():
        known = names.get(name.lower()) if type(name) is str else None
        if known is None:
            return Refusal(f"request header {name!r} is not allowed: allowed are "
                           f"{', '.join(names.values())} (a function's request_headers "
                           f"adds to them)")
        if type(value) is not str or not _VALUE.fullmatch(value) \
                or len(value) > MAX_HEADER_VALUE:
            return Refusal(f"request header {known} must be printable ASCII, at most "
                           f"{MAX_HEADER_VALUE} characters")
        out.append((known, value))
    if content_type is not None and not any(k == "Content-Type" for k, _ in out):
        out.append(("Content-Type", content_type))
    return tuple(out)


def url(base: str, request: Request) -> str:
    """The URL a request task calls: its function's, then the path, then the query (after
    any query the function's URL has: `?code=KEY`)."""
    base, _, fixed = base.partition("?")
    target = base.rstrip("/") + request.path if request.path else base
    query = "&".join(q for q in (fixed, request.query) if q)
    return f"{target}?{query}" if query else target


def call_ext(request: Request | None, result_headers: tuple[str, ...],
             connect_timeout_ms: int = CONNECT_TIMEOUT_MS, move: int = 0,
             host: str | None = None, pool: tuple | None = None) -> dict | None:
    """T_CALL's ext for a task (protocol/schema/task_messages.py Call): None for a plain
    first call of a function that keeps no header at the default connect timeout, most
    calls, which costs no Call.  `move`: the attempt's nth move to another server;
    `host`: the name a resolved server's address stands for (sent as Host); `pool`: the
    upstream's connection pool and its keep-alive settings."""
    if request is None:
        if not result_headers and connect_timeout_ms == CONNECT_TIMEOUT_MS and not move \
                and host is None and pool is None:
            return None
        return Call(keep=result_headers, connect_timeout_ms=connect_timeout_ms,
                    move=move, host=host, pool=pool).ext()
    return Call(request.method, request.headers, True, result_headers,
                connect_timeout_ms, move, host, pool).ext()
