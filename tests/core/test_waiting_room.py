"""The waiting room in the broker core, on a fake clock: online tasks share their
function's line and limits with offline ones, are admitted (never called) when their turn
comes, hold a slot until done, cancelled or their pass expires, and are cancelled as
abandoned when nobody looks at them within the heartbeat (broker/core/tasks/store.py)."""
from __future__ import annotations

import pytest

from test_tasks_core import T0, WALL
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import (ABANDONED, ADMITTED, CANCELLED, QUEUED, SUCCESS,
                                            FunctionSpec, Tasks)


class Room:
    def __init__(self, **spec) -> None:
        self.store = Tasks({"shop": FunctionSpec("shop", "http://fn/shop", **{
            "concurrency": 2, "online": "public", **spec})}, wall_offset=WALL)
        self.now, self.n = T0, 0

    def join(self, client="10.0.0.1", **options):
        self.n += 1
        task = self.store.enqueue("shop", b"{}", options or None, self.now, uid=f"t{self.n}",
                                  client_ip=client, online=True)
        self.store.admit(self.now)
        return task

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.store.expire(self.now)
        self.store.admit(self.now)

    def statuses(self, tasks) -> list[str]:
        return [t.status for t in tasks]


def test_online_tasks_are_admitted_in_line_up_to_the_concurrency_and_never_handed_out():
    room = Room()
    tasks = [room.join() for _ in range(3)]
    assert room.statuses(tasks) == [ADMITTED, ADMITTED, QUEUED]
    assert room.store.take("dispatcher", room.now) is None
    info = views.info(room.store, tasks[0].uid, room.now)
    assert info["type"] == "online" and info["passExpiresAt"] == pytest.approx(T0 + WALL + 300)
    assert views.info(room.store, tasks[2].uid, room.now)["waitNum"] == 0


def test_levels_go_first_in_the_room_too():
    room = Room(concurrency=1)
    first = room.join()
    normal, vip = room.join(), room.join(level=2)
    room.store.done(first.uid, room.now)
    room.store.admit(room.now)
    assert (vip.status, normal.status) == (ADMITTED, QUEUED)


def test_an_admitted_task_holds_its_slot_until_done_then_the_next_one_is_admitted():
    room = Room(concurrency=1)
    first, second = room.join(), room.join()
    room.advance(100)
    assert (first.status, second.status) == (ADMITTED, QUEUED)
    assert room.store.done(first.uid, room.now).status == SUCCESS
    room.store.admit(room.now)
    assert second.status == ADMITTED and first.ended_by == "done"
    assert room.store.done(first.uid, room.now).code == "not_admitted"


def test_a_pass_that_expires_ends_its_task_and_frees_the_slot():
    room = Room(concurrency=1, pass_ttl_ms=60_000)
    first, second = room.join(), room.join()
    room.advance(59.9)
    assert first.status == ADMITTED
    room.advance(0.1)
    assert (first.status, first.ended_by, second.status) == (SUCCESS, "expired", ADMITTED)
    assert room.store.next_deadline() == pytest.approx(room.now + 60)


def test_a_waiting_task_nobody_looks_at_is_abandoned_and_everyone_behind_moves_up():
    room = Room(concurrency=1, heartbeat_ms=30_000)
    holder, gone, kept = room.join(), room.join(), room.join()
    room.advance(20)
    room.store.seen(kept, room.now)                  # its user polls; the other's does not
    room.advance(10)
    assert (gone.status, gone.error) == (CANCELLED, ABANDONED)
    room.store.seen(kept, room.now)
    assert kept.status == QUEUED and views.info(room.store, kept.uid, room.now)["waitNum"] == 0
    room.advance(25)
    assert kept.status == QUEUED, "looked at 25 s ago: still in line"
    room.store.done(holder.uid, room.now)
    room.store.admit(room.now)
    assert kept.status == ADMITTED


def test_cancelling_an_admitted_task_revokes_it_and_frees_its_slot():
    room = Room(concurrency=1)
    first, second = room.join(), room.join()
    assert room.store.cancel(first.uid, room.now).status == CANCELLED
    room.store.admit(room.now)
    assert second.status == ADMITTED


def test_online_and_offline_tasks_share_one_line_and_one_concurrency():
    room = Room(concurrency=2, online="master")
    offline = room.store.enqueue("shop", b"{}", None, room.now, uid="off")
    online = room.join()
    later = room.store.enqueue("shop", b"{}", None, room.now, uid="off2")
    assert online.status == QUEUED, "behind the offline task at the head of the line"
    assert room.store.take("d", room.now) is offline
    room.store.admit(room.now)
    assert online.status == ADMITTED
    assert room.store.take("d", room.now) is None and later.status == QUEUED, "2 in use"


