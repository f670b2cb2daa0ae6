"""A dispatcher's probes for the broker's active health checks (workers/upstream/health_checks.py):
R.T_CHECKS starts a probe loop per server, each probe a GET of url + path with a
User-Agent naming the dispatcher, reported as T_CHECKED (passed on a listed status, failed
on another, a timeout or a refused connection); a new list replaces the old, and losing
the broker stops them.  Against a real aiohttp server on loopback, with a fake link."""
from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from test_dispatcher import dispatcher, refused_port, until
from zstalk.protocol.schema import Op, R

OK = [[200, 299]]


@contextlib.asynccontextmanager
async def health_host():
    """GET /ok answers 200, anything else 503; `agents` lists the User-Agents that came."""
    agents: list[str] = []

    async def health(request: web.Request) -> web.Response:
        agents.append(request.headers.get("User-Agent", ""))
        return web.Response(status=200 if request.path == "/ok" else 503)
    app = web.Application()
    app.router.add_get("/{path:.*}", health)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield "http://127.0.0.1:%d" % runner.addresses[0][1], agents
    finally:
        await runner.cleanup()


def checks(*entries) -> tuple:
    return (1, R.T_CHECKS, [list(e) for e in entries])


def reports(link) -> list[tuple]:
    return [op[2:] for op in link.ops if op[0] == Op.T_CHECKED]


def test_each_server_given_is_probed_on_its_timer_and_each_result_reported():
    async def main() -> None:
        async with health_host() as (url, agents), dispatcher() as (d, link):
            refused = f"http://127.0.0.1:{refused_port()}"
            d.on_replies([checks(["gpu", url, "/ok", 50, 1000, OK],
                                 ["gpu", url + "/", "sick", 50, 1000, OK],
                                 ["gpu", refused, "/ok", 50, 1000, OK])])
            await until(lambda: len(reports(link)) >= 9)
            got = {(server, ok) for _, server, ok, _ in reports(link)}
            assert got == {(url, True), (url + "/", False), (refused, False)}
            sick = next(r for r in reports(link) if r[1] == url + "/")
            assert sick[3].endswith("answered 503")
            assert agents[0].startswith("zstalk-health-check/") and "(dispatcher " in agents[0]
    asyncio.run(main())


def test_a_new_list_replaces_the_old_and_losing_the_broker_stops_every_probe():
    async def main() -> None:
        async with health_host() as (url, _), dispatcher() as (d, link):
            d.on_replies([checks(["gpu", url, "/ok", 50, 1000, OK])])
            await until(lambda: reports(link))
            d.on_replies([checks(["gpu", url + "/", "x", 60_000, 1000, OK])])
            assert [key[1] for key in d.checks.loops] == [url + "/"]
            d.on_lost()
            assert d.checks.loops == {}
    asyncio.run(main())
