"""Worker pools in the pure broker core, driven with a fake clock (broker/core/beanstalk/pools.py)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_broker_core import FRONT, Harness, codes
from zstalk.protocol.schema import (WORKER_VERSIONS, Batch, Heartbeat, Hello, Op, R, Replies,
                                    SessionState)

POOL = b"pool-a"
POOL_B = b"pool-b"
V = list(WORKER_VERSIONS)


class PoolHarness(Harness):
    """Keeps what the broker sends each peer until that peer's replies are asked for."""

    def __init__(self, **config) -> None:
        self.mail: dict[bytes, list] = {}
        self.alive = [FRONT]        # the peers that keep heartbeating while time passes
        super().__init__(**config)

    def put(self, conn: int, body: bytes = b"x", pri: int = 0, delay: int = 0, ttr: int = 60) -> int:
        """The id of a put on FRONT; other replies of that turn stay in the mailbox."""
        replies = self.send((Op.PUT, conn, pri, delay, ttr, body))
        [inserted] = [r for r in replies if r[0] == conn and r[1] == R.INSERTED]
        replies.remove(inserted)
        self.mail.setdefault(FRONT, []).extend(replies)
        return inserted[2]

    def advance(self, seconds: float, peer: bytes = FRONT) -> list[tuple]:
        self.now += seconds
        for p in self.alive:
            self.broker.handle(p, Heartbeat(0), self.now)
        self.broker.expire(self.now)
        return self.replies(peer)

    def replies(self, peer: bytes = FRONT) -> list[tuple]:
        for p, msg in self.broker.flush():
            if isinstance(msg, Replies):
                self.mail.setdefault(p, []).extend(msg.items)
        return self.mail.pop(peer, [])

    def pool(self, peer: bytes, front_id: int, tubes=("default",), credits: int = 1) -> list:
        self.broker.handle(peer, Hello(front_id, "pool", 1, 0, []), self.now)
        self.broker.flush()
        self.alive.append(peer)
        return self.send((Op.OPEN, 1), (Op.SUBSCRIBE, 1, V, list(tubes), credits), peer=peer)

    def pushed(self, replies) -> list[int]:
        return [r[2] for r in replies if r[1] == R.JOB]


@pytest.fixture
def h() -> PoolHarness:
    h = PoolHarness()
    h.open(1, 2)
    return h


def test_a_pool_is_pushed_jobs_in_reserve_order_up_to_its_credits(h):
    h.send((Op.USE, 1, "b"))
    ids = [h.put(1, pri=p) for p in (5, 1)]
    h.send((Op.USE, 1, "a"))
    ids += [h.put(1, pri=p) for p in (3, 1)]
    replies = h.pool(POOL, 7, tubes=("a", "b"), credits=3)
    assert replies[0] == (1, R.SUBSCRIBED, WORKER_VERSIONS[1])
    assert h.pushed(replies) == [ids[1], ids[3], ids[2]]
    assert h.send(peer=POOL) == []


def test_a_pushed_job_carries_tube_priority_ttr_and_attempt(h):
    job_id = h.put(1, body=b"hello", pri=7, ttr=30)
    [_, job] = h.pool(POOL, 7, credits=1)
    assert job == (1, R.JOB, job_id, b"hello", "default", 7, 30, 1)


def test_credit_lets_the_next_job_through_in_the_same_batch_as_the_delete(h):
    a, b = h.put(1), h.put(1)
    assert h.pushed(h.pool(POOL, 7, credits=1)) == [a]
    replies = h.send((Op.DELETE, 1, a), (Op.CREDIT, 1, 1), peer=POOL)
    assert replies == [(1, R.DELETED), (1, R.JOB, b, b"x", "default", 0, 60, 1)]


def test_a_pool_with_credits_left_gets_a_job_put_later_at_once(h):
    h.pool(POOL, 7, credits=2)
    job_id = h.put(1)
    assert h.pushed(h.replies(POOL)) == [job_id]


def test_a_pool_never_holds_more_jobs_than_its_credits(h):
    for _ in range(10):
        h.put(1)
    assert len(h.pushed(h.pool(POOL, 7, credits=4))) == 4
    assert h.stats()["current-jobs-reserved"] == 4
    assert h.stats()["current-jobs-ready"] == 6


def test_pools_and_blocked_reserves_take_turns(h):
    h.send((Op.RESERVE, 2, -1))                   # a beanstalk client blocks first
    h.pool(POOL, 7, credits=5)                    # then a pool with room for five
    ids = [h.put(1) for _ in range(4)]
    assert [r[2] for r in h.replies(FRONT) if r[1] == R.RESERVED] == [ids[0]]
    assert h.pushed(h.replies(POOL)) == ids[1:]
    h.send((Op.DELETE, 2, ids[0]), (Op.RESERVE, 2, -1))   # the client queues behind the pool
    more = [h.put(1) for _ in range(2)]
    assert h.pushed(h.replies(POOL)) == [more[0]]          # its last credit
    assert [r[2] for r in h.replies(FRONT) if r[1] == R.RESERVED] == [more[1]]


