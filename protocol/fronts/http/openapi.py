"""The OpenAPI document of the cloud-task HTTP API, served at GET /v1/openapi.json.

How it works: `document()` builds the whole document as a plain dict in this one place.
Every bound in it comes from the constant the rule is enforced with (the task API's
vocabulary, protocol/schema/tasks.py: the option ranges, statuses, the uniqueId and
function-name patterns; api.py: the batch and page sizes), so a rule changed there changes here too.  tests/fronts/test_openapi.py
keeps the rest true: the document is checked against OpenAPI's own schema, the option
schemas are checked against `parse_options` on the same values, and schemathesis drives
a real `zstalk serve` from the document it serves (no 5xx; every status, content type and
body as documented).

OpenAPI 3.1 (https://spec.openapis.org/oas/v3.1.0): its schemas are JSON Schema 2020-12,
so "null or absent" and "one object or an array" are said plainly.  Response objects
are closed (`additionalProperties: false`), so a field the API starts to send without
being documented here fails the tests.
"""
from __future__ import annotations

from ...schema import VERSION
from ...schema.task_info import (ENQUEUED, ENQUEUED_TOKEN, FIELDS, FRONT_FIELDS, STATUS_ORDER,
                                 WAIT_TIME, time_schema)
from ...schema.tasks import (DEFAULT_ATTEMPTS, DEFAULT_BACKOFF_MS, DEFAULT_KEEP_RESULT_MS,
                             DEFAULT_TIMEOUT_MS, FUNCTION_NAME, GROUP, INT64, MAX_ATTEMPTS,
                             MAX_DURATION_MS, MAX_LEVEL, MAX_PAGE, MAX_TIMEOUT_MS, METHODS,
                             QUEUE_TIMEOUT, QUEUED, RUNNING, SAFE_HEADERS, SCHEDULE_NAME,
                             STATUSES, UNIQUE_ID, ADMITTED)
from . import openapi_views
from .api import MAX_BATCH, PAGE_LIMIT
from .cors import MAX_AGE_S, ROUTES

OPENAPI_VERSION = "3.1.0"
PATH = "/v1/openapi.json"
_DAY_MS = 24 * 3600 * 1000
_STATUSES = sorted(STATUSES, key=STATUS_ORDER.index)


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _pattern(regex) -> str:
    """A fullmatch regex of broker/core/tasks/store.py as a JSON Schema pattern (which may match
    anywhere, so it is anchored)."""
    return f"^{regex.pattern}$"


def _ms(description: str, default: int | None = None, low: int = 0,
        high: int = MAX_DURATION_MS) -> dict:
    schema = {"type": "integer", "minimum": low, "maximum": high, "description": description}
    if default is not None:
        schema["default"] = default
    return schema


# -- request schemas (what broker/core/tasks/store.py parse_options and api.py parse_task take) -------
def task_options() -> dict:
    year = f"{MAX_DURATION_MS} ms is {MAX_DURATION_MS // _DAY_MS} days"
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "How the task runs. Every option is optional; an unknown one is a "
                       f"400. Durations are integer milliseconds ({year}). Integers are "
                       "written as such: 1.0 or 1e3 is refused.",
        "properties": {
            "attempts": {"type": "integer", "minimum": 0, "maximum": MAX_ATTEMPTS,
                         "default": DEFAULT_ATTEMPTS,
                         "description": "How many times a failed call is retried (so by "
                                        "default a failing task is called twice)."},
            "backoff": {"oneOf": [_ms("A fixed wait before each retry.", DEFAULT_BACKOFF_MS),
                                  _ref("Backoff")],
                        "description": "The wait before each retry: milliseconds, or a "
                                       "policy.", "default": DEFAULT_BACKOFF_MS},
            "delay": _ms("The wait before the first call.", 0),
            "deliveryMode": {"type": "string", "enum": ["atLeastOnce", "atMostOnce"],
                             "default": "atLeastOnce",
                             "description": "Whether a call whose outcome is unknown (a timeout "
                                            "after sending, a lost connection, a dispatcher "
                                            "gone mid-call) is retried (atLeastOnce: the "
                                            "function may run more than once) or fails the "
                                            "task (atMostOnce)."},
            "group": {"type": "string", "pattern": _pattern(GROUP),
                      "description": "Its group, the tenant it is enqueued for: within a "
                                     "level, a function's groups with a due task are served "
                                     "in turn, one task per turn, each group's best by "
                                     "`priority`, so one group's backlog does not hold up "
                                     "the others. Default: none (the group \"\"). Like "
                                     "every option, only a request with the master key may "
                                     "set it."},
            "keepResult": _ms("How long a finished task stays queryable (and its uniqueId "
                              "taken); a read by its token or the master key shortens it to "
                              "the function's keep_result_after_read, if set.",
                              DEFAULT_KEEP_RESULT_MS),
            "level": {"type": "integer", "minimum": 0, "maximum": MAX_LEVEL, "default": 0,
                      "description": "Higher levels run first among a function's due tasks "
                                     "(0 normal, 2 VIP, 3 SVIP...), then `priority`. Like "
                                     "every option, only a request with the master key may "
                                     "set it."},
            "priority": {"type": "integer", "format": "int64", "minimum": INT64[0],
                         "maximum": INT64[1],
                         "description": "Lower runs first among a function's due tasks of "
                                        "one level. Default: the enqueue time in ms since the "
                                        "epoch, so tasks run in time order."},
            "queueTimeout": _ms(f"How long after createdAt the task may still be queued "
                                f"(delays and retry waits count): past it the task fails "
                                f"with the error \"{QUEUE_TIMEOUT}\" and is never called. "
                                "Default: the function's queue_timeout in the config (none "
                                "unless set). A delay at or past it is a 400.", low=1),
            "timeout": _ms("How long one call may take. Default: the function's timeout in "
                           f"the config ({DEFAULT_TIMEOUT_MS} ms unless set). At most the "
                           "function's "
                           f"max_timeout in the config, {MAX_TIMEOUT_MS} ms (15 min) unless "
                           "set: the maximum here.", low=1, high=MAX_TIMEOUT_MS),
            "uniqueId": {"type": "string", "pattern": _pattern(UNIQUE_ID),
                         "description": "The task's id (default: 32 random hex digits). While "
                                        "a task with this id exists (queued, running, or "
                                        "finished within keepResult) enqueueing another is "
                                        "a 409."},
        },
    }


