"""The dashboard's data (issue 50): one snapshot of the whole broker, and a stream of them.

    GET /v1/dashboard?q=&limit=&tubesAfter=&functionsAfter=     a snapshot (JSON)
    GET /v1/dashboard/events?(the same)                         the snapshot every second (SSE)

A snapshot holds `tubes` (the operator's view, busiest first, `q` a part of the name; each
with `putRate`, puts in the last second, and `puts`, the last HISTORY_S per-second
differences of total-jobs, for a sparkline), `counters`, `peers` (the fronts, worker pools
and dispatchers connected: GET /v1/peers), `functions` (busiest first, as the tubes; queued, running,
startRate, the `waitTime` a newcomer would get, pauses, upstream servers) and `schedules`
(next fire), each list with the `next` cursor of its page.  Functions and schedules are
shown with the master key or the viewer key (counts: no task's params or result), or
where none is configured; else they are null.

How it works: a snapshot is five asks the operator's views already answer (V_TUBES by
activity, V_COUNTERS, V_PEERS, V_FUNCTIONS by activity and a T_SCHEDULES page), so the broker counts no
beanstalk command for it.  One snapshot per query is made at most once a second and
shared by every client asking the same (`Dashboard.snapshot`): a thousand dashboards cost
the broker what one does.  `History` is pure and takes the clock: it keeps, for the tubes
it has seen, one total a second and gives their differences; it forgets the least recently
seen beyond MAX_NAMES.  The broker searches and ranks the tubes and the functions alike
(shared/ranking.py), so `q` finds one among all of them and a page walks the ranking.

The stream takes its place under the task streams' caps (streams.py: the front's
max_streams, PER_CLIENT a client address) and writes `event: snapshot` every TICK_S; a
client that leaves more than BUFFER_MAX unsent is cut off (it reconnects).
"""
from __future__ import annotations

import asyncio
import collections
import json
import math
from typing import Any, Awaitable, Callable, NamedTuple

from aiohttp import web

from ...schema import Op, R
from ...schema.tasks import MAX_PAGE
from .api import Problem, function_json, refuse, reply_problem, schedule_json
from .streams import BUFFER_MAX, HEADERS, TICK_S, hold_little
from .views import parse_limit

HISTORY_S = 60              # seconds of per-second differences kept for a sparkline
MAX_NAMES = 20_000          # tubes whose history is kept (the least recently seen go)
DEFAULT_LIMIT = 50
PARAMETERS = ("q", "limit", "tubesAfter", "functionsAfter")


class Query(NamedTuple):
    """What one snapshot is of: a part of a name, a page's length, where the pages start."""
    q: str
    limit: int
    tubes_after: str
    functions_after: str


def parse_query(query) -> Query | str:
    unknown = [key for key in query if key not in PARAMETERS]
    if unknown:
        return f"unknown parameter {unknown[0]!r}; parameters are {', '.join(PARAMETERS)}"
    limit = parse_limit(query, DEFAULT_LIMIT)
    if isinstance(limit, str):
        return limit
    return Query(query.get("q", ""), limit, query.get("tubesAfter", ""),
                 query.get("functionsAfter", ""))


class History:
    """Per name, one running total a second (the latest within it), for HISTORY_S seconds;
    `rates` are the differences of consecutive seconds (a second with no sample: the
    total stayed)."""

    def __init__(self, seconds: int = HISTORY_S, max_names: int = MAX_NAMES) -> None:
        self.seconds, self.max_names = seconds, max_names
        self.totals: collections.OrderedDict[str, dict[int, int]] = collections.OrderedDict()

    def record(self, name: str, total: int, now: float) -> None:
        second = math.floor(now)
        kept = self.totals.pop(name, None) or {}
        kept[second] = total
        for old in [s for s in kept if s <= second - self.seconds - 1]:
            del kept[old]
        self.totals[name] = kept            # (now the most recently seen)
        while len(self.totals) > self.max_names:
            self.totals.popitem(last=False)

    def rates(self, name: str, now: float) -> list[int]:
        """The last HISTORY_S per-second differences, oldest first (0 before the first)."""
        kept = self.totals.get(name, {})
        second = math.floor(now)
        out, last = [], None
        for s in range(second - self.seconds, second + 1):
            total = kept.get(s, last)
            out.append(0 if last is None or total is None else max(0, total - last))
            last = total
        return out[1:]


