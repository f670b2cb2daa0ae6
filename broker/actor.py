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
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import time

import zmq

from ..protocol.schema import HEARTBEAT_S, SchemaError, decode, encode
from .core import Broker, Config
from .stats import process_sysinfo

log = logging.getLogger("zstalk.broker")
_MAX_MESSAGES_PER_TURN = 4    # then reply: fronts overlap their work with ours
# plain ints: pyzmq's enum arithmetic costs microseconds on the hot path
_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)


class BrokerActor:
    def __init__(self, bind: str, config: Config, ctx: zmq.Context | None = None) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        for opt, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.ROUTER_HANDOVER, 1),
                           (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0)):
            self.sock.setsockopt(opt, value)
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        now = time.monotonic()
        self.core = Broker(config, now, process_sysinfo, wall_offset=time.time() - now)
        self.running = True
        self._signals: list[int] = []

    # -- signals -----------------------------------------------------------------------
    def install_signals(self) -> socket.socket:
        """Route SIGTERM/SIGINT/SIGUSR1 through a socketpair the poller watches."""
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, lambda signum, frame: self._signals.append(signum))
        self._wsock = wsock
        return rsock

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
    def run(self) -> None:
        rsock = self.install_signals()
        poller = select.epoll()
        poller.register(self.sock.getsockopt(zmq.FD), select.EPOLLIN)
        poller.register(rsock.fileno(), select.EPOLLIN)
        signal_fd = rsock.fileno()
        next_heartbeat = time.monotonic()
        log.info("broker %016x listening on %s", self.core.broker_id, self.endpoint)
        while self.running:
            now = time.monotonic()
            # ZeroMQ's FD only signals edges: sleep only when ZMQ_EVENTS says nothing waits
            if not self.sock.getsockopt(_EVENTS) & _POLLIN:
                deadline = self.core.next_deadline()
                wake = next_heartbeat if deadline is None else min(deadline, next_heartbeat)
                for fd, _ in poller.poll(max(0.0, wake - now)):
                    if fd == signal_fd:
                        self._take_signals(rsock)
            self._receive()
            now = time.monotonic()
            self.core.expire(now)
            if now >= next_heartbeat:
                self._send(self.core.heartbeats())
                next_heartbeat = now + HEARTBEAT_S
            self._send(self.core.flush())
        poller.close()
        self.sock.close(linger=0)
        log.info("broker stopped")

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
                    log.warning("front %016x unreachable: closing its sessions", front.front_id)
                    self.core.drop_front(front, time.monotonic())


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
