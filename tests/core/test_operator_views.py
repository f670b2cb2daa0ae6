"""The HTTP front's views of tubes, jobs and counters (broker/core/views.py) on the pure
core with a fake clock: what they show, what their actions do, and that looking counts no
beanstalk `cmd-*` (a beanstalk client's `stats` is the same before and after)."""
from __future__ import annotations

import pytest

from zstalk.broker.core.broker import Broker, Config
from zstalk.broker.core.views import RANK_S
from zstalk.protocol.schema import Batch, Heartbeat, Hello, Op, R, Replies

BS, HTTP, COUNTER = b"beanstalk", b"http", b"counter"


class Node:
    def __init__(self) -> None:
        self.now = 1000.0
        self.broker = Broker(Config(), self.now)
        for peer, kind in ((BS, "beanstalk"), (HTTP, "http"), (COUNTER, "counter")):
            self.broker.handle(peer, Hello(hash(peer) & 0xFFFF, kind, 1, 0, []), self.now)
            self.send(peer, (Op.OPEN, 1))

    def send(self, peer: bytes, *ops) -> list[tuple]:
        self.broker.handle(peer, Batch(list(ops)), self.now)
        return [item for p, msg in self.broker.flush() if p == peer and isinstance(msg, Replies)
                for item in msg.items]

    def view(self, *op) -> tuple:
        [reply] = self.send(HTTP, (op[0], 1, *op[1:]))
        return reply[1:]

    def put(self, tube: str, n: int = 1, delay: int = 0) -> list[int]:
        replies = self.send(BS, (Op.USE, 1, tube), *[(Op.PUT, 1, 0, delay, 60, b"body")] * n)
        return [r[2] for r in replies if r[1] == R.INSERTED]

    def stats(self) -> dict:
        [(_, _, pairs)] = self.send(BS, (Op.STATS, 1))
        return dict(pairs)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for peer in (BS, HTTP, COUNTER):
            self.broker.handle(peer, Heartbeat(0), self.now)
        self.broker.expire(self.now)


@pytest.fixture
def node() -> Node:
    return Node()


def test_looking_at_tubes_jobs_and_counters_counts_no_beanstalk_command(node):
    [job] = node.put("emails")
    before = {k: v for k, v in node.stats().items() if k.startswith("cmd-")}
    node.view(Op.V_TUBES, "", "name", "", 100)
    node.view(Op.V_TUBE, "emails")
    node.view(Op.V_JOB, job, True)
    node.view(Op.V_COUNTERS)
    node.view(Op.V_PEEK, "emails", True)
    after = {k: v for k, v in node.stats().items() if k.startswith("cmd-")}
    assert after == {**before, "cmd-stats": before["cmd-stats"] + 1}   # (our own stats)


def test_tubes_are_listed_by_name_filtered_and_paged(node):
    for tube in ("b-mail", "a-mail", "sms"):
        node.put(tube)
    code, infos, more = node.view(Op.V_TUBES, "mail", "name", "", 1)
    assert (code, [i["name"] for i in infos], more) == (R.V_PAGE, ["a-mail"], "a-mail")
    code, infos, more = node.view(Op.V_TUBES, "mail", "name", "a-mail", 1)
    assert ([i["name"] for i in infos], more) == (["b-mail"], None)
    assert infos[0]["currentJobsReady"] == 1 and infos[0]["paused"] is False


def test_activity_sorts_the_busiest_first_and_is_sorted_again_at_most_once_a_second(node):
    node.put("quiet")
    node.put("busy", 5)
    _, infos, _ = node.view(Op.V_TUBES, "", "activity", "", 10)
    assert [i["name"] for i in infos] == ["busy", "quiet", "default"]
    assert [i["activity"] for i in infos] == [5, 1, 0]
    node.put("quiet", 10)
    _, infos, _ = node.view(Op.V_TUBES, "", "activity", "", 10)
    assert [i["name"] for i in infos][:2] == ["busy", "quiet"], "sorted a moment ago"
    node.advance(RANK_S)
    _, infos, more = node.view(Op.V_TUBES, "", "activity", "", 1)
    assert ([i["name"] for i in infos], more) == (["quiet"], "quiet")
    _, infos, _ = node.view(Op.V_TUBES, "", "activity", "quiet", 1)
    assert [i["name"] for i in infos] == ["busy"]


def test_a_kick_takes_buried_jobs_of_the_tube_and_counts_no_kick_command(node):
    ids = node.put("work", 3)
    node.send(BS, (Op.WATCH, 1, "work"), *[(Op.RESERVE, 1, 0)] * 3,
              *[(Op.BURY, 1, i, 0) for i in ids])
    assert node.view(Op.V_KICK, "work", 2) == (R.V_INFO, {"tube": "work", "kicked": 2})
    assert node.stats()["current-jobs-buried"] == 1 and node.stats()["cmd-kick"] == 0
    assert node.view(Op.V_KICK, "nope", 1)[:2] == (R.T_ERROR, "not_found")
    assert node.view(Op.V_KICK, "work", -1)[:2] == (R.T_ERROR, "bad_request")


def test_a_tube_paused_for_seconds_hands_out_nothing_until_then(node):
    node.put("work")
    code, info = node.view(Op.V_PAUSE_TUBE, "work", 10)
    assert code == R.V_INFO and info["paused"] is True and info["pause"] == 10
    assert node.send(BS, (Op.WATCH, 1, "work"), (Op.IGNORE, 1, "default"),
                     (Op.RESERVE, 1, 0))[-1][1] == R.TIMED_OUT
    node.advance(10.5)
    assert node.send(BS, (Op.RESERVE, 1, 0))[-1][1] == R.RESERVED
    assert node.view(Op.V_PAUSE_TUBE, "work", -5)[:2] == (R.T_ERROR, "bad_request")


