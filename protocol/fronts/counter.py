"""The counter front: an asyncio TCP / unix-socket listener that speaks yrmcds' binary
counter protocol to clients and schema ops to the broker, which holds the counters.

Per connection (`CounterConn`): bytes go into the sans-IO `yrmcds.Parser`; each event
becomes a *slot* in the connection's reply queue, as in the beanstalk front.  A `Reject`
(bad magic, unknown opcode, invalid arguments) fills its slot at once with the exact
bytes yrmcds sends; a `Request` leaves as one op (batched per loop turn by the link) and
its slot keeps the request, whose opcode and opaque the reply is built from when the
broker answers.  Slots are written strictly in order, so pipelined replies come back in
request order, as yrmcds answers a connection's frames (src/counter/sockets.cpp).  Dump is
one frame per counter plus the empty terminator, written together (sockets.cpp cmd_dump).

Closing (yrmcds: release_all in sockets.cpp): a client's EOF lets the replies already owed
go out, then the broker hears CLOSE (which releases everything the session holds) before
the socket closes.  A frame over 30 MiB (`TooLarge`, yrmcds' MAX_REQUEST_LENGTH) ends the
connection the same way, with no reply of its own.  TCP keepalive is on, so a client host
that vanishes is noticed too.  Beyond `max_connections`, a connection is accepted and
closed at once, as yrmcds does (handler.cpp, make_counter_socket).

The front mirrors what each session holds from the Acquire and Release replies it
relays, and reports it in `session_states()` (Hello) for the sessions registered with a
broker it lost, so that the broker can re-register their holdings.

The broker restarting or going away: the counter sessions survive, because the broker
re-registers every session's holdings from the Hello the link sends when it reconnects
(that tally is the truth).  So when the link reports the broker lost, the requests it had
in flight are settled against the tally just before that Hello is built: a Release is
applied to the tally and answered OK (or 0x22 if the tally does not cover it), so it
takes effect exactly once whether or not the old broker saw it; an Acquire is answered
0x21 and left out of the tally, so it is undone if the old broker did apply it; Noop,
Get, Stats and Dump change nothing and are asked again once the broker is back.
While the link is out of touch with a broker it had (`link.fail_closed`) the front fails
closed: an Acquire is answered 0x21 at once and never sent; other requests are held by
the link for up to `hold_s` (a Release then reaches the broker after the Hello that
listed the tally without it: applied once).  A front that has never reached a broker
(it started before the broker) holds Acquires too: nothing can be held yet, so waiting
up to `hold_s` for the first Welcome overcommits nothing.
yrmcds has no status for "the server could not do this now", so a request the broker
cannot answer in time (held past `hold_s`, or refused because the broker does not know
the session) is answered 0x21 if it is an Acquire, and otherwise closes the connection
after the replies before it: every yrmcds client knows that a closed connection has
released its holdings, and the broker releases them when the CLOSE reaches it.

Bounds: at most MAX_IN_FLIGHT unanswered requests per connection; reading pauses while
more than READ_LIMIT_SLACK unparsed bytes wait behind them or behind a client that does
not read its replies (transport write buffer above WRITE_HIGH).  The one frame being
received may still take up to yrmcds' 30 MiB.
"""
from __future__ import annotations

import collections
import logging

from ..codecs import yrmcds
from .base import LinkedConn, LinkedFront
from ..schema import Op, R, SessionState
from ..codecs.yrmcds import NEED_DATA, Opcode, Parser, Reject, Request, Status

log = logging.getLogger("zstalk.front")

READ_LIMIT_SLACK = 256 * 1024
MAX_IN_FLIGHT = 8192
#: a slot's content when no yrmcds reply fits: the connection closes at that point
CLOSE_HERE = object()

_OPEN, _CLOSE = Op.OPEN, Op.CLOSE
_ACQUIRE, _RELEASE, _GET = int(Opcode.ACQUIRE), int(Opcode.RELEASE), int(Opcode.GET)
_NO_ARGS = {int(Opcode.NOOP): Op.C_NOOP, int(Opcode.STATS): Op.C_STATS,
            int(Opcode.DUMP): Op.C_DUMP}
_C_ACQUIRE, _C_RELEASE, _C_GET = Op.C_ACQUIRE, Op.C_RELEASE, Op.C_GET

# R.C_OK value -> reply, per request opcode (value: int, or None for no body)
_OK = {
    int(Opcode.NOOP): lambda opaque, _value: yrmcds.noop_response(opaque),
    _GET: yrmcds.get_response,
    _ACQUIRE: yrmcds.acquire_response,
    _RELEASE: lambda opaque, _value: yrmcds.release_response(opaque),
}


def request_op(conn: int, req: Request) -> tuple:
    """A parsed request as a schema op."""
    opcode = req.opcode
    if opcode == _ACQUIRE:
        return (_C_ACQUIRE, conn, req.name, req.resources, req.maximum)
    if opcode == _RELEASE:
        return (_C_RELEASE, conn, req.name, req.resources)
    if opcode == _GET:
        return (_C_GET, conn, req.name)
    return (_NO_ARGS[opcode], conn)


def refused(req: Request) -> bytes:
    """Fail closed: nothing is acquired without the broker."""
    return yrmcds.error_response(req.opcode, req.opaque, Status.RESOURCE_NOT_AVAILABLE)