def test_two_pools_and_a_client_are_served_round_robin(h):
    h.pool(POOL, 7, credits=10)
    h.pool(POOL_B, 8, credits=10)
    h.send((Op.RESERVE, 2, -1))
    ids = [h.put(1) for _ in range(6)]
    client = [r[2] for r in h.replies(FRONT) if r[1] == R.RESERVED]
    assert h.pushed(h.replies(POOL)) == [ids[0], ids[3], ids[5]]
    assert h.pushed(h.replies(POOL_B)) == [ids[1], ids[4]]
    assert client == [ids[2]]


def test_paused_tubes_are_skipped_and_pushed_when_they_resume(h):
    h.send((Op.USE, 1, "slow"))
    paused = h.put(1)
    h.send((Op.PAUSE_TUBE, 1, "slow", 5))
    h.send((Op.USE, 1, "fast"))
    fast = h.put(1)
    assert h.pushed(h.pool(POOL, 7, tubes=("slow", "fast"), credits=2)) == [fast]
    assert h.pushed(h.advance(6, peer=POOL)) == [paused]


def test_a_delayed_job_is_pushed_when_it_comes_due(h):
    h.pool(POOL, 7, credits=1)
    job_id = h.put(1, delay=2)
    assert h.pushed(h.advance(1, peer=POOL)) == []
    assert h.pushed(h.advance(1.5, peer=POOL)) == [job_id]


def test_a_pushed_job_that_outlives_its_ttr_is_ready_again_without_deadline_soon(h):
    job_id = h.put(1, ttr=2)
    h.pool(POOL, 7, credits=1)
    assert codes(h.advance(1.5, peer=POOL)) == []        # no DEADLINE_SOON for a pool
    h.advance(1.0, peer=POOL)
    assert h.job_stats(job_id)["state"] == "ready"
    assert h.job_stats(job_id)["timeouts"] == 1
    # a late delete still removes it while it waits ready (beanstalkd deletes ready jobs)
    assert h.send((Op.DELETE, 1, job_id), peer=POOL) == [(1, R.DELETED)]


def test_the_pool_answers_its_jobs_with_release_bury_and_touch(h):
    a, b, c = h.put(1), h.put(1), h.put(1)
    h.pool(POOL, 7, credits=3)
    replies = h.send((Op.TOUCH, 1, a), (Op.RELEASE, 1, b, 9, 10), (Op.BURY, 1, c, 3), peer=POOL)
    assert codes(replies) == [R.TOUCHED, R.RELEASED, R.BURIED]
    assert h.job_stats(b)["state"] == "delayed" and h.job_stats(b)["pri"] == 9
    assert h.job_stats(c)["state"] == "buried"


def test_a_released_job_comes_back_with_its_attempt_count(h):
    job_id = h.put(1)
    h.pool(POOL, 7, credits=2)
    replies = h.send((Op.RELEASE, 1, job_id, 0, 0), peer=POOL)
    assert (1, R.RELEASED) in replies
    assert (1, R.JOB, job_id, b"x", "default", 0, 60, 2) in replies


def test_a_pool_that_goes_silent_has_its_jobs_released(h):
    ids = [h.put(1) for _ in range(3)]
    h.pool(POOL, 7, credits=3)
    assert h.stats()["current-jobs-reserved"] == 3
    h.alive.remove(POOL)
    h.advance(2.5)                      # only FRONT heartbeats
    assert h.stats()["current-jobs-ready"] == 3
    assert [h.job_stats(i)["state"] for i in ids] == ["ready"] * 3


def test_subscribing_with_no_credits_stops_the_pushes(h):
    h.pool(POOL, 7, credits=5)
    assert h.send((Op.SUBSCRIBE, 1, V, ["default"], 0), peer=POOL) == [(1, R.SUBSCRIBED, 1)]
    h.put(1)
    assert h.replies(POOL) == []
    assert h.stats()["current-waiting"] == 0


def test_a_pool_with_credits_counts_as_a_waiting_worker_connection(h):
    before = h.stats()
    h.pool(POOL, 7, credits=1)
    after = h.stats()
    assert after["current-connections"] == before["current-connections"] + 1
    assert after["current-workers"] == before["current-workers"] + 1
    assert after["current-waiting"] == before["current-waiting"] + 1
    h.put(1)                              # its one credit is spent: no longer waiting
    assert h.stats()["current-waiting"] == before["current-waiting"]


