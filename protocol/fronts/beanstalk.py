"""The beanstalk front: an asyncio TCP / unix-socket listener that speaks beanstalkd's text
protocol to clients and schema ops to the broker.

Per connection (`BeanstalkConn`): bytes go into the sans-IO `Parser`; each event becomes
a *slot* in the connection's reply queue.  A reply the front makes itself (BAD_FORMAT,
JOB_TOO_BIG, ...) fills its slot at once; a command for the broker leaves as an op
(batched per loop turn by the link) and its slot fills when the broker answers.  Slots
are written strictly in order, so local and broker replies interleave exactly as
beanstalkd would send them.  Commands after a reserve that may block leave at once: the
broker holds them until the reserve is answered (schema: "Ordering behind a waiting
reserve"), which is what beanstalkd, not reading past a waiting reserve, amounts to.
At end of input the broker hears HALF_CLOSE: a reserve that waits then, or would wait
later, answers TIMED_OUT, as beanstalkd's does for a half-closed client.

The front mirrors each session's used tube, watch list and held job ids from the
replies it relays, so after losing the broker it can re-register them (Hello).

Bounds: the parser holds one line plus one body; parsing stops at SESSION_OPS_MAX commands
or SESSION_BYTES_MAX job bytes in flight and while the client is not reading its replies
(transport write buffer above WRITE_HIGH); reading pauses while the parser holds more than
READ_LIMIT_SLACK beyond one line and body.  `max_connections` extra connections are
accepted and closed at once, as beanstalkd does past its descriptor limit.
"""
from __future__ import annotations

import logging

from ..codecs.beanstalk import NEED_DATA, Parser, Reject
from ..codecs.beanstalk_replies import INTERNAL_ERROR, format_reply
from .base import LinkedConn, LinkedFront
from ..schema import SESSION_BYTES_MAX, SESSION_OPS_MAX, Op, R, SessionState, Welcome
from ..schema.ops import ARG, CODE, PUT_BODY

log = logging.getLogger("zstalk.front")

READ_LIMIT_SLACK = 256 * 1024

_SIMPLE = {  # command name -> op code, for commands whose args map straight onto the op
    "use": Op.USE, "reserve-job": Op.RESERVE_JOB, "delete": Op.DELETE,
    "release": Op.RELEASE, "bury": Op.BURY, "touch": Op.TOUCH, "watch": Op.WATCH,
    "ignore": Op.IGNORE, "peek": Op.PEEK, "peek-ready": Op.PEEK_READY,
    "peek-delayed": Op.PEEK_DELAYED, "peek-buried": Op.PEEK_BURIED, "kick": Op.KICK,
    "kick-job": Op.KICK_JOB, "stats": Op.STATS, "stats-job": Op.STATS_JOB,
    "stats-tube": Op.STATS_TUBE, "list-tubes": Op.LIST_TUBES,
    "list-tube-used": Op.LIST_TUBE_USED, "list-tubes-watched": Op.LIST_TUBES_WATCHED,
    "pause-tube": Op.PAUSE_TUBE, "reserve-with-timeout": Op.RESERVE,
}
_PUT, _RESERVE, _OPEN, _CLOSE = Op.PUT, Op.RESERVE, Op.OPEN, Op.CLOSE
_COUNT, _HALF_CLOSE = Op.COUNT, Op.HALF_CLOSE
_RELEASING = frozenset({R.DELETED, R.RELEASED, R.BURIED})


def command_op(conn: int, cmd) -> tuple:
    """A parsed command as a schema op."""
    name = cmd.name
    if name == "put":
        pri, delay, ttr, _size = cmd.args
        return (_PUT, conn, pri, delay, ttr, cmd.body)
    if name == "reserve":
        return (_RESERVE, conn, -1)
    return (_SIMPLE[name], conn, *cmd.args)


