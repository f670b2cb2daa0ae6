"""Runs fronts on an asyncio loop: listeners, the front and its broker link.

`start_front` puts one front on the running loop, whatever its placement (the broker
address decides: `local:NAME` beside the broker, tcp:// or ipc:// across ZeroMQ), so a
front process (`zstalk front …`) and the one-process server (broker/run/serve.py) start
fronts the same way.  `run_*_front` are the front processes: they run until SIGTERM /
SIGINT, then stop accepting, close the client connections and the link; nothing is left
in flight that the broker would not clean up itself (it closes the sessions of a front
that says nothing more).
"""
from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import TYPE_CHECKING, Callable

from ..metrics import build_info
from ...protocol.codecs.prometheus import render
from ...protocol.fronts.base import LinkedFront
from ...protocol.network.loop import run
from . import tune_gc

if TYPE_CHECKING:       # (the probes load when a role has a health port: not on zstalkd's start)
    from ...protocol.network.health import HealthOptions


#: a process's role in zstalk_build_info, by its link's kind
ROLES = {"beanstalk": "front", "counter": "front", "http": "front"}


class RunningFront:
    """A started front and its listening servers."""

    def __init__(self, front: LinkedFront, servers: list) -> None:
        self.front = front
        self.servers = servers

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.front.close()


async def start_front(make_front: Callable[[], LinkedFront],
                      sockets: list[socket.socket]) -> RunningFront:
    """Make the front (its link needs the running loop), connect it, start listening."""
    loop = asyncio.get_running_loop()
    front = make_front()
    front.link.start()
    servers = [await loop.create_server(front.protocol_factory, sock=s) for s in sockets]
    return RunningFront(front, servers)


async def _serve(make_front: Callable[[], LinkedFront], sockets: list[socket.socket],
                 health: HealthOptions | None = None) -> None:
    loop = asyncio.get_running_loop()
    from ...protocol.network.health import link_ready
    running = await start_front(make_front, sockets)
    probes = await _probes(health, link_ready(running.front.link), running.front)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if probes is not None:
        probes.close()
    running.close()


async def _probes(health: HealthOptions | None, ready, source):
    """The process's probes and /metrics (protocol/network/health.py; `source` has
    samples() and a role); a port it cannot bind ends it (exit 111)."""
    from ...protocol.network.health import HealthBindError, start_health
    def metrics() -> bytes:
        return render([build_info(ROLES.get(source.kind, source.kind)), *source.samples()])
    try:
        return await start_health(health, ready, metrics=metrics)
    except HealthBindError as exc:
        print(f"zstalk: {exc}", file=sys.stderr)
        raise SystemExit(111) from None


def beanstalk_front(broker: str, max_connections: int, max_job_size: int,
                    hold_s: float = 5.0):
    from ...protocol.fronts.beanstalk import BeanstalkFront
    return lambda: BeanstalkFront(broker, max_connections=max_connections, hold_s=hold_s,
                                  max_job_size=max_job_size)


def counter_front(broker: str, max_connections: int, hold_s: float = 5.0):
    from ...protocol.fronts.counter import CounterFront
    return lambda: CounterFront(broker, max_connections=max_connections, hold_s=hold_s)


def run_beanstalk_front(broker: str, sockets: list[socket.socket], max_connections: int,
                        max_job_size: int, hold_s: float,
                        health: HealthOptions | None = None) -> None:
    tune_gc()
    run(_serve(beanstalk_front(broker, max_connections, max_job_size, hold_s), sockets,
               health))


def run_counter_front(broker: str, sockets: list[socket.socket], max_connections: int,
                      hold_s: float, health: HealthOptions | None = None) -> None:
    tune_gc()
    run(_serve(counter_front(broker, max_connections, hold_s), sockets, health))


async def _until_stopped(actor, start, health: HealthOptions | None = None) -> None:
    """Start an actor with an async close() (HTTP front, dispatcher); close it on SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    from ...protocol.network.health import link_ready
    await start()
    probes = await _probes(health, link_ready(actor.link), actor)
    await stop.wait()
    if probes is not None:
        probes.close()
    await actor.close()


def run_http_front(broker: str, sockets: list[socket.socket], master_key: str | None,
                   limits, tls=None, health: HealthOptions | None = None,
                   hold_s: float = 5.0) -> None:
    """The HTTP front until SIGTERM: `limits` a listen.HttpLimits, `tls` an ssl.SSLContext,
    requests held up to `hold_s` while no broker answers."""
    tune_gc()
    from ...protocol.fronts.http.front import HttpFront

    async def main() -> None:
        front = HttpFront(broker, master_key=master_key, limits=limits, tls=tls, hold_s=hold_s)
        await _until_stopped(front, lambda: front.start(sockets), health)
    run(main())


def run_dispatcher(broker: str, slots: int, health: HealthOptions | None = None) -> None:
    tune_gc()
    from ...workers.upstream.dispatcher import Dispatcher

    async def main() -> None:
        dispatcher = Dispatcher(broker, slots=slots)

        async def start() -> None:
            dispatcher.start()
        await _until_stopped(dispatcher, start, health)
    run(main())
