"""The HTTP front's views of tubes, jobs and counters: an operator's looks and actions on
the beanstalk and counter families, parsed into V_* ops and formatted back.

    GET    /v1/tubes?q=&sort=name|activity&after=&limit=   a page: {"tubes", "next"}
    GET    /v1/tubes/{tube}                      one tube's stats-tube, camelCase
    GET    /v1/tubes/{tube}/peek                 its next ready, delayed and buried job
    POST   /v1/tubes/{tube}/kick   {"bound": n}  up to n buried (else delayed) jobs: kicked
    PATCH  /v1/tubes/{tube}        {"pausedFor": seconds}   pause-tube (0: resume now)
    GET    /v1/jobs/{id}                         stats-job; its body with the master key
    DELETE /v1/jobs/{id}                         a ready, delayed or buried job (409 reserved)
    GET    /v1/counters                          every counter and fn:NAME slot, and stats
    GET    /v1/peers                             the fronts, worker pools and dispatchers

Looking needs no key (a wrong one is refused: 403), except a job's body (of GET
/v1/jobs/{id} or a peek's jobs), shown only with the master key (or when none is configured); acting (kick, pause, delete) needs the
master key.  The broker answers these ops itself (broker/core/views.py), counting no
beanstalk `cmd-*`, so a dashboard polling them changes nothing `stats` says.  A job's
body is JSON text when it is UTF-8, else base64 with "bodyEncoding": "base64".

The handlers get the front's few shared tools as arguments (`Views`), so this module
imports no front.
"""
from __future__ import annotations

import base64
from typing import Any, Callable

from aiohttp import web

from ...schema import Op, R
from ...schema.tasks import MAX_PAGE
from .api import Problem, refuse, reply_problem

PAGE_LIMIT = 100
MAX_ID = (1 << 64) - 1


def parse_ranked(query) -> tuple | str:
    """GET /v1/tubes's and GET /v1/functions's query: (q, sort, after, limit), or why not
    (a 400)."""
    unknown = [key for key in query if key not in ("q", "sort", "after", "limit")]
    if unknown:
        return f"unknown parameter {unknown[0]!r}; parameters are q, sort, after, limit"
    sort = query.get("sort", "name")
    if sort not in ("name", "activity"):
        return "sort is name or activity"
    limit = parse_limit(query, PAGE_LIMIT)
    if isinstance(limit, str):
        return limit
    return (query.get("q", ""), sort, query.get("after", ""), limit)


def parse_limit(query, default: int) -> int | str:
    """A page's `limit`, 1 to MAX_PAGE (`default` when not given), or why not (a 400)."""
    try:
        limit = int(query.get("limit", default))
    except ValueError:
        return "limit must be an integer"
    if not 1 <= limit <= MAX_PAGE:
        return f"limit is 1 to {MAX_PAGE}"
    return limit


def parse_job_id(text: str) -> int | str:
    # (ASCII digits only: str.isdigit takes "³", which int() refuses)
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_ID:
        return f"a job id is a whole number, 1 to {MAX_ID}"
    return int(text)


def whole(doc: Any, key: str, most: int) -> int | str:
    """The one field of a body, a whole number 0 to `most`, or why not."""
    if not isinstance(doc, dict) or set(doc) != {key}:
        return f'the body must be {{"{key}": <whole number>}}'
    value = doc[key]
    if type(value) is not int or not 0 <= value <= most:
        return f"{key} is a whole number, 0 to {most}"
    return value


def job_json(info: dict) -> dict:
    """A V_JOB's info as the API shows it (a body: text, else base64)."""
    body = info.get("body")
    if body is None:
        return info
    out = dict(info)
    try:
        out["body"] = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        out["body"], out["bodyEncoding"] = base64.b64encode(body).decode(), "base64"
    return out


def peek_json(info: dict) -> dict:
    """A V_PEEK's info as the API shows it: each job as job_json shows one (None: none)."""
    return {key: (job_json(value) if isinstance(value, dict) else value)
            for key, value in info.items()}