def test_a_job_shows_its_stats_and_its_body_only_when_asked_and_is_deleted_unless_reserved(node):
    [ready, held] = node.put("work", 2)
    code, info = node.view(Op.V_JOB, ready, False)
    assert (code, info["id"], info["tube"], info["state"], "body" in info) == (
        R.V_INFO, ready, "work", "ready", False)
    assert node.view(Op.V_JOB, ready, True)[1]["body"] == b"body"
    node.send(BS, (Op.WATCH, 1, "work"), (Op.RESERVE_JOB, 1, held))
    assert node.view(Op.V_DELETE_JOB, held)[:2] == (R.T_ERROR, "reserved")
    assert node.view(Op.V_DELETE_JOB, ready)[1]["id"] == ready
    assert node.view(Op.V_JOB, ready, False)[:2] == (R.T_ERROR, "not_found")
    assert node.stats()["cmd-delete"] == 0 and node.stats()["current-jobs-ready"] == 0


def test_a_peek_shows_the_next_ready_delayed_and_buried_job_and_counts_no_peek_command(node):
    [first, second] = node.put("work", 2)
    [later] = node.put("work", delay=30)
    node.send(BS, (Op.WATCH, 1, "work"), (Op.IGNORE, 1, "default"), (Op.RESERVE_JOB, 1, second),
              (Op.BURY, 1, second, 7))
    node.advance(10)
    code, info = node.view(Op.V_PEEK, "work", False)
    assert code == R.V_INFO and info == {
        "tube": "work",
        "ready": {"id": first, "pri": 0, "age": 10, "delayLeft": 0},
        "delayed": {"id": later, "pri": 0, "age": 10, "delayLeft": 19},
        "buried": {"id": second, "pri": 7, "age": 10, "delayLeft": 0}}
    # (delayLeft as stats-job's time-left: whole seconds, one less on a whole number)
    assert node.view(Op.V_JOB, later, False)[1]["timeLeft"] == 19
    assert node.view(Op.V_PEEK, "work", True)[1]["ready"]["body"] == b"body"
    assert node.view(Op.V_PEEK, "default", True)[1] == {
        "tube": "default", "ready": None, "delayed": None, "buried": None}
    assert node.view(Op.V_PEEK, "nope", False)[:2] == (R.T_ERROR, "not_found")
    assert not any(node.stats()[f"cmd-peek-{s}"] for s in ("ready", "delayed", "buried"))


def test_the_peers_are_every_front_with_a_pools_credits_and_a_dispatchers_slots(node):
    pool, dispatcher = b"pool", b"dispatcher"
    node.broker.handle(pool, Hello(7, "pool", 4242, 0, []), node.now)
    node.send(pool, (Op.OPEN, 1), (Op.SUBSCRIBE, 1, [1, 1], ["emails", "sms"], 3))
    node.broker.handle(dispatcher, Hello(8, "dispatcher", 4343, 0, []), node.now)
    node.send(dispatcher, (Op.OPEN, 1), (Op.T_SUBSCRIBE, 1, 16, False))
    node.put("emails")                  # (pushed to the pool: one credit taken, one held)
    node.advance(2)                     # (the node's own fronts say a heartbeat: seen now)
    code, info = node.view(Op.V_PEERS)
    assert code == R.V_INFO and info["total"] == 5
    peers = {p["kind"]: p for p in info["peers"]}
    assert sorted(peers) == ["beanstalk", "counter", "dispatcher", "http", "pool"]
    assert {k: peers["pool"][k] for k in ("pid", "frontId", "sessions", "credits", "reserved",
                                          "tubes")} == {
        "pid": 4242, "frontId": 7, "sessions": 1, "credits": 2, "reserved": 1,
        "tubes": ["emails", "sms"]}
    assert (peers["dispatcher"]["slots"], peers["dispatcher"]["stopping"]) == (16, False)
    assert "slots" not in peers["http"] and "credits" not in peers["beanstalk"]
    assert peers["beanstalk"]["reserved"] == 0 and peers["http"]["lastSeenMs"] == 0
    assert peers["pool"]["lastSeenMs"] == peers["dispatcher"]["lastSeenMs"] == 2000


def test_the_counters_view_lists_each_counter_with_its_current_and_most(node):
    node.send(COUNTER, (Op.C_ACQUIRE, 1, b"gpu", 2, 4))
    code, info = node.view(Op.V_COUNTERS)
    assert code == R.V_INFO and info["counters"] == [{"name": "gpu", "current": 2, "max": 2}]
    assert info["stats"]["objects"] == 1


def test_a_tube_shows_how_long_its_oldest_ready_job_has_waited_counting_a_release_afresh(node):
    assert node.view(Op.V_TUBE, "default")[1]["oldestReadyAgeMs"] == 0, "no ready job"
    [first, second] = node.put("work", 2)
    node.advance(2.5)
    assert node.view(Op.V_TUBE, "work")[1]["oldestReadyAgeMs"] == 2500
    node.send(BS, (Op.WATCH, 1, "work"), (Op.RESERVE_JOB, 1, first))
    node.advance(1.0)
    assert node.view(Op.V_TUBE, "work")[1]["oldestReadyAgeMs"] == 3500, "the second one's"
    node.send(BS, (Op.RELEASE, 1, first, 0, 0), (Op.DELETE, 1, second))
    node.advance(0.25)
    _, [info], _ = node.view(Op.V_TUBES, "work", "name", "", 10)
    assert info["oldestReadyAgeMs"] == 250, "released: ready again since then"
    node.send(BS, (Op.DELETE, 1, first))
    assert node.view(Op.V_TUBE, "work")[1]["oldestReadyAgeMs"] == 0
