"""A task's info: what the broker answers about a task (R.T_TASK, R.T_LIST), the HTTP front
shows and the OpenAPI document describes, from one table.

`FIELDS` names every field once, in the order the broker writes them: its name in the
API (camelCase), whether every info has it, whether it is a time, and its JSON Schema as
the HTTP API shows it.  `TaskInfo` is the broker's typed value of the same fields (snake
case, None for a field that does not apply); `wire()` makes the map that travels, only
the fields that apply, by their API names, so the bytes are what they always were (peers
of every schema version read them).  On the wire a time is wall-clock seconds and a
result bytes; the front shows times as RFC 3339 (`TIMES`) and a result as JSON.  The
front adds the waiting room's pass (`FRONT_FIELDS`), which the broker cannot sign.
An enqueue answers only `ENQUEUED`, the fields of its 201.
"""
from typing import Any, NamedTuple

from .tasks import (ADMITTED, CANCELLED, FAILED, GROUP, MAX_ATTEMPTS, MAX_LEVEL, QUEUED,
                    RUNNING, SUCCESS, UNIQUE_ID)

#: the statuses in the order a task goes through them (the document lists them so)
STATUS_ORDER = (QUEUED, RUNNING, ADMITTED, SUCCESS, FAILED, CANCELLED)


class Field(NamedTuple):
    name: str                   # the API's (and the wire map's key)
    schema: dict                # as the HTTP API shows it (JSON Schema 2020-12)
    required: bool = False      # every info has it
    time: bool = False          # wall-clock seconds on the wire, RFC 3339 over HTTP


def time_schema(description: str) -> dict:
    """A time as the HTTP API shows it."""
    return {"type": "string", "format": "date-time",
            "description": f"{description} (RFC 3339 UTC with milliseconds)."}


UNIQUE_ID_SCHEMA = {"type": "string", "pattern": f"^{UNIQUE_ID.pattern}$"}
WAIT_TIME = {"type": "integer", "minimum": 0,
             "description": "About how many ms until it starts (queued only): the latest of "
                            "its delay, what its function's rate allows for the tasks ahead "
                            "of it and what its concurrency does at the mean time a slot "
                            "is held (a call, or an admitted online task until done, expiry "
                            "or cancel): the last minute's, or the last ten holds' within "
                            "the hour when fewer ended in the minute, or else the "
                            "function's expected_duration. Absent when its function left "
                            "the config, and with no delay, no rate or pause, no such holds "
                            "to go by and no expected_duration."}