def backoff() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "A retry policy: `fixed` waits `delay` before every retry, "
                       "`exponential` delay * 2^(retry - 1); both at most `maxDelay`; "
                       "`jitter` waits a uniformly random part of that (full jitter). A 503 "
                       "with Retry-After waits at least that long (and pauses the function); "
                       "a 429 is no failure: the task keeps its place, no attempt is spent, "
                       "and the function pauses.",
        "properties": {
            "type": {"type": "string", "enum": ["fixed", "exponential"], "default": "fixed"},
            "delay": _ms("The first wait.", DEFAULT_BACKOFF_MS),
            "maxDelay": _ms("The longest wait.", MAX_DURATION_MS),
            "jitter": {"type": "boolean", "default": False},
        },
    }


def task_request() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["function"],
        "properties": {
            "function": {"type": "string", "pattern": _pattern(FUNCTION_NAME),
                         "description": "The function to call: one named in the config, or "
                                        "any name under its base_url. A name that is not "
                                        "configured is a 404."},
            "params": {"description": "Any JSON value: the body POSTed to the function "
                                      "(default null)."},
            "request": _ref("CallRequest"),
            "type": {"type": "string", "enum": ["offline", "online"], "default": "offline",
                     "description": "online: a waiting-room task, admitted (a pass) when its "
                                    "turn comes, never called."},
            "options": {"oneOf": [_ref("TaskOptions"), {"type": "null"}]},
        },
        # params or a request, not both (a null params beside a request is none)
        "not": {"required": ["params", "request"],
                "properties": {"params": {"not": {"type": "null"}}}},
        "examples": [{"function": "closeOrder", "params": {"id": 1234},
                      "options": {"delay": 600000, "attempts": 10, "backoff": 10000}},
                     {"function": "report", "request": {
                         "method": "GET", "path": "/daily", "query": {"day": "2026-11-26"},
                         "headers": {"Accept": "application/pdf"}}}],
    }


def call_request() -> dict:
    strings = {"type": "array", "items": {"type": "string"}}
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "A request task's call, in place of params (the master key only): "
                       "sent to the function's URL with `path` appended. The path may not "
                       "hold '..', '//', '\\', a percent-encoded '.' or '/', a line break, "
                       "'?' or '#', nor characters RFC 3986 does not allow in a path.",
        "properties": {
            "method": {"type": "string", "enum": list(METHODS), "default": "POST"},
            "path": {"type": "string", "default": "",
                     "pattern": r"^(/[A-Za-z0-9\-._~!$&'()*+,;=:@%]*)*$"},
            "query": {"type": "object", "additionalProperties": {
                "oneOf": [{"type": "string"}, strings]},
                "description": "Sent in the order given, percent-encoded."},
            "headers": {"type": "object", "additionalProperties": {"type": "string"},
                        "description": "Only " + ", ".join(SAFE_HEADERS) + ", and "
                                       "those the function's request_headers lists."},
            "body": {"description": "null (no body), a string (text), {\"base64\": "
                                    "\"...\"} (bytes) or any other JSON value (sent as "
                                    "JSON)."},
        },
    }


# -- response schemas ------------------------------------------------------------------------
def task_info() -> dict:
    fields = (*FIELDS, *FRONT_FIELDS)       # (protocol/schema/task_info.py: one table)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [f.name for f in fields if f.required],
        "description": "A task as it is now; fields that do not apply are absent.",
        "properties": {f.name: f.schema for f in fields},
    }


def enqueued() -> dict:
    schemas = {f.name: f.schema for f in (*FIELDS, *FRONT_FIELDS)
               if f.name in ENQUEUED or f in FRONT_FIELDS}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["uniqueId", "status", "createdAt", "token"],
        "description": "Made after the hand-out of the enqueue's turn, so it says what a GET "
                       "right after would: queued with its place (waitNum, waitTime); "
                       "running when a dispatcher took it at once; an online task admitted "
                       "at once with its pass, passExpiresAt and admitUrl; queued in a held "
                       "line with its phase (a room event's pre-line: opensAt and no place "
                       "yet; closed: its place and no waitTime). And the task's own token, "
                       "given only here.",
        "properties": {
            **schemas,
            "status": {"type": "string", "enum": [QUEUED, RUNNING, ADMITTED]},
            "waitNum": {"type": "integer", "minimum": 0,
                        "description": "Tasks of its function ahead of it (queued only)."},
            ENQUEUED_TOKEN.name: ENQUEUED_TOKEN.schema,
        },
    }


