"""Cron schedules in the broker core with a fake clock: made, fired into tasks, paused,
deleted, listed, kept in the binlog across restarts (a missed fire once, never twice),
and wall-clock steps (no burst, no repeat).  The cron rules themselves: test_cron.py."""
from __future__ import annotations

import os

import pytest

from test_tasks_binlog import HTTP, WALL_OFFSET, Node
from zstalk.broker.core.schedules.schedules import fire_id
from zstalk.broker.core.tasks.store import FunctionSpec
from zstalk.protocol.schema import Op, R

EVERY_5_MIN = "0 */5 * * * ?"


class Scheduler(Node):
    def schedule(self, name="s1", expr=EVERY_5_MIN, zone="UTC", function="f", params=b"[7]",
                 options=None) -> tuple:
        [reply] = self.send(HTTP, (Op.T_SCHEDULE, 1, name, expr, zone, function, params,
                                   options))[HTTP]
        return reply

    def ask(self, *op) -> tuple:
        [reply] = self.send(HTTP, (op[0], 1, *op[1:]))[HTTP]
        return reply

    @property
    def wall(self) -> float:
        return self.now + WALL_OFFSET

    def tasks(self) -> list:
        return sorted(self.broker.tasks.tasks.values(), key=lambda t: t.seq)

    def restart(self, later_s: float = 0.0, claims=None) -> "Scheduler":
        self.wal.close()
        return Scheduler(self.path, self.now + later_s, self.wal.opts.segment_size,
                         self.functions, claims)


@pytest.fixture
def node(tmp_path):
    return Scheduler(tmp_path)


