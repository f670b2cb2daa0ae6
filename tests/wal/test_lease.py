"""The lease's pure parts (broker/wal/lease.py) on a fake clock: when a standby claims,
what the value carries, and whose a value is.  The lease against a real NATS is in
tests/ha/test_failover.py."""
from __future__ import annotations

from types import SimpleNamespace

from zstalk.broker.wal.lease import Holder, Watch, ours


def test_a_lease_renewed_is_never_lapsed_however_long_the_standby_watches():
    w = Watch(lease_s=1.5)
    now = 100.0
    for revision in range(1, 40):           # a renewal every 0.25 s, for 10 s
        w.seen(revision, Holder(3, "a"), now)
        assert not w.lapsed(now)
        now += 0.25
    assert w.epoch == 3


def test_a_lease_lapses_lease_s_after_the_standby_first_saw_its_revision_on_its_own_clock():
    w = Watch(lease_s=1.5)
    w.seen(7, Holder(2, "a"), now=50.0)     # renewed at some time we do not know
    w.seen(7, Holder(2, "a"), now=51.0)
    assert not w.lapsed(51.49)
    assert w.lapsed(51.5)


def test_a_standby_that_has_not_looked_yet_does_not_claim():
    assert not Watch(lease_s=1.5).lapsed(1e9)


def test_a_vacant_key_is_claimed_at_once_and_a_deleted_one_keeps_the_epochs_seen():
    w = Watch(lease_s=1.5)
    w.seen(4, Holder(5, "a"), now=10.0)
    w.seen(5, None, now=10.1, vacant=True)     # released: its delete marker's revision
    assert w.lapsed(10.1)
    assert w.epoch == 5 and w.revision == 5


def test_a_value_that_cannot_be_read_is_timed_as_any_holder():
    w = Watch(lease_s=1.5)
    w.seen(9, Holder.decode(b"not json"), now=0.0)
    assert w.holder is None and not w.vacant
    assert not w.lapsed(1.0) and w.lapsed(1.5)


def test_a_holder_round_trips_and_junk_reads_as_none():
    h = Holder(12, "00ff", "tcp://10.0.0.5:11400", 4711)
    assert Holder.decode(h.encode()) == h
    assert Holder.decode(b'{"epoch": 1, "instance": "x"}') == Holder(1, "x", "", 0)
    for junk in (b"", b"[]", b'{"epoch": "x", "instance": "a"}', b"\xff", None):
        assert Holder.decode(junk) is None


def test_a_value_is_ours_only_with_our_instance_and_our_epoch():
    assert ours(Holder(3, "me"), "me", 3)
    assert not ours(Holder(4, "me"), "me", 3)
    assert not ours(Holder(3, "you"), "me", 3)
    assert not ours(None, "me", 3)


def test_a_claim_nats_could_not_take_gives_the_leader_a_whole_lease_again():
    w = Watch(lease_s=1.5)
    w.seen(3, Holder(1, "a"), now=0.0)
    assert w.lapsed(6.0)                    # no renewal seen: NATS electing, or a dead leader
    w.unsure(6.0)                           # our claim was not taken either
    assert not w.lapsed(7.4) and w.lapsed(7.5)
    w.seen(4, Holder(1, "a"), now=7.0)      # the leader renewed once NATS was back
    assert not w.lapsed(8.4)


class ElectingKv:
    """A lease bucket whose first `silent` deletes get no answer (NATS electing its
    leader), the first of them `applied` all the same (its answer lost)."""

    def __init__(self, silent: int, applied: bool) -> None:
        self.silent, self.applied = silent, applied
        self.deleted = False
        self.deletes = 0

    async def delete(self, key, last):
        import asyncio

        from nats.js.errors import KeyWrongLastSequenceError
        self.deletes += 1
        if self.deletes == 1 and self.applied:
            self.deleted = True
        if self.deletes <= self.silent:
            await asyncio.sleep(3600)
        if self.deleted:
            raise KeyWrongLastSequenceError(description="wrong last sequence")
        self.deleted = True

    async def get(self, key):
        from nats.js.errors import KeyNotFoundError
        if self.deleted:
            raise KeyNotFoundError(entry=None, op="DEL")
        return SimpleNamespace(revision=5, value=Holder(3, "a").encode())


def release_with(kv: ElectingKv, monkeypatch, within_s: float = 1.0) -> bool:
    import asyncio
    import time

    from zstalk.broker.wal import lease as L
    monkeypatch.setattr(L, "REQUEST_S", 0.05)
    from zstalk.broker.wal.stream import Options
    held = L.Lease(Options(("nats://127.0.0.1:4222",)), "a")
    held.kv, held.epoch, held.revision = kv, 3, 5
    return asyncio.run(held._release(time.monotonic() + within_s))


def test_a_release_asks_again_while_nats_elects_and_gives_the_key_back(monkeypatch):
    kv = ElectingKv(silent=3, applied=False)
    assert release_with(kv, monkeypatch) is True
    assert kv.deleted and kv.deletes == 4


def test_a_release_whose_answer_was_lost_finds_the_key_gone_and_counts_as_done(monkeypatch):
    kv = ElectingKv(silent=1, applied=True)
    assert release_with(kv, monkeypatch) is True and kv.deletes == 2


def test_a_release_nats_never_answers_ends_in_its_time_and_says_so(monkeypatch):
    import pytest
    with pytest.raises(TimeoutError, match="no answer from NATS at nats://127.0.0.1:4222"):
        release_with(ElectingKv(silent=10 ** 6, applied=False), monkeypatch, within_s=0.3)