def batch_item() -> dict:
    fields = {name: schema for name, schema in enqueued()["properties"].items()
              if name != "status"}
    ok = {"type": "object", "additionalProperties": False,
          "required": ["status", "uniqueId", "createdAt", ENQUEUED_TOKEN.name],
          "description": "The 201's fields but the task's status: an online task admitted "
                         "at once has its pass, passExpiresAt and admitUrl here too; "
                         "waitNum is 0 for a task not queued, and absent in a pre-line.",
          "properties": {"status": {"type": "integer", "enum": [201]}, **fields}}
    refused = {"type": "object", "additionalProperties": False,
               "required": ["status", "error", "message"],
               "properties": {"status": {"type": "integer", "minimum": 400, "maximum": 599},
                              "error": {"type": "string"}, "message": {"type": "string"}}}
    return {"oneOf": [ok, refused],
            "description": "One item's outcome, in the order sent: `status` is the HTTP status "
                           "the item alone would have had, with its 201 or error body."}


def page() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["tasks", "next"],
        "properties": {
            "tasks": {"type": "array", "maxItems": MAX_PAGE, "items": _ref("TaskInfo")},
            "next": {"oneOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"type": "null"}],
                     "description": "The `after` of the next page; null: no more."},
        },
    }


def error() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "string", "pattern": "^[a-z_]+$",
                      "description": "A stable code: bad_request, unauthorized, forbidden, "
                                     "not_found, unknown_function, duplicate, "
                                     "not_cancellable, too_large, unsupported_media_type, "
                                     "draining, out_of_memory, unavailable, ..."},
            "message": {"type": "string", "description": "What went wrong, for people."},
        },
    }


# -- schedules (broker/core/schedules/schedules.py) ---------------------------------------------------------
def schedule_request() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "cron", "function"],
        "properties": {
            "name": {"type": "string", "pattern": _pattern(SCHEDULE_NAME)},
            "cron": {"type": "string", "description": "6 fields, seconds first: second minute "
                     "hour day-of-month month day-of-week, with `* , - /`, `?` in exactly one "
                     "of the day fields, JAN-DEC and SUN-SAT, day-of-week numbers 1 = SUN to "
                     "7 = SAT (Quartz)."},
            "timezone": {"type": "string", "default": "UTC",
                         "description": "An IANA time zone name, such as Europe/Berlin."},
            "function": {"type": "string", "pattern": _pattern(FUNCTION_NAME)},
            "params": {"description": "The JSON body of every call (default null)."},
            "options": {"oneOf": [_ref("TaskOptions"), {"type": "null"}],
                        "description": "The tasks' options, as for an enqueue, but for "
                                       "uniqueId (each fire makes its own)."},
        },
        "examples": [{"name": "close-orders", "cron": "0 */5 * * * ?", "function": "closeOrder",
                      "timezone": "Asia/Shanghai", "params": {"all": True}}],
    }


def schedule() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "cron", "timezone", "function", "params", "options", "paused",
                     "createdAt"],
        "properties": {
            "name": {"type": "string"}, "cron": {"type": "string"},
            "timezone": {"type": "string"}, "function": {"type": "string"},
            "params": {}, "options": {"type": "object"},
            "paused": {"type": "boolean"},
            "createdAt": time_schema("When it was made"),
            "nextFireAt": time_schema("When it fires next (absent: paused, or never again)"),
            "lastFireAt": time_schema("When it last fired"),
            "lastError": {"type": "string",
                          "description": "Why its last fire enqueued nothing, if so."},
        },
    }


def schedule_page() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["schedules", "next"],
        "properties": {
            "schedules": {"type": "array", "maxItems": MAX_PAGE, "items": _ref("Schedule")},
            "next": {"oneOf": [{"type": "string"}, {"type": "null"}],
                     "description": "The `after` of the next page (a name); null: no more."},
        },
    }


def _schedule_name() -> dict:
    return {"name": "name", "in": "path", "required": True, "example": "close-orders",
            "schema": {"type": "string"}}


def _keyed_op(operation_id: str, summary: str, ok: dict, *errors: str, **extra) -> dict:
    return {"operationId": operation_id, "summary": summary, "security": _key(), **extra,
            "responses": _responses(ok, "401", "403", *errors, "503")}


def schedule_paths() -> dict:
    one = _json(_ref("Schedule"), "The schedule.")
    body = lambda ref: {"required": True,       # noqa: E731
                        "content": {"application/json": {"schema": _ref(ref)}}}
    limit = {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}}
    after = {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "A cursor: the previous page's `next`."}
    pause = {"type": "object", "additionalProperties": False, "required": ["paused"],
             "properties": {"paused": {"type": "boolean"}}}
    return {
        "/v1/schedules": {
            "post": _keyed_op("createSchedule", "Make a cron schedule that enqueues a task "
                                 "at each fire time", {"201": _json(_ref("Schedule"), "Made.")},
                                 "400", "404", "408", "409", "413", "415",
                                 requestBody=body("ScheduleRequest")),
            "get": _keyed_op("listSchedules", "A page of schedules by name",
                                {"200": _json(_ref("SchedulePage"), "A page.")}, "400",
                                parameters=[after, limit]),
        },
        "/v1/schedules/{name}": {
            "get": _keyed_op("getSchedule", "A schedule, with its next fire time",
                                {"200": one}, "404", parameters=[_schedule_name()]),
            "patch": _keyed_op("pauseSchedule", "Pause or resume a schedule", {"200": one},
                                  "400", "404", "408", "413", "415",
                                  parameters=[_schedule_name()],
                                  requestBody={"required": True, "content": {
                                      "application/json": {"schema": pause}}}),
            "delete": _keyed_op("deleteSchedule", "Delete a schedule", {"200": one}, "404",
                                   parameters=[_schedule_name()]),
        },
    }