class BeanstalkConn(LinkedConn):
    def __init__(self, front: "BeanstalkFront", conn: int) -> None:
        super().__init__(front, conn)
        self.parser = Parser(front.max_job_size)
        self.inflight_bytes = 0     # put body bytes sent and not yet answered
        self.starved = False        # the parser asked for more bytes than it has
        self.quitting = False
        self.use = "default"
        self.watch = ["default"]
        self.held: set[int] = set()

    def eof_received(self) -> bool:
        self.eof = True
        if self.unanswered or self.parser.buffered:     # a reserve may wait, or come
            self.front.link.submit((_HALF_CLOSE, self.conn))
        self.pump()
        return True

    # -- commands ----------------------------------------------------------------------
    def pump(self) -> None:
        """Turn buffered bytes into replies and ops, as far as the bounds allow."""
        if not self.starved:            # (a parser that wants bytes wants new ones)
            self.take_input()
        self.flush()
        self._regulate_reading()

    def take_input(self) -> None:
        self.starved = False
        while self._parse() and self._flush_frees():
            pass

    def _parse(self) -> bool:
        """Parse until input runs out or a bound stops it; True when a bound did."""
        parser, submit = self.parser, self.front.link.submit
        slots, conn = self.slots, self.conn
        bound, n = False, 0
        while not (self.quitting or self.write_paused):
            if len(slots) >= SESSION_OPS_MAX or self.inflight_bytes >= SESSION_BYTES_MAX:
                bound = True
                break
            ev = parser.next_event()
            if ev is NEED_DATA:
                self.starved = True
                break
            n += 1
            if type(ev) is Reject:
                if ev.counts:
                    submit((_COUNT, conn, ev.counts, ev.consumes_id))
                slots.append([None, ev.reply])
                self.front.own_replies += 1
                continue
            if ev.name == "quit":
                self.quitting = True
                break
            op = command_op(conn, ev)
            slot = [op, None]
            slots.append(slot)
            self.unanswered.append(slot)
            submit(op)
            if op[CODE] == _PUT:
                self.inflight_bytes += len(op[PUT_BODY])
        self.front.commands += n
        return bound

    def _flush_frees(self) -> bool:
        """At the in-flight bound: write what is answered; True if that made room."""
        n = len(self.slots)
        self.flush()
        return len(self.slots) < n and self.inflight_bytes < SESSION_BYTES_MAX

    def answer(self, reply: tuple) -> None:
        """Fill the oldest unanswered slot with the broker's reply and mirror its effect."""
        slot = self.unanswered.popleft()
        op, code = slot[0], reply[1]
        slot[1] = format_reply(reply)
        if op[CODE] == _PUT:
            self.inflight_bytes -= len(op[PUT_BODY])
        elif code == R.RESERVED:
            self.held.add(reply[2])
        elif code in _RELEASING:
            self.held.discard(op[ARG])
        elif code == R.USING and op[CODE] == Op.USE:
            self.use = reply[2]
        elif code == R.WATCHING:
            self._mirror_watch(op)

    def _mirror_watch(self, op: tuple) -> None:
        name = op[ARG]
        if op[CODE] == Op.WATCH and name not in self.watch:
            self.watch.append(name)
        elif op[CODE] == Op.IGNORE and name in self.watch:
            i = self.watch.index(name)
            last = self.watch.pop()
            if last != name:
                self.watch[i] = last

    def undone_ops(self) -> list[tuple]:
        """A broker that stopped gracefully answered every op it ran, so what is left is a
        reserve still waiting and what waits behind it, and what was held since: none ran,
        so all go to the next broker, in order (their slots stay, for its replies)."""
        return [slot[0] for slot in self.unanswered]

    def settle_unanswered(self) -> None:
        """The broker is gone: every command it had is answered INTERNAL_ERROR, never replayed."""
        self.front.own_replies += len(self.unanswered)
        while self.unanswered:
            self.unanswered.popleft()[1] = INTERNAL_ERROR
        self.inflight_bytes = 0

    def flush(self) -> None:
        slots, out = self.slots, []
        while slots and slots[0][1] is not None:
            out.append(slots.popleft()[1])
        if self.transport is None:
            return
        if out:
            self.transport.write(b"".join(out))
        if not slots and (self.quitting or self.eof):
            self.front.forget(self)    # the broker hears of it before the client sees EOF
            self.transport.close()

    def _regulate_reading(self) -> None:
        parser = self.parser
        full = parser.buffered > parser.max_job_size + READ_LIMIT_SLACK
        if full is not self.read_paused:        # (runs twice per command: keep it cheap)
            self._set_reading(full)

    def state(self) -> SessionState:
        return SessionState(self.conn, self.use, list(self.watch), sorted(self.held))



class BeanstalkFront(LinkedFront):
    kind = "beanstalk"
    conn_class = BeanstalkConn

    def __init__(self, broker: str, max_connections: int = 0, hold_s: float = 5.0,
                 max_job_size: int = 65535) -> None:
        super().__init__(broker, max_connections, hold_s)
        self.max_job_size = max_job_size

    def on_stopped(self) -> list[tuple]:
        """After a graceful stop: every connection's unanswered ops, in order (protocol/links/zeromq.py
        sends again those it had sent, and keeps those it holds)."""
        ops: list[tuple] = []
        for c in list(self.conns.values()):
            c.stale = True
            ops.extend(c.undone_ops())
        return ops

    def on_welcome(self, w: Welcome) -> None:
        self.max_job_size = w.settings.max_job_size
        for c in self.conns.values():
            c.parser.max_job_size = w.settings.max_job_size
        super().on_welcome(w)
