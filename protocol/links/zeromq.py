"""A front's link to the broker: one DEALER socket driven from an asyncio loop.

Ops queued during one event-loop turn leave as one `Batch` at the end of the turn
(`call_soon`), which is what makes the cluster fast.  Replies come back through the
socket's edge-triggered FD; after every send the socket is checked again, as ZeroMQ
requires of an FD that only signals edges.

Life cycle: CONNECTING (Hello sent, waiting for Welcome) -> READY -> LOST when nothing
has come from the broker for PEER_TIMEOUT_S, or a heartbeat names another broker
incarnation.  A broker stopping on SIGTERM says so first (`Stopping`): READY -> HOLDING,
where ops are held as while LOST but the replies to those already sent still come; the
link answers `Holding` (no op follows it), and the broker's final Stopping, after its
last reply, makes it LOST: what is still unanswered then never ran (a waiting reserve and
what waits behind it), so the owner may hand it back to be sent to the next broker first
(`on_stopped`).  Heartbeats go on while HOLDING: the broker may wait STOP_WAIT_S (5 s) for
other fronts' Holding, longer than PEER_TIMEOUT_S, and must not take us for dead meanwhile
(it would fence us and stop heartbeating, so we would give up on it too).  So a rolling
restart of the broker holds commands for the next one and fails none.  On LOST the socket
is thrown away with everything still queued in it, so nothing is replayed to a new
broker; the owner answers INTERNAL_ERROR for every op already sent (`on_lost`).  Ops
submitted while not READY are held (bounded count, `hold_s` timeout) and sent after
Welcome, or answered INTERNAL_ERROR when the time runs out.  `Fenced` means the broker
gave up on this incarnation: the owner closes every client connection and the link
starts over under a new incarnation.

Several brokers (`--broker tcp://a:11400,tcp://b:11400`: the instances of one journal,
docs/ha.md): the link says Hello to one at a time.  A standby answers `NotLeader`, which
names where the leader is reached; the link goes there at once.  A NotLeader naming no
leader (none known yet: the lease lapsed, a takeover under way) is asked again every
NOT_LEADER_RETRY_S.  An endpoint that does not welcome the link within PEER_TIMEOUT_S,
and a broker lost for silence or after its final Stopping, make it go to the next
endpoint of the list; a broker that restarted (another incarnation) is asked again where
it was.  So nothing is ever sent to a broker but the one that welcomed this incarnation,
and what a lost leader left unanswered is failed as ever, never replayed.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time

import zmq

from ..network import curve
from . import handshakes
from .owner import CONNECTING, READY, LinkOwner, LinkStats  # shared by both links
from ..schema import (HEARTBEAT_S, PEER_TIMEOUT_S, SILENT_OPS, Batch, Fenced, Heartbeat, Hello,
                      Holding, NotLeader, Op, Replies, R, SchemaError, Settings, Stopping,
                      Welcome, decode, encode)

log = logging.getLogger("zstalk.front")

LOST = "lost"
HOLDING = "holding"     # the broker is stopping: replies still come, nothing more is sent
#: a batch leaves early when it reaches this many ops, so that under a pipelined flood
#: the broker works on one part while the front parses the next (instead of taking turns)
MAX_BATCH_OPS = 512
#: while no broker answers, "waiting for the broker" is logged at most this often
WAITING_LOG_S = 30.0
#: held whatever the bound, so the broker's view of connections stays right; they are
#: bounded by the number of client connections (and OPEN/CLOSE pairs cancel at the bound)
_CONNECTION_OPS = frozenset({Op.OPEN, Op.CLOSE, Op.HALF_CLOSE})
# plain ints: pyzmq's enum arithmetic costs microseconds on the hot path
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
#: ops a broker may not answer at once: a batch of only these is not timed (LinkStats)
_MAY_WAIT = frozenset(int(op) for op in (*SILENT_OPS, Op.RESERVE))
#: a standby that knows no leader yet is asked again this often (a takeover takes ~1-3 s)
NOT_LEADER_RETRY_S = 0.2
#: ... and stayed with this long at most before the next endpoint is tried (it may be cut
#: off from NATS, and another instance lead meanwhile)
NOT_LEADER_STAY_S = 3 * PEER_TIMEOUT_S


def endpoints_of(address: str) -> list[str]:
    """The endpoints of a comma-separated `--broker` value (ZSTALK_BROKER), in order."""
    found = [part.strip() for part in address.split(",") if part.strip()]
    if not found:
        raise ValueError(f"no broker endpoint in {address!r}")
    return found


class BrokerLink:
    def __init__(self, endpoint: str, kind: str, owner: LinkOwner,
                 hold_s: float = 5.0, max_held: int = 100_000,
                 ctx: zmq.Context | None = None, keys=curve.FROM_ENV) -> None:
        """`keys`: CURVE keys (protocol/network/curve.py), by default from the environment; a
        non-local endpoint without them is refused (curve.CurveError)."""
        self.keys = curve.given_or_env(keys)
        self.endpoints = endpoints_of(endpoint)
        for each in self.endpoints:
            curve.check_local(each, self.keys, kind)
        self.endpoint = self.endpoints[0]      # the one asked now (a leader named, maybe)
        self._listed = 0                        # ... or the list's last one asked
        self._retry: asyncio.TimerHandle | None = None
        self.kind = kind
        self.owner = owner
        self.hold_s = hold_s
        self.max_held = max_held
        self.ctx = ctx or zmq.Context.instance()
        self.loop = asyncio.get_running_loop()
        self.front_id = random.getrandbits(64) or 1
        self.state = CONNECTING
        self.state_id = 0
        self.broker_id = 0
        self.settings = Settings()
        self.batch: list[tuple] = []
        self.held: list[tuple[float, tuple]] = []
        self.stats = LinkStats()
        self._flush_scheduled = False
        self._sent_early = False        # read_done sent this turn's first batch
        self.sock: zmq.Socket | None = None
        self.last_heard = time.monotonic()
        self.hello_at = self.asked_at = 0.0
        self._ticker: asyncio.TimerHandle | None = None
        self._waiting_since: float | None = None
        # not READY since (health.py); -inf: never welcomed, so not ready (a front with a
        # wrong key or address must not pass a rollout on the strength of its hold time)
        self.down_since: float | None = -math.inf
        self._waiting_said = -WAITING_LOG_S
        self._schema_said = -WAITING_LOG_S
        self._watch: handshakes.HandshakeWatch | None = None
        # the last failed handshake's cause, and whether it is certain (handshakes.cause)
        self._refused_because: tuple[str, bool] | None = None
        self._probing: asyncio.Task | None = None   # asking the endpoint what it is

    # -- socket ------------------------------------------------------------------------
    def start(self) -> None:
        self._connect()
        self._tick()

    def close(self, linger_ms: int = 0) -> None:
        """Stop; `linger_ms` gives ops already sent (a goodbye CLOSE) time to leave."""
        if self._ticker:
            self._ticker.cancel()
        if self._retry is not None:
            self._retry.cancel()
        if self._probing is not None:
            self._probing.cancel()
        self._drop_socket(linger_ms)

    def _connect(self, endpoint: str | None = None) -> None:
        """A fresh socket saying Hello to `endpoint` (by default the one asked last)."""
        if endpoint is not None:
            self.endpoint = endpoint
            if endpoint in self.endpoints:      # (a leader named that is in the list: after
                self._listed = self.endpoints.index(endpoint)   # it, the next one)
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._drop_socket()
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, curve.identity(self.front_id, self.keys))
        if self.keys is not None:
            curve.secure_client(s, self.keys)
        for opt, value in ((zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0),
                           (zmq.RECONNECT_IVL, 100), (zmq.RECONNECT_IVL_MAX, 1000)):
            s.setsockopt(opt, value)
        self._watch = handshakes.HandshakeWatch(s)
        s.connect(self.endpoint)
        self.sock = s
        self.loop.add_reader(s.getsockopt(zmq.FD), self._drain)
        self.state = CONNECTING
        self.stats.sent_at = None       # (its replies, if any, will not come)
        self.hello_at = self.asked_at = time.monotonic()
        if self.down_since is None:
            self.down_since = self.hello_at
        self._say_hello()

    def _say_hello(self) -> None:
        self._send(Hello(self.front_id, self.kind, os.getpid(), self.state_id,
                         self.owner.session_states()))

    def _next_listed(self) -> str:
        """The next endpoint of the list (the same one when there is only one)."""
        self._listed = (self._listed + 1) % len(self.endpoints)
        return self.endpoints[self._listed]

    def _read_handshakes(self) -> None:
        """Why handshakes with the broker failed, if they did: the last one is kept for the
        waiting line (read when it is said: a monitor's FD need not wake the loop)."""
        for event, value in self._watch.events() if self._watch else ():
            found = handshakes.cause(event, value, self.keys is not None)
            if found is not None and (found[1] or self._refused_because is None):
                self._refused_because = found

    def _drop_socket(self, linger_ms: int = 0) -> None:
        if self._watch is not None:
            self._read_handshakes()
            self._watch.close()
            self._watch = None
        if self.sock is not None:
            self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
            self.sock.close(linger=linger_ms)
            self.sock = None

    def _send(self, msg) -> None:
        if self.sock is None:       # closed: the front is shutting down
            return
        try:
            self.sock.send(encode(msg), _NOBLOCK)
        except zmq.Again:
            self._unsent(msg)
            return
        self._drain()

    def _unsent(self, msg) -> None:
        """The socket has no connection to queue on: ZeroMQ drops a connection's queue when
        its handshake fails (a CURVE mismatch, a refused key), and a send right after that
        finds none.  A Hello or a Heartbeat is said again on the next tick; a Batch is lost
        with the connection, so a READY link takes the broker as lost (its owner answers
        what it awaits), exactly as if the broker had gone silent."""
        if self.state is READY and isinstance(msg, Batch):
            self._lose("cannot send to it: ZeroMQ has no connection to queue on")

    def _drain(self) -> None:
        """Take every message waiting on the socket (edge-triggered FD: loop until empty)."""
        sock = self.sock
        while sock is not None and sock.getsockopt(_EVENTS) & _POLLIN:
            data = sock.recv(_NOBLOCK)
            try:
                msg = decode(data)
            except SchemaError as exc:
                now = time.monotonic()
                if now - self._schema_said >= WAITING_LOG_S:    # (heartbeats: twice a second)
                    self._schema_said = now
                    log.warning("%s: ignoring messages from the broker at %s: %s", self.kind,
                                self.endpoint, exc)
                continue
            self._handle(msg)
            sock = self.sock

    @property
    def fail_closed(self) -> bool:
        """Out of touch with a broker we had: requests that must not wait are refused.
        (A front that never reached one holds everything for `hold_s` instead.)"""
        return self.state is not READY and self.broker_id != 0

    # -- ops ---------------------------------------------------------------------------
    def gather(self) -> None:
        """A read from a client begins (its ops leave with the turn's batch anyway)."""

    def read_done(self) -> None:
        """A read from a client was handled.  The first read of a loop turn sends its ops
        at once (an idle client's command gains a loop turn, ~30 us); ops of later reads
        in the same turn wait for its end, so under load one message still carries the
        commands of many connections."""
        if self.batch and not self._sent_early and self.state is READY:
            self._sent_early = True
            batch, self.batch = self.batch, []
            self._send_batch(batch)

    def submit(self, op: tuple) -> None:
        if self.state is READY:
            self.batch.append(op)
            if len(self.batch) >= MAX_BATCH_OPS:
                self._flush()          # let the broker start while we parse the rest
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)
        elif op[0] == Op.CLOSE and len(self.held) >= self.max_held and self._cancel_held_open(op[1]):
            pass        # at the bound, a connection that came and went is forgotten
        elif op[0] in _CONNECTION_OPS or len(self.held) < self.max_held:
            self.held.append((time.monotonic(), op))
            if op[0] not in SILENT_OPS:
                self.stats.held += 1
        elif op[0] not in SILENT_OPS:
            # full: fail the OLDEST held command, so each connection's replies stay in order
            self._fail_oldest_held()
            self.held.append((time.monotonic(), op))
            self.stats.held += 1
        # else a COUNT past the bound: a lost stat, never acknowledged data

    def _fail_oldest_held(self) -> None:
        for i, (_, held) in enumerate(self.held):
            if held[0] not in SILENT_OPS:
                del self.held[i]
                self.stats.failed += 1
                self.owner.on_replies([(held[1], R.INTERNAL_ERROR)])
                return

    def _cancel_held_open(self, conn: int) -> bool:
        """A connection that opened and closed while the broker was away never existed for it."""
        if not any(op[0] == Op.OPEN and op[1] == conn for _, op in self.held):
            return False
        self.held = [(at, op) for at, op in self.held if op[1] != conn]
        return True

    def flush_now(self) -> None:
        if self.batch:
            self._flush()

    def take_unsent(self) -> list[tuple]:
        """The ops held or gathered and not sent, in order, taken away (`relink`)."""
        unsent = [op for _, op in self.held] + self.batch
        self.held, self.batch = [], []
        return unsent

    def _flush(self) -> None:
        self._flush_scheduled = self._sent_early = False
        if self.batch and self.state is READY:
            batch, self.batch = self.batch, []
            self._send_batch(batch)

    def _send_batch(self, batch: list) -> None:
        stats = self.stats
        if stats.armed and stats.sent_at is None and any(
                op[0] not in _MAY_WAIT for op in batch):
            stats.armed = False
            stats.sent_at = time.monotonic()        # (timed to the next Replies)
        self._send(Batch(batch))

    # -- broker messages ---------------------------------------------------------------
    def _handle(self, msg) -> None:
        self.last_heard = time.monotonic()
        if isinstance(msg, Replies):
            sent_at = self.stats.sent_at
            if sent_at is not None:
                self.stats.sent_at = None
                self.stats.round_trip.observe(self.last_heard - sent_at)
            self.owner.on_replies(msg.items)
        elif isinstance(msg, Heartbeat):
            if self.state in (READY, HOLDING) and msg.sender_id != self.broker_id:
                self._lose("broker restarted (new incarnation)", move=False)
        elif isinstance(msg, Welcome):
            self._welcome(msg)
        elif isinstance(msg, NotLeader):
            self._not_leader(msg)
        elif isinstance(msg, Settings):
            self.settings = msg         # the broker read its config again
        elif isinstance(msg, Stopping) and msg.broker_id == self.broker_id:
            self._stopping(msg.final)
        elif isinstance(msg, Fenced) and msg.broker_id != self.broker_id:
            if self.state in (READY, HOLDING):
                self._lose("broker restarted (it does not know this front)", move=False)
        elif isinstance(msg, Fenced) and msg.front_id == self.front_id:
            log.warning("fenced by the broker: closing client connections, starting over")
            self.batch = []         # ops of the fenced incarnation must not reach the next
            self.owner.on_fenced()
            self.front_id = random.getrandbits(64) or 1
            self.state_id = 0
            self._connect()

    def _welcome(self, w: Welcome) -> None:
        self.broker_id = w.broker_id
        self.settings = w.settings
        self.state_id = w.state_id
        self.state = READY
        self.down_since = None
        # what the owner sends on Welcome (re-OPEN, SUBSCRIBE, ...) goes before the ops
        # held while the broker was away: they may need the session it sets up
        self.owner.on_welcome(w)
        if self._waiting_since is not None:
            log.warning("%s: reached the broker at %s", self.kind, self.endpoint)
            self._waiting_since, self._waiting_said = None, -WAITING_LOG_S
        self._refused_because = None
        log.info("registered with broker %016x", w.broker_id)
        held, self.held = self.held, []
        for _, op in held:
            self.submit(op)

    def _not_leader(self, msg: NotLeader) -> None:
        """A standby answered our Hello: go to the leader it names at once, or, when it
        knows none, ask it again shortly; after NOT_LEADER_STAY_S of that, the tick moves
        on to the next endpoint (as it does PEER_TIMEOUT_S after a Hello nobody answers)."""
        if self.state is not CONNECTING:
            return
        if msg.leader and msg.leader != self.endpoint:
            log.info("%s: %s does not lead: going to the leader at %s (epoch %d)", self.kind,
                     self.endpoint, msg.leader, msg.epoch)
            try:
                curve.check_local(msg.leader, self.keys, self.kind)
            except curve.CurveError as exc:
                log.warning("%s: not going to %s: %s", self.kind, msg.leader, exc)
                return
            self._connect(msg.leader)
        elif self._retry is None:
            now = time.monotonic()
            if now - self.asked_at < NOT_LEADER_STAY_S:
                self.hello_at = now         # (it answers: no moving on for silence)
            self._retry = self.loop.call_later(NOT_LEADER_RETRY_S, self._ask_again)

    def _ask_again(self) -> None:
        self._retry = None
        if self.state is CONNECTING:
            self._say_hello()

    def _stopping(self, final: bool) -> None:
        if final:
            if self.state in (READY, HOLDING):
                self._lose("the broker stopped", stopped=True)
        elif self.state is READY:
            self._flush()                   # what this turn gathered still goes to it
            self.state = HOLDING
            self.down_since = time.monotonic()
            self._send(Holding(self.front_id))
            log.info("%s: the broker is stopping: holding commands for the next one",
                     self.kind)

    def _lose(self, why: str, stopped: bool = False, move: bool = True) -> None:
        """`stopped`: after the broker's final Stopping, which came after its last reply,
        so an owner with `on_stopped` sends what is unanswered to the next broker: those
        ops go first, ahead of what was held meanwhile.  Otherwise the owner takes all it
        awaits as lost (on_lost: it fails or re-sends it itself), so ops held while
        HOLDING are dropped here, but for the silent ones (OPEN, CLOSE, ...), which it
        does not await."""
        # (a broker that said it stops, after its last reply, is no failure of it)
        (log.info if stopped else log.warning)("lost the broker: %s", why)
        self.state = LOST
        self.batch = []
        on_stopped = getattr(self.owner, "on_stopped", None)    # (optional: mailbox.py)
        if stopped and on_stopped is not None:
            now = time.monotonic()
            # what the owner still awaits includes what it submitted while HOLDING, which is
            # here already (the same op objects): only what was sent goes ahead of it
            held = {id(op) for _, op in self.held}
            self.held[:0] = [(now, op) for op in on_stopped() if id(op) not in held]
        else:
            self.held = [(at, op) for at, op in self.held if op[0] in SILENT_OPS]
            self.owner.on_lost()
        # (a broker gone silent or stopped: the next endpoint may lead now; one that
        # restarted is asked again where it was)
        self._connect(self._next_listed() if move else None)

    # -- timers ------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        if self.state is READY or self.state is HOLDING:
            self._send(Heartbeat(self.front_id))    # (HOLDING too: module comment)
            if self.state is READY:
                self.stats.armed = True
            if now - self.last_heard > PEER_TIMEOUT_S:
                self._lose(f"silent for {now - self.last_heard:.1f} s")
        elif now - self.hello_at > PEER_TIMEOUT_S:
            self._say_waiting(now)
            self._connect(self._next_listed())    # Hello again, on a fresh socket
        self._expire_held(now)
        self._ticker = self.loop.call_later(HEARTBEAT_S, self._tick)

    def _say_waiting(self, now: float) -> None:
        """No broker answers: say so once, then every WAITING_LOG_S (not every Hello)."""
        if now - self._waiting_said < WAITING_LOG_S:
            return
        if self._waiting_since is None:
            self._waiting_since = self.hello_at
        self._waiting_said = now
        self._read_handshakes()
        known, seconds = self._refused_because, now - self._waiting_since
        if known is not None and known[1]:
            self._say_unwelcomed(seconds, known[0])
        elif self._probing is None or self._probing.done():
            self._probing = self.loop.create_task(self._probe_then_say(seconds, known))

    async def _probe_then_say(self, seconds: float, known: tuple[str, bool] | None) -> None:
        """Without a certain cause, ask the endpoint what answers there (handshakes.probe)."""
        found = await handshakes.probe(self.endpoint)
        if self.state is CONNECTING:        # (not welcomed meanwhile)
            self._say_unwelcomed(seconds, handshakes.probed_cause(
                found, self.keys is not None, guess=known[0] if known else None))

    def _say_unwelcomed(self, seconds: float, why: str | None) -> None:
        log.warning("%s: %s", self.kind, handshakes.unwelcomed(self.endpoint, seconds, why))

    def _expire_held(self, now: float) -> None:
        if not self.held or now - self.held[0][0] < self.hold_s:
            return
        keep, failed = [], []
        for at, op in self.held:
            if now - at < self.hold_s or op[0] in SILENT_OPS:
                keep.append((at, op))
            else:
                failed.append((op[1], R.INTERNAL_ERROR))
        self.held = keep
        if failed:
            self.stats.failed += len(failed)
            self.owner.on_replies(failed)
