"""The broker actor: the pure core (core/broker.py) driven by an asyncio loop, for every placement.

Peers reach the core two ways, and the core cannot tell them apart (each is a routing id):
* **over ZeroMQ** (remote fronts, native worker pools, producers): one ROUTER socket whose
  FD is watched with `add_reader`.  That FD only signals edges, so after every send and
  every turn `ZMQ_EVENTS` is checked again and a read is scheduled if anything waits.
* **through the in-process mailbox** (fronts placed beside the broker, `local:` links in
  protocol/links/mailbox.py): a front hands its batch to `post()`, the core handles it and the
  replies are delivered back to the front's link in the same call: no socket, no
  encoding, no extra loop turn.

A turn (`_turn`): handle what came in, fire due timers (`expire`), write the turn's binlog
records, then send or deliver each peer the one Replies message the core gathered for it.
The next deadline is armed with `call_later`, its delay taken from the clock when it is
armed (not from the turn's start: a long turn would make every next timer late by its
length, as 1,000 schedules firing each second showed: 16 ms), remote
fronts get a Heartbeat every HEARTBEAT_S, and in-process fronts are never declared dead
for silence: they share our loop, so a long GC pause or a slow disk write stalls them
exactly as long as it stalls us; nor, while we stop, is a remote front that answered
Holding (below).

Stopping (SIGTERM): with fronts or pools in other processes, the broker first tells them
(`Stopping`, protocol/schema/messages.py) and keeps serving what they already sent until each has answered
`Holding`, or has gone, or STOP_WAIT_S has passed; then it writes its binlog to disk, sends the last
replies and a final Stopping, and closes, giving those STOP_LINGER_MS to leave.  A front
holds what its clients send meanwhile for the next broker, so a rolling restart fails no
command.  A front welcomed meanwhile (it connected, restarted or re-registered) is told
right after its Welcome and waited for as well, until the same deadline.  A second SIGTERM
stops at once.  A front that answered Holding waits for our final Stopping however long
a slower one keeps us (STOP_WAIT_S, more than PEER_TIMEOUT_S) and sends no op meanwhile
(nor a heartbeat, if its link is older than protocol/links/zeromq.py's heartbeats while holding): it is
kept alive until we exit, so that we neither fence it nor stop heartbeating it, which
would make it give up on us and fail what it holds.  A front that has not answered is
dropped for silence as ever, and then no longer waited for.

ROUTER_MANDATORY makes a send to a front that has gone raise EHOSTUNREACH instead of
dropping it; the core then treats that front as dead.  The core appends its records to a
journal (core/shared/journal.py: with --binlog, wal/binlog.py; with --journal, NATS
JetStream, wal/jetstream.py; else the null journal); each turn ends the journal's turn,
which writes them, before any reply of that turn leaves, so a crash loses nothing
acknowledged.  A journal that holds replies (the binlog under `fsync_ms == 0`, the stream
always) makes them wait in `held` until its `durable` ticket covers their turn's (group
commit); it tells the loop when that moves (the binlog's fsync thread, through its notify
FD; the stream's acknowledgements, on our loop).  A journal that fails (`failed`: deposed
by another writer, NATS out of reach too long) has what is held dropped, never sent, its
fronts Fenced (they close their clients), and the process exits with its code.

Servers with `resolve` (core/upstreams/spec.py) have their names looked up off the core
by a Resolver (resolver.py), an asyncio task beside us started when the config (at start
or on SIGHUP) has one; each answer is handed to the core (`_resolved`) and a turn follows.

zmq is imported only when an endpoint is bound, so a server whose fronts all live in this
process answers its first client before the ZeroMQ machinery has loaded.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import math
import os
import resource
import signal
import time

from ..protocol.network import curve
from ..protocol.links.mailbox import register_mailbox, unregister_mailbox
from ..protocol.schema import (HEARTBEAT_S, SCHEMA_VERSION, Fenced, Holding, SchemaError,
                               Stopping, decode_peer, encode)
from .core.broker import Broker, Config, Front
from .core.beanstalk.stats import SysInfo
from .metrics import DEFAULT_TOP, BrokerMetrics
from .router import BindError, Router, bind_router, open_router  # noqa: F401 (BindError: run/)

log = logging.getLogger("zstalk.broker")
_MAX_MESSAGES_PER_TURN = 4    # then reply: fronts overlap their work with ours
#: a peer's undecodable messages are logged at most this often
SAY_AGAIN_S = 30.0
#: with schedules, the wall clock is looked at at least this often (steps: schedules.py)
WALL_CHECK_S = 1.0
#: a stopping broker waits this long at most for its remote fronts' Holding (one that
#: goes away meanwhile, as when a supervisor stops them all at once, is not waited for) ...
STOP_WAIT_S = 5.0
#: ... and gives its last replies this long to leave
STOP_LINGER_MS = 1000
#: the peers on a BrokerLink (protocol/links/zeromq.py), which take Stopping (producers do not)
_HOLDING_KINDS = frozenset({"beanstalk", "counter", "http", "dispatcher", "pool"})
# libzmq's option and flag numbers as plain ints (zmq.h; stable across versions): pyzmq's
# enum arithmetic costs microseconds on the hot path, and zmq need not be imported yet
_EVENTS, _RCVMORE, _POLLIN, _NOBLOCK, _SNDMORE = 15, 13, 1, 1, 2


class BrokerActor:
    def __init__(self, bind: str | None, config: Config, ctx=None, binlog=None,
                 also_bind: tuple[str, ...] = (), config_path: str | None = None,
                 keys=curve.FROM_ENV, metrics_top: int = DEFAULT_TOP) -> None:
        self.config_path = config_path      # the --config file SIGHUP reads again
        # CURVE (protocol/network/curve.py): our keys and the admitted clients' directory, by
        # default from the environment; the ZAP handler starts with the socket
        self.keys = curve.server_keys() if keys is curve.FROM_ENV else keys
        self.admitted: curve.Admitted | None = None
        self.auth = None
        self._mismatch_logged = -math.inf
        self.old_peers: dict[bytes, int] = {}    # peer -> the older schema version it speaks
        self._said: dict[bytes, float] = {}     # peer -> when a problem with it was logged
        # the binlog first: a locked or foreign directory fails before we take the endpoint
        with no_gc():       # a million recovered jobs: the collector would double the time
            self.journal, recovered = open_journal(binlog, config)
            self.core = self._make_core(config, recovered)
        self.journal = self.core.journal        # (the null one without --binlog)
        #: what the binlog's replay brought back, (jobs, tasks, schedules), for the start line
        self.restored: tuple[int, int, int] | None = None if recovered is None else (
            len(recovered.jobs), len(recovered.tasks), len(recovered.schedules))
        self.old_peers = self.core.old_peers    # (shared: the core asks it too)
        if recovered is not None:
            gc.freeze()     # and later full collections need not walk them again
        self.metrics = BrokerMetrics(self.core, metrics_top)    # read at a scrape
        self.held: collections.deque = collections.deque()   # (ticket, messages)
        self.ctx = ctx
        self.sock = None
        self.endpoint: str | None = None
        self.endpoints: list[str] = []
        self.local: dict[bytes, object] = {}      # peer -> in-process link (mailbox.LocalLink)
        self.local_names: list[str] = []
        self._inbox: list[tuple[bytes, object]] = []
        self._busy = False
        self._again = False       # a delivery of ours changed the core: one more turn
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._heartbeat: asyncio.TimerHandle | None = None
        self._read_scheduled = False
        self._sock_used = False     # this turn called into the socket (see _check_socket)
        self._stopped: asyncio.Future | None = None
        self._stop_requested = False
        self._told: list[bytes] = []            # peers told Stopping
        self._awaiting: set[bytes] | None = None    # ... that have not answered Holding
        self._holding: set[bytes] = set()           # ... that have: kept alive (_keep_alive)
        self.closed = False
        self.exit_code: int | None = None   # the journal failed: the process exits so
        self._refusal_watch = None      # with CURVE: the ROUTER's monitor (_watch_refusals)
        self.resolver = None            # resolver.Resolver, once a server has `resolve`
        if bind is not None or also_bind:
            self.bind(*((bind,) if bind is not None else ()), *also_bind)

    def render_metrics(self, more=()) -> bytes:
        """GET /metrics: the broker's state now, and `more` samples (in-process fronts')."""
        return self.metrics.render(time.monotonic(), more)

    def _make_core(self, config: Config, recovered) -> Broker:
        now = time.monotonic()
        return Broker(config, now, process_sysinfo, wall_offset=time.time() - now,
                      journal=self.journal, restored=recovered)

    # -- endpoints -----------------------------------------------------------------------
    def bind(self, *endpoints: str) -> None:
        """Bind ZeroMQ endpoints (now, or later: a server binds the worker endpoint after it
        answers its first client); raises BindError naming the endpoint."""
        import zmq
        self._zmq = zmq
        if self.sock is None:
            self.ctx = self.ctx or zmq.Context.instance()
            self._take(open_router(self.ctx, self.keys))
        for endpoint in endpoints:    # e.g. TCP for worker pools beside ipc://
            self._took(bind_router(self.sock, endpoint, self.keys))

    def adopt(self, router: "Router", endpoints: list[str]) -> None:
        """Serve on a socket a standby's door made and bound (standby.py): the peers that
        connected while it stood by stay connected, and what they sent meanwhile is read
        now."""
        import zmq
        self._zmq = zmq
        self.ctx = self.ctx or zmq.Context.instance()
        self._take(router)
        for bound in endpoints:
            self._took(bound)

    def _take(self, router: "Router") -> None:
        self.sock, self.admitted, self.auth = router
        if self.keys is not None:
            self._watch_refusals()
        if self.loop is not None:
            self._watch_socket()

    def _took(self, bound: str) -> None:
        self.endpoints.append(bound)
        self.endpoint = self.endpoint or bound

    def _watch_refusals(self) -> None:
        """With CURVE, say which peers are refused and why (protocol/links/handshakes.py)."""
        from ..protocol.links import handshakes
        events = (self._zmq.EVENT_ACCEPTED | self._zmq.EVENT_DISCONNECTED
                  | self._zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                  | self._zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | self._zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self.refusals = handshakes.Refusals(self.admitted.refusals)
        self._refusal_watch = handshakes.HandshakeWatch(self.sock, events)

    def _read_refusals(self) -> None:
        """Connections and refused handshakes (the monitor's FD signals edges: read until
        empty, and on every heartbeat too)."""
        for event, value in self._refusal_watch.events():
            self.refusals.on_event(event, value)

    def expose(self, name: str) -> str:
        """Let fronts in this process reach us at `local:NAME` (protocol/links/mailbox.py)."""
        address = register_mailbox(name, self)
        self.local_names.append(address)
        return address

    # -- the in-process mailbox (protocol/links/mailbox.py, Mailbox) -------------------------------
    def attach(self, peer: bytes, link) -> None:
        self.local[peer] = link

    def detach(self, peer: bytes) -> None:
        """A front in this process closed: its sessions close now, as for a silent front."""
        if self.local.pop(peer, None) is not None and not self.closed:
            front = self.core.fronts.get(peer)
            if front is not None:
                self.core.drop_front(front, time.monotonic())
                self._again = True
                if not self._busy:
                    self._turn()

    def post(self, peer: bytes, msg) -> None:
        """A message from a front in this process: handled, and the replies delivered,
        before this returns (or, when a delivery of ours led here, right after it)."""
        if self.closed:
            return      # stopped: the process is closing its client connections
        self._inbox.append((peer, msg))
        if not self._busy:
            self._turn()

    # -- signals -------------------------------------------------------------------------
    def install_signals(self) -> None:
        loop = self.loop
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)
        loop.add_signal_handler(signal.SIGUSR1, self.drain)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        # a supervisor's child starts with these blocked, so one passed on before now
        # waited instead of killing us (broker/run/supervisor.py); it is handled now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1, signal.SIGHUP])

    def reload(self) -> None:
        """SIGHUP: read the admitted keys and the config file again; a config file with an
        error, or with a waiting room this process has no pass keys for
        (config_file.check_passes), changes nothing."""
        if self.admitted is not None:
            log.info("SIGHUP: %d client keys admitted from %s", self.admitted.reload(),
                     self.admitted.directory)
        if self.config_path is None:     # (a signal that read nothing at all: say so)
            (log.info if self.admitted is not None else log.warning)(
                "SIGHUP: no --config file to read again")
            return
        from .config_file import ConfigError, check_passes, load
        try:
            fns = load(self.config_path, self.core.config.room_pages)
            warnings = fns.warnings + check_passes(fns, self.config_path)
        except ConfigError as exc:
            log.warning("SIGHUP: kept the config in use: %s", exc)
            return
        for warning in warnings:
            log.warning("SIGHUP: %s", warning)
        self.core.configure_functions(fns, time.monotonic())
        self._follow_names(fns.upstreams)
        log.info("SIGHUP: read %s again (%d functions%s)", self.config_path, len(fns.named),
                 ", and any under base_url" if fns.base else "")
        if any(spec.health_check is not None for spec in fns.upstreams):
            from .core.upstreams.health import describe     # (the start line's, again)
            log.info("SIGHUP: %s", describe(fns.upstreams))
        self._again = True
        if not self._busy:
            self._turn()

    def _follow_names(self, upstreams) -> None:
        """Start looking names up once an upstream has a server with `resolve` (the
        Resolver asks the core which, every round: a reload that drops them idles it)."""
        if self.resolver is not None or not any(
                server.resolve for spec in upstreams for server in spec.servers):
            return
        from .resolver import Resolver
        self.resolver = Resolver(self.core.resolving, self._resolved)
        self.resolver.start()

    def _resolved(self, upstream: str, url: str, addresses: tuple) -> bool:
        """A lookup's answer: the core's peers follow it, and a turn offers the calls."""
        changed = self.core.resolved(upstream, url, addresses, time.monotonic())
        if changed:
            self._again = True
            if not self._busy:
                self._turn()
        return changed

    def drain(self) -> None:
        log.info("SIGUSR1: drain mode on, put now answers DRAINING")
        self.core.draining = True

    def stop(self) -> None:
        """End serve(), once the remote fronts hold (module comment); callable from any
        thread (in-process use: zstalk.broker.testing)."""
        self._stop_requested = True
        if self._stopped is not None:
            with contextlib.suppress(RuntimeError):     # the loop already closed
                self.loop.call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        if self._awaiting is not None or self.closed:
            self._finish()                              # a second SIGTERM: now
            return
        self._told = [front.peer for front in self.core.fronts.values() if self._holds(front)]
        self._awaiting = set(self._told)
        self.core.after_welcome = self._tell_newcomer
        if not self._told:
            self._finish()
            return
        log.info("stopping: telling %d fronts and pools to hold their commands",
                 len(self._told))
        self._send([(peer, Stopping(self.core.broker_id, False)) for peer in self._told])
        self._check_socket()
        self.loop.call_later(STOP_WAIT_S, self._finish)     # (newcomers too: no later)
        self._wait_for(set())

    def _holds(self, front: Front) -> bool:
        """A front that takes Stopping: in another process, on a link (not a producer),
        of schema version 3 or later."""
        return (front.peer not in self.local and front.kind in _HOLDING_KINDS
                and self.old_peers.get(front.peer, SCHEMA_VERSION) >= 3)

    def _tell_newcomer(self, front: Front) -> Stopping | None:
        """A front welcomed while we stop (it connected, restarted or re-registered
        meanwhile) is told as the others were, right after its Welcome (core.after_welcome),
        and waited for until the same deadline: else it would go on sending us commands
        and fail what is unanswered when we exit."""
        if not self._holds(front):
            return None
        if front.peer not in self._told:
            self._told.append(front.peer)       # (so it gets the final Stopping too)
        self._holding.discard(front.peer)       # a link started over answers again
        self._awaiting.add(front.peer)
        log.info("stopping: telling front %016x, welcomed meanwhile, to hold its commands",
                 front.front_id)
        return Stopping(self.core.broker_id, False)

    def _on_holding(self, peer: bytes) -> None:
        """A front sends no op after Holding: all it sent is handled (this turn)."""
        if self._awaiting is not None and peer in self._awaiting:
            self._holding.add(peer)
            self._wait_for({peer})

    def _wait_for(self, answered: set[bytes]) -> None:
        """Stop once every front told has answered or gone (a send to it failed)."""
        self._awaiting -= answered
        self._awaiting.intersection_update(self.core.fronts)
        if not self._awaiting:
            self.loop.call_soon(self._finish_if_answered)   # after this turn's replies

    def _finish_if_answered(self) -> None:
        if not self._awaiting:      # (a front welcomed since is waited for too)
            self._finish()

    def _finish(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    # -- running -------------------------------------------------------------------------
    def start(self) -> None:
        """Attach to the running loop: watch the socket and the binlog, arm the timers."""
        self.loop = asyncio.get_running_loop()
        self._stopped = self.loop.create_future()
        if self._stop_requested:
            self._finish()
        if self.sock is not None:
            self._watch_socket()
        self.journal.start(self.loop, self._on_journal)
        self._follow_names(self.core.config.upstreams)
        self._beat()
        self._turn()
        log.info("broker %016x listening on %s", self.core.broker_id,
                 ", ".join(self.endpoints + self.local_names) or "nothing")

    def let_last_replies_leave(self) -> None:
        """At process exit, after close(): a process that just exits drops what its
        ZeroMQ context still queues; this waits up to STOP_LINGER_MS for it to leave."""
        if self._told and self.ctx is not None:
            self.ctx.destroy(linger=0)     # (the closed socket keeps its own linger)

    async def wait_stopped(self) -> None:
        await self._stopped

    async def serve(self, signals: bool = True) -> None:
        self.start()
        if signals:
            self.install_signals()
        try:
            await self.wait_stopped()
        finally:
            self.close()

    def run(self, signals: bool = True) -> None:
        """Run on a loop of our own until stopped; `signals=False` in a thread."""
        from ..protocol.network.loop import run
        run(self.serve(signals))

    def close(self) -> None:
        """Stop: binlog to disk, held replies out, sockets closed."""
        if self.closed:
            return
        self.closed = True
        for handle in (self._timer, self._heartbeat):
            if handle is not None:
                handle.cancel()
        self._timer = self._heartbeat = None
        if self.resolver is not None:
            self.resolver.stop()
        self._shutdown_journal()
        if self._told:              # after the last replies: go to the next broker
            self._send([(peer, Stopping(self.core.broker_id, True)) for peer in self._told])
        if self._refusal_watch is not None:
            if self.loop is not None:
                self.loop.remove_reader(self._refusal_watch.fd)
            self._refusal_watch.close()
            self._refusal_watch = None
        if self.sock is not None:
            if self.loop is not None:
                self.loop.remove_reader(self.sock.FD)
            self.sock.close(linger=STOP_LINGER_MS if self._told else 0)
            self.sock = None
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        for address in self.local_names:
            unregister_mailbox(address)
        for endpoint in self.endpoints:
            if endpoint.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.unlink(endpoint[len("ipc://"):])
        log.info("broker stopped")

    # -- the turn ------------------------------------------------------------------------
    def _turn(self) -> None:
        """Handle the inbox, fire due timers, write the binlog, send and deliver replies;
        repeated while deliveries to in-process fronts post more.

        Timers are fired only once the armed one is due: `_timer_at` is never later than
        the core's next deadline (every turn ends in `_arm`), and a deadline set during a
        turn is not earlier than that turn's `now`, so the core's `expire` would find
        nothing to do before then (a deadline of `now` itself, as `pause-tube x 0` sets,
        fires on the next loop iteration)."""
        core = self.core
        self._busy = True
        expired = False
        try:
            while True:
                now = time.monotonic()
                if self._inbox:
                    inbox, self._inbox = self._inbox, []
                    for peer, msg in inbox:
                        core.handle(peer, msg, now)
                if now >= self._timer_at:
                    if not expired:
                        self.metrics.timer_lateness.observe(now - self._timer_at)
                    self._keep_alive(now)
                    if core.tasks_built and core.schedules.by_name:  # (a pair read now)
                        core.observe_wall(time.time(), time.monotonic())
                    core.expire(now)
                    expired = True
                self._commit(core.flush(), now)
                if not (self._inbox or self._again):
                    break
                self._again = False
        finally:
            self._busy = False
        self._arm(now, expired)
        self._check_socket()

    def _keep_alive(self, now: float) -> None:
        """Fronts not declared dead for silence: those in this process, and while we stop
        those that answered Holding (module comment)."""
        fronts = self.core.fronts
        for peers in (self.local, self._holding):
            for peer in peers:
                front = fronts.get(peer)
                if front is not None:
                    front.last_seen = now

    def _arm(self, now: float, expired: bool) -> None:
        """Make sure a timer fires at the core's (or the journal's) next deadline, when
        the turn set one before the armed timer (core.next_wake) or that timer fired."""
        if expired:         # what was due has fired: an armed timer still pending is stale
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timer_at = math.inf
        wake = self.core.next_wake(None if expired else self._timer_at)
        if wake is not None and self.core.tasks_built and self.core.schedules.by_name:
            wake = min(wake, now + WALL_CHECK_S)
        sync = self.journal.due()
        if sync is not None and (wake is None or sync < wake):
            wake = sync
        if wake is None or wake >= self._timer_at or self.loop is None:
            return      # the armed timer fires first, and arms the next one then
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        # (the delay from now, not from the turn's start: call_later counts from its call)
        self._timer = self.loop.call_later(max(0.0, wake - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None      # _timer_at stays: it is due, so this turn fires the timers
        self._timer_at = min(self._timer_at, time.monotonic())   # (a clock a hair behind)
        self._turn()

    def _beat(self) -> None:
        """Heartbeat the peers across ZeroMQ (in-process ones share our loop: no need)."""
        local = self.local
        self._send([m for m in self.core.heartbeats() if m[0] not in local])
        self.metrics.tick(time.monotonic())
        if self._refusal_watch is not None:
            self._read_refusals()
        if self._awaiting:          # stopping: a front that has gone will not answer
            self._wait_for(set())
        self._heartbeat = self.loop.call_later(HEARTBEAT_S, self._beat)
        self._check_socket()

    # -- ZeroMQ --------------------------------------------------------------------------
    def _watch_socket(self) -> None:
        self.loop.add_reader(self.sock.FD, self._on_readable)
        if self._refusal_watch is not None:     # (read at once: its peers' addresses go fast)
            self.loop.add_reader(self._refusal_watch.fd, self._read_refusals)
            self._read_refusals()
        self._sock_used = True
        self._check_socket()

    def _check_socket(self) -> None:
        """The FD signals edges only, and any call into the socket (a send, a receive,
        reading its events) may take the edge of messages that then wait unannounced: so
        after a turn that called into it, look whether messages wait.  A turn that did
        not (fronts in this process only: `zstalk serve`'s clients) cannot have taken an
        edge, and skips the look, which costs two system calls (ZeroMQ's poll of its
        command pipe and its fork check)."""
        if not self._sock_used:
            return
        self._sock_used = False
        sock = self.sock
        if sock is not None and not self._read_scheduled and sock.getsockopt(_EVENTS) & _POLLIN:
            self._read_scheduled = True
            self.loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        self._read_scheduled = False
        if self.sock is None:
            return              # closed after this read was scheduled (stopping)
        if self._receive():
            self._turn()
        else:
            self._check_socket()

    def _receive(self) -> int:
        sock, handle = self.sock, self.core.handle
        self._sock_used = True
        taken = 0
        while taken < _MAX_MESSAGES_PER_TURN and sock.getsockopt(_EVENTS) & _POLLIN:
            taken += 1
            peer = sock.recv(_NOBLOCK)
            if self.keys is not None:
                data = self._keyed_frame(peer)
                if data is None:
                    continue
            else:
                data = sock.recv(_NOBLOCK) if sock.getsockopt(_RCVMORE) else b""
            while sock.getsockopt(_RCVMORE):      # not one of ours: drop extra frames
                sock.recv(_NOBLOCK)
                data = b""
            try:
                version, msg = decode_peer(data)
            except SchemaError as exc:
                self._say_once(peer, f"ignoring messages from {peer.hex()}: {exc}")
                continue
            if type(msg) is Holding:
                self._on_holding(peer)
                continue
            if version != SCHEMA_VERSION:
                if peer not in self.old_peers:
                    log.warning("peer %s speaks schema version %d (this broker %d): it is "
                                "answered in its version; update it", peer.hex(), version,
                                SCHEMA_VERSION)
                self.old_peers[peer] = version
            elif self.old_peers:
                self.old_peers.pop(peer, None)
            handle(peer, msg, time.monotonic())
        return taken

    def _say_once(self, peer: bytes, text: str) -> None:
        """Log `text` about `peer` at most every SAY_AGAIN_S (a peer sending junk must not
        fill the log)."""
        now = time.monotonic()
        if now - self._said.get(peer, -math.inf) >= SAY_AGAIN_S:
            if len(self._said) > 1024:
                self._said.clear()
            self._said[peer] = now
            log.warning("%s", text)

    def _keyed_frame(self, peer: bytes) -> bytes | None:
        """With CURVE, the message's data, if its identity belongs to the key it came with
        (curve.identity); else None: dropped, and said at most every few seconds."""
        sock = self.sock
        if not sock.getsockopt(_RCVMORE):
            return b""
        frame = sock.recv(_NOBLOCK, copy=False)
        if sock.getsockopt(_RCVMORE):           # not one of ours: drop extra frames
            while sock.getsockopt(_RCVMORE):
                sock.recv(_NOBLOCK)
            return b""
        if curve.matches(peer, frame.get("User-Id")):
            return frame.bytes
        now = time.monotonic()
        if now - self._mismatch_logged >= curve.REFUSAL_LOG_S:
            self._mismatch_logged = now
            log.warning("dropped a message from %s: its identity is not its key's", peer.hex())
        return None

    # -- replies -------------------------------------------------------------------------
    def _commit(self, messages: list, now: float) -> None:
        """End the journal's turn (its records written), then send the turn's replies, or
        hold them until the journal says the turn is durable."""
        core, journal = self.core, self.journal
        core.end_turn(now)
        journal.maintain(core.live)
        ticket = journal.end_turn(now, core.live)
        if not journal.hold_replies:
            self._send(messages)
            return
        if messages:
            self.held.append((ticket, messages))
            if ticket > journal.durable:
                journal.wait_for(ticket)
        durable = journal.durable
        while self.held and self.held[0][0] <= durable:
            self._send(self.held.popleft()[1])

    def _shutdown_journal(self) -> None:
        """Stopping: which jobs clients hold (the journal's JOB_HELD), so the next broker
        keeps them for them, and everything made durable before the held replies leave
        (a journal that could not make them durable: they are dropped, never sent)."""
        journal = self.journal
        if journal.failed is None:
            self.core.log_holdings()
            self.core.end_turn(time.monotonic())
        journal.close(time.monotonic(), self.core.live)
        while self.held and self.held[0][0] <= journal.durable and journal.failed is None:
            self._send(self.held.popleft()[1])
        self.held.clear()

    def _on_journal(self) -> None:
        """The journal's durable ticket moved (held replies may leave), or it failed."""
        if self.journal.failed is not None:
            self._journal_failed(*self.journal.failed)
        elif not self._busy and not self.closed:
            self._turn()

    def _journal_failed(self, code: int, why: str) -> None:
        """The journal can make nothing durable any more (another broker writes it, or it
        was out of reach for too long): what is held was never acknowledged and is
        dropped, nothing more is answered, every front is told to close its clients
        (Fenced), and the process stops with `code`."""
        if self.exit_code is not None or self.closed:
            return
        log.error("%s", why)
        self.exit_code = code
        self.held.clear()
        fenced = [(front.peer, Fenced(front.front_id, self.core.broker_id))
                  for front in self.core.fronts.values()]
        self._send(fenced)
        self._inbox.clear()
        self._finish()

    def _send(self, messages) -> None:
        local, sock = self.local, self.sock
        for peer, msg in messages:
            link = local.get(peer)
            if link is not None:
                link.deliver(msg)
                continue
            if sock is None:
                continue
            try:                        # first: a message that cannot be encoded must not
                data = encode(msg, self.old_peers.get(peer, SCHEMA_VERSION))
            except Exception:           # leave half a multipart message on the socket
                log.exception("cannot encode a message for %s: dropped", peer.hex())
                continue
            if data is None:            # (a message its version does not have)
                continue
            self._sock_used = True
            try:
                sock.send(peer, _NOBLOCK | _SNDMORE)
                sock.send(data, _NOBLOCK)
            except self._zmq.ZMQError as exc:
                if exc.errno != self._zmq.EHOSTUNREACH:
                    raise
                front = self.core.fronts.get(peer)
                if front is not None:
                    # with no sessions left it has said goodbye (a pool that stopped)
                    (log.warning if front.sessions else log.info)(
                        "front %016x unreachable: closing its sessions", front.front_id)
                    self.core.drop_front(front, time.monotonic())


def process_sysinfo() -> SysInfo:
    """This process's facts for beanstalk's `stats` (the core reads no clock or OS)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    u = os.uname()
    return SysInfo(os.getpid(), ru.ru_utime, ru.ru_stime, u.nodename, u.version, u.machine)


@contextlib.contextmanager
def no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def open_journal(opts, config: Config):
    """The journal for --binlog's directory or --journal's stream (wal/stream.py's
    Options), replayed: (the journal, Restored); without one, (None, None): the core
    makes its null journal."""
    if opts is None:
        return None, None
    from .wal.binlog import Binlog, BinlogError, Options as BinlogOptions
    if not isinstance(opts, BinlogOptions):     # (wal/stream.py's: NATS loads only then)
        return open_stream_journal(opts, config)
    started = time.monotonic()
    journal = Binlog(opts)
    try:
        restored = journal.restore(config.max_job_size)
    except OSError as exc:      # disk full or unreadable at start: not a bind problem
        raise BinlogError(f"{opts.path}: {exc}") from exc
    log.info("binlog %s: %d jobs and %d tasks recovered in %.2f s", opts.path,
             len(restored.jobs), len(restored.tasks), time.monotonic() - started)
    return journal, restored


def open_stream_journal(opts, config: Config):
    """The journal on NATS JetStream (wal/jetstream.py: nats loads only now), its stream
    checked and replayed: raises stream.JournalError with the exit code to use."""
    from .wal.jetstream import JetStreamJournal
    started = time.monotonic()
    journal = JetStreamJournal(opts)
    restored = journal.restore(config.max_job_size)
    log.info("journal %s: %d jobs and %d tasks recovered in %.2f s", opts.stream,
             len(restored.jobs), len(restored.tasks), time.monotonic() - started)
    return journal, restored