def test_a_pool_speaking_no_common_version_is_refused(h):
    h.broker.handle(POOL, Hello(7, "pool", 1, 0, []), h.now)
    h.broker.flush()
    far = [WORKER_VERSIONS[1] + 1, WORKER_VERSIONS[1] + 5]
    replies = h.send((Op.OPEN, 1), (Op.SUBSCRIBE, 1, far, ["default"], 5), peer=POOL)
    assert replies == [(1, R.BAD_VERSION, *WORKER_VERSIONS)]
    h.put(1)
    assert h.replies(POOL) == []


def test_a_newer_pool_is_answered_with_the_highest_common_version(h):
    h.broker.handle(POOL, Hello(7, "pool", 1, 0, []), h.now)
    h.broker.flush()
    replies = h.send((Op.OPEN, 1), (Op.SUBSCRIBE, 1, [1, 99], ["default"], 1), peer=POOL)
    assert replies == [(1, R.SUBSCRIBED, WORKER_VERSIONS[1])]


def test_pools_cannot_reserve_and_clients_cannot_subscribe(h):
    h.pool(POOL, 7, credits=0)
    assert h.send((Op.RESERVE, 1, 0), peer=POOL) == [(1, R.INTERNAL_ERROR)]
    assert h.send((Op.SUBSCRIBE, 2, V, ["default"], 1)) == [(2, R.INTERNAL_ERROR)]
    assert h.send((Op.CREDIT, 2, 1)) == []


def test_a_resubscription_moves_the_pool_to_other_tubes(h):
    h.pool(POOL, 7, tubes=("a",), credits=2)
    h.send((Op.SUBSCRIBE, 1, V, ["b"], 2), peer=POOL)
    h.send((Op.USE, 1, "a"))
    h.put(1)
    assert h.replies(POOL) == []
    h.send((Op.USE, 1, "b"))
    job_id = h.put(1)
    assert h.pushed(h.replies(POOL)) == [job_id]
    assert "a" in h.broker.queue.tubes     # (a job is still in it)


def test_a_malformed_subscription_gets_bad_format_and_no_jobs(h):
    h.broker.handle(POOL, Hello(7, "pool", 1, 0, []), h.now)
    h.broker.flush()
    h.put(1)
    for bad in ((Op.SUBSCRIBE, 1, V, [], 5), (Op.SUBSCRIBE, 1, V, ["x" * 201], 5),
                (Op.SUBSCRIBE, 1, "v", ["a"], 5), (Op.SUBSCRIBE, 1, V, ["a"], "lots"),
                (Op.SUBSCRIBE, 1, V, ["-a"], 5), (Op.SUBSCRIBE, 1, V, ["a b"], 5),
                (Op.SUBSCRIBE, 1, V, ["a"], float("inf")), (Op.SUBSCRIBE, 1, V, ["a"])):
        assert h.send((Op.OPEN, 1), bad, peer=POOL) == [(1, R.BAD_FORMAT)]
    assert h.send((Op.CREDIT, 1, "many"), peer=POOL) == []     # silent, even when malformed
    assert h.stats()["current-jobs-ready"] == 1
    assert h.stats()["current-workers"] == 0


def test_a_pool_that_says_hello_again_keeps_only_the_jobs_it_lists(h):
    a, b = h.put(1), h.put(1)
    h.pool(POOL, 7, credits=2)
    # the pool lost the broker for a moment; it still holds `a`, and gave `b` up
    listed = [SessionState(1, "default", ["default"], [a])]
    h.broker.handle(POOL, Hello(7, "pool", 1, h.broker.state_id, listed), h.now)
    h.broker.flush()
    assert h.job_stats(a)["state"] == "reserved"
    assert h.job_stats(b)["state"] == "ready"
    assert h.send((Op.DELETE, 1, a), peer=POOL) == [(1, R.DELETED)]


# -- ops from native peers are checked as beanstalkd's parser would ------------------------
@pytest.mark.parametrize("pri, delay", [(1.5, 0), (2 ** 32, 0), (-1, 0), (True, 0), ("5", 0),
                                        (0, 2 ** 32), (0, -3), (0, 0.5)])
def test_a_pool_releasing_with_a_priority_or_delay_beanstalkd_refuses_gets_bad_format(h, pri, delay):
    job_id = h.put(1)
    h.pool(POOL, 7, credits=1)
    assert h.send((Op.RELEASE, 1, job_id, pri, delay), peer=POOL) == [(1, R.BAD_FORMAT)]
    assert h.job_stats(job_id)["state"] == "reserved"       # still the pool's, unharmed
    assert h.send((Op.RELEASE, 1, job_id, 5, 0), peer=POOL)[0] == (1, R.RELEASED)


