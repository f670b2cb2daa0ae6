"""The OpenAPI document's part for the views of tubes, jobs and counters (views.py): their
paths and schemas, which openapi.py's `document` merges into the whole.  The few shared
helpers (a keyed operation, a JSON answer, the refusals) are openapi.py's, handed in by
`paths`' caller, so neither module imports the other in a circle."""
from __future__ import annotations

from typing import Callable

from ...schema.tasks import MAX_PAGE

COUNT = {"type": "integer", "minimum": 0}
TUBE_FIELDS = ("currentJobsUrgent", "currentJobsReady", "currentJobsReserved",
               "currentJobsDelayed", "currentJobsBuried", "totalJobs", "currentUsing",
               "currentWatching", "currentWaiting", "cmdDelete", "cmdPauseTube", "pause",
               "pauseTimeLeft", "activity", "oldestReadyAgeMs")
JOB_FIELDS = ("id", "pri", "age", "delay", "ttr", "timeLeft", "file", "reserves", "timeouts",
              "releases", "buries", "kicks")


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def schemas() -> dict:
    tube = {"type": "object", "additionalProperties": False,
            "required": ["name", *TUBE_FIELDS, "paused"],
            "description": "A tube as beanstalk's stats-tube shows it (its keys in camelCase), "
                           "whether it is paused now, and its activity: puts, reserves and "
                           "deletes so far (what sort=activity orders by), and how long "
                           "its oldest ready job has been ready, in ms (oldestReadyAgeMs, 0 "
                           "when none is: a released, kicked or no longer delayed job counts "
                           "from then).",
            "properties": {"name": {"type": "string"}, "paused": {"type": "boolean"},
                           **{k: COUNT for k in TUBE_FIELDS}}}
    job = {"type": "object", "additionalProperties": False,
           "required": ["tube", "state", *JOB_FIELDS],
           "description": "A job as beanstalk's stats-job shows it (camelCase); its body "
                          "only to the master key.",
           "properties": {"tube": {"type": "string"},
                          "state": {"enum": ["ready", "delayed", "reserved", "buried"]},
                          "body": {"type": "string"},
                          "bodyEncoding": {"enum": ["base64"], "description":
                                           "Present when the body is not UTF-8 text."},
                          **{k: COUNT for k in JOB_FIELDS}}}
    counters = {"type": "object", "additionalProperties": False,
                "required": ["counters", "stats"],
                "properties": {
                    "counters": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False,
                        "required": ["name", "current", "max"],
                        "properties": {"name": {"type": "string"}, "current": COUNT,
                                       "max": {**COUNT, "description": "The most in use this "
                                               "stat interval."}}}},
                    "stats": {"type": "object", "description": "yrmcds' counter stats.",
                              "additionalProperties": {"type": "integer"}}}}
    page = {"type": "object", "additionalProperties": False, "required": ["tubes", "next"],
            "properties": {"tubes": {"type": "array", "maxItems": MAX_PAGE,
                                     "items": _ref("TubeStats")},
                           "next": {"oneOf": [{"type": "string"}, {"type": "null"}],
                                    "description": "The `after` of the next page."}}}
    peered = peers()
    return {"TubeStats": tube, "JobStats": job, "Counters": counters, "TubePage": page,
            "TubePeek": peek(), "Peers": peered, "Dashboard": dashboard(tube, counters, peered)}


