"""The broker's counters (yrmcds semantics) driven with a fake clock, no processes."""
from __future__ import annotations

import pytest

from zstalk.broker.core.broker import Broker, Config
from zstalk.broker.core.counters import NOT_ACQUIRED, NOT_FOUND, RESOURCE_NOT_AVAILABLE
from zstalk.protocol.schema import (PEER_TIMEOUT_S, Batch, Heartbeat, Hello, Op, R, Replies,
                                    SessionState)

FRONT = b"counter-front"
U32 = 0xFFFFFFFF
EPOCH_OFFSET = 1_700_000_000.0     # wall clock = fake monotonic clock + this


class Harness:
    def __init__(self, stat_interval_s: int = 10) -> None:
        self.now = 1000.0
        self.broker = Broker(Config(stat_interval_s=stat_interval_s), self.now,
                             wall_offset=EPOCH_OFFSET)
        self.hello(FRONT, 1)

    def hello(self, peer: bytes, front_id: int, state_id: int = 0, sessions=()) -> list:
        self.broker.handle(peer, Hello(front_id, "counter", 1, state_id, list(sessions)), self.now)
        return self.broker.flush()

    def send(self, *ops, peer: bytes = FRONT) -> list[tuple]:
        self.broker.handle(peer, Batch([tuple(op) for op in ops]), self.now)
        return [item for p, m in self.broker.flush() if p == peer and isinstance(m, Replies)
                for item in m.items]

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.broker.handle(FRONT, Heartbeat(0), self.now)
        self.broker.expire(self.now)
        self.broker.flush()

    def to_next_boundary(self, after: float = 0.5) -> None:
        wall = self.now + EPOCH_OFFSET
        interval = self.broker.config.stat_interval_s
        self.advance(interval - wall % interval + after)

    def acquire(self, conn, name, n, maximum):
        return self.send((Op.C_ACQUIRE, conn, name, n, maximum))[0][1:]

    def release(self, conn, name, n):
        return self.send((Op.C_RELEASE, conn, name, n))[0][1:]

    def get(self, conn, name):
        return self.send((Op.C_GET, conn, name))[0][1:]

    def dump(self) -> dict:
        [(_, code, records)] = self.send((Op.C_DUMP, 1))
        assert code == R.C_DUMP
        return {name: (cur, peak) for name, cur, peak in records}


@pytest.fixture
def h() -> Harness:
    h = Harness()
    h.send((Op.OPEN, 1), (Op.OPEN, 2))
    return h


def test_acquires_succeed_up_to_the_maximum_and_echo_the_requested_count(h):
    assert [h.acquire(1, b"c", n, 10) for n in (2, 3, 5)] == [(R.C_OK, 2), (R.C_OK, 3), (R.C_OK, 5)]
    assert h.get(1, b"c") == (R.C_OK, 10)
    assert h.acquire(1, b"c", 1, 10) == (R.C_ERROR, RESOURCE_NOT_AVAILABLE)
    assert h.release(1, b"c", 3) == (R.C_OK, None)
    assert h.acquire(1, b"c", 2, 10) == (R.C_OK, 2)


def test_a_connection_only_releases_what_it_acquired(h):
    h.acquire(1, b"c", 10, 20)
    h.acquire(2, b"c", 1, 20)
    assert h.release(2, b"c", 2) == (R.C_ERROR, NOT_ACQUIRED)
    assert h.release(2, b"c", 1) == (R.C_OK, None)
    assert h.release(2, b"c", 0) == (R.C_ERROR, NOT_ACQUIRED)      # holds nothing now
    assert h.release(1, b"c", 0) == (R.C_OK, None)                 # holds some: fine
    assert h.get(2, b"c") == (R.C_OK, 10)


def test_releasing_a_missing_counter_is_not_found_even_for_zero(h):
    assert h.release(1, b"nope", 0) == (R.C_ERROR, NOT_FOUND)
    assert h.get(1, b"nope") == (R.C_ERROR, NOT_FOUND)


def test_the_u32_wrap_around_acquire_is_refused(h):
    h.acquire(1, b"w", 1, U32)
    assert h.acquire(1, b"w", U32, U32) == (R.C_ERROR, RESOURCE_NOT_AVAILABLE)
    assert h.get(1, b"w") == (R.C_OK, 1)


def test_a_maximum_below_the_consumption_refuses_and_changes_nothing(h):
    h.acquire(1, b"c", 2, 10)
    assert h.acquire(1, b"c", 1, 1) == (R.C_ERROR, RESOURCE_NOT_AVAILABLE)
    assert h.dump()[b"c"] == (2, 2)


def test_closing_a_connection_releases_everything_it_held(h):
    h.acquire(1, b"a", 3, 10)
    h.acquire(2, b"a", 8, 20)
    h.acquire(2, b"b", 1, 1)
    h.send((Op.CLOSE, 2))
    assert (h.get(1, b"a"), h.get(1, b"b")) == ((R.C_OK, 3), (R.C_OK, 0))


def test_a_dead_fronts_holdings_are_released(h):
    h.acquire(1, b"a", 4, 10)
    other = b"other-front"
    h.hello(other, 2)
    h.now += PEER_TIMEOUT_S + 0.1
    h.broker.handle(other, Heartbeat(2), h.now)
    h.broker.expire(h.now)
    h.broker.handle(other, Batch([(Op.OPEN, 1), (Op.C_GET, 1, b"a")]), h.now)
    [(_, replies)] = [(p, m) for p, m in h.broker.flush() if p == other and isinstance(m, Replies)]
    assert replies.items == [(1, R.C_OK, 0)]


