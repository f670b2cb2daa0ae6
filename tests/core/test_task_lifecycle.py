"""A function's expected_duration in the broker core, on a fake clock (issue 45 item 2):
waitTime from the configured mean hold until MIN_SAMPLES holds ended, then from the
measured one."""
from __future__ import annotations

import pytest

from test_task_tokens import Room, TOKENS
from test_tasks_core import Clock
from zstalk.broker.config_file import ConfigError, functions
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.components.limits import MIN_SAMPLES
from zstalk.protocol.schema import R


# -- the config ------------------------------------------------------------------------------
def test_expected_duration_is_a_duration_per_function_or_for_every_function():
    config = functions({"base_url": "http://h", "expected_duration": "2s",
                        "mine": {"expected_duration": "500ms"}, "plain": {}})
    mine, plain = config.named
    assert (mine.expected_duration_ms, plain.expected_duration_ms) == (500, 2000)
    assert functions({"f": {"url": "http://h/f"}}).named[0].expected_duration_ms == 0


@pytest.mark.parametrize("entry, message", [
    ({"expected_duration": "2"}, "[functions.f]: expected_duration: a duration is"),
    ({"expected_duration": "0s"}, "[functions.f]: expected_duration must be above 0"),
])
def test_a_bad_value_is_refused_naming_the_file_and_the_key(entry, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        functions({"f": {"url": "http://h/f", **entry}}, "zstalk.toml")


# -- expected_duration -----------------------------------------------------------------------
def wait_ms(c: Clock, uid: str) -> int | None:
    return views.info(c.store, uid, c.now).get("waitTime")


def test_a_fresh_function_with_expected_duration_has_a_wait_time_for_its_first_queued_task():
    c = Clock(f={"expected_duration_ms": 3000}, g={})
    for fn in ("f", "g"):
        c.enqueue(fn)
    c.take()
    c.take()                            # (each function's one slot is taken)
    mine, other = c.enqueue("f"), c.enqueue("g")
    assert wait_ms(c, mine.uid) == 3000, "one round of the expected call"
    assert wait_ms(c, other.uid) is None, "no rate, no measured mean, no expected_duration"
    # (a task enqueued now: behind `mine`, two rounds)
    assert views.function_stats(c.store, "f", c.now)["waitTime"] == 6000
    assert "waitTime" not in views.function_stats(c.store, "g", c.now)


def test_the_measured_mean_wins_once_min_samples_holds_ended():
    c = Clock(f={"expected_duration_ms": 10_000})
    for ended in range(MIN_SAMPLES):
        c.enqueue()
        running = c.take()
        probe = c.enqueue()             # behind the call in the one slot
        assert wait_ms(c, probe.uid) == 10_000, f"{ended} holds ended: the configured mean"
        c.store.cancel(probe.uid, c.now)
        c.advance(2.0)                  # every call takes 2 s
        assert c.report(running, "success", status_code=200)
    c.enqueue()
    c.take()
    probe = c.enqueue()
    assert wait_ms(c, probe.uid) == 2000, f"{MIN_SAMPLES} ended: their mean, 2 s"


def test_an_online_functions_expected_duration_is_the_mean_visit_until_visits_ended():
    room = Room(expected_duration_ms=90_000)
    room.join("first", TOKENS[0])       # (admitted: the one slot)
    [_, code, second] = room.join("second", TOKENS[1])
    assert code == R.T_TASK and second["status"] == "queued" and second["waitTime"] == 90_000


def test_without_expected_duration_wait_time_stays_absent_until_min_samples_ended():
    room = Room()
    room.join("first", TOKENS[0])
    [_, _, second] = room.join("second", TOKENS[1])
    assert second["status"] == "queued" and "waitTime" not in second