# -- operations ------------------------------------------------------------------------------
def _json(schema: dict, description: str, headers: dict | None = None,
          links: dict | None = None) -> dict:
    out = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    if links:
        out["links"] = links
    return out


def _links(*operation_ids: str) -> dict:
    """Where an answer's uniqueId can go next (OpenAPI links: clients and stateful testers
    read them)."""
    return {op: {"operationId": op, "parameters": {"uniqueId": "$response.body#/uniqueId"}}
            for op in operation_ids}


#: the refusals every operation can answer, and when
_ERRORS = {
    "400": "A malformed request: the body, a parameter or an option.",
    "401": "No `Authorization: Bearer <master key>` (with a master key configured), where "
           "the config's [api] policy needs it.",
    "403": "A wrong master key; or, with no master key configured, a Host header that does "
           "not name loopback.",
    "403 keyless": "With no master key configured, a Host header that does not name loopback.",
    "404": "No such task, or no such function.",
    "408": "The body did not all arrive within the server's body timeout "
           "(--http-body-timeout, 30 s by default); the connection is closed.",
    "409": "A conflict: the uniqueId is taken, or the task can no longer be cancelled.",
    "409 finished": "The task has finished (success, failed or cancelled): there is "
                    "nothing left to cancel.",
    "413": "A body over the config's `[api] max_body` (1 MiB by default).",
    "415": "A body not sent as Content-Type: application/json.",
    "429": "Too many: online tasks waiting from this client address (the function's "
           "max_waiting_per_client, too_many_waiting), a new group beyond the function's "
           "max_groups (too_many_groups), or the function's line is full: as many online "
           "tasks wait as its max_waiting says (line_full, with Retry-After).",
    "503": "The broker cannot take it now: draining, out of job memory (--max-jobs-bytes), "
           "or out of reach.",
}


#: a 429 line_full's header: when to try again (api.py RETRY_AFTER_S)
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer", "minimum": 0},
                                "description": "line_full only: seconds to wait before "
                                               "trying again."}}


def _responses(ok: dict, *errors: str) -> dict:
    """`ok` and the refusals named in `errors` ("403 keyless": an operation that needs no key)."""
    out = dict(ok)
    for name in errors:
        status = name.split()[0]
        headers = {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Bearer"]}}}
        out[status] = _json(_ref("Error"), _ERRORS[name], headers if status == "401" else
                            _RETRY_AFTER if status == "429" else None)
    return out


def _key() -> list:
    return [{"masterKey": []}]


def _token() -> list:
    return [{"taskToken": []}]


#: a task token that is not the task's own
_WRONG_TOKEN = ("A wrong master key; a task token that is not this task's own (another "
                "task's, a wrong one, or this task has none); or, with no master key "
                "configured, a Host header that does not name loopback.")


def _unique_id() -> dict:
    """The path parameter; its example names a task the tests make."""
    return {"name": "uniqueId", "in": "path", "required": True, "example": "order-1234",
            "schema": {"type": "string", "pattern": _pattern(UNIQUE_ID)}}


def enqueue() -> dict:
    location = {"Location": {"schema": {"type": "string"}, "description": "/v1/tasks/{uniqueId}"}}
    body = {"oneOf": [_ref("TaskRequest"),
                      {"type": "array", "maxItems": MAX_BATCH, "items": _ref("TaskRequest")}]}
    return {
        "operationId": "enqueue",
        "summary": "Enqueue a task, or an array of them",
        "description": f"One task answers 201. An array of up to {MAX_BATCH} is enqueued in one "
                       "broker round trip and answers 200 with each item's result in order; an "
                       "item with an error enqueues nothing for that item only. A body that is "
                       "not JSON, or too many items, is a 400 and enqueues nothing. Needs the "
                       "master key unless the config says `[api] public_enqueue = true`; "
                       "then an enqueue without it may set no option.",
        "security": [*_key(), {}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": _responses({
            "201": _json(_ref("Enqueued"), "Enqueued.", location,
                         _links("getTask", "cancelTask")),
            "200": _json({"type": "array", "maxItems": MAX_BATCH, "items": _ref("BatchItem")},
                         "The array form: each item's result."),
        }, "400", "401", "403", "404", "408", "409", "413", "415", "429", "503"),
    }


def listing() -> dict:
    def query(name: str, schema: dict, description: str) -> dict:
        return {"name": name, "in": "query", "required": False, "schema": schema,
                "description": description}
    return {
        "operationId": "listTasks",
        "summary": "A page of tasks, oldest first (for operators)",
        "security": _key(),
        "parameters": [
            query("function", {"type": "string"}, "Only this function's tasks."),
            query("status", {"type": "string", "enum": _STATUSES}, "Only tasks in this status."),
            query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE,
                            "default": PAGE_LIMIT}, "Tasks in the page at most."),
            query("after", {"type": "integer"},
                  "A cursor: the previous page's `next` (absent: from the start)."),
        ],
        "responses": _responses({"200": _json(_ref("TaskPage"), "A page; fewer tasks than "
                                              "`limit` does not mean the last page, a null "
                                              "`next` does.")},
                                "400", "401", "403", "503"),
    }


