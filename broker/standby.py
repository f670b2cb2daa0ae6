"""What a standby answers its peers on the broker's endpoint (issue 43; docs/ha.md).

An instance of `zstalk serve --journal` or `zstalk broker --journal` that does not lead
binds its endpoint anyway, so that fronts, dispatchers and worker pools given every
instance (`--broker tcp://a:11400,tcp://b:11400`) learn where the leader is without a
NATS client of their own.  The `Door` answers:

  * a Hello with NotLeader(the leader's --advertise address, its epoch), as this
    instance's lease shows it (run/leading.py `pointer`), or NotLeader("", epoch) while
    it knows none (no lease yet, its renewals stopped, or this instance is taking over):
    the link asks again shortly (protocol/links/zeromq.py);
  * nothing to a peer of schema version 5 or older, which has no NotLeader: its link says
    Hello again until this instance leads and welcomes it (logged once per peer);
  * a Batch or a Heartbeat (a peer of the broker that ran here before) with Fenced
    from the door's own incarnation, so its link takes that broker as gone at once and
    asks again: nothing it sent ran here.

`answer` is the pure part.  The door runs on a thread of its own with a poller, as a
`zstalk broker` standby has no event loop while it waits.  At takeover the thread stops
and the broker actor adopts the very socket (`hand_over`, actor.py `adopt`): peers
connected meanwhile stay connected, and a Hello that came meanwhile is read and welcomed
by the actor.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

from ..protocol.network import curve
from ..protocol.schema import (Batch, Fenced, Heartbeat, Hello, NotLeader, SchemaError,
                               decode_peer, encode)
from ..protocol.ratelog import RateLog
from .router import Router, bind_router, open_router

log = logging.getLogger("zstalk.broker")
#: the thread looks whether it should stop this often
POLL_MS = 50
#: versions that know NotLeader (messages.py)
KNOWS_NOT_LEADER = 6


def answer(peer: bytes, version: int, msg, pointer: tuple[str, int],
           door_id: int) -> NotLeader | Fenced | None:
    """What the door says to `msg` from `peer` (module comment); None: nothing."""
    if isinstance(msg, Hello):
        return NotLeader(*pointer) if version >= KNOWS_NOT_LEADER else None
    if isinstance(msg, Heartbeat):
        return Fenced(msg.sender_id, door_id)
    if isinstance(msg, Batch) and len(peer) >= 8:
        return Fenced(int.from_bytes(peer[:8], "big"), door_id)
    return None


class Door:
    """A standby's ROUTER on `endpoints`, answering on a thread until `hand_over()`.
    `pointer()` gives (where the leader is reached or "", its epoch)."""

    def __init__(self, endpoints: list[str], pointer: Callable[[], tuple[str, int]],
                 ctx=None, keys=curve.FROM_ENV) -> None:
        import zmq
        self.zmq = zmq
        self.keys = curve.server_keys() if keys is curve.FROM_ENV else keys
        self.ctx = ctx or zmq.Context.instance()
        self.pointer = pointer
        self.door_id = random.getrandbits(64) or 1
        self.router = open_router(self.ctx, self.keys)
        try:
            self.endpoints = [bind_router(self.router.sock, e, self.keys) for e in endpoints]
        except BaseException:
            self._close_router()
            raise
        self.said = RateLog(log, 3600.0, "said Hello")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zstalk-standby-door",
                                        daemon=True)

    def start(self) -> "Door":
        self._thread.start()
        log.info("standing by on %s: peers are told where the leader is",
                 ", ".join(self.endpoints))
        return self

    def hand_over(self) -> tuple[Router, list[str]]:
        """Stop answering; the socket and what was bound, for the broker actor."""
        self._halt()
        return self.router, self.endpoints

    def close(self) -> None:
        """A standby that stops without leading."""
        self._halt()
        self._close_router()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _close_router(self) -> None:
        self.router.sock.close(linger=0)
        if self.router.auth is not None:
            self.router.auth.stop()

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        sock = self.router.sock
        poller = self.zmq.Poller()
        poller.register(sock, self.zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(POLL_MS):
                self._receive(sock)

    def _receive(self, sock) -> None:
        zmq = self.zmq
        while not self._stop.is_set():
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 2:
                continue            # (not one of ours)
            peer, data = frames[0].bytes, frames[1]
            if self.keys is not None and not curve.matches(peer, data.get("User-Id")):
                continue            # (its identity is not its key's: the actor says so)
            try:
                version, msg = decode_peer(data.bytes)
            except SchemaError:
                continue
            reply = answer(peer, version, msg, self.pointer(), self.door_id)
            if reply is None and isinstance(msg, Hello):
                self.said.say(peer, time.monotonic(), "peer %s speaks schema version %d: a "
                              "standby cannot tell it where the leader is; it is welcomed "
                              "once this instance leads (update it)", peer.hex(), version)
            data = encode(reply, version) if reply is not None else None
            if data is not None:
                try:
                    sock.send_multipart([peer, data], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass            # (gone meanwhile: ROUTER_MANDATORY)