def next_multiple(wall: float, step: int) -> float:
    return (int(wall) // step + 1) * step


def test_a_schedule_says_when_it_fires_next_and_fires_a_task_then(node):
    code, info = node.schedule()[1:3]
    first = next_multiple(node.wall, 300)
    assert code == R.T_SCHEDULE and info["nextFireAt"] == first and info["paused"] is False
    assert node.tasks() == []
    node.advance(first - node.wall - 0.001)
    assert node.tasks() == []
    node.advance(0.001)
    [task] = node.tasks()
    assert (task.function, task.params, task.priority) == ("f", b"[7]", int(first * 1000))
    assert task.uid == fire_id("s1", first)
    info = node.ask(Op.T_SCHEDULE_INFO, "s1")[2]
    assert (info["lastFireAt"], info["nextFireAt"]) == (first, first + 300)


def test_each_fire_is_its_own_task_with_the_schedule_s_options(node):
    node.schedule(expr="*/10 * * * * ?", options={"attempts": 5, "priority": -1})
    for _ in range(35):
        node.advance(1)
    tasks = node.tasks()
    assert len(tasks) == 3 and len({t.uid for t in tasks}) == 3
    assert {(t.attempts, t.priority) for t in tasks} == {(5, -1)}


@pytest.mark.parametrize("args, code, words", [
    ({"expr": "0 */5 * * *"}, "bad_request", "cron"),
    ({"expr": "0 0 0 ? * 8"}, "bad_request", "day-of-week"),
    ({"expr": "0 0 0 * * MON"}, "bad_request", "?"),
    ({"zone": "Mars/Olympus_Mons"}, "bad_request", "timezone"),
    ({"function": "nosuch"}, "unknown_function", "nosuch"),
    ({"options": {"uniqueId": "x"}}, "bad_request", "uniqueId"),
    ({"options": {"delay": -1}}, "bad_request", "delay"),
    ({"name": "a b"}, "bad_request", "name"),
    ({"name": "x" * 65}, "bad_request", "name"),
])
def test_a_bad_schedule_is_refused_with_the_reason_and_makes_nothing(tmp_path, args, code,
                                                                      words):
    node = Scheduler(tmp_path, functions=(FunctionSpec("f", "http://fn/f"),))
    reply = node.schedule(**args)
    assert reply[1:3] == (R.T_ERROR, code) and words in reply[3]
    assert node.broker.schedules.by_name == {}


def test_a_name_is_taken_until_its_schedule_is_deleted(node):
    node.schedule()
    assert node.schedule()[1:3] == (R.T_ERROR, "duplicate")
    assert node.ask(Op.T_UNSCHEDULE, "s1")[1] == R.T_SCHEDULE
    assert node.ask(Op.T_SCHEDULE_INFO, "s1")[1:3] == (R.T_ERROR, "not_found")
    node.advance(600)
    assert node.tasks() == []                       # deleted: it fires no more
    assert node.schedule()[1] == R.T_SCHEDULE


def test_a_paused_schedule_fires_nothing_and_resumes_from_now_without_a_burst(node):
    node.schedule(expr="* * * * * ?")
    node.ask(Op.T_SCHEDULE_PAUSE, "s1", True)
    node.advance(100)
    assert node.tasks() == []
    info = node.ask(Op.T_SCHEDULE_PAUSE, "s1", False)[2]
    assert info["nextFireAt"] == int(node.wall) + 1
    node.advance(1)
    assert len(node.tasks()) == 1


def test_schedules_are_listed_by_name_page_by_page(node):
    for name in ("c", "a", "b"):
        node.schedule(name=name)
    _, code, infos, more = node.ask(Op.T_SCHEDULES, "", 2)
    assert code == R.T_SCHEDULES and [i["name"] for i in infos] == ["a", "b"] and more == "b"
    _, _, infos, more = node.ask(Op.T_SCHEDULES, more, 2)
    assert [i["name"] for i in infos] == ["c"] and more is None


def test_a_fire_whose_function_is_gone_says_why_and_the_schedule_goes_on(node):
    node.schedule(expr="*/10 * * * * ?")
    node.broker.tasks.configure({}, None, node.now)         # f taken out of the config (SIGHUP)
    node.advance(10)
    info = node.ask(Op.T_SCHEDULE_INFO, "s1")[2]
    assert node.tasks() == [] and "f" in info["lastError"]
    assert info["nextFireAt"] > node.wall


# -- the binlog ----------------------------------------------------------------------------
def test_a_schedule_comes_back_after_a_restart_and_fires_on_time(node):
    node.schedule(params=b'{"n": 1}', options={"attempts": 3})
    first = next_multiple(node.wall, 300)
    again = node.restart(later_s=10)
    info = again.ask(Op.T_SCHEDULE_INFO, "s1")[2]
    assert (info["nextFireAt"], info["options"], info["params"]) == (first, {"attempts": 3},
                                                                     b'{"n": 1}')
    again.advance(first - again.wall)
    [task] = again.tasks()
    assert task.attempts == 3 and task.priority == int(first * 1000)


def test_fires_missed_while_down_fire_once_on_return_and_never_again(node):
    node.schedule(expr="* * * * * ?")
    node.advance(1)
    assert len(node.tasks()) == 1
    missed = node.ask(Op.T_SCHEDULE_INFO, "s1")[2]["nextFireAt"]
    again = node.restart(later_s=3600)              # an hour of fires missed
    fired = [t for t in again.tasks() if t.uid == fire_id("s1", missed)]
    assert len(again.tasks()) == 2 and len(fired) == 1
    assert again.ask(Op.T_SCHEDULE_INFO, "s1")[2]["nextFireAt"] == int(again.wall) + 1
    third = again.restart()                         # the catch-up fire was logged
    assert len(third.tasks()) == 2


def test_a_deleted_or_paused_schedule_stays_so_after_a_restart(node):
    node.schedule(name="gone")
    node.schedule(name="paused")
    node.ask(Op.T_UNSCHEDULE, "gone")
    node.ask(Op.T_SCHEDULE_PAUSE, "paused", True)
    again = node.restart(later_s=3600)
    assert list(again.broker.schedules.by_name) == ["paused"]
    assert again.ask(Op.T_SCHEDULE_INFO, "paused")[2]["paused"] is True
    assert again.tasks() == []


def test_compaction_carries_schedules_forward(tmp_path):
    node = Scheduler(tmp_path, segment_size=16 * 1024)
    node.schedule(name="hourly", expr="0 0 * * * ?")
    node.schedule(name="often", expr="* * * * * ?")
    node.broker.tasks.configure({}, None, node.now)         # its fires enqueue nothing (no f)...
    for _ in range(600):                            # ...but its records fill many segments
        node.advance(1)
    segments = [n for n in os.listdir(tmp_path) if n.endswith(".wal")]
    assert node.wal.records_migrated >= 1 and len(segments) <= 6, segments
    again = node.restart()
    assert sorted(again.broker.schedules.by_name) == ["hourly", "often"]


# -- the wall clock ------------------------------------------------------------------------
def test_a_fire_the_broker_was_too_busy_to_make_on_time_is_made_once(node):
    node.schedule(expr="* * * * * ?")
    node.advance(30)                                # (a turn that took 30 s)
    assert len(node.tasks()) == 1


def test_a_wall_clock_stepped_forward_fires_no_burst(node):
    node.schedule(expr="* * * * * ?")
    node.advance(1)
    node.broker.observe_wall(node.wall + 3600, node.now)    # NTP: an hour ahead
    node.advance(0.5)
    node.advance(0.6)
    assert len(node.tasks()) == 2                   # one more, not 3,600


def test_a_wall_clock_stepped_back_fires_nothing_twice(node):
    node.schedule(expr="*/10 * * * * ?")
    node.advance(30)
    fired = {t.uid for t in node.tasks()}
    node.broker.observe_wall(node.wall - 25, node.now)      # back 25 s
    node.advance(30)
    uids = [t.uid for t in node.tasks()]
    assert len(uids) == len(set(uids)) and fired < set(uids)


def test_a_slewing_wall_clock_just_moves_the_fires(node):
    node.schedule(expr="*/10 * * * * ?")
    first = node.ask(Op.T_SCHEDULE_INFO, "s1")[2]["nextFireAt"]
    node.broker.observe_wall(node.wall + 0.3, node.now)
    assert node.broker.schedules.next_deadline() == pytest.approx(first - node.wall - 0.3 + node.now)


def test_a_wall_clock_read_under_a_millisecond_off_moves_no_fire_so_none_is_early(node):
    node.schedule(expr="* * * * * ?")
    first = next_multiple(node.wall, 1)
    node.broker.observe_wall(node.wall + 0.0009, node.now)      # (the spread of two reads)
    node.advance(first - node.wall - 0.0005)
    assert node.tasks() == [], "half a millisecond before its time"
    node.advance(0.0005)
    [task] = node.tasks()
    assert task.created + node.broker.tasks.wall_offset >= first