class Dashboard:
    """The two routes over the front's tools: `call` an op, `viewing` (True: the master or
    the viewer key; False: neither; a wrong key's Problem), `respond` (a Problem as the
    response), `streams` (the task streams: their caps) and `client` (a request's client
    address as the caps count it)."""

    def __init__(self, conn: int, call: Callable[[tuple], Awaitable[tuple]],
                 viewing: Callable, respond: Callable, streams, client: Callable,
                 clock: Callable[[], float]) -> None:
        self.conn, self.call, self.viewing = conn, call, viewing
        self.respond, self.streams, self.client, self.clock = respond, streams, client, clock
        self.history = History()
        self.made: dict[tuple, tuple[int, asyncio.Future]] = {}    # (query, full) -> (second, snapshot)
        self.tick_s, self.buffer_max = TICK_S, BUFFER_MAX

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/dashboard", self.get)
        app.router.add_get("/v1/dashboard/events", self.events)

    # -- the snapshot --------------------------------------------------------------------
    async def snapshot(self, query: Query, full: bool) -> dict | Problem:
        """The snapshot of `query` this second (made once, shared)."""
        second = math.floor(self.clock())
        made = self.made.get((query, full))
        if made is None or made[0] != second:
            if len(self.made) > 1000:           # (queries of seconds gone: forget them)
                self.made = {k: v for k, v in self.made.items() if v[0] == second}
            made = (second, asyncio.ensure_future(self._make(query, full)))
            self.made[(query, full)] = made
        return await asyncio.shield(made[1])

    async def _make(self, query: Query, full: bool) -> dict | Problem:
        q, limit, tubes_after, functions_after = query
        tubes = await self.call((Op.V_TUBES, self.conn, q, "activity", tubes_after, limit))
        counters = await self.call((Op.V_COUNTERS, self.conn))
        peers = await self.call((Op.V_PEERS, self.conn))
        if tubes[1] != R.V_PAGE or counters[1] != R.V_INFO or peers[1] != R.V_INFO:
            return reply_problem(tubes if tubes[1] != R.V_PAGE else
                                 counters if counters[1] != R.V_INFO else peers)
        now = self.clock()
        out: dict[str, Any] = {"tubes": self._rated(tubes[2], now), "tubesNext": tubes[3],
                               "counters": counters[2]["counters"], "peers": peers[2]["peers"],
                               "functions": None, "functionsNext": None, "schedules": None}
        if full:
            await self._tasks(out, q, limit, functions_after)
        return out

    def _rated(self, tubes: list[dict], now: float) -> list[dict]:
        for tube in tubes:
            self.history.record(tube["name"], tube["totalJobs"], now)
            tube["puts"] = self.history.rates(tube["name"], now)
            tube["putRate"] = tube["puts"][-1]
        return tubes

    async def _tasks(self, out: dict, q: str, limit: int, functions_after: str) -> None:
        functions = await self.call((Op.V_FUNCTIONS, self.conn, q, "activity",
                                     functions_after, limit))
        if functions[1] == R.V_PAGE:
            out["functions"] = [function_json(f) for f in functions[2]]
            out["functionsNext"] = functions[3]
        schedules = await self.call((Op.T_SCHEDULES, self.conn, "", MAX_PAGE))
        if schedules[1] == R.T_SCHEDULES:
            out["schedules"] = [schedule_json(s) for s in schedules[2]
                                if q in s["name"] or q in s.get("function", "")]

    def _asked(self, request: web.Request) -> tuple[Query, bool] | Problem:
        """The query, and whether functions and schedules are shown; or a refusal."""
        shown = self.viewing(request)
        if isinstance(shown, Problem):
            return shown
        query = parse_query(request.query)
        if isinstance(query, str):
            return refuse(400, query)
        return query, shown

    # -- the routes ----------------------------------------------------------------------
    async def get(self, request: web.Request) -> web.Response:
        asked = self._asked(request)
        snap = asked if isinstance(asked, Problem) else await self.snapshot(*asked)
        if isinstance(snap, Problem):
            return self.respond(snap)
        return web.json_response(snap, headers={"Cache-Control": "no-store"})

    async def events(self, request: web.Request) -> web.StreamResponse:
        asked = self._asked(request)
        if isinstance(asked, Problem):
            return self.respond(asked)
        client = self.client(request)
        refused = self.streams.take(client)
        if refused is not None:
            return self.respond(refused)
        try:
            return await self._stream(request, *asked)
        finally:
            self.streams.give_back(client)

    async def _stream(self, request: web.Request, query: Query, full: bool):
        transport = request.transport
        if transport is None or transport.is_closing():
            return web.Response(status=204)
        response = web.StreamResponse(headers=HEADERS)
        response.force_close()
        await response.prepare(request)
        hold_little(transport, self.buffer_max)
        self.streams.open += 1
        try:
            while not self.streams.closing and not transport.is_closing():
                snap = await self.snapshot(query, full)
                data = ({"error": snap.code, "message": snap.message}
                        if isinstance(snap, Problem) else snap)
                name = "problem" if isinstance(snap, Problem) else "snapshot"
                chunk = f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
                if not await self._write(response, transport, chunk.encode()):
                    break
                await asyncio.sleep(self.tick_s - self.clock() % self.tick_s)
            return response
        finally:
            self.streams.open -= 1

    async def _write(self, response, transport, chunk: bytes) -> bool:
        try:
            await response.write(chunk)
        except ConnectionError:
            return False
        if transport.get_write_buffer_size() > self.buffer_max:
            transport.abort()                   # (a slow reader: it reconnects)
            return False
        return True