def test_an_online_task_gets_a_server_made_id_and_a_client_may_wait_only_so_often():
    room = Room(concurrency=1, max_waiting_per_client=2)
    error = room.store.enqueue("shop", b"{}", {"uniqueId": "mine"}, room.now, uid="x",
                               online=True)
    assert error.code == "bad_request" and "server-made" in error.message
    room.join("2001:db8::1")                        # admitted: not waiting
    room.join("2001:db8::2")
    room.join("2001:db8::3")
    refused = room.join("2001:db8::ffff")            # the same /64
    assert refused.code == "too_many_waiting"
    assert room.join("2001:db8:0:1::1").status == QUEUED, "another /64 may wait"


def test_a_function_taking_online_tasks_only_refuses_offline_ones():
    room = Room(online="only")
    error = room.store.enqueue("shop", b"{}", None, room.now, uid="x")
    assert error.code == "bad_request" and "online tasks only" in error.message


def test_the_rooms_numbers_show_in_the_functions_stats():
    room = Room(concurrency=1, heartbeat_ms=10_000)
    first = room.join()
    for _ in range(3):
        room.join()
    room.advance(5)
    room.store.seen(room.store.tasks["t4"], room.now)
    room.advance(5)                                 # t2 and t3 abandoned; t4 kept
    stats = views.function_stats(room.store, "shop", room.now)
    assert (stats["waitingOnline"], stats["admitted"]) == (1, 1)
    assert (stats["admissionsPerMinute"], stats["abandonedPerMinute"]) == (1.0, 2.0)
    room.store.done(first.uid, room.now)
    room.store.admit(room.now)
    stats = views.function_stats(room.store, "shop", room.now)
    assert (stats["waitingOnline"], stats["admitted"]) == (0, 1)


# -- through the broker's ops ---------------------------------------------------------------------
def online_enqueue(b, uid_hint: str, keyed: bool = True) -> tuple:
    from test_tasks_core import HTTP
    from zstalk.protocol.schema import Op
    [reply] = b.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", None, uid_hint, keyed,
                            {"type": "online"}))[HTTP]
    return reply


def test_online_master_needs_the_key_even_when_the_api_opens_enqueue():
    from test_tasks_core import BrokerClock
    from zstalk.broker.core.tasks.store import ApiPolicy
    from zstalk.protocol.schema import R
    b = BrokerClock(api=ApiPolicy(public_enqueue=True), online="master")
    assert online_enqueue(b, "u1", keyed=False)[1:3] == (R.T_ERROR, "unauthorized")
    public = BrokerClock(online="public")
    assert online_enqueue(public, "u2", keyed=False)[1] == R.T_TASK


def test_an_online_task_behind_an_offline_head_is_admitted_in_the_same_turn():
    from test_tasks_core import D1, BrokerClock
    from zstalk.protocol.schema import Op, R
    b = BrokerClock(concurrency=5, online="public")
    b.enqueue("off")
    online = online_enqueue(b, "on")
    assert online[2]["status"] == "queued"
    out = b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    assert [i[2] for i in out[D1] if i[1] == R.T_CALL] == ["off"]
    assert b.broker.tasks.tasks[online[2]["uniqueId"]].status == ADMITTED


# -- CORS: what the broker tells the HTTP fronts (protocol/fronts/http/cors.py) ----------------
def test_the_broker_tells_fronts_each_functions_origins_and_which_a_page_may_enqueue_from():
    from test_tasks_core import HTTP, BrokerClock
    from zstalk.broker.config_file import TaskConfig
    from zstalk.broker.core.tasks.store import ApiPolicy
    from zstalk.protocol.schema import Settings
    b = BrokerClock(online="public", allow_origins=("https://shop.example",))
    assert b.broker.settings()[5:7] == ({"f": ["https://shop.example"]}, ["https://shop.example"])
    A, B, D = "https://a.example", "https://b.example", "https://d.example"
    functions = (FunctionSpec("master", "http://fn/m", allow_origins=(A,)),
                 FunctionSpec("only", "http://fn/o", online="only", allow_origins=(B,)),
                 FunctionSpec("none", "http://fn/n"))
    base = FunctionSpec("", "http://fn", allow_origins=(D,))
    b.broker.configure_functions(TaskConfig(functions), b.now)
    [sent] = [msg for peer, msg in b.broker.flush() if peer == HTTP and isinstance(msg, Settings)]
    assert sent[5:7] == ({"master": [A], "only": [B]}, [B]), "master: read and done only"
    b.broker.configure_functions(TaskConfig(functions, base, ApiPolicy(public_enqueue=True)),
                                 b.now)
    # (names under base_url have origins: every named function is listed, "none" without)
    assert b.broker.settings()[5:7] == ({"master": [A], "only": [B], "none": [], "": [D]},
                                       [A, B, D])