def test_a_counter_at_zero_answers_get_until_the_next_interval_boundary(h):
    h.to_next_boundary(after=1.0)
    h.acquire(1, b"g0", 1, 5)
    h.release(1, b"g0", 1)
    h.advance(5)
    assert h.get(1, b"g0") == (R.C_OK, 0)
    assert h.dump()[b"g0"] == (0, 1)
    h.to_next_boundary()
    assert h.get(1, b"g0") == (R.C_ERROR, NOT_FOUND)
    assert b"g0" not in h.dump()


def test_dump_reports_the_peak_within_the_current_interval(h):
    h.to_next_boundary(after=1.0)
    h.acquire(1, b"g1", 5, 10)
    h.release(1, b"g1", 3)
    assert h.dump()[b"g1"] == (2, 5)
    h.to_next_boundary()
    assert h.dump()[b"g1"] == (2, 2)
    h.acquire(1, b"g1", 1, 10)
    assert h.dump()[b"g1"] == (3, 3)


def test_stats_name_yrmcds_fifteen_items_in_order_with_live_values(h):
    h.acquire(1, b"ab", 1, 2)
    [(_, code, pairs)] = h.send((Op.C_NOOP, 1), (Op.C_STATS, 1))[1:]
    assert code == R.STATS
    names = [k for k, _ in pairs]
    assert names == ["objects", "total_objects", "used_memory", "conflicts", "gc_count",
                     "last_gc_elapsed", "total_gc_elapsed", "curr_connections",
                     "total_connections", "command:noop", "command:get", "command:acquire",
                     "command:release", "command:stats", "command:dump"]
    values = dict(pairs)
    assert (values["objects"], values["used_memory"], values["curr_connections"]) == (1, 66, 2)
    assert (values["command:noop"], values["command:acquire"], values["command:stats"]) == (1, 1, 1)
    assert values["gc_count"] == 1          # once at start-up, as yrmcds


def test_counter_sessions_are_not_beanstalk_connections(h):
    beanstalk = b"beanstalk-front"
    h.broker.handle(beanstalk, Hello(9, "beanstalk", 1, 0, []), h.now)
    h.broker.handle(beanstalk, Batch([(Op.OPEN, 1), (Op.STATS, 1)]), h.now)
    [replies] = [m for p, m in h.broker.flush() if p == beanstalk and isinstance(m, Replies)]
    assert dict(replies.items[0][2])["current-connections"] == 1


def test_an_op_of_the_other_protocol_or_a_malformed_op_is_an_internal_error(h):
    out = h.send((Op.PUT, 1, 0, 0, 1, b"x"), (Op.C_ACQUIRE, 1, b"x"), (Op.C_NOOP, 1))
    assert out == [(1, R.INTERNAL_ERROR), (1, R.INTERNAL_ERROR), (1, R.C_OK, None)]


def test_re_registered_holdings_rebuild_the_counters():
    h = Harness()
    out = h.hello(b"front-x", 7, h.broker.state_id,
                  [SessionState(1, "", [], [], [(b"a", 2), (b"b", 1)]),
                   SessionState(2, "", [], [], [(b"a", 3)])])
    assert out[0][1].restored
    h.send((Op.OPEN, 9), peer=b"front-x")
    assert h.send((Op.C_GET, 9, b"a"), (Op.C_GET, 9, b"b"), peer=b"front-x") == [
        (9, R.C_OK, 5), (9, R.C_OK, 1)]
    h.send((Op.CLOSE, 2), peer=b"front-x")
    assert h.send((Op.C_GET, 9, b"a"), peer=b"front-x") == [(9, R.C_OK, 2)]


def test_after_a_broker_restart_acquires_wait_for_fronts_to_re_register():
    h = Harness()
    stale_state = h.broker.state_id + 1          # the state of a broker that went away
    out = h.hello(b"front-y", 8, stale_state, [SessionState(1, "", [], [], [(b"a", 4)])])
    assert out[0][1].restored
    h.send((Op.OPEN, 2), peer=b"front-y")
    assert h.send((Op.C_ACQUIRE, 2, b"a", 1, 10), peer=b"front-y") == [
        (2, R.C_ERROR, RESOURCE_NOT_AVAILABLE)]
    assert h.send((Op.C_GET, 2, b"a"), peer=b"front-y") == [(2, R.C_OK, 4)]
    h.now += PEER_TIMEOUT_S + 1.1
    h.broker.handle(b"front-y", Heartbeat(8), h.now)
    assert h.send((Op.C_ACQUIRE, 2, b"a", 1, 10), peer=b"front-y") == [(2, R.C_OK, 1)]


def test_a_fresh_cluster_acquires_at_once():
    h = Harness()
    h.send((Op.OPEN, 1))
    assert h.acquire(1, b"a", 1, 1) == (R.C_OK, 1)


def test_counter_ops_with_values_yrmcds_would_refuse_are_invalid_arguments(h):
    h.acquire(1, b"x", 5, 10)
    bad = [(Op.C_ACQUIRE, 2, b"x", -5, 10), (Op.C_ACQUIRE, 2, b"z", 0, 10),
           (Op.C_ACQUIRE, 2, b"y", 20, 10), (Op.C_ACQUIRE, 2, b"", 1, 1),
           (Op.C_ACQUIRE, 2, b"y", 1, U32 + 1), (Op.C_RELEASE, 2, b"x", -1),
           (Op.C_GET, 2, "not bytes")]
    assert h.send(*bad) == [(2, R.C_ERROR, 0x04)] * len(bad)
    assert h.get(1, b"x") == (R.C_OK, 5) and b"z" not in h.dump() and b"y" not in h.dump()
