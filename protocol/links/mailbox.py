"""In-process links: a front beside the broker reaches it through a mailbox, not ZeroMQ.

A front never knows where its broker runs.  It is given a broker address and calls
`open_link(address, ...)` (protocol/links/__init__.py): `tcp://…` or `ipc://…` give a `BrokerLink` (zeromq.py,
a ZeroMQ DEALER socket), `local:NAME` gives a `LocalLink` to the broker actor that registered
NAME in this process (`register_mailbox`), in the way ZeroMQ's `inproc://` names a
socket in the same context.  Both links take the same calls from the front (`submit`,
`flush_now`, `start`, `close`, …) and call the same `LinkOwner` methods back with the
same schema messages, so one front implementation serves both placements.

A LocalLink passes the typed messages themselves: nothing is encoded or copied.  While
a front handles one read from a client (`gather()` … `read_done()`) the ops it submits
are collected.  The first read of a loop turn hands them to the broker as one Batch at
`read_done`; the broker handles it and delivers the replies back through `deliver()`
before `read_done` returns, so an idle client's command and its reply take one
event-loop turn.  Reads after it in the same turn (many connections ready at once) go as
one Batch at the end of the turn, so the broker's per-turn work is shared.  Ops
submitted at other times (a connection opening, commands parsed after a reply unblocked
them) leave at the end of the loop turn (`call_soon`), or right after the delivery that
caused them.

The broker shares the front's loop, so there is no silence to watch: no heartbeats,
and the link is never LOST.  Its round trip (owner.LinkStats) is the broker's handling
of a batch, timed once per PROBE_S.  It can still be fenced (the broker dropped this front for
a reason of its own): the owner closes its clients and the link says Hello again.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Protocol

from ..schema import SILENT_OPS, Batch, Fenced, Hello, Replies, Settings, Welcome
from .owner import CONNECTING, PROBE_S, READY, LinkStats

LOCAL_PREFIX = "local:"

_mailboxes: dict[str, "Mailbox"] = {}


class Mailbox(Protocol):
    """What a broker actor offers the fronts in its process (broker/actor.py)."""
    def attach(self, peer: bytes, link: "LocalLink") -> None: ...
    def detach(self, peer: bytes) -> None: ...
    def post(self, peer: bytes, msg) -> None: ...


def register_mailbox(name: str, mailbox: Mailbox) -> str:
    address = LOCAL_PREFIX + name
    if address in _mailboxes:
        raise ValueError(f"{address} is already taken in this process")
    _mailboxes[address] = mailbox
    return address


def unregister_mailbox(address: str) -> None:
    _mailboxes.pop(address, None)


def local_link(address: str, kind: str, owner) -> "LocalLink":
    """The link to the broker actor that registered `address` (`local:NAME`) here."""
    try:
        return LocalLink(_mailboxes[address], kind, owner)
    except KeyError:
        raise ValueError(f"no broker at {address} in this process") from None


class LocalLink:
    fail_closed = False     # the broker is never out of reach

    def __init__(self, mailbox: Mailbox, kind: str, owner) -> None:
        self.mailbox = mailbox
        self.kind = kind
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        self.state = CONNECTING
        self.broker_id = 0
        self.state_id = 0
        self.settings = Settings()
        self.batch: list[tuple] = []
        self.held: list[tuple] = []         # submitted before Welcome (start() not called)
        self.stats = LinkStats()
        self._prober: asyncio.TimerHandle | None = None
        self._gathering = False
        self._flush_scheduled = False
        self._sent_early = False        # read_done sent this turn's first batch
        self._new_incarnation()

    def _new_incarnation(self) -> None:
        self.front_id = random.getrandbits(64) or 1
        self.peer = self.front_id.to_bytes(8, "big")

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._prober is None:
            self._arm_probe()
        self.mailbox.attach(self.peer, self)
        self.mailbox.post(self.peer, Hello(self.front_id, self.kind, os.getpid(), self.state_id,
                                           self.owner.session_states()))

    def close(self, linger_ms: int = 0) -> None:
        if self._prober is not None:
            self._prober.cancel()
            self._prober = None
        self.flush_now()
        self.state = CONNECTING
        self.mailbox.detach(self.peer)

    # -- ops -----------------------------------------------------------------------------
    def submit(self, op: tuple) -> None:
        if self.state is not READY:
            self.held.append(op)
            if op[0] not in SILENT_OPS:
                self.stats.held += 1
            return
        self.batch.append(op)
        if not (self._gathering or self._flush_scheduled):
            self._flush_scheduled = True
            self.loop.call_soon(self._scheduled_flush)

    def gather(self) -> None:
        """The front starts handling one read: its ops go together at read_done()."""
        self._gathering = True

    def read_done(self) -> None:
        """The first read of a loop turn goes to the broker at once; the reads after it in
        the same turn (many connections ready together) go as one batch at its end, so
        the broker's per-turn work is paid once for them all."""
        self._gathering = False
        if self._sent_early:
            if self.batch and not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._scheduled_flush)
            return
        if self.batch:
            self._sent_early = True
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._scheduled_flush)
            self.flush_now()

    def flush_now(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            stats = self.stats
            if stats.armed:
                stats.armed = False
                started = time.monotonic()
                self.mailbox.post(self.peer, Batch(batch))
                stats.round_trip.observe(time.monotonic() - started)
            else:
                self.mailbox.post(self.peer, Batch(batch))

    def take_unsent(self) -> list[tuple]:
        """The ops held or gathered and not sent, in order, taken away (`relink`)."""
        unsent = self.held + self.batch
        self.held, self.batch = [], []
        return unsent

    def _arm_probe(self) -> None:
        self.stats.armed = True
        self._prober = self.loop.call_later(PROBE_S, self._arm_probe)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = self._sent_early = False
        if self.batch:          # (mostly empty: a call saved, one-at-a-time clients' way)
            self.flush_now()

    # -- broker messages (called by the actor, on our loop) ------------------------------
    def deliver(self, msg) -> None:
        if type(msg) is Replies:
            self.owner.on_replies(msg.items)
            if self.batch:          # commands the replies unblocked go in the same turn
                self.flush_now()
        elif isinstance(msg, Welcome):
            self._welcome(msg)
        elif isinstance(msg, Settings):
            self.settings = msg         # the broker read its config again
        elif isinstance(msg, Fenced) and msg.front_id == self.front_id:
            self.batch, self.held = [], []
            self.state = CONNECTING
            self.owner.on_fenced()
            self.mailbox.detach(self.peer)
            self._new_incarnation()
            self.state_id = 0
            self.start()
        # Heartbeat: never sent to us; any other Fenced is not ours

    def _welcome(self, w: Welcome) -> None:
        self.broker_id = w.broker_id
        self.settings = w.settings
        self.state_id = w.state_id
        self.state = READY
        self.owner.on_welcome(w)
        held, self.held = self.held, []
        for op in held:
            self.submit(op)