def peers() -> dict:
    """GET /v1/peers's answer: the fronts, worker pools and dispatchers connected."""
    peer = {"type": "object", "additionalProperties": False,
            "required": ["kind", "frontId", "pid", "version", "sessions", "lastSeenMs"],
            "properties": {
                "kind": {"type": "string", "description": "beanstalk, counter, http, pool "
                         "(a zstalk worker), client (a native client) or dispatcher."},
                "frontId": COUNT, "pid": COUNT,
                "version": {**COUNT, "description": "The schema version it speaks."},
                "sessions": {**COUNT, "description": "Its client connections (one for a "
                             "pool or a dispatcher)."},
                "lastSeenMs": {**COUNT, "description": "Since it last spoke (a heartbeat "
                               "at least every second)."},
                "reserved": {**COUNT, "description": "Jobs its sessions hold (beanstalk "
                             "fronts, pools and native clients)."},
                "credits": {**COUNT, "description": "A pool's: jobs it can take now."},
                "tubes": {"type": "array", "items": {"type": "string"},
                          "description": "A pool's: the tubes it takes jobs from."},
                "slots": {**COUNT, "description": "A dispatcher's: calls it can take now."},
                "stopping": {"type": "boolean", "description": "A dispatcher's: it finishes "
                             "its calls and takes no more."}}}
    return {"type": "object", "additionalProperties": False, "required": ["peers", "total"],
            "properties": {"peers": {"type": "array", "maxItems": MAX_PAGE, "items": peer,
                                     "description": "By kind, then process id."},
                           "total": {**COUNT, "description": "How many there are."}}}


def peek() -> dict:
    """GET /v1/tubes/{tube}/peek's answer: its next ready, delayed and buried job."""
    job = {"oneOf": [{"type": "object", "additionalProperties": False,
                      "required": ["id", "pri", "age", "delayLeft"],
                      "properties": {"id": COUNT, "pri": COUNT, "age": COUNT,
                                     "delayLeft": {**COUNT, "description": "Seconds until a "
                                                   "delayed job is ready (stats-job's "
                                                   "time-left); 0 for the others."},
                                     "body": {"type": "string", "description":
                                              "Only to the master key."},
                                     "bodyEncoding": {"enum": ["base64"], "description":
                                                      "Present when the body is not "
                                                      "UTF-8 text."}}},
                     {"type": "null"}]}
    return {"type": "object", "additionalProperties": False,
            "required": ["tube", "ready", "delayed", "buried"],
            "description": "What peek-ready, peek-delayed and peek-buried would show "
                           "(null: none); no cmd-peek-* is counted.",
            "properties": {"tube": {"type": "string"}, "ready": job, "delayed": job,
                           "buried": job}}


def dashboard(tube: dict, counters: dict, peered: dict) -> dict:
    """GET /v1/dashboard's snapshot (dashboard.py)."""
    rated = {**tube, "required": [*tube["required"], "puts", "putRate"], "properties": {
        **tube["properties"], "putRate": {**COUNT, "description": "Puts in the last second."},
        "puts": {"type": "array", "items": COUNT, "description": "Puts a second, the last "
                 "60 seconds, oldest first (differences kept by the front)."}}}
    cursor = {"oneOf": [{"type": "string"}, {"type": "null"}],
              "description": "The next page's start (tubesAfter, functionsAfter)."}
    shown = lambda item, text: {"oneOf": [  # noqa: E731
        {"type": "array", "items": item}, {"type": "null"}], "description": text}
    return {"type": "object", "additionalProperties": False,
            "required": ["tubes", "tubesNext", "counters", "peers", "functions",
                         "functionsNext", "schedules"],
            "properties": {
                "tubes": {"type": "array", "maxItems": MAX_PAGE, "items": rated,
                          "description": "Busiest first (as sort=activity)."},
                "tubesNext": cursor, "functionsNext": cursor,
                "counters": counters["properties"]["counters"],
                "peers": peered["properties"]["peers"],
                "functions": shown(_ref("FunctionStats"), "Busiest first (starts a second, "
                                   "then tasks queued and running); null without the "
                                   "master or the viewer key."),
                "schedules": shown(_ref("Schedule"), "Null without the master key.")}}


