"""Kill campaigns (issue 43, "in CI: 5 kills of each kind"), with real processes: two
instances of `zstalk serve --journal` (each with a worker endpoint and a counter port) on a
3-node nats-server cluster on loopback (tests/support/nats_cluster.py).

Each kind is 5 rounds on one journal.  In a round, with the leader L and the standby S:

  * 2 producers put on L, one job at a time, each acknowledged before the next; when L's
    connection breaks they go on on S;
  * 3 workers reserve and delete through S (whose fronts serve through L); one of them,
    the keeper, reserves a job before the kill and holds it until the grace after the
    takeover is over, then deletes it;
  * two clients compete for one counter of at most 1 (yrmcds Acquire and Release): one
    through L's counter port (its connection dies with L; it then goes to S's), one
    through S's;
  * after 1 s or more of that, kill -9 of L ("broker"), or of L and the NATS node leading
    the journal's stream, back to back ("nats"); S must lead, and the round's line gives
    the seconds from the kill to the first acknowledged put on S.  L is started again
    (the same command and ports) and must stand by; the NATS node too, and every replica
    of the journal's and the lease's streams must be current before the next round, which
    kills S, the new leader.

Over all rounds (tests/support/campaign.py keeps the books):

  * 0 acknowledged jobs lost and none acknowledged DELETED back (check_durable on the last
    leader; a worker that reserves a deleted job says so too);
  * no job held by two workers at once: the spans each worker surely held each job
    (RESERVED read .. delete sent) never overlap.  docs/ha.md, "The failure model": a job
    reserved at the crash is kept for its holder's front to re-register it (5 s), and a
    client of a standby's front "keeps the job it had reserved"; with a TTR of 120 s no
    job's time runs out in a round, so nobody else may get a held job at any time, before
    the grace or after it, and the holder's delete is answered DELETED, never NOT_FOUND;
  * no counter granted twice: the spans each client surely held it (Acquire OK read ..
    Release sent, or the last reply before its connection died) never overlap ("Acquire
    answers 0x21 for a few seconds while fronts return the counters they hold"); and in
    every round someone gets it after the kill (a hold that died with the leader went);
  * no connection to S breaks, and nothing is answered but what the protocol allows there
    (INTERNAL_ERROR only for a command in flight at the loss).
Times are asserted with room for a loaded 2-core machine; the figures are printed (-s).
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from campaign import CounterUser, Holds, Ledger, Producer, Worker
from nats_cluster import Cluster, cluster  # noqa: F401 (a fixture)
from servers import LOOPBACK, free_port, self_check, wait_for
from test_binlog_end_to_end import check_durable
from test_failover import answers, stats
from test_follow import Followed, leader_and_follower

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own journal")
ROUNDS = 5
GRACE_S = 5.0           # docs/ha.md: a job reserved at the crash is kept 5 s for its holder
WARM_S = 1.0            # traffic before each kill, at the least
FIRST_PUT_S = {"broker": 15.0, "nats": 35.0}    # the longest a survivor may take (loaded)
SETTLE_S = 60.0         # a restarted instance standing by, a NATS node caught up


class Campaigner(Followed):
    """An instance with a worker endpoint and a counter port of its own."""

    def __init__(self, urls: str, name: str) -> None:
        counter = (LOOPBACK, free_port())
        super().__init__(urls, name, "--counter-port", str(counter[1]),
                         "--counter-listen", LOOPBACK)
        self.counter_address = counter          # (after ServerProcess's own None)


class Round:
    """One round's clients, all threads of this process."""

    def __init__(self, tag: str, ledger: Ledger, holds: Holds, leader: Campaigner,
                 standby: Campaigner) -> None:
        self.stop, self.keep = threading.Event(), threading.Event()
        self.producers = [Producer(f"{tag}p{i}", self.stop, ledger, leader.address,
                                   standby.address) for i in range(2)]
        self.keeper = Worker(f"{tag}w0", self.stop, ledger, holds, standby.address, self.keep)
        self.workers = [self.keeper] + [Worker(f"{tag}w{i}", self.stop, ledger, holds,
                                               standby.address) for i in (1, 2)]
        self.counters = [CounterUser(f"{tag}c{where}", self.stop, ledger, holds, first,
                                     standby.counter_address)
                         for where, first in (("L", leader.counter_address),
                                              ("S", standby.counter_address))]
        self.actors = [*self.producers, *self.workers, *self.counters]

    def start(self) -> None:
        for actor in self.actors:
            actor.start()

    def warm(self) -> bool:
        return (sum(p.acked for p in self.producers) >= 20 and self.keeper.holding.is_set()
                and sum(w.reserved for w in self.workers) >= 10
                and all(c.grants for c in self.counters))

    def first_on_survivor(self) -> float | None:
        return min((p.first_on_survivor for p in self.producers
                    if p.first_on_survivor is not None), default=None)

    def end(self) -> None:
        self.keep.set()
        self.stop.set()
        for actor in self.actors:
            actor.join(60)
        assert not any(a.is_alive() for a in self.actors), "a client did not stop"


