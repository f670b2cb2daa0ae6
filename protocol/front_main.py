"""Runs one front process: an asyncio loop with the listeners, the front and its broker link.

The loop is the same for every protocol; only the front it builds differs (beanstalk or
counter), so `_serve` takes a function that makes the front once the loop is running
(its link needs the loop).

SIGTERM / SIGINT stop accepting, close the client connections and the link, and end the
loop; nothing is left in flight that the broker would not clean up itself (it closes
the sessions of a front that says nothing more).
"""
from __future__ import annotations

import asyncio
import signal
import socket
from typing import Callable

from .beanstalk_front import BeanstalkFront
from .counter_front import CounterFront


async def _serve(make_front: Callable[[], BeanstalkFront | CounterFront],
                 sockets: list[socket.socket]) -> None:
    loop = asyncio.get_running_loop()
    front = make_front()
    front.link.start()
    servers = [await loop.create_server(front.protocol_factory, sock=s) for s in sockets]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()
    front.close()


def run_beanstalk_front(broker: str, sockets: list[socket.socket], max_connections: int,
                        max_job_size: int, hold_s: float) -> None:
    asyncio.run(_serve(lambda: BeanstalkFront(broker, max_connections=max_connections,
                                              hold_s=hold_s, max_job_size=max_job_size),
                       sockets))


def run_counter_front(broker: str, sockets: list[socket.socket], max_connections: int,
                      hold_s: float) -> None:
    asyncio.run(_serve(lambda: CounterFront(broker, max_connections=max_connections,
                                            hold_s=hold_s),
                       sockets))