# -- the ETA of online tasks ----------------------------------------------------------------------
def hold_slots(room: Room, users: list, holds_s: list[float], until: float) -> dict:
    """Users who call done `holds_s[i % len]` seconds after their admission, on a clock
    going second by second to `until`; each task's admission time (fake clock)."""
    admitted_at: dict = {}
    while room.now < until:
        for i, task in enumerate(users):
            if task.status == ADMITTED:
                admitted_at.setdefault(task.uid, room.now)
                if room.now - admitted_at[task.uid] >= holds_s[i % len(holds_s)]:
                    room.store.done(task.uid, room.now)
        room.store.admit(room.now)
        for task in users:
            if task.status == ADMITTED:
                admitted_at.setdefault(task.uid, room.now)
        room.advance(1.0)
    return admitted_at


def test_behind_a_full_concurrency_an_online_task_waits_about_as_long_as_users_hold_their_slot():
    room = Room(concurrency=2)                      # no rate: the concurrency holds the line
    users = [room.join() for _ in range(16)]
    hold_slots(room, users, [9.0, 11.0], room.now + 65)     # 12 through: the minute's holds
    newcomer, joined = room.join(), room.now
    info = views.info(room.store, newcomer.uid, room.now)
    assert info["waitNum"] == 2 and "waitTime" in info, info
    admitted_at = hold_slots(room, users + [newcomer], [9.0, 11.0], joined + 60)
    waited = admitted_at[newcomer.uid] - joined
    assert info["waitTime"] / 1000 == pytest.approx(waited, abs=3.0), (info, waited)


def test_calls_and_admissions_turn_the_same_slots_over_but_show_their_durations_apart():
    from zstalk.broker.core.tasks.store import Outcome
    room = Room(concurrency=2, online="master", pass_ttl_ms=40_000)
    for i in range(9):                              # calls of 80 ms
        room.store.enqueue("shop", b"{}", None, room.now, uid=f"call{i}")
        task = room.store.take("d", room.now)
        room.store.outcome(task.uid, task.attempt, Outcome("success", 200, b"{}"), room.now + 0.08)
    done, expired = room.join(), room.join()
    room.advance(20)
    room.store.done(done.uid, room.now)             # held 20 s
    cancelled = room.join()
    room.advance(5)
    room.store.cancel(cancelled.uid, room.now)      # held 5 s: a cancel frees a slot too
    room.advance(15)                                # the pass expires: held 40 s
    assert expired.ended_by == "expired"
    stats = views.function_stats(room.store, "shop", room.now)
    assert stats["callP50Ms"] <= 100 and stats["callP90Ms"] <= 100, "calls only"
    assert 5_000 <= stats["holdP50Ms"] <= 30_000 and stats["holdP90Ms"] <= 60_000
    waiting = [room.join() for _ in range(3)]       # 2 admitted, 1 in line: a round's wait
    mean_s = (9 * 0.08 + 20 + 5 + 40) / 12
    assert views.info(room.store, waiting[2].uid, room.now)["waitTime"] == round(mean_s * 1000)


def test_a_room_whose_users_stay_minutes_still_gets_an_eta_from_its_last_ten_holds():
    room = Room(concurrency=2, pass_ttl_ms=7_200_000, heartbeat_ms=7_200_000)
    users = [room.join() for _ in range(16)]
    hold_slots(room, users, [300.0], room.now + 31 * 60)   # 12 through, 2 of them this minute
    newcomer = room.join()
    info = views.info(room.store, newcomer.uid, room.now)
    assert (info["waitNum"], info["waitTime"]) == (2, 2 * 300_000), \
        "ceil(3 / 2) rounds of the last ten holds' mean"


def test_holds_older_than_the_hour_are_no_basis_for_an_eta():
    room = Room(concurrency=2, pass_ttl_ms=7_200_000, heartbeat_ms=7_200_000)
    users = [room.join() for _ in range(16)]
    hold_slots(room, users, [300.0], room.now + 31 * 60)
    newcomer = room.join()
    assert "waitTime" in views.info(room.store, newcomer.uid, room.now)
    room.advance(3600)                              # the two admitted hold their slots on
    assert "waitTime" not in views.info(room.store, newcomer.uid, room.now)
