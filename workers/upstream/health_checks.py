"""A dispatcher's probes for the broker's active health checks (nginx Plus's
`health_check`; the rules are broker/core/upstreams/health.py's).

The broker gives each checked server to one dispatcher and pushes it R.T_CHECKS: the
whole list of servers this dispatcher probes now, each [upstream, url, path,
interval_ms, timeout_ms, statuses that pass as [[lo, hi], ...]].  `assign` keeps the
probe loop of a server whose entry is unchanged, stops those no longer listed and starts
the new ones; `stop` ends them all (the broker is gone: it gives the servers out again
when we come back).  Each loop, on its own timer, sends `GET url + path` within the
timeout, with no redirects followed and
`User-Agent: zstalk-health-check/<version> (dispatcher <host>:<pid>)` so a server's log
tells a probe from a call, and reports the result (`report`, made T_CHECKED by the
dispatcher): ok when the status is in the ranges, else why not.  The first probe of a
server waits a random part of its interval, so servers given out together do not probe
in step.  The probes have their own connection pool: they never take a call's slot.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from typing import Callable

import aiohttp

from ...protocol.schema import VERSION

log = logging.getLogger("zstalk.dispatcher")
#: connections the probes may hold at once (the broker bounds probes per second)
PROBE_CONNECTIONS = 64
USER_AGENT = f"zstalk-health-check/{VERSION} (dispatcher {socket.gethostname()}:{os.getpid()})"


class HealthChecker:
    """The probe loops of the servers the broker gave this dispatcher."""

    def __init__(self, report: Callable[[str, str, bool, str | None], None]) -> None:
        self.report = report
        self.loops: dict[tuple[str, str], tuple[tuple, asyncio.Task]] = {}
        self.http: aiohttp.ClientSession | None = None

    def assign(self, checks: list) -> None:
        """R.T_CHECKS: probe exactly these servers from now on."""
        wanted = {}
        for check in checks if isinstance(checks, list) else ():
            if isinstance(check, (list, tuple)) and len(check) >= 6:
                wanted[check[0], check[1]] = tuple(map(_frozen, check))
        for key, (entry, task) in list(self.loops.items()):
            if wanted.get(key) != entry:
                task.cancel()
                del self.loops[key]
        loop = asyncio.get_running_loop()
        started = 0
        for key, entry in wanted.items():
            if key not in self.loops:
                self.loops[key] = (entry, loop.create_task(self._probe_loop(*entry[:6])))
                started += 1
        log.info("dispatcher: health checks of %d servers (%d new) for the broker",
                 len(self.loops), started)

    def stop(self) -> None:
        for _, task in self.loops.values():
            task.cancel()
        self.loops.clear()

    async def close(self) -> None:
        self.stop()
        if self.http is not None:
            await self.http.close()

    async def _probe_loop(self, upstream: str, url: str, path: str, interval_ms: int,
                          timeout_ms: int, statuses: tuple) -> None:
        interval_s = max(interval_ms, 1) / 1000
        await asyncio.sleep(random.uniform(0, interval_s))
        while True:
            ok, error = await self.probe(url + path, timeout_ms / 1000, statuses)
            self.report(upstream, url, ok, error)
            await asyncio.sleep(interval_s)

    async def probe(self, target: str, timeout_s: float, statuses) -> tuple[bool, str | None]:
        """One check: (passed, why not)."""
        try:
            async with self._session().get(
                    target, headers={"User-Agent": USER_AGENT}, allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                status = resp.status
        except asyncio.TimeoutError:
            return False, f"no answer from {target} within {round(timeout_s * 1000)} ms"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return False, f"{target}: {exc.__class__.__name__}: {exc}"
        if any(lo <= status <= hi for lo, hi in statuses):
            return True, None
        return False, f"{target} answered {status}"

    def _session(self) -> aiohttp.ClientSession:
        if self.http is None:
            self.http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=PROBE_CONNECTIONS),
                cookie_jar=aiohttp.DummyCookieJar())
        return self.http


def _frozen(value):
    """A list from the wire as a tuple (nested too), to compare entries and key them."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