class Views:
    """The routes above, over the front's tools: `call` an op, `check_key` (None: the
    master key was shown, or none is needed), `keyed` (True, False, or a wrong key's
    Problem), `json_body` (a keyed request's decoded body, or its Problem) and `respond`
    (a Problem as the response)."""

    def __init__(self, conn: int, call: Callable, check_key: Callable, keyed: Callable,
                 json_body: Callable, respond: Callable) -> None:
        self.conn, self.call, self.check_key, self.keyed = conn, call, check_key, keyed
        self.json_body, self.respond = json_body, respond

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/tubes", self.tubes)
        app.router.add_get("/v1/tubes/{tube}", self.tube)
        app.router.add_get("/v1/tubes/{tube}/peek", self.peek)
        app.router.add_patch("/v1/tubes/{tube}", self.pause_tube)
        app.router.add_post("/v1/tubes/{tube}/kick", self.kick)
        app.router.add_get("/v1/jobs/{id}", self.job)
        app.router.add_delete("/v1/jobs/{id}", self.delete_job)
        app.router.add_get("/v1/counters", self.counters)
        app.router.add_get("/v1/peers", self.peers)

    async def _answer(self, op: tuple, shape: Callable[[Any], Any] = lambda info: info):
        reply = await self.call(op)
        if reply[1] == R.V_INFO:
            return web.json_response(shape(reply[2]))
        if reply[1] == R.V_PAGE:
            return web.json_response({"tubes": reply[2], "next": reply[3]})
        return self.respond(reply_problem(reply))

    def _looking(self, request: web.Request) -> Problem | None:
        """Looking needs no key; a wrong one is still refused."""
        key = self.keyed(request)
        return key if isinstance(key, Problem) else None

    async def tubes(self, request: web.Request) -> web.Response:
        denied = self._looking(request)
        query = denied or parse_ranked(request.query)
        if isinstance(query, (Problem, str)):
            return self.respond(query if isinstance(query, Problem) else refuse(400, query))
        return await self._answer((Op.V_TUBES, self.conn, *query))

    async def tube(self, request: web.Request) -> web.Response:
        denied = self._looking(request)
        if denied:
            return self.respond(denied)
        return await self._answer((Op.V_TUBE, self.conn, request.match_info["tube"]))

    async def peek(self, request: web.Request) -> web.Response:
        key = self.keyed(request)
        if isinstance(key, Problem):
            return self.respond(key)
        return await self._answer((Op.V_PEEK, self.conn, request.match_info["tube"], key is True),
                                  peek_json)

    async def kick(self, request: web.Request) -> web.Response:
        return await self._acted(request, Op.V_KICK, "bound", 2 ** 32 - 1)

    async def pause_tube(self, request: web.Request) -> web.Response:
        return await self._acted(request, Op.V_PAUSE_TUBE, "pausedFor", 2 ** 32 - 1)

    async def _acted(self, request: web.Request, opcode: int, key: str, most: int):
        """A keyed action on a tube whose body is one whole number."""
        doc = await self.json_body(request)
        value = doc if isinstance(doc, Problem) else whole(doc, key, most)
        if isinstance(value, (Problem, str)):
            return self.respond(value if isinstance(value, Problem) else refuse(400, value))
        return await self._answer((opcode, self.conn, request.match_info["tube"], value))

    async def job(self, request: web.Request) -> web.Response:
        key = self.keyed(request)
        job_id = key if isinstance(key, Problem) else parse_job_id(request.match_info["id"])
        if isinstance(job_id, (Problem, str)):
            return self.respond(job_id if isinstance(job_id, Problem) else refuse(400, job_id))
        return await self._answer((Op.V_JOB, self.conn, job_id, key is True), job_json)

    async def delete_job(self, request: web.Request) -> web.Response:
        denied = self.check_key(request)
        job_id = denied or parse_job_id(request.match_info["id"])
        if isinstance(job_id, (Problem, str)):
            return self.respond(job_id if isinstance(job_id, Problem) else refuse(400, job_id))
        return await self._answer((Op.V_DELETE_JOB, self.conn, job_id))

    async def counters(self, request: web.Request) -> web.Response:
        denied = self._looking(request)
        if denied:
            return self.respond(denied)
        return await self._answer((Op.V_COUNTERS, self.conn))

    async def peers(self, request: web.Request) -> web.Response:
        denied = self._looking(request)
        if denied:
            return self.respond(denied)
        return await self._answer((Op.V_PEERS, self.conn))
