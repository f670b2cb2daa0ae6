# Server-Sent Event streams read by the thousand from one asyncio process (aiohttp), as
# bench_room's part 4 follows 2,000 tasks' places.
#
# A front counts at most 4 event streams per client address (PER_CLIENT in
# protocol/fronts/http/streams.py), as a launch's visitors each come from an address of
# their own.  So the reader opens its streams from many loopback source addresses, at
# most `per_address` streams each: 127.0.0.0/8 is all the loopback's on Linux, so
# 127.1.x.y binds with no set-up, and the front counts each stream by its real peer
# address, trusting no header (X-Forwarded-For would need [api] trust_forwarded, which
# changes what the broker counts per client too).  One aiohttp session a source
# address (a TCPConnector with local_addr), no timeout on a stream's body.
#
# Each stream is parsed as WHATWG HTML section 9.2.6 says ("event:" and "data:" lines,
# a blank line dispatches, a line starting ":" is a comment), and every event handed to
# a callback with its name, its data (JSON) and when it arrived (time.monotonic()).
from __future__ import annotations

import asyncio
import json
import resource
import time


def source_addresses(streams: int, per_address: int) -> list[str]:
    """One loopback source address for every `per_address` of `streams`: 127.1.x.y."""
    n = -(-streams // per_address)
    return [f"127.1.{i // 250}.{i % 250 + 1}" for i in range(n)]


def raise_open_files() -> int:
    """The soft open-files limit raised to the hard one (a stream is a socket): the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Sources:
    """An aiohttp session per source address; `session(i)` for the i-th stream."""

    def __init__(self, streams: int, per_address: int) -> None:
        import aiohttp
        self.per_address = per_address
        self.sessions = [aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(ip, 0), limit=per_address),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0))
            for ip in source_addresses(streams, per_address)]

    def session(self, i: int):
        return self.sessions[i // self.per_address]

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.sessions), return_exceptions=True)


async def follow(session, url: str, token: str, on_event) -> str:
    """Read the event stream at `url` with the Bearer `token` until it ends (or the task
    is cancelled), calling on_event(name, data, arrived) for each event: why it ended
    ("end": the server closed it, or "HTTP <status>")."""
    async with session.get(url, headers={"Authorization": f"Bearer {token}",
                                         "Accept": "text/event-stream"}) as r:
        if r.status != 200:
            return f"HTTP {r.status}"
        name, data = "message", []
        async for raw in r.content:
            line = raw.decode().rstrip("\r\n")
            if not line:
                if data:
                    on_event(name, json.loads("\n".join(data)), time.monotonic())
                name, data = "message", []
            elif line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        return "end"