def paths(keyed_op: Callable, json: Callable, responses: Callable) -> dict:
    """The views' paths, with openapi.py's `_keyed_op`, `_json` and `_responses`."""
    tube = {"name": "tube", "in": "path", "required": True, "example": "default",
            "schema": {"type": "string"}}
    job = {"name": "id", "in": "path", "required": True, "example": "1",
           "schema": {"type": "string", "pattern": "^[0-9]+$"}}
    looked = lambda op, summary, ok, *errors, **extra: {   # noqa: E731 (a keyless look)
        "operationId": op, "summary": summary, "security": [{}, {"masterKey": []}], **extra,
        "responses": responses(ok, "403", *errors, "503")}
    one = lambda key: {"required": True, "content": {"application/json": {"schema": {  # noqa
        "type": "object", "additionalProperties": False, "required": [key],
        "properties": {key: {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1}}}}}}
    query = [{"name": name, "in": "query", "required": False, "schema": schema,
              "description": text} for name, schema, text in (
        ("q", {"type": "string"}, "Only tubes whose name holds this."),
        ("sort", {"enum": ["name", "activity"], "default": "name"},
         "By name, or by activity, busiest first (ranked at most once a second)."),
        ("after", {"type": "string"}, "A cursor: the previous page's `next`."),
        ("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100},
         "At most this many."))]
    tube_ok = {"200": json(_ref("TubeStats"), "The tube.")}
    kicked = {"type": "object", "additionalProperties": False, "required": ["tube", "kicked"],
              "properties": {"tube": {"type": "string"}, "kicked": COUNT}}
    return {
        "/v1/tubes": {"get": looked("listTubes", "A page of tubes, by name or activity",
                                    {"200": json(_ref("TubePage"), "A page.")}, "400",
                                    parameters=query)},
        "/v1/tubes/{tube}": {
            "get": looked("getTube", "A tube's stats", tube_ok, "404", parameters=[tube]),
            "patch": keyed_op("pauseTube", "Pause a tube for some seconds (0: resume)",
                              tube_ok, "400", "404", "408", "413", "415", parameters=[tube],
                              requestBody=one("pausedFor"))},
        "/v1/tubes/{tube}/peek": {"get": looked(
            "peekTube", "A tube's next ready, delayed and buried job (bodies: master key)",
            {"200": json(_ref("TubePeek"), "The jobs.")}, "404", parameters=[tube])},
        "/v1/tubes/{tube}/kick": {"post": keyed_op(
            "kickTube", "Kick up to `bound` buried jobs of a tube (else delayed ones)",
            {"200": json(kicked, "How many were kicked.")}, "400", "404", "408", "413", "415",
            parameters=[tube], requestBody=one("bound"))},
        "/v1/jobs/{id}": {
            "get": looked("getJob", "A job's stats, and its body with the master key",
                          {"200": json(_ref("JobStats"), "The job.")}, "400", "404",
                          parameters=[job]),
            "delete": keyed_op("deleteJob", "Delete a ready, delayed or buried job",
                               {"200": json(_ref("JobStats"), "The job, as it was.")},
                               "400", "404", "409", parameters=[job])},
        "/v1/counters": {"get": looked("listCounters", "Every counter: in use and the most",
                                       {"200": json(_ref("Counters"), "The counters.")})},
        "/v1/peers": {"get": looked("listPeers", "The fronts, worker pools and dispatchers",
                                    {"200": json(_ref("Peers"), "Those connected.")})},
        **dashboard_paths(looked, json),
        **ui_paths(looked, json),
    }