def get_task() -> dict:
    return {
        "operationId": "getTask",
        "summary": "A task's status and result",
        "description": "Needs no key: a random uniqueId is the capability (unless the config "
                       "says `[api] private_results = true`), or the task's own token "
                       "(Authorization: Bearer zt1_..., from its 201), which reads it under "
                       "private_results too. A wrong key or token is refused. A read "
                       "by the token or the master key that returns a finished task "
                       "shortens its keep to its function's keep_result_after_read, if set "
                       "(never lengthens it); a read by id alone does not.",
        "security": [{}, *_key(), *_token()],
        "parameters": [_unique_id()],
        "responses": {**_responses({"200": _json(_ref("TaskInfo"), "The task.")},
                                   "401", "403", "404", "503"),
                      "403": _json(_ref("Error"), _WRONG_TOKEN)},
    }


def task_events() -> dict:
    """GET /v1/tasks/{uniqueId}/events (protocol/fronts/http/streams.py, events.py)."""
    retry = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds."}}
    event = {"type": "object", "description": "One event (its data: JSON).",
             "properties": {"event": {"type": "string", "enum": ["place", "admitted", "end"]},
                            "id": {"type": "string"}, "retry": {"type": "integer"},
                            "data": {"type": "string", "contentMediaType": "application/json"}}}
    return {
        "operationId": "taskEvents",
        "summary": "A task's place as it changes: Server-Sent Events",
        "description": "For whoever may read the task (as getTask). Events, each with an `id` "
                       "that is the state it sent: `place` {status, waitNum, waitTime, and "
                       "whatever else the task shows of its place} when waitNum or anything "
                       "but waitTime changes, or waitTime moves by 10 % or 5 s; `admitted` "
                       "{pass, passExpiresAt, admitUrl}; `end` {status, error, endedBy}, "
                       "then the stream ends. A comment every 15 s, `retry: 2000` first. "
                       "With `Last-Event-ID` (on any front) the current place is sent first "
                       "only if it moved from that one. An open stream keeps a waiting "
                       "online task's place (it counts as looking). A stream whose client "
                       "leaves 64 KiB unsent is closed.",
        "security": [{}, *_key(), *_token()],
        "parameters": [_unique_id(),
                       {"name": "Last-Event-ID", "in": "header", "required": False,
                        "schema": {"type": "string"},
                        "description": "The id of the last event the client had."}],
        "responses": {**_responses({"200": {"description": "The stream.", "content": {
                          "text/event-stream": {"schema": event}}}},
                                   "401", "404"),
                      "403": _json(_ref("Error"), _WRONG_TOKEN),
                      "429": _json(_ref("Error"), "This client address has 4 streams open "
                                                  "(too_many_streams).", retry),
                      "503": _json(_ref("Error"), "The front holds as many streams as it may "
                                                  "(--http-max-streams, streams_full), or the "
                                                  "broker is out of reach.", retry)},
    }


def cancel() -> dict:
    return {
        "operationId": "cancelTask",
        "summary": "Cancel a task that is queued, waiting for a retry or running (its call "
                   "is aborted), or leave the waiting room",
        "description": "With the master key, or the task's own token (Authorization: Bearer "
                       "zt1_..., from its 201: this task only). An online task waiting in "
                       "line leaves it at once and everyone behind moves up; an admitted "
                       "one frees its slot and its pass is revoked. A running task is "
                       "cancelled at once, its slot free: its dispatcher aborts the HTTP "
                       "call (the function's host sees the connection close), and what "
                       "the call reports later only sets possiblyExecuted (a success; for "
                       "atMostOnce, a request that reached the host). A dispatcher older "
                       "than schema 8 is not told: its call runs to its end.",
        "security": [*_key(), *_token()],
        "parameters": [_unique_id()],
        "responses": {**_responses({"200": _json(_ref("TaskInfo"), "Cancelled: the task, "
                                                 "with status cancelled.")},
                                   "401", "403", "404", "409 finished", "503"),
                      "403": _json(_ref("Error"), _WRONG_TOKEN)},
    }


def done() -> dict:
    return {
        "operationId": "taskDone",
        "summary": "An admitted online task's user is through: its slot goes to the next",
        "description": "Authorised by the task's pass (Authorization: Bearer <pass>, or "
                       "X-Zstalk-Pass) or the master key.",
        "security": [],
        "parameters": [_unique_id()],
        "responses": _responses({"200": _json(_ref("TaskInfo"), "Done: the task, a success "
                                              "with endedBy done.")},
                                "401", "403", "404", "409", "503"),
    }


def passes_verify() -> dict:
    plain = {"schema": {"type": "string"}}
    return {
        "operationId": "verifyPass",
        "summary": "Check a waiting-room pass (for nginx's auth_request)",
        "description": "The pass in Authorization: Bearer or X-Zstalk-Pass; ?function= "
                       "names the function it must be for. 204 lets the request through; "
                       "X-Zstalk-Pass-Check says whether the broker confirmed the task is "
                       "still admitted (broker) or was out of reach (offline).",
        "security": [],
        "parameters": [{"name": "function", "in": "query", "required": False,
                        "schema": {"type": "string"}}],
        "responses": {
            "204": {"description": "A good pass.",
                    "headers": {"X-Zstalk-Task-Id": plain, "X-Zstalk-Pass-Check": plain}},
            "401": _json(_ref("Error"), "No pass, or not one.",
                         {"WWW-Authenticate": {"schema": {"type": "string"}}}),
            "403": _json(_ref("Error"), "Expired, forged, another function's, an unknown "
                                        "key's, or revoked (done or cancelled); or this "
                                        "front has no pass key file (no_keys)."),
        },
    }


