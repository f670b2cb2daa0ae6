"""T_POSITIONS in the broker core, on a fake clock (issue 48): an HTTP front asks once a
second for the places of every task its event streams follow, and gets each as its
info shows it less what is not about the place (task_info.position); each waiting online
task asked about counts as looked at, so an open stream keeps its user's place.  The
front's side: tests/fronts/test_event_stream.py; end to end:
tests/end_to_end/test_event_stream_end_to_end.py."""
from __future__ import annotations

import time

from test_tasks_core import HTTP, BrokerClock
from zstalk.broker.core.tasks import views
from zstalk.protocol.schema import MAX_POSITIONS, Op, R
from zstalk.protocol.schema.task_info import NOT_PLACE, position


class Room(BrokerClock):
    """A broker whose function "f" is a public room of one slot, with a rate, whose
    waiting users must look every 30 s."""

    def __init__(self, **spec) -> None:
        super().__init__(**{"online": "public", "concurrency": 1, "rate": 10,
                            "pass_ttl_ms": 60_000, "heartbeat_ms": 30_000,
                            "admit_url": "https://shop.example/in", **spec})

    def join(self, uid: str) -> None:
        [reply] = self.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", None, uid, True,
                                   {"type": "online"}))[HTTP]
        assert reply[1] == R.T_TASK, reply

    def positions(self, *uids) -> tuple:
        [reply] = self.send(HTTP, (Op.T_POSITIONS, 1, list(uids)))[HTTP]
        return reply

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.broker.expire(self.now)


def test_the_places_of_many_tasks_come_in_one_reply_in_the_order_asked():
    room = Room()
    for uid in ("a", "b", "c"):
        room.join(uid)
    conn, code, places = room.positions("c", "nosuch", "a", "b")
    assert (conn, code) == (1, R.T_POSITIONS)
    admitted = {"status": "admitted", "passExpiresAt": room.now + 60,     # (wall offset 0)
                "admitUrl": "https://shop.example/in"}
    assert places[1] is None and places[2] == admitted
    assert [places[3]["waitNum"], places[0]["waitNum"]] == [0, 1]
    assert places[3]["status"] == places[0]["status"] == "queued"
    assert places[0]["waitTime"] > places[3]["waitTime"] > 0


def test_a_place_is_the_info_without_what_is_not_about_the_place_so_new_fields_travel():
    room = Room()
    room.join("a")
    room.join("b")
    store = room.broker.tasks
    info = views.info(store, "b", room.now, keyed=True)
    [place] = room.positions("b")[2]
    assert place == {k: v for k, v in info.items() if k not in NOT_PLACE}
    assert "result" in NOT_PLACE and "function" not in place and "uniqueId" not in place
    # a field a later version adds to the info (a room's phase) is part of the place
    assert position({**info, "phase": "pre-line", "opensAt": 5.0}) == {
        **place, "phase": "pre-line", "opensAt": 5.0}


def test_an_ended_task_shows_its_status_and_error():
    room = Room()
    room.join("a")
    room.join("b")
    room.send(HTTP, (Op.T_CANCEL, 1, "b"))
    [place] = room.positions("b")[2]
    assert place["status"] == "cancelled" and "waitNum" not in place


def test_being_asked_about_keeps_a_waiting_users_place_and_one_nobody_asks_about_is_dropped():
    room = Room()
    for uid in ("holder", "followed", "forgotten"):
        room.join(uid)
    for _ in range(40):                  # 40 s, asked about every second (a stream's front)
        room.advance(1)
        room.positions("followed")
    status = {uid: room.info(uid)[2]["status"] for uid in ("followed", "forgotten")}
    assert status == {"followed": "queued", "forgotten": "cancelled"}
    assert room.info("forgotten")[2]["error"] == "abandoned"


def test_more_ids_than_one_op_may_carry_or_not_a_list_is_refused():
    room = Room()
    for ids in ([f"t{i}" for i in range(MAX_POSITIONS + 1)], "abc", None):
        [(_, code, error, message)] = room.send(HTTP, (Op.T_POSITIONS, 1, ids))[HTTP]
        assert (code, error) == (R.T_ERROR, "bad_request"), ids
        assert str(MAX_POSITIONS) in message
    assert room.positions(*[f"t{i}" for i in range(MAX_POSITIONS)])[1] == R.T_POSITIONS


def test_the_places_of_a_full_op_in_a_long_line_cost_a_bisect_each_not_a_walk():
    # (the op's time grows with log(line), not the line: 500 places in a line of 20,000
    # take about what they take in a line of 500 (1-2x quiet), where a walk would take
    # 40x; the bound is 15x, for a loaded machine: CI's run measured 5.8x under a hog)
    times = []
    for line in (MAX_POSITIONS, 40 * MAX_POSITIONS):
        room = Room(max_waiting_per_client=10 ** 6)
        store = room.broker.tasks
        for i in range(line):
            store.enqueue("f", b"{}", None, room.now, uid=f"t{i}", online=True)
        asked = [f"t{i}" for i in range(0, line, line // MAX_POSITIONS)][:MAX_POSITIONS]
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            places = room.positions(*asked)[2]
            best = min(best, time.perf_counter() - start)
        assert places[-1]["waitNum"] == int(asked[-1][1:])
        times.append(best)
    assert times[1] < 15 * times[0], times