FIELDS = (
    Field("uniqueId", UNIQUE_ID_SCHEMA, True),
    Field("function", {"type": "string"}, True),
    Field("status", {"type": "string", "enum": list(STATUS_ORDER),
                     "description": "queued also while waiting for a retry (then `error` "
                                    "holds the last failure and `retryAt` the next try)."},
          True),
    Field("createdAt", time_schema("When it was enqueued"), True, True),
    Field("calls", {"type": "integer", "minimum": 0, "description": "Calls made so far."},
          True),
    Field("maxCalls", {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS + 1,
                       "description": "Calls it may get in all: the first and its retries "
                                      "(`attempts` + 1)."}, True),
    Field("attempt", {"type": "integer", "minimum": 0,
                      "description": "The same as `calls` (the name LeanCloud's Cloud "
                                     "Queue uses)."}, True),
    Field("attempts", {"type": "integer", "minimum": 0, "maximum": MAX_ATTEMPTS,
                       "description": "Retries allowed after the first call (the option "
                                      "`attempts`; `maxCalls` is one more)."}, True),
    Field("startedAt", time_schema("When its latest call started"), time=True),
    Field("finishedAt", time_schema("When it finished"), time=True),
    Field("statusCode", {"type": "integer",
                         "description": "The HTTP status of the latest call's response."}),
    Field("result", {"description": "The function's response: its JSON value, its text "
                                    "when it is text, or {\"base64\": \"...\"} when it "
                                    "is bytes (resultHeaders has its Content-Type)."}),
    Field("resultHeaders", {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "The response headers kept: Content-Type and "
                                           "those the function's result_headers lists "
                                           "(request tasks, such functions, and bytes)."}),
    Field("error", {"type": "string", "description": "Why the latest call failed."}),
    Field("level", {"type": "integer", "minimum": 1, "maximum": MAX_LEVEL,
                    "description": "Its level (absent: 0)."}),
    Field("group", {"type": "string", "pattern": f"^{GROUP.pattern}$",
                    "description": "Its group, the tenant its function's rotation serves "
                                   "in turn (absent: none, the group \"\")."}),
    Field("clientIp", {"type": "string", "description": "The address that enqueued it "
                                                       "(the master key only)."}),
    Field("type", {"type": "string", "enum": ["online"],
                   "description": "An online (waiting-room) task; absent: offline."}),
    Field("passExpiresAt", time_schema("When an admitted task's pass expires"), time=True),
    Field("admitUrl", {"type": "string", "description": "Where its user goes, the pass "
                                                        "in the URL's fragment."}),
    Field("endedBy", {"type": "string", "enum": ["done", "expired"]}),
    Field("waitNum", {"type": "integer", "minimum": 0,
                      "description": "Due tasks of its function handed out before it if "
                                     "every group could start now: its level and those "
                                     "above, then its function's groups in turn (queued "
                                     "only; one not due yet: as if it were due now)."}),
    Field("waitTime", WAIT_TIME),
    Field("retryAt", time_schema("When the next try is due (queued after a failure)"), time=True),
    Field("upstreamAddr", {"type": "string",
                           "description": "The servers of its function's upstream its "
                                          "latest attempt called, in order, as nginx's "
                                          "$upstream_addr (\"http://a:8000, "
                                          "http://b:8000\"): more than one when a failed "
                                          "call moved to the next server (next_upstream)."}),
    Field("phase", {"type": "string", "enum": ["pre-line", "closed"],
                    "description": "Its function's line is held (queued only; absent: "
                                   "open): `pre-line` until a room event's opening "
                                   "(`opensAt`), when the visitors who joined before it "
                                   "are drawn in a random order, ahead of later joiners "
                                   "(no `waitNum` or `waitTime` before the draw); `closed`: "
                                   "the line fills and nobody is admitted (no "
                                   "`waitTime`)."}),
    Field("opensAt", time_schema("When the room event's pre-line is drawn and the line "
                                 "opens (phase pre-line only)"), time=True),
    Field("possiblyExecuted", {"type": "boolean", "enum": [True],
                               "description": "Cancelled during a call, which was aborted, "
                                              "and the function may have run all the same: "
                                              "the call's report came later and was a "
                                              "success, or (atMostOnce) says the request "
                                              "reached the host. Absent: not known to."}),
)
#: what the HTTP front adds to an admitted task's info (protocol/fronts/http/room.py)
FRONT_FIELDS = (
    Field("pass", {"type": "string", "description": "An admitted task's signed pass."}),
    Field("passError", {"type": "string", "description": "Why no pass was issued."}),
)
TIMES = tuple(f.name for f in FIELDS if f.time)
#: what a task's place leaves out of its info (T_POSITIONS, the HTTP front's event stream):
#: the fields about the task rather than where it stands.  Left out by name, not picked:
#: any other field, today's (status, waitNum, waitTime, the pass's, an end's error) or one
#: a later version adds to the info (a room's phase), is part of the place.
NOT_PLACE = frozenset({"uniqueId", "function", "createdAt", "calls", "maxCalls", "attempt",
                       "attempts", "startedAt", "finishedAt", "statusCode", "result",
                       "resultHeaders", "level", "group", "clientIp", "type"})
#: an enqueue's answer, the fields of its 201 (made after the turn's hand-out): the id,
#: the status, createdAt and, queued, the place (or a held line's phase); admitted at once, the pass's fields (the
#: front adds `pass`, FRONT_FIELDS, and the task's own `token`, ENQUEUED_TOKEN)
ENQUEUED = ("uniqueId", "status", "createdAt", "waitNum", "waitTime", "passExpiresAt",
            "admitUrl", "phase", "opensAt")
ENQUEUED_TOKEN = Field("token", {
    "type": "string", "pattern": "^zt1_[A-Za-z0-9_-]{43}$",
    "description": "The task's own token, given once: `Authorization: Bearer <token>` reads "
                   "it (GET) and cancels or leaves it (DELETE) without the master key. The "
                   "server keeps only its SHA-256. Not a pass: done and verify take the "
                   "pass."})


class TaskInfo(NamedTuple):
    """FIELDS as the broker fills them (None: the field does not apply)."""
    unique_id: str
    function: str
    status: str
    created_at: float
    calls: int
    max_calls: int
    attempt: int
    attempts: int
    started_at: float | None = None
    finished_at: float | None = None
    status_code: int | None = None
    result: bytes | None = None
    result_headers: dict | None = None
    error: str | None = None
    level: int | None = None
    group: str | None = None
    client_ip: str | None = None
    type: str | None = None
    pass_expires_at: float | None = None
    admit_url: str | None = None
    ended_by: str | None = None
    wait_num: int | None = None
    wait_time: int | None = None
    retry_at: float | None = None
    upstream_addr: str | None = None
    phase: str | None = None
    opens_at: float | None = None
    possibly_executed: bool | None = None

    def wire(self) -> dict[str, Any]:
        """The map that travels: the fields that apply, by their API names."""
        return {name: value for name, value in zip(_NAMES, self) if value is not None}


_NAMES = tuple(f.name for f in FIELDS)
assert len(_NAMES) == len(TaskInfo._fields), "TaskInfo and FIELDS name the same fields"


def position(info: dict[str, Any]) -> dict[str, Any]:
    """A task's place, from its info as it travels (`wire()`): what NOT_PLACE leaves."""
    return {name: value for name, value in info.items() if name not in NOT_PLACE}