def room_paths() -> dict:
    """The waiting page and its static files (protocol/fronts/http/page.py): for browsers."""
    name = {"name": "function", "in": "path", "required": True, "schema": {"type": "string"}}
    static = {"name": "name", "in": "path", "required": True,
              "schema": {"type": "string", "enum": ["room.js", "room.css"]}}
    return {
        "/room/{function}": {"get": {
            "operationId": "roomPage",
            "summary": "The waiting page of a function the public may join",
            "description": "HTML (its room_template, or the built-in page) in English or "
                           "German by Accept-Language, under a Content-Security-Policy "
                           "without 'unsafe-inline'. Its script joins the line, or takes "
                           "back the place its localStorage keeps, follows taskEvents and "
                           "goes to admitUrl when admitted. Only for a function whose "
                           "`online` is \"public\" or \"only\".",
            "security": [{}], "parameters": [name],
            "responses": _responses({"200": {"description": "The page.", "content": {
                "text/html": {"schema": {"type": "string"}}}}}, "404")}},
        "/room/static/{name}": {"get": {
            "operationId": "roomStatic",
            "summary": "The waiting page's script or style, cached for a year",
            "security": [{}], "parameters": [static],
            "responses": _responses({"200": {"description": "The file.", "content": {
                "text/javascript": {"schema": {"type": "string"}},
                "text/css": {"schema": {"type": "string"}}}}}, "404")}},
    }


def preflight(path: str, operation_id: str) -> dict:
    """OPTIONS on a route a page may call (protocol/fronts/http/cors.py)."""
    route, plain = ROUTES[path], {"schema": {"type": "string"}}

    def header(name: str, description: str) -> dict:
        return {"name": name, "in": "header", "required": False,
                "schema": {"type": "string"}, "description": description}
    judged = ("the origins of the functions a request without the master key can enqueue "
              "to" if route.enqueue else "any function's origins")
    return {
        "operationId": operation_id,
        "summary": f"CORS preflight: may a page {' or '.join(route.methods)} here?",
        "description": f"A browser asks before a page at another origin may "
                       f"{' or '.join(route.methods)} "
                       f"here. Allowed when the Origin is among {judged} (each function's "
                       "`allow_origins` in the config; the request itself is then judged by "
                       "its function's), the method is "
                       f"{' or '.join(route.methods)} and the headers are among "
                       f"{', '.join(route.headers)}. "
                       "Without Origin and Access-Control-Request-Method: a plain OPTIONS, "
                       "answered 204 with Allow.",
        "security": [],
        "parameters": [header("Origin", "The page's origin, as the browser sends it."),
                       header("Access-Control-Request-Method", "The method it will use."),
                       header("Access-Control-Request-Headers", "The headers it will send, "
                                                                "comma-separated.")],
        "responses": {
            "204": {"description": "Allowed (the browser keeps the answer for Max-Age "
                                   "seconds); or a plain OPTIONS.",
                    "headers": {"Access-Control-Allow-Origin": plain,
                                "Access-Control-Allow-Methods": plain,
                                "Access-Control-Allow-Headers": plain,
                                "Access-Control-Max-Age": {"schema": {
                                    "type": "string", "enum": [str(MAX_AGE_S)]}},
                                "Allow": plain}},
            "403": _json(_ref("Error"), "Not an origin, method or header this route allows: "
                                        "no CORS headers, so the browser stops there."),
        },
    }