def test_a_native_client_gets_bad_format_for_a_bad_tube_and_job_too_big_for_a_big_body():
    h = PoolHarness(max_job_size=10)
    h.broker.handle(POOL, Hello(7, "client", 1, 0, []), h.now)
    h.broker.flush()
    assert h.send((Op.OPEN, 1), (Op.USE, 1, "no spaces"), peer=POOL) == [(1, R.BAD_FORMAT)]
    assert h.send((Op.USE, 1, "-dash"), peer=POOL) == [(1, R.BAD_FORMAT)]
    assert h.send((Op.PUT, 1, 0, 0, 60, b"x" * 11), peer=POOL) == [(1, R.JOB_TOO_BIG)]
    assert h.send((Op.PUT, 1, 0, 0, 60, "text"), peer=POOL) == [(1, R.BAD_FORMAT)]
    assert h.send((Op.PUT, 1, 0, 0, 60, b"x" * 10), peer=POOL)[0][1] == R.INSERTED


def test_silent_ops_are_never_answered_even_for_an_unknown_session(h):
    h.broker.handle(POOL, Hello(7, "pool", 1, 0, []), h.now)
    h.broker.flush()
    assert h.send((Op.CREDIT, 5, 1), (Op.CREDIT, 1, float("inf")), (Op.COUNT, 1, "put", 0),
                  peer=POOL) == []


def test_a_pool_cannot_send_counter_ops_or_count(h):
    h.pool(POOL, 7, credits=0)
    assert h.send((Op.C_NOOP, 1), peer=POOL) == [(1, R.BAD_FORMAT)]
    before = h.stats()["cmd-put"]
    h.send((Op.COUNT, 1, "put", True), peer=POOL)
    assert h.stats()["cmd-put"] == before


_values = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 65, 2 ** 65),
                    st.floats(allow_nan=True), st.binary(max_size=20), st.text(max_size=20))
_ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(Op.codes()), st.just(1)).flatmap(
        lambda head: st.lists(_values, max_size=5).map(lambda rest: (*head, *rest))),
    _values, st.lists(_values, max_size=3)), max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_ops, max_size=4))
def test_arbitrary_ops_from_a_pool_never_break_the_broker(batches):
    h = PoolHarness()
    h.open(1)
    ids = [h.put(1) for _ in range(3)]
    h.pool(POOL, 7, credits=2)
    for ops in batches:
        h.broker.handle(POOL, Batch(ops), h.now)
        h.replies(POOL)
    h.advance(120)                            # every timer fires; nothing may raise
    for job_id in ids:                        # and every job is still somewhere sane
        state = h.broker.queue.jobs.get(job_id)
        assert state is None or state.state in ("ready", "delayed", "buried", "reserved")
        if state is not None and state.state == "reserved":
            assert state.holder is not None and job_id in state.holder.reserved
    assert h.send((Op.PUT, 1, 0, 0, 60, b"after"))[0][1] == R.INSERTED


def test_a_pool_saying_hello_again_gets_nothing_pushed_until_it_subscribes_again(h):
    a = h.put(1)
    h.pool(POOL, 7, credits=3)          # holds `a`, two credits left and waiting
    h.broker.handle(POOL, Hello(7, "pool", 1, h.broker.state_id,
                                [SessionState(1, "default", ["default"], [])]), h.now)
    h.broker.flush()
    assert h.job_stats(a)["state"] == "ready"      # given up, and not pushed straight back
    assert h.pushed(h.replies(POOL)) == []
    assert h.pushed(h.send((Op.SUBSCRIBE, 1, V, ["default"], 1), peer=POOL)) == [a]


def test_a_native_put_with_ttr_0_gets_ttr_1_as_beanstalkd_gives_it(h):
    h.broker.handle(POOL, Hello(7, "client", 1, 0, []), h.now)
    h.broker.flush()
    [(_, code, job_id)] = h.send((Op.OPEN, 1), (Op.PUT, 1, 0, 0, 0, b"x"), peer=POOL)
    assert h.job_stats(job_id)["ttr"] == 1


def test_a_reserve_blocked_when_its_front_lost_the_broker_is_not_answered_after_hello(h):
    """The front answered the blocked reserve INTERNAL_ERROR when it lost the broker; a
    job now must not become that connection's reply to its next command."""
    h.send((Op.RESERVE, 2, -1))
    sessions = [SessionState(c, "default", ["default"], []) for c in (1, 2)]
    h.broker.handle(FRONT, Hello(1, "beanstalk", 1, h.broker.state_id, sessions), h.now)
    h.broker.flush()
    job_id = h.put(1)
    assert [r for r in h.replies(FRONT) if r[1] == R.RESERVED] == []
    assert h.job_stats(job_id)["state"] == "ready"
