# Traffic for kill campaigns (tests/ha/test_kill_campaigns.py): threads of this process that
# put, reserve and delete, and compete for a counter, and the books that say afterwards
# whether anything acknowledged was lost, came back, or was held twice at once.
#
# Holding is judged from the client's side, soundly: a holder surely held a thing from the
# moment it *read* the grant (RESERVED, an Acquire's OK) to the moment it *sent* the
# release (delete, Release), or, if its connection broke, to the last reply it read on it
# (the server lets go no sooner than the connection closes).  Those intervals lie inside
# the server's own, so two holders' intervals of one thing that overlap were two holders at
# once, whatever the timing of the machine; one that merely touches is not counted.
#
#   Ledger      acknowledged puts and deletes (check_durable's fields), and what went wrong
#   Holds       who surely held what, when; overlaps()
#   Producer    puts one job at a time, each acknowledged before the next; its connection
#               broken, it goes on on the survivor and notes its first acknowledgement there
#   Worker      reserve-with-timeout, a short hold, delete; the keeper holds its first job
#               until told (across a kill and the grace after it)
#   CounterUser Acquire (max 1), a short hold, Release; connection lost: the survivor's port
from __future__ import annotations

import os
import random
import threading
import time

from servers import Address, CounterClient, RawClient
from zstalk.protocol.codecs.yrmcds import Status

REPLY_S = 40.0          # a front holds commands 15 s across a failover; NATS elects for up to 9
RETRY_S = 0.02
COUNTER = b"campaign"   # one counter of at most 1: every grant is exclusive


class Ledger:
    """What the servers acknowledged, over all rounds (check_durable reads the first three)."""

    def __init__(self) -> None:
        self.acked_puts: dict[int, bytes] = {}
        self.acked_deletes: set[int] = set()
        self.delete_sent: set[int] = set()      # acknowledged or not: the job may be gone
        self.came_back: list[int] = []          # reserved after a DELETED
        self.lost_holds: list[tuple[str, int]] = []    # a holder's delete NOT_FOUND
        self.broken: list[str] = []             # connections to a survivor that broke
        self.errors: list[str] = []             # replies no client should get


class Holds:
    """Who surely held what, when (above): [got, let go) per holder and thing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple, float] = {}     # (thing, holder) -> since
        self.spans: list[tuple[object, str, float, float]] = []

    def got(self, thing, holder: str, at: float) -> None:
        with self._lock:
            self._open[(thing, holder)] = at

    def let_go(self, thing, holder: str, at: float) -> None:
        with self._lock:
            since = self._open.pop((thing, holder), None)
            if since is not None:
                self.spans.append((thing, holder, since, at))

    def lost(self, holder: str, last_reply: float) -> None:
        """`holder`'s connection broke: what it held, it surely held until its last reply."""
        with self._lock:
            for thing, who in [k for k in self._open if k[1] == holder]:
                self.spans.append((thing, who, self._open.pop((thing, who)), last_reply))

    def close(self, at: float) -> None:
        for thing, holder in list(self._open):
            self.let_go(thing, holder, at)

    def overlaps(self) -> list[tuple]:
        """Pairs of spans of one thing, by two holders, that overlap."""
        by_thing: dict = {}
        for span in self.spans:
            by_thing.setdefault(span[0], []).append(span)
        found = []
        for spans in by_thing.values():
            spans.sort(key=lambda s: s[2])
            for i, (_, holder, _, end) in enumerate(spans):
                for other in spans[i + 1:]:
                    if other[2] >= end:
                        break
                    if other[1] != holder:
                        found.append((spans[i], other))
        return found

    def count(self, holder: str) -> int:
        return sum(1 for s in self.spans if s[1] == holder)


class Actor(threading.Thread):
    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop = stop


class Producer(Actor):
    """Puts on `first` until its connection breaks, then on `then` (the survivor)."""

    def __init__(self, name: str, stop, ledger: Ledger, first: Address, then: Address) -> None:
        super().__init__(name, stop)
        self.ledger, self.first, self.then = ledger, first, then
        self.acked = self.internal = self.unanswered = 0
        self.on_survivor = threading.Event()
        self.first_on_survivor: float | None = None

    def run(self) -> None:
        address, n = self.first, 0
        while not self.stop.is_set():
            try:
                c = RawClient(address, REPLY_S)
            except OSError:
                address = self.then
                time.sleep(RETRY_S)
                continue
            try:
                while not self.stop.is_set():
                    n += 1
                    self._put(c, address, b"%s-%06d-%s" % (self.name.encode(), n,
                                                             os.urandom(4).hex().encode()))
            except (OSError, TimeoutError, ConnectionError):
                self.unanswered += 1
            finally:
                c.close()
            address = self.then

    def _put(self, c: RawClient, address: Address, body: bytes) -> None:
        c.send(b"put 0 0 120 %d\r\n%s\r\n" % (len(body), body))
        reply = c.read_reply()
        if not reply:
            raise ConnectionError("closed")
        if reply.startswith(b"INSERTED "):
            self.ledger.acked_puts[int(reply.split()[1])] = body
            self.acked += 1
            if address == self.then and self.first_on_survivor is None:
                self.first_on_survivor = time.monotonic()
                self.on_survivor.set()
        elif reply == b"INTERNAL_ERROR\r\n":    # sent to the lost leader: may have been done
            self.internal += 1
        else:
            self.ledger.errors.append(f"{self.name}: put answered {reply!r}")