# -- functions (broker/core/tasks/views.py function_stats) -------------------------------------
def function_stats() -> dict:
    count = {"type": "integer", "minimum": 0}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "queued", "due", "delayed", "running", "oldestQueuedAgeMs"],
        "description": "A function's queue, limits and pause, as now.  A function gone "
                       "from the config whose tasks still wait shows its counts only, "
                       "without concurrency: its tasks are not called until it is back.",
        "properties": {
            "name": {"type": "string"},
            "queued": {**count, "description": "Tasks queued: due and delayed."},
            "due": count, "delayed": count,
            "running": {**count, "description": "Calls in flight."},
            "paused": {"type": "boolean",
                       "description": "An operator paused it (PATCH): no call starts and "
                                      "no online task is admitted until resumed; kept "
                                      "across restarts. Apart from pausedUntil, the "
                                      "server's own pause after a 429 or 503."},
            "upstream": {"type": "string", "description": "The upstream its calls go to."},
            "host": {"type": "object", "additionalProperties": False,
                     "required": ["url", "state", "fails"],
                     "description": "Its plain url's host (scheme, host and port, shared "
                                    "by the functions under it) while calls to it fail "
                                    "(absent: they do not, or max_fails is 0). Failed: "
                                    "shut by this function's max_fails, its tasks wait in "
                                    "place until one probe call may go at usableAt.",
                     "properties": {"url": {"type": "string"},
                                    "state": {"type": "string", "enum": ["usable", "failed"]},
                                    "fails": {"type": "integer", "minimum": 1},
                                    "usableAt": {"type": "string", "format": "date-time"}}},
            "waitingOnline": {**count, "description": "Online tasks waiting in line."},
            "admitted": {**count, "description": "Online tasks admitted now (each holds a "
                                                 "slot until done or its pass expires)."},
            "admissionsPerMinute": {"type": "number", "minimum": 0},
            "abandonedPerMinute": {"type": "number", "minimum": 0},
            "servers": {"type": "array", "description": "Its upstream's servers as the "
                                                        "broker sees them for every dispatcher.",
                        "items": {"type": "object", "additionalProperties": False,
                                  "required": ["url", "state", "inFlight", "fails"],
                                  "properties": {
                                      "url": {"type": "string", "description":
                                              "scheme://host[:port]; for a server whose name "
                                              "its upstream resolves (resolve), one of the "
                                              "name's addresses."},
                                      "name": {"type": "string", "description":
                                               "A resolved name's server: the url as "
                                               "written, sent as Host (absent: url is)."},
                                      "state": {"type": "string", "description":
                                                "draining: an address its name no longer "
                                                "resolves to, shown while calls on it run.",
                                                "enum": ["usable", "failed", "paused", "full",
                                                         "down", "unhealthy", "draining"]},
                                      "backup": {"type": "boolean"},
                                      "inFlight": count, "fails": count,
                                      "usableAt": {"type": "string", "format": "date-time"},
                                      "slowStartUntil": {
                                          "type": "string", "format": "date-time",
                                          "description": "In slow start until then: its "
                                                         "weight ramps up after it recovered "
                                                         "or was added (absent: full)."},
                                      "weightShare": {
                                          "type": "number", "minimum": 0, "maximum": 1,
                                          "description": "In slow start: the part of its "
                                                         "weight it has now."},
                                      "health": {
                                          "type": "object", "additionalProperties": False,
                                          "required": ["status", "lastCheck"],
                                          "description": "Its upstream's active health "
                                                         "checks (absent: it has none): "
                                                         "down is skipped by every pick.",
                                          "properties": {
                                              "status": {"type": "string",
                                                         "enum": ["up", "down"]},
                                              "lastCheck": {"type": ["string", "null"],
                                                            "format": "date-time"},
                                              "error": {"type": "string", "description":
                                                        "Why the last check failed "
                                                        "(absent: it passed)."}}},
                                      "lastError": {"type": "string"}}}},
            "groups": {"type": "object", "additionalProperties": False,
                       "required": ["count", "busiest"],
                       "description": "Its named groups with queued, running or admitted "
                                      "tasks (absent: none; tasks without a group are not "
                                      "in it).",
                       "properties": {
                           "count": count,
                           "busiest": {"type": "array", "maxItems": 10,
                                       "description": "The 10 with the most queued tasks "
                                                      "(due and delayed), most first.",
                                       "items": {"type": "object",
                                                 "additionalProperties": False,
                                                 "required": ["group", "queued", "running"],
                                                 "properties": {
                                                     "group": {"type": "string"},
                                                     "queued": count,
                                                     "running": {**count, "description":
                                                                 "Calls in flight and "
                                                                 "admitted online tasks."}}}}}},
            "heldByCounters": {**count, "description": "Slots counter clients hold as the "
                                                    "counter fn:NAME (absent: none); they "
                                                    "count against concurrency too."},
            "concurrency": {"type": "integer", "minimum": 1},
            "oldestQueuedAgeMs": {**count, "description": "How long its oldest queued task "
                                                       "has been waiting since createdAt."},
            "rate": {"type": "string", "pattern": "^[0-9]+/[smh]$",
                     "description": "At most this many calls start per second, minute or "
                                    "hour, over every dispatcher (absent: no rate)."},
            "burst": count,
            "groupConcurrency": {"type": "integer", "minimum": 1,
                                 "description": "Calls at once per group, over every "
                                                "dispatcher (absent: no such limit)."},
            "groupRate": {"type": "string", "pattern": "^[0-9]+/[smh]$",
                          "description": "At most this many calls of each group start per "
                                         "second, minute or hour (absent: no group rate)."},
            "groupBurst": count,
            "pausedUntil": time_schema("No call starts before then: its server answered 429 or "
                                 "503"),
            "pauseReason": {"type": "string"},
            "startRate": {"type": "number", "minimum": 0,
                          "description": "Calls started per second over the last minute."},
            "callP50Ms": {**count, "description": "Its calls' durations over the last "
                                                "minute: median (absent: none ended)."},
            "callP90Ms": {**count, "description": "... and 90th percentile."},
            "holdP50Ms": {**count, "description": "How long its admitted online tasks held "
                                                "their slot (admission to done, expiry or "
                                                "cancel) over the last minute: median "
                                                "(absent: none ended)."},
            "holdP90Ms": {**count, "description": "... and 90th percentile."},
            "waitTime": {**WAIT_TIME, "description": "The waitTime a task enqueued now "
                                                        "would get (absent in a held line)."},
            "phase": {"type": "string", "enum": ["pre-line", "closed"],
                      "description": "Its line is held (absent: open): a room event's "
                                     "pre-line until opensAt, or closed; nobody starts."},
            "opensAt": time_schema("When the room event's pre-line is drawn and the line "
                                   "opens (phase pre-line only)"),
            "maxWaiting": {"type": "integer", "minimum": 1,
                           "description": "Online tasks that may wait at once (absent: no "
                                          "cap); one more is a 429 line_full."},
            "lastDraw": {"type": "object", "additionalProperties": False,
                         "required": ["opensAt", "seed"],
                         "description": "Its latest room event's draw: the order of the "
                                        "pre-line is reproducible from the seed and the "
                                        "tasks' ids (docs/waiting-room.md).",
                         "properties": {
                             "opensAt": time_schema("The opening the draw was made for"),
                             "seed": {"type": "string", "pattern": "^[0-9]{1,20}$",
                                      "description": "The draw's 64-bit seed, in decimal."}}},
        },
    }


