"""A client of zstalk's counters (the yrmcds counter protocol): distributed semaphores.

A counter is a name and a count of units in use.  `acquire(name, n, maximum)` takes n
units if the count stays within `maximum` (the capacity travels with every request, as in
yrmcds), else raises NotAvailable; `release` gives them back; whatever a connection
still holds is released when it closes or its host goes away.  So a batch job, a cron
script or nginx-maxconn-module can share one limit with every other process that asks:

    from zstalk.workers import CounterClient, NotAvailable

    with CounterClient("127.0.0.1", 11215) as counters:
        try:
            with counters.hold(b"renders", 1, maximum=4):
                render()                    # at most 4 at once, across every process
        except NotAvailable:
            print("busy, try later")

One blocking connection, one request at a time, each reply checked against its request's
opaque (protocol/codecs/yrmcds.py builds and cuts the frames); not thread-safe: one
client per thread.  Names are bytes (1 to 65535); counts are u32.
"""
from __future__ import annotations

import contextlib
import socket
from typing import Iterator

from ..protocol.codecs import yrmcds
from ..protocol.codecs.yrmcds import Opcode, Status

PORT = 11215                # yrmcds' default counter port, and zstalk serve's


class CounterError(Exception):
    """The server refused a request: `status` is yrmcds' code (0x01 not found, 0x04
    invalid arguments, 0x21 resource not available, 0x22 not acquired)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{message} (status {status:#04x})")
        self.status = status


class NotAvailable(CounterError):
    """Acquire would take the counter over its maximum (status 0x21)."""


class CounterClient:
    def __init__(self, host: str = "127.0.0.1", port: int = PORT, timeout: float = 10.0) -> None:
        if not 0 < port <= 65535:       # (getaddrinfo would take 99999 as 34463)
            raise ValueError(f"port must be 1 to 65535, not {port!r} (host {host})")
        self.address = (host, port)
        self.sock = socket.create_connection(self.address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.opaque = 0

    def close(self) -> None:
        """Closing releases everything this connection holds (at the server)."""
        self.sock.close()

    def __enter__(self) -> "CounterClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the protocol ------------------------------------------------------------------
    def acquire(self, name: bytes, resources: int = 1, maximum: int = 1) -> int:
        """Take `resources` units of `name` if the count stays within `maximum`; returns
        the units taken; raises NotAvailable if it would not."""
        body = self._call(lambda o: yrmcds.acquire_request(o, name, resources, maximum))
        return int.from_bytes(body, "big")

    def release(self, name: bytes, resources: int = 1) -> None:
        """Give back units this connection acquired (CounterError 0x22 for more)."""
        self._call(lambda o: yrmcds.release_request(o, name, resources))

    def get(self, name: bytes) -> int:
        """The count in use now (CounterError 0x01 for a counter no one holds)."""
        return int.from_bytes(self._call(lambda o: yrmcds.get_request(o, name)), "big")

    def noop(self) -> None:
        self._call(lambda o: yrmcds.request(Opcode.NOOP, o))

    def stats(self) -> dict[str, bytes]:
        return yrmcds.stats_items(self._call(lambda o: yrmcds.request(Opcode.STATS, o)))

    def dump(self) -> list[tuple[bytes, int, int]]:
        """(name, in use, the most in use this stat interval) of every counter."""
        opaque = self._send(lambda o: yrmcds.request(Opcode.DUMP, o))
        records = []
        while body := self._body(opaque):
            current, peak, length = yrmcds.DUMP_FIXED.unpack_from(body)
            records.append((body[10:10 + length], current, peak))
        return records

    @contextlib.contextmanager
    def hold(self, name: bytes, resources: int = 1, maximum: int = 1) -> Iterator[None]:
        """acquire, then release on leaving the block (whatever it raised)."""
        self.acquire(name, resources, maximum)
        try:
            yield
        finally:
            self.release(name, resources)

    # -- frames ------------------------------------------------------------------------
    def _call(self, build) -> bytes:
        return self._body(self._send(build))

    def _send(self, build) -> int:
        self.opaque = (self.opaque + 1) & 0xFFFFFFFF
        self.sock.sendall(build(self.opaque))
        return self.opaque

    def _body(self, opaque: int) -> bytes:
        reply = yrmcds.next_reply(self.buf)
        while reply is None:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"the counter server at {self.address[0]}:"
                                      f"{self.address[1]} closed the connection")
            self.buf += chunk
            reply = yrmcds.next_reply(self.buf)
        if reply.opaque != opaque:
            raise ConnectionError(f"a reply to request {reply.opaque}, not {opaque}")
        if reply.status != Status.OK:
            kind = NotAvailable if reply.status == Status.RESOURCE_NOT_AVAILABLE else CounterError
            raise kind(reply.status, reply.body.decode("ascii", "replace"))
        return reply.body