class Worker(Actor):
    """Reserves, holds a moment, deletes, on one connection to `address`.  A keeper holds
    its first job until `keep` is set."""

    def __init__(self, name: str, stop, ledger: Ledger, holds: Holds, address: Address,
                 keep: threading.Event | None = None) -> None:
        super().__init__(name, stop)
        self.ledger, self.holds, self.address, self.keep = ledger, holds, address, keep
        self.holding = threading.Event()       # the keeper holds its job
        self.kept: tuple[int, bytes] | None = None      # (job, its delete's reply)
        self.reserved = self.internal = 0
        self.last_reply = time.monotonic()

    def run(self) -> None:
        try:
            with RawClient(self.address, REPLY_S) as c:
                while not self.stop.is_set():
                    self._turn(c)
        except (OSError, TimeoutError, ConnectionError) as e:
            self.ledger.broken.append(f"{self.name}: {e!r}")
            self.holds.lost(self.name, self.last_reply)

    def _ask(self, c: RawClient, command: bytes) -> bytes:
        c.send(command)
        reply = c.read_reply()
        if not reply:
            raise ConnectionError("closed")
        self.last_reply = time.monotonic()
        return reply

    def _turn(self, c: RawClient) -> None:
        reply = self._ask(c, b"reserve-with-timeout 1\r\n")
        if reply.startswith(b"RESERVED "):
            job = int(reply.split()[1])
            self.holds.got(("job", job), self.name, self.last_reply)
            self.reserved += 1
            if job in self.ledger.acked_deletes:
                self.ledger.came_back.append(job)
            if self.keep is not None:
                self.holding.set()
                self.keep.wait(REPLY_S * 2)     # (bounded: the round sets it)
                self.keep = None
                self.kept = (job, self._delete_job(c, job))
            else:
                time.sleep(random.uniform(0, 0.02))
                self._delete_job(c, job)
        elif reply == b"INTERNAL_ERROR\r\n":    # in flight at the loss: maybe reserved,
            self.internal += 1                  # unknown to us: the grace frees it
        elif reply != b"TIMED_OUT\r\n":
            self.ledger.errors.append(f"{self.name}: reserve answered {reply!r}")

    def _delete_job(self, c: RawClient, job: int) -> bytes:
        self.holds.let_go(("job", job), self.name, time.monotonic())
        self.ledger.delete_sent.add(job)
        for attempt in range(50):
            reply = self._ask(c, b"delete %d\r\n" % job)
            if reply == b"DELETED\r\n":
                self.ledger.acked_deletes.add(job)
            elif reply == b"NOT_FOUND\r\n":
                if attempt == 0:                # ours, and no TTR ran out: the hold was lost
                    self.ledger.lost_holds.append((self.name, job))
            elif reply == b"INTERNAL_ERROR\r\n":     # maybe done: ask again
                time.sleep(0.05)
                continue
            else:
                self.ledger.errors.append(f"{self.name}: delete {job} answered {reply!r}")
            return reply
        self.ledger.errors.append(f"{self.name}: delete {job} never answered but INTERNAL_ERROR")
        return b""


class CounterUser(Actor):
    """Acquire COUNTER (max 1) on `first`, hold a moment, Release; again.  Its connection
    lost, it goes on on `then`."""

    def __init__(self, name: str, stop, ledger: Ledger, holds: Holds, first: Address,
                 then: Address) -> None:
        super().__init__(name, stop)
        self.ledger, self.holds, self.first, self.then = ledger, holds, first, then
        self.grants = self.refused = 0
        self.last_reply = time.monotonic()

    def run(self) -> None:
        address = self.first
        while not self.stop.is_set():
            try:
                with CounterClient(address, REPLY_S) as c:
                    while not self.stop.is_set():
                        self._turn(c)
            except (OSError, TimeoutError, ConnectionError):
                self.holds.lost(self.name, self.last_reply)
                time.sleep(RETRY_S)
            address = self.then

    def _turn(self, c: CounterClient) -> None:
        reply = c.acquire(COUNTER, 1, 1)
        self.last_reply = time.monotonic()
        if reply.status == Status.RESOURCE_NOT_AVAILABLE:
            self.refused += 1
            time.sleep(random.uniform(0, 0.01))
            return
        if reply.status != Status.OK:
            self.ledger.errors.append(f"{self.name}: Acquire answered {reply.status:#x}")
            return
        self.grants += 1
        self.holds.got("counter", self.name, self.last_reply)
        time.sleep(random.uniform(0.005, 0.03))
        self.holds.let_go("counter", self.name, time.monotonic())
        reply = c.release(COUNTER, 1)
        self.last_reply = time.monotonic()
        if reply.status != Status.OK:           # 0x22: the hold was lost under us
            self.ledger.errors.append(f"{self.name}: Release answered {reply.status:#x}")