def function_paths() -> dict:
    limit = {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}}
    after = {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "A cursor: the previous page's `next`."}
    q = {"name": "q", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "Only functions whose name holds this (among all of them)."}
    sort = {"name": "sort", "in": "query", "required": False,
            "schema": {"enum": ["name", "activity"], "default": "name"},
            "description": "By name, or busiest first: starts a second over the last minute, "
                           "then tasks queued and running (ranked at most once a second)."}
    page = {"type": "object", "additionalProperties": False, "required": ["functions", "next"],
            "properties": {"functions": {"type": "array", "maxItems": MAX_PAGE,
                                         "items": _ref("FunctionStats")},
                           "next": {"oneOf": [{"type": "string"}, {"type": "null"}]}}}
    name = {"name": "name", "in": "path", "required": True, "example": "closeOrder",
            "schema": {"type": "string"}}
    return {
        "/v1/functions": {"get": _keyed_op(
            "listFunctions", "A page of functions (configured, or used by tasks), by name "
            "or busiest first", {"200": _json(page, "A page.")}, "400",
            parameters=[q, sort, after, limit])},
        "/v1/functions/{name}": {
            "get": _keyed_op("getFunction", "A function's queue, limits and pause",
                             {"200": _json(_ref("FunctionStats"), "The function.")}, "404",
                             parameters=[name]),
            "patch": _keyed_op("pauseFunction", "Pause a function, or resume it (an "
                               "operator's pause: kept across restarts)",
                               {"200": _json(_ref("FunctionStats"), "The function.")},
                               "400", "404", "408", "413", "415", parameters=[name],
                               requestBody={"required": True, "content": {
                                   "application/json": {"schema": {
                                       "type": "object", "additionalProperties": False,
                                       "required": ["paused"],
                                       "properties": {"paused": {"type": "boolean"}}}}}})},
    }


def retry() -> dict:
    return {
        "operationId": "retryTask",
        "summary": "Run a failed or cancelled task again",
        "description": "Its attempts start again from the first and its error, status code "
                       "and result are cleared; it is queued, due now (no queueTimeout: it "
                       "had its time). Any other status, or an online task, is 409 "
                       "not_retryable.",
        "security": _key(),
        "parameters": [_unique_id()],
        "responses": _responses({"200": _json(_ref("TaskInfo"), "The task, queued again (or "
                                              "running, when a dispatcher took it at once).")},
                                "401", "403", "404", "409", "503"),
    }


def openapi() -> dict:
    return {
        "operationId": "openapi",
        "summary": "This document",
        "security": [],
        "responses": _responses({"200": _json({"type": "object"}, "The OpenAPI document.")},
                                "403 keyless"),
    }


def document() -> dict:
    """The OpenAPI document of the whole HTTP API."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "zstalk cloud tasks",
            "version": VERSION,
            "description": "Enqueue a function call; zstalk makes it over HTTP with retries, "
                           "delays, priorities and deduplication, and keeps its result. Times "
                           "are RFC 3339 UTC with milliseconds, durations integer "
                           "milliseconds. Every error is JSON {\"error\", \"message\"}. "
                           "A web page at another origin may enqueue, read and end the tasks "
                           "of a function whose `allow_origins` (in the config) lists it "
                           "(CORS: the OPTIONS operations).",
        },
        "paths": {
            "/v1/tasks": {"post": enqueue(), "get": listing(),
                          "options": preflight("/v1/tasks", "preflightEnqueue")},
            "/v1/tasks/{uniqueId}": {
                "get": get_task(), "delete": cancel(),
                "options": preflight("/v1/tasks/{uniqueId}", "preflightGetTask")},
            "/v1/tasks/{uniqueId}/events": {
                "get": task_events(),
                "options": preflight("/v1/tasks/{uniqueId}/events", "preflightTaskEvents")},
            "/v1/tasks/{uniqueId}/done": {
                "post": done(),
                "options": preflight("/v1/tasks/{uniqueId}/done", "preflightTaskDone")},
            "/v1/tasks/{uniqueId}/retry": {"post": retry()},
            "/v1/passes/verify": {"get": passes_verify()},
            **room_paths(),
            **schedule_paths(),
            **function_paths(),
            **openapi_views.paths(_keyed_op, _json, _responses),
            PATH: {"get": openapi()},
        },
        "components": {
            "schemas": {"TaskRequest": task_request(), "CallRequest": call_request(),
                        "TaskOptions": task_options(),
                        "Backoff": backoff(), "TaskInfo": task_info(), "Enqueued": enqueued(),
                        "BatchItem": batch_item(), "TaskPage": page(), "Error": error(),
                        "ScheduleRequest": schedule_request(), "Schedule": schedule(),
                        "SchedulePage": schedule_page(), "FunctionStats": function_stats(),
                        **openapi_views.schemas()},
            "securitySchemes": {"masterKey": {
                "type": "http", "scheme": "bearer",
                "description": "The master key (--master-key or ZSTALK_MASTER_KEY, or the "
                               "file --master-key-file or ZSTALK_MASTER_KEY_FILE names). With none "
                               "configured no key is asked for, and only loopback Host names "
                               "are answered."},
                "taskToken": {
                    "type": "http", "scheme": "bearer",
                    "description": "A task's own token, `zt1_` and 43 characters of base64url, "
                                   "given once in its enqueue's answer (`token`): it reads, "
                                   "cancels or leaves that task only. The server keeps only "
                                   "its SHA-256. Not a pass (done and verify take the pass)."}},
        },
    }
