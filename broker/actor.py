"""The broker actor: one ZeroMQ ROUTER socket around the pure core (core.py).

The loop, in the shape of zguide's mdbroker: sleep in zmq_poll until a message or the
core's next deadline (monotonic clock); take every message that is waiting (up to a
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
import signal
import socket
import time

import zmq

from ..protocol.schema import HEARTBEAT_S, SchemaError, decode, encode
from .core import Broker, Config
from .stats import process_sysinfo

log = logging.getLogger("zstalk.broker")
_MAX_MESSAGES_PER_TURN = 256


class BrokerActor:
    def __init__(self, bind: str, config: Config, ctx: zmq.Context | None = None) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        for opt, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.ROUTER_HANDOVER, 1),
                           (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0)):
            self.sock.setsockopt(opt, value)
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.core = Broker(config, time.monotonic(), process_sysinfo)
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
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(rsock, zmq.POLLIN)
        next_heartbeat = time.monotonic()
        log.info("broker %016x listening on %s", self.core.broker_id, self.endpoint)
        while self.running:
            now = time.monotonic()
            wake = min(d for d in (self.core.next_deadline(), next_heartbeat) if d is not None)
            timeout_ms = max(0, int((wake - now) * 1000) + 1)
            for sock, _ in poller.poll(timeout_ms):
                if sock is self.sock:
                    self._receive()
                else:
                    self._take_signals(rsock)
            now = time.monotonic()
            self.core.expire(now)
            if now >= next_heartbeat:
                self._send(self.core.heartbeats())
                next_heartbeat = now + HEARTBEAT_S
            self._send(self.core.flush())
        self.sock.close(linger=0)
        log.info("broker stopped")

    def _receive(self) -> None:
        for _ in range(_MAX_MESSAGES_PER_TURN):
            try:
                peer, data = self.sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            except ValueError:      # not two frames: not one of ours
                continue
            try:
                msg = decode(data)
            except SchemaError as exc:
                log.warning("ignoring message from %s: %s", peer.hex(), exc)
                continue
            self.core.handle(peer, msg, time.monotonic())

    def _send(self, messages) -> None:
        for peer, msg in messages:
            try:
                self.sock.send_multipart((peer, encode(msg)), zmq.NOBLOCK)
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
