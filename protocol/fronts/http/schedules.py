"""The cron-schedule requests of the HTTP front, parsed into ops and formatted back.

    POST   /v1/schedules   {"name", "cron", "timezone"?, "function", "params"?, "options"?}
    GET    /v1/schedules?after=&limit=          a page by name: {"schedules", "next"}
    GET    /v1/schedules/{name}
    PATCH  /v1/schedules/{name}   {"paused": true | false}
    DELETE /v1/schedules/{name}

Every one needs the master key (when one is configured).  The front checks the shape of
a body only; the broker checks the rest (the cron expression, the zone, the function and
the options: broker/core/schedules/schedules.py) and answers T_SCHEDULE, T_SCHEDULES or T_ERROR.
"""
from __future__ import annotations

import json
from typing import Any

from ...schema import Op

SCHEDULE_KEYS = ("name", "cron", "timezone", "function", "params", "options")
SCHEDULE_TIMES = ("createdAt", "nextFireAt", "lastFireAt")
PAGE_LIMIT = 100


def parse_schedule(doc: Any, conn: int) -> tuple | str:
    """The T_SCHEDULE op for a POST body already decoded as JSON, or why not (a 400)."""
    if not isinstance(doc, dict):
        return "a schedule must be a JSON object"
    unknown = [key for key in doc if key not in SCHEDULE_KEYS]
    if unknown:
        return f"unknown field {unknown[0]!r}; fields are {', '.join(SCHEDULE_KEYS)}"
    for key in ("name", "cron", "function"):
        if not isinstance(doc.get(key), str):
            return f"{key} must be a string" if key in doc else f"{key} is required"
    zone = doc.get("timezone", "UTC")
    if not isinstance(zone, str):
        return "timezone must be a string (an IANA name such as Europe/Berlin)"
    options = doc.get("options")
    if options is not None and not isinstance(options, dict):
        return "options must be an object"
    params = json.dumps(doc.get("params"), separators=(",", ":")).encode()
    return (Op.T_SCHEDULE, conn, doc["name"], doc["cron"], zone, doc["function"], params,
            options)


def parse_page(query, conn: int, opcode: int = Op.T_SCHEDULES) -> tuple | str:
    unknown = [key for key in query if key not in ("after", "limit")]
    if unknown:
        return f"unknown parameter {unknown[0]!r}"
    try:
        limit = int(query.get("limit", PAGE_LIMIT))
    except ValueError:
        return "limit must be an integer"
    return (opcode, conn, query.get("after", ""), limit)


def parse_paused(doc: Any) -> bool | str:
    """A PATCH body that pauses or resumes (a schedule, a function): its boolean, or why
    not (a 400)."""
    if not isinstance(doc, dict) or set(doc) != {"paused"} or type(doc["paused"]) is not bool:
        return 'the body must be {"paused": true} or {"paused": false}'
    return doc["paused"]


def parse_pause(doc: Any, conn: int, name: str) -> tuple | str:
    paused = parse_paused(doc)
    return paused if isinstance(paused, str) else (Op.T_SCHEDULE_PAUSE, conn, name, paused)
