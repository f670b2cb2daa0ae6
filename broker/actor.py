"""The broker actor: one ZeroMQ ROUTER socket around the pure core (core.py).

The loop, in the shape of zguide's mdbroker: sleep (epoll on the socket's FD, after
ZMQ_EVENTS says nothing is waiting) until a message or the core's next deadline
(monotonic clock); take every message that is waiting (up to a
cap, so timers are not starved), hand each to the core; fire due timers; send each
front the one Replies message the core gathered for it; heartbeat fronts every
HEARTBEAT_S.  Batching falls out of that shape: everything handled in one turn goes
back to a front as one message.

ROUTER_MANDATORY makes a send to a front that has gone raise EHOSTUNREACH instead of
dropping it; the core then treats that front as dead.  Signals arrive through a
wakeup fd registered in the poller, so SIGTERM ends the loop at once and SIGUSR1
(drain mode) takes effect without waiting for the next timer.

With a binlog (binlog.py) each turn writes the records the core appended before any
reply of that turn is sent, so a crash of this process loses nothing acknowledged.
fsync runs on the binlog's thread, which wakes the loop through a pipe in the poller;
under `fsync_ms == 0` the replies of every turn wait in `held` until an fsync covers
the write that preceded them (group commit).
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import collections
import contextlib
import gc
import time

import zmq

from ..protocol.schema import HEARTBEAT_S, SchemaError, decode, encode
from .binlog import Binlog, BinlogError, Options as BinlogOptions
from .core import Broker, Config
from .stats import process_sysinfo

log = logging.getLogger("zstalk.broker")
_MAX_MESSAGES_PER_TURN = 4    # then reply: fronts overlap their work with ours
# plain ints: pyzmq's enum arithmetic costs microseconds on the hot path
_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)


class BindError(Exception):
    """An endpoint the broker cannot bind (in use, bad address): exit 111."""


class BrokerActor:
    def __init__(self, bind: str, config: Config, ctx: zmq.Context | None = None,
                 binlog: BinlogOptions | None = None, also_bind: tuple[str, ...] = ()) -> None:
        # the binlog first: a locked or foreign directory fails before we take the endpoint
        with no_gc():       # a million recovered jobs: the collector would double the time
            self.wal, recovered = open_binlog(binlog, config)
            self.core = self._make_core(config, recovered)
        if recovered is not None:
            gc.freeze()     # and later full collections need not walk them again
        self.held: collections.deque = collections.deque()   # (write_seq, messages)
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        for opt, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.ROUTER_HANDOVER, 1),
                           (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0)):
            self.sock.setsockopt(opt, value)
        for endpoint in (bind, *also_bind):    # e.g. TCP for worker pools beside ipc://
            try:
                self.sock.bind(endpoint)
            except zmq.ZMQError as exc:
                self.sock.close(linger=0)
                raise BindError(f"{endpoint}: {os.strerror(exc.errno)}") from exc
            if endpoint == bind:
                self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.running = True
        self._signals: list[int] = []
        # wakes the loop for a signal or stop() from another thread
        self._rsock, self._wsock = socket.socketpair()
        for sock in (self._rsock, self._wsock):
            sock.setblocking(False)

    def _make_core(self, config: Config, recovered) -> Broker:
        now = time.monotonic()
        return Broker(config, now, process_sysinfo, wall_offset=time.time() - now,
                      wal=self.wal, recovered=recovered)

    # -- signals -----------------------------------------------------------------------
    def install_signals(self) -> None:
        """Route SIGTERM/SIGINT/SIGUSR1 through the socketpair the poller watches."""
        signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, lambda signum, frame: self._signals.append(signum))

    def stop(self) -> None:
        """End run() from any thread (in-process use: zstalk.workers.testing)."""
        self.running = False
        try:
            self._wsock.send(b"s")
        except OSError:
            pass

    def _take_signals(self, rsock: socket.socket) -> None:
        try:
            rsock.recv(512)
        except BlockingIOError:
            pass
        while self._signals:
            signum = self._signals.pop(0)
            if signum == signal.SIGUSR1:
                log.info("SIGUSR1: drain mode on, put now answers DRAINING")
                self.core.draining = True
            else:
                self.running = False

    # -- loop --------------------------------------------------------------------------
    def run(self, signals: bool = True) -> None:
        """The loop; `signals=False` for a broker running in a thread (stop() ends it)."""
        if signals:
            self.install_signals()
        rsock = self._rsock
        poller = select.epoll()
        poller.register(self.sock.getsockopt(zmq.FD), select.EPOLLIN)
        poller.register(rsock.fileno(), select.EPOLLIN)
        signal_fd = rsock.fileno()
        sync_fd = self.wal.notify_fd if self.wal else None
        if sync_fd is not None:
            poller.register(sync_fd, select.EPOLLIN)
        next_heartbeat = time.monotonic()
        log.info("broker %016x listening on %s", self.core.broker_id, self.endpoint)
        while self.running:
            now = time.monotonic()
            # ZeroMQ's FD only signals edges: sleep only when ZMQ_EVENTS says nothing waits
            if not self.sock.getsockopt(_EVENTS) & _POLLIN:
                wake = min(d for d in (self.core.next_deadline(), next_heartbeat,
                                       self.wal and self.wal.sync_due()) if d is not None)
                for fd, _ in poller.poll(max(0.0, wake - now)):
                    if fd == signal_fd:
                        self._take_signals(rsock)
                    elif fd == sync_fd:
                        self.wal.on_synced(time.monotonic())
            self._receive()
            now = time.monotonic()
            self.core.expire(now)
            if now >= next_heartbeat:
                self._send(self.core.heartbeats())
                next_heartbeat = now + HEARTBEAT_S
            self._commit(self.core.flush(), now)
        self._shutdown_binlog()
        poller.close()
        self.sock.close(linger=0)
        if signals:
            signal.set_wakeup_fd(-1)
        self._rsock.close()
        self._wsock.close()
        log.info("broker stopped")

    def _commit(self, messages: list, now: float) -> None:
        """Write this turn's records, then send its replies, or hold them for the fsync."""
        wal = self.wal
        if wal is None:
            self._send(messages)
            return
        wal.maintain(self.core.queue.jobs)
        wal.write(self.core.queue.jobs, self.core.next_id)
        wal.after_write(now)
        if wal.opts.fsync_ms != 0:
            self._send(messages)
            return
        if messages:
            self.held.append((wal.write_seq, messages))
        while self.held and self.held[0][0] <= wal.synced:
            self._send(self.held.popleft()[1])

    def _shutdown_binlog(self) -> None:
        """SIGTERM: everything written reaches the disk before we exit."""
        if self.wal is None:
            return
        self.wal.write(self.core.queue.jobs, self.core.next_id)
        if self.wal.syncer is not None:
            self.wal.syncer.stop()      # no fsync of ours may run beside the last one
            self.wal.syncer = None
        self.wal.sync_all()
        while self.held:
            self._send(self.held.popleft()[1])
        self.wal.close()

    def _receive(self) -> None:
        sock, handle = self.sock, self.core.handle
        for _ in range(_MAX_MESSAGES_PER_TURN):
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                return
            peer = sock.recv(_NOBLOCK)
            data = sock.recv(_NOBLOCK) if sock.getsockopt(_RCVMORE) else b""
            while sock.getsockopt(_RCVMORE):      # not one of ours: drop extra frames
                sock.recv(_NOBLOCK)
                data = b""
            try:
                msg = decode(data)
            except SchemaError as exc:
                log.warning("ignoring message from %s: %s", peer.hex(), exc)
                continue
            handle(peer, msg, time.monotonic())

    def _send(self, messages) -> None:
        sock = self.sock
        for peer, msg in messages:
            try:
                sock.send(peer, _NOBLOCK | _SNDMORE)
                sock.send(encode(msg), _NOBLOCK)
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                front = self.core.fronts.get(peer)
                if front is not None:
                    # with no sessions left it has said goodbye (a pool that stopped)
                    (log.warning if front.sessions else log.info)(
                        "front %016x unreachable: closing its sessions", front.front_id)
                    self.core.drop_front(front, time.monotonic())


@contextlib.contextmanager
def no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def open_binlog(opts: BinlogOptions | None, config: Config):
    """Open and replay the binlog directory: (Binlog, Replayed) or (None, None)."""
    if opts is None:
        return None, None
    started = time.monotonic()
    wal = Binlog(opts)
    try:
        recovered = wal.open(config.max_job_size)
    except OSError as exc:      # disk full or unreadable at start: not a bind problem
        raise BinlogError(f"{opts.path}: {exc}") from exc
    log.info("binlog %s: %d jobs recovered in %.2f s", opts.path, len(recovered.jobs),
             time.monotonic() - started)
    return wal, recovered


def run_broker(bind: str, config: Config) -> None:
    actor = BrokerActor(bind, config)
    try:
        actor.run()
    finally:
        if bind.startswith("ipc://"):
            try:
                os.unlink(bind[len("ipc://"):])
            except OSError:
                pass
