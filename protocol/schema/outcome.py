"""A call's outcome: one type for the dispatcher that reports it (workers/upstream/dispatcher.py) and
the task store that applies it (broker/core/tasks/model/outcomes.py), and its wire form.

On the wire an outcome is T_OUTCOME's fields after (conn, unique_id, attempt): kind,
status_code, result, error, retry_after_ms, and an ext map (None when it says nothing):
{"headers": {name: value}} (the response headers a success keeps: resultHeaders) and
{"failure": "error" | "timeout"} (how a failed call failed: an upstream's servers are judged
by it), and from schema 8 {"sent": true | false} (whether the request may have been sent:
a call that failed before it was moves to the next server whatever the task's delivery
mode) and {"move": n} (the call's T_CALL said it was the attempt's nth move, echoed so
a late report of an earlier server's call is not taken for the current one's).
`fields()` makes that tuple; `Outcome.read(fields)` reads a peer's, checked once here:
None when it cannot be one (the core notes the report and changes nothing); an error
text is cut to TASK_ERROR_CHARS and made valid UTF-8; a Retry-After is bounded (-1: none
was sent; a dispatcher before schema 2 sent 0 for none); headers are kept only when they
are strings of a sane size, and only for a success.
"""
from __future__ import annotations

from typing import NamedTuple

from .tasks import MAX_DURATION_MS, OUTCOME_KINDS, TASK_ERROR_CHARS

#: what a success may keep of its response's headers (more, or larger: none are kept)
MAX_RESULT_HEADERS, MAX_RESULT_HEADER_BYTES = 64, 64 << 10
#: how a call failed, as the dispatcher says (None: not said; "": the broker's own verdict,
#: a dispatcher gone or no report in time, which is no server's fault)
FAILURES = ("error", "timeout")


class Outcome(NamedTuple):
    kind: str                   # "success" | "failure" | "unknown" | "fatal" | "declined"
    status_code: int | None = None
    result: bytes | None = None
    error: str | None = None
    retry_after_ms: int = -1    # a 429 / 503's Retry-After, ms (-1: none was sent)
    result_headers: dict | None = None  # a success's kept response headers (resultHeaders)
    failure: str | None = None  # "error", "timeout"; None: not said; "": the broker's verdict
    sent: bool = True           # the request may have been sent (a peer that does not say: it may)
    move: int = 0               # which call of its attempt this is: 0 the first, n its nth move

    def fields(self) -> tuple:
        """The wire form: T_OUTCOME's fields after (conn, unique_id, attempt)."""
        ext = {}
        if self.result_headers:
            ext["headers"] = self.result_headers
        if self.failure:
            ext["failure"] = self.failure
        if not self.sent:
            ext["sent"] = False
        if self.move:
            ext["move"] = self.move
        return (self.kind, self.status_code, self.result, self.error, self.retry_after_ms,
                ext or None)

    @classmethod
    def read(cls, kind, status_code, result, error, retry_after_ms,
             ext=None) -> "Outcome | None":
        """A peer's outcome from its wire fields, or None when they cannot be one."""
        if (kind not in OUTCOME_KINDS or type(retry_after_ms) is not int
                or not (result is None or type(result) is bytes)
                or not (status_code is None
                        or type(status_code) is int and 100 <= status_code <= 599)):
            return None
        if error is not None:           # text that can travel on to any front
            error = str(error)[:TASK_ERROR_CHARS].encode(
                "utf-8", "backslashreplace").decode("utf-8")
        wait_ms = -1 if retry_after_ms < 0 else min(retry_after_ms, MAX_DURATION_MS)
        said = ext if isinstance(ext, dict) else {}
        headers = _result_headers(said.get("headers")) if kind == "success" else None
        failure, move = said.get("failure"), said.get("move")
        return cls(kind, status_code, result, error, wait_ms, headers,
                   failure if failure in FAILURES else None, said.get("sent") is not False,
                   move if type(move) is int and move > 0 else 0)


def _result_headers(headers) -> dict | None:
    """Headers to keep, if they are {str: str} of a sane size."""
    if not isinstance(headers, dict) or not headers or len(headers) > MAX_RESULT_HEADERS:
        return None
    if not all(type(k) is str and type(v) is str for k, v in headers.items()):
        return None
    if sum(len(k) + len(v) for k, v in headers.items()) > MAX_RESULT_HEADER_BYTES:
        return None
    return headers