def kill(kind: str, cluster: Cluster, name: str, leader: Campaigner):
    """kill -9 of the leader (and, for "nats", of its stream's NATS leader): the clock
    read before the signals, and the node killed."""
    node = cluster.stream_leader(f"ZSTALK_{name}") if kind == "nats" else None
    assert kind == "broker" or node is not None, "the journal's stream has no NATS leader"
    killed = time.monotonic()
    os.killpg(leader.process.pid, signal.SIGKILL)
    if node is not None:
        os.killpg(node.proc.pid, signal.SIGKILL)
    leader.process.wait()
    if node is not None:
        node.kill()                     # (reaps it; proc None until started again)
    return killed, node


def play(kind: str, n: int, cluster: Cluster, name: str, ledger: Ledger, holds: Holds,
         leader: Campaigner, standby: Campaigner) -> None:
    r = Round(f"{kind[0]}{n}", ledger, holds, leader, standby)
    r.start()
    try:
        began = time.monotonic()
        assert wait_for(r.warm, 30, 0.02), "no traffic through both instances"
        time.sleep(max(0.0, WARM_S - (time.monotonic() - began)))
        killed, node = kill(kind, cluster, name, leader)
        for p in r.producers:
            p.on_survivor.wait(max(0.0, killed + FIRST_PUT_S[kind] - time.monotonic()))
        first = r.first_on_survivor()
        assert first is not None, (f"no put acknowledged by the survivor within "
                                   f"{FIRST_PUT_S[kind]} s:\n{standby.output()[-6000:]}")
        print(f"\nkill campaign {kind} round {n}/{ROUNDS}: first acknowledged put on the "
              f"survivor {first - killed:.2f} s after the kill (load "
              f"{os.getloadavg()[0]:.1f})", end="")
        assert standby.leads(), standby.leader()
        if node is not None:
            cluster.restart(node)
        leader.launch()
        time.sleep(max(0.0, first + GRACE_S + 0.5 - time.monotonic()))   # the grace over
        r.keep.set()
        assert wait_for(lambda: r.keeper.kept is not None, 30, 0.02), "the keeper never let go"
        assert r.keeper.kept[1] == b"DELETED\r\n", f"the job kept across the kill: {r.keeper.kept}"
    finally:
        r.end()
    # the counter a client of the dead leader may have held was given back with it: once
    # the grace for fronts to return theirs is over, someone gets it again
    assert any(thing == "counter" and since > killed for thing, _, since, _ in holds.spans), \
        "nobody got the counter after the kill"
    assert wait_for(lambda: leader.stands_by_for(standby) and answers(leader.address),
                    SETTLE_S, 0.05), (leader.leader(), leader.output()[-3000:])
    if node is not None:
        assert wait_for(lambda: cluster.settled([f"ZSTALK_{name}", f"KV_zstalk_{name}"]),
                        SETTLE_S, 0.2), "the NATS streams' replicas did not catch up"


def test_the_books_see_two_holders_at_once_and_only_then():
    holds = Holds()
    holds.spans += [("job", "w0", 1.0, 5.0), ("job", "w1", 5.0, 6.0),   # (one after the other)
                    ("job", "w2", 5.5, 5.6),                            # (inside w1's)
                    ("counter", "c0", 1.0, 2.0), ("counter", "c0", 1.5, 3.0)]   # (the same)
    holds.got("counter", "c1", 2.5)
    holds.lost("c1", 2.9)               # (its connection broke: held until its last reply)
    assert holds.overlaps() == [(("job", "w1", 5.0, 6.0), ("job", "w2", 5.5, 5.6)),
                                (("counter", "c0", 1.5, 3.0), ("counter", "c1", 2.5, 2.9))]


@pytest.mark.parametrize("kind", ["broker", "nats"])
def test_five_kills_lose_nothing_acknowledged_and_grant_nothing_twice(cluster, kind):
    name = "k" + os.urandom(4).hex()
    ledger, holds = Ledger(), Holds()
    leader, standby = leader_and_follower(cluster, name, Campaigner)
    try:
        for n in range(1, ROUNDS + 1):
            play(kind, n, cluster, name, ledger, holds, leader, standby)
            leader, standby = standby, leader
        holds.close(time.monotonic())
        assert not ledger.errors, ledger.errors[:5]
        assert not ledger.broken, f"connections to the standby broke: {ledger.broken[:5]}"
        assert not ledger.came_back, f"DELETED jobs came back: {ledger.came_back[:5]}"
        assert not ledger.lost_holds, f"held jobs taken from their holder: {ledger.lost_holds}"
        assert not holds.overlaps(), f"held by two at once: {holds.overlaps()[:3]}"
        counters = sum(1 for s in holds.spans if s[0] == "counter")
        jobs = sum(1 for s in holds.spans if s[0] != "counter")
        print(f"\nkill campaign {kind}: {len(ledger.acked_puts)} puts acknowledged, "
              f"{len(ledger.acked_deletes)} deleted, {jobs} reservations and {counters} "
              f"counter grants, none at once", end="")
        assert counters >= ROUNDS * 2, "the counter was hardly competed for"
        check_durable(leader.address, ledger)
        assert stats(leader.address)[b"journal-epoch"] == b"%d" % (ROUNDS + 1)
    finally:
        for node in cluster.nodes:
            if node.proc is None:
                cluster.restart(node)
        leader.stop()
        standby.stop()