def ui_paths(looked: Callable, json: Callable) -> dict:
    """The dashboard's log-in (protocol/fronts/http/ui.py, access.py)."""
    role = {"type": "object", "additionalProperties": False, "required": ["role"],
            "properties": {"role": {"enum": ["master", "viewer", "nobody"]},
                           "keyed": {"type": "boolean", "description": "Whether the server "
                                     "has a master key (false: loopback only, no log-in)."}}}
    cookie = {"Set-Cookie": {"schema": {"type": "string"}, "description":
                             "zstalk_ui: HttpOnly; SameSite=Strict; Path=/ (Secure on HTTPS)."}}
    login_ok = json(role, "Logged in: the cookie is set (with a master key configured).")
    login_ok["headers"] = cookie
    body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "additionalProperties": False, "required": ["key"],
        "properties": {"key": {"type": "string"}}}}}}
    asset = {"name": "name", "in": "path", "required": True,
             "schema": {"enum": ["dashboard.js", "dashboard.css"]}}
    page = lambda *kinds: {"description": "The file, with a Content-Security-Policy that "  # noqa
                           "allows only this origin.", "content": {kind: {"schema": {
                               "type": "string"}} for kind in kinds}}
    return {
        "/ui": {"get": {"operationId": "uiRedirect", "summary": "On to /ui/ (typed without "
                        "its slash)", "security": [{}], "responses": {"308": {
                            "description": "Location: /ui/", "headers": {"Location": {
                                "schema": {"type": "string", "const": "/ui/"}}}}}}},
        "/ui/": {"get": {"operationId": "uiPage", "summary": "The dashboard: one page",
                         "security": [{}], "responses": {"200": page("text/html")}}},
        "/ui/assets/{name}": {"get": {
            "operationId": "uiAsset", "summary": "The dashboard's script and style",
            "security": [{}], "parameters": [asset],
            "responses": {"200": page("text/javascript", "text/css"),
                          "404": json({"$ref": "#/components/schemas/Error"}, "No such file.")}}},
        "/ui/login": {"post": looked(
            "uiLogin", "Exchange the master key or the viewer key for the dashboard's cookie",
            {"200": login_ok}, "400", "408", "413", "415", "429", requestBody=body,
            description="The cookie, signed with a key derived from the master key, is "
                        "taken by every front with the same keys, for 12 hours; rotating "
                        "the key logs everyone out. An action (not GET) made with the "
                        "cookie and no bearer key also needs the header X-Zstalk-Action: 1. "
                        "10 wrong keys from one address within 60 s: 429 for a while.")},
        "/ui/logout": {"post": looked("uiLogout", "Clear the dashboard's cookie",
                                      {"200": json(role, "The cookie is cleared.")})},
        "/ui/session": {"get": looked("uiSession", "Who this request is: master, viewer "
                                      "or nobody", {"200": json(role, "The role.")})},
    }


def dashboard_paths(looked: Callable, json: Callable) -> dict:
    query = [{"name": name, "in": "query", "required": False, "schema": schema,
              "description": text} for name, schema, text in (
        ("q", {"type": "string"}, "Only tubes, functions and schedules whose name holds "
                                  "this (the broker searches all of them)."),
        ("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 50},
         "At most this many tubes, and functions."),
        ("tubesAfter", {"type": "string"}, "The previous snapshot's `tubesNext`."),
        ("functionsAfter", {"type": "string"}, "The previous snapshot's `functionsNext`."))]
    event = {"type": "object", "description": "One event (its data: JSON).",
             "properties": {"event": {"enum": ["snapshot", "problem"]},
                            "data": {"type": "string", "contentMediaType": "application/json"}}}
    return {
        "/v1/dashboard": {"get": looked(
            "getDashboard", "The whole broker at a glance: tubes, counters, functions, "
            "schedules", {"200": json(_ref("Dashboard"), "A snapshot.")}, "400",
            parameters=query)},
        "/v1/dashboard/events": {"get": looked(
            "dashboardEvents", "The dashboard's snapshot every second: Server-Sent Events",
            {"200": {"description": "The stream: `snapshot` (a Dashboard) every second, or "
                                    "`problem` (an Error) while the broker does not answer.",
                     "content": {"text/event-stream": {"schema": event}}}}, "400", "429",
            parameters=query,
            description="Under the task streams' caps (4 a client address, "
                        "--http-max-streams a front); a client that leaves 64 KiB unsent "
                        "is cut off and reconnects.")},
    }
