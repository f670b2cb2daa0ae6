"""A dispatcher's pool per upstream (workers/upstream/keepalive.py) against a real server that counts
requests per TCP connection (tests/support/counting_http.py): `keepalive_requests` closes a
connection after its Nth request, which says `Connection: close`; `keepalive_timeout`
closes an idle one; `keepalive` cuts the idle connections back to N; 0 is a connection per
call; and two upstreams never share a connection."""
from __future__ import annotations

import asyncio
import time

from counting_http import CountingServer
from test_dispatcher import PARAMS, dispatcher, until

from zstalk.protocol.schema import R


def push(d, url: str, uid: str, pool: list) -> None:
    d.on_replies([(1, R.T_CALL, uid, 1, url, PARAMS, 5000, {"result_headers": [], "pool": pool})])


async def one_by_one(d, link, url: str, pool: list, count: int, prefix: str = "t") -> None:
    for i in range(count):
        push(d, url, f"{prefix}{i}", pool)
        assert (await link.outcome(f"{prefix}{i}")).kind == "success"


def test_a_connection_carries_keepalive_requests_calls_the_last_saying_close() -> None:
    async def main(server: CountingServer) -> None:
        async with dispatcher() as (d, link):
            await one_by_one(d, link, server.url + "/f", ["gpu", 32, 60_000, 3], 10)
            await until(lambda: len(server.connections) == 4 and all(
                c.closed_at for c in server.connections[:3]))
    with CountingServer() as server:
        asyncio.run(main(server))
        assert [c.requests for c in server.connections] == [3, 3, 3, 1]
        assert [c.closing for c in server.connections] == [[3], [3], [3], []]


def test_an_idle_connection_is_closed_after_keepalive_timeout() -> None:
    async def main(server: CountingServer) -> float:
        async with dispatcher() as (d, link):
            await one_by_one(d, link, server.url + "/f", ["gpu", 32, 500, 1000], 2)
            idle_from = time.monotonic()
            await until(lambda: server.connections[0].closed_at is not None, within_s=10)
            return server.connections[0].closed_at - idle_from
    with CountingServer() as server:
        idle_s = asyncio.run(main(server))
        # (aiohttp's cleanup runs every keepalive_timeout: closed between one and two)
        assert 0.3 <= idle_s <= 5.0, idle_s
        assert [(c.requests, c.closing) for c in server.connections] == [(2, [])]


def test_idle_connections_beyond_keepalive_are_closed_and_the_rest_reused() -> None:
    async def main(server: CountingServer) -> None:
        async with dispatcher() as (d, link):
            for i in range(5):              # five at once: five connections
                push(d, server.url + "/f", f"t{i}", ["gpu", 2, 60_000, 1000])
            for i in range(5):
                assert (await link.outcome(f"t{i}")).kind == "success"
            await until(lambda: server.open_connections() == 2)
            await one_by_one(d, link, server.url + "/f", ["gpu", 2, 60_000, 1000], 4, "u")
            assert len(server.connections) == 5 and server.open_connections() == 2
    with CountingServer(delay_s=0.3) as server:
        asyncio.run(main(server))
        assert sum(c.requests for c in server.connections) == 9


def test_keepalive_0_opens_a_connection_per_call() -> None:
    async def main(server: CountingServer) -> None:
        async with dispatcher() as (d, link):
            await one_by_one(d, link, server.url + "/f", ["gpu", 0, 60_000, 1000], 3)
    with CountingServer() as server:
        asyncio.run(main(server))
        assert [(c.requests, c.closing) for c in server.connections] == [(1, [1])] * 3


def test_two_upstreams_on_one_server_keep_connections_of_their_own() -> None:
    async def main(server: CountingServer) -> None:
        async with dispatcher() as (d, link):
            for i in range(3):
                await one_by_one(d, link, server.url + "/f", ["a", 32, 60_000, 1000], 1, f"a{i}")
                await one_by_one(d, link, server.url + "/f", ["b", 32, 60_000, 1000], 1, f"b{i}")
    with CountingServer() as server:
        asyncio.run(main(server))
        assert [c.requests for c in server.connections] == [3, 3]


def test_new_settings_make_a_new_pool_and_the_old_one_closes() -> None:
    async def main(server: CountingServer) -> None:
        async with dispatcher() as (d, link):
            await one_by_one(d, link, server.url + "/f", ["gpu", 32, 60_000, 1000], 2, "old")
            await one_by_one(d, link, server.url + "/f", ["gpu", 32, 60_000, 500], 2, "new")
            await until(lambda: server.connections[0].closed_at is not None)
            assert len(d.pools.by_name) == 1 and not d.pools.closing
    with CountingServer() as server:
        asyncio.run(main(server))
        assert [c.requests for c in server.connections] == [2, 2]
