"""What every protocol front shares: its client connections by number, admission past
`--max-connections`, and the broker-link callbacks that fan replies and broker loss out
to those connections.

A front subclass names its connection class (`conn_class`) and its link `kind`. Each
connection object provides `answer(reply)`, `pump()`, `settle_unanswered()` (the broker
is gone: decide what each command in flight gets), `state()` (its SessionState for
re-registration), `abort()`, and the attributes `conn`, `unanswered` and `stale`.

For /metrics a front counts the commands its clients sent and the replies it made itself
(a protocol error, a refusal, INTERNAL_ERROR for what a lost broker left unanswered), as
plain integers; connections are counted when scraped, and what waited for the broker is
its link's (owner.LinkStats).  `front_samples` reads them all.
"""
from __future__ import annotations

import asyncio
import collections
import socket

from ..codecs.prometheus import Sample
from ..links import open_link
from ..links.owner import LinkOwner
from ..schema import Op, SessionState, Welcome

_OPEN, _CLOSE = Op.OPEN, Op.CLOSE


WRITE_HIGH = 1024 * 1024    # unwritten reply bytes per connection before we stop reading


class LinkedConn(asyncio.Protocol):
    """One client connection of a front: socket options, admission, the OPEN/CLOSE ops,
    and back-pressure (no parsing while the client leaves replies unread; no reading
    while the parser holds too much). Subclasses parse in `pump()` and decide in
    `_regulate_reading()` how much is too much."""

    def __init__(self, front, conn: int) -> None:
        self.front = front
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.slots: collections.deque = collections.deque()      # [command, reply | None]
        self.unanswered: collections.deque = collections.deque()
        self.eof = False
        self.write_paused = False
        self.read_paused = False
        self.stale = False          # registered with a broker we lost
        self.replied = False        # the broker's replies to this read pumped it already

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)   # vanished hosts
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        if not self.front.admit(self):
            transport.close()
            return
        self.front.link.submit((_OPEN, self.conn))

    def data_received(self, data: bytes) -> None:
        link = self.front.link
        link.gather()
        self.parser.receive_data(data)
        self.replied = False
        self.take_input()
        link.read_done()        # beside the broker: the replies are back before this returns
        if not self.replied:    # (else on_replies pumped: written, reading regulated)
            self.pump()

    def take_input(self) -> None:
        """Parse what a read brought and submit its ops (a subclass may leave writing the
        replies to the pump that follows them)."""
        self.pump()

    def connection_lost(self, exc) -> None:
        if self.front.conns.pop(self.conn, None) is self:
            self.front.link.submit((_CLOSE, self.conn))
        self.transport = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.pump()

    def _set_reading(self, full: bool) -> None:
        if self.transport is None:
            return
        if full and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        elif not full and self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class LinkedFront(LinkOwner):
    kind = ""
    conn_class: type = object

    def __init__(self, broker: str, max_connections: int = 0, hold_s: float = 5.0) -> None:
        self.conns: dict = {}
        self.max_connections = max_connections
        self._next_conn = 0
        self.commands = 0           # (for /metrics: front_samples)
        self.own_replies = 0
        self.link = open_link(broker, self.kind, self, hold_s=hold_s)

    def protocol_factory(self):
        self._next_conn += 1
        return self.conn_class(self, self._next_conn)

    def admit(self, c) -> bool:
        if self.max_connections and len(self.conns) >= self.max_connections:
            return False                # accept, then close: as beanstalkd and yrmcds do
        self.conns[c.conn] = c
        return True

    def connections(self) -> int:
        return len(self.conns)

    def samples(self) -> list[Sample]:
        return front_samples(self)

    def forget(self, c) -> None:
        """Close a session at the broker now (not at the next loop turn)."""
        if self.conns.pop(c.conn, None) is c:
            self.link.submit((_CLOSE, c.conn))
            self.link.flush_now()

    # -- LinkOwner ---------------------------------------------------------------------
    def on_replies(self, items: list) -> None:
        conns, touched = self.conns, {}
        for item in items:
            c = conns.get(item[0])
            if c is not None and c.unanswered:
                c.answer(item)
                touched[c] = None
        for c in touched:
            c.replied = True
            c.pump()

    def on_welcome(self, w: Welcome) -> None:
        for c in list(self.conns.values()):
            if c.stale and not w.restored:
                c.abort()     # the broker lost its state: look like a restarted server
            c.stale = False

    def on_lost(self) -> None:
        for c in list(self.conns.values()):
            c.stale = True
            c.settle_unanswered()
            c.pump()

    def on_fenced(self) -> None:
        for c in list(self.conns.values()):
            self.conns.pop(c.conn, None)
            c.abort()

    def session_states(self) -> list[SessionState]:
        return [c.state() for c in self.conns.values() if c.stale]

    def close(self) -> None:
        for c in list(self.conns.values()):
            c.abort()
        self.link.close()


def front_samples(front) -> list[Sample]:
    """A front's /metrics (protocol/codecs/prometheus.py METRICS, role front): any front
    with `kind`, `link`, `commands`, `own_replies` and `connections()`."""
    kind, stats = (front.kind,), front.link.stats
    return [Sample("zstalk_front_connections", kind, front.connections()),
            Sample("zstalk_front_commands_total", kind, front.commands),
            Sample("zstalk_front_own_replies_total", kind, front.own_replies + stats.failed),
            Sample("zstalk_front_link_round_trip_seconds", kind, stats.round_trip),
            Sample("zstalk_front_held_total", kind, stats.held)]