def format_reply(req: Request, reply: tuple):
    """The broker's reply to `req` as yrmcds bytes, or CLOSE_HERE when none fits."""
    code, opcode, opaque = reply[1], req.opcode, req.opaque
    if code == R.C_OK and opcode in _OK:
        return _OK[opcode](opaque, reply[2])
    if code == R.C_ERROR and reply[2] in yrmcds.ERROR_BODIES:
        return yrmcds.error_response(opcode, opaque, reply[2])
    if code == R.STATS and opcode == Opcode.STATS:
        return yrmcds.stats_response(opaque, reply[2])
    if code == R.C_DUMP and opcode == Opcode.DUMP:
        return yrmcds.dump_response(opaque, reply[2])
    if code != R.INTERNAL_ERROR:
        log.warning("unexpected broker reply %r to opcode 0x%02x", reply[1:2], opcode)
    return refused(req) if opcode == _ACQUIRE else CLOSE_HERE


class CounterConn(LinkedConn):
    def __init__(self, front: "CounterFront", conn: int) -> None:
        super().__init__(front, conn)
        self.parser = Parser()
        self.closing = False        # parse no more; close once the owed replies are out
        self.starved = False        # the parser needs more bytes (no whole frame buffered)
        self.holds: dict[bytes, int] = {}

    def eof_received(self) -> bool:
        self.eof = True         # whole frames already in are still answered, as in yrmcds
        self.pump()
        return True




    # -- requests ----------------------------------------------------------------------
    def pump(self) -> None:
        """Turn buffered frames into replies and ops, as far as the bounds allow."""
        parser, link = self.parser, self.front.link
        slots, unanswered, conn = self.slots, self.unanswered, self.conn
        self.starved = False
        front, n = self.front, 0
        while not (self.closing or self.write_paused) and len(unanswered) < MAX_IN_FLIGHT:
            ev = parser.next_event()
            if ev is NEED_DATA:
                self.starved = True
                break
            n += 1
            kind = type(ev)
            if kind is Request:
                if ev.opcode == _ACQUIRE and link.fail_closed:
                    slots.append([ev, refused(ev)])
                    front.own_replies += 1
                    continue
                slot = [ev, None]
                slots.append(slot)
                unanswered.append(slot)
                link.submit(request_op(conn, ev))
            elif kind is Reject:
                slots.append([None, ev.reply])
                front.own_replies += 1
            else:                   # TooLarge: no reply of its own, as in yrmcds
                self.closing = True
        front.commands += n
        self.flush()
        self._regulate_reading()

    def answer(self, reply: tuple) -> None:
        """Fill the oldest unanswered slot with the broker's reply and mirror its effect."""
        slot = self.unanswered.popleft()
        req = slot[0]
        slot[1] = format_reply(req, reply)
        if reply[1] == R.C_OK:
            if req.opcode == _ACQUIRE:
                self.holds[req.name] = self.holds.get(req.name, 0) + req.resources
            elif req.opcode == _RELEASE:
                self._take_back(req.name, req.resources)

    def _take_back(self, name: bytes, resources: int) -> None:
        left = self.holds.get(name, 0) - resources
        if left > 0:
            self.holds[name] = left
        else:
            self.holds.pop(name, None)     # yrmcds erases a tally entry at 0 (on_release)

    def settle_unanswered(self) -> None:
        """The broker is lost and the link is about to list our tally in its Hello: settle
        what was in flight against the tally (see the module comment)."""
        pending, self.unanswered = self.unanswered, collections.deque()
        for slot in pending:
            req = slot[0]
            if req.opcode == _RELEASE:
                slot[1] = self._release_locally(req)
                self.front.own_replies += 1
            elif req.opcode == _ACQUIRE:
                slot[1] = refused(req)
                self.front.own_replies += 1
            else:
                self.unanswered.append(slot)
                self.front.link.submit(request_op(self.conn, req))

    def _release_locally(self, req: Request) -> bytes:
        held = self.holds.get(req.name, 0)
        if not held or req.resources > held:     # what the broker says too (yrmcds' on_release)
            return yrmcds.error_response(req.opcode, req.opaque, Status.NOT_ACQUIRED)
        self._take_back(req.name, req.resources)
        return yrmcds.release_response(req.opaque)

    def flush(self) -> None:
        slots, out, close_here = self.slots, [], False
        while slots and slots[0][1] is not None:
            data = slots.popleft()[1]
            if data is CLOSE_HERE:
                close_here = self.closing = True
                slots.clear()
                self.unanswered.clear()
                break
            out.append(data)
        if self.transport is None:
            return
        if out:
            self.transport.write(b"".join(out))
        if close_here or (not slots and (self.closing or (self.eof and self.starved))):
            self.front.forget(self)    # the broker hears of it before the client sees EOF
            self.transport.close()

    def _regulate_reading(self) -> None:
        self._set_reading(self.closing or (not self.starved and self.parser.buffered > READ_LIMIT_SLACK))

    def state(self) -> SessionState:
        return SessionState(self.conn, "", [], [], sorted(self.holds.items()))



class CounterFront(LinkedFront):
    kind = "counter"
    conn_class = CounterConn
