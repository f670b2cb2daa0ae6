"""A function's expected_duration and keep_result_after_read in the broker core, on a fake
clock (issue 45 items 2 and 4): waitTime from the configured mean hold until MIN_SAMPLES
holds ended, then from the measured one; a finished task read by its own token or the
master key is kept keep_result_after_read at most, never longer than it was, and a
listing or a read by id alone changes nothing.  With the binlog the shorter keep
survives a restart: tests/wal/test_tasks_binlog.py.  End to end:
tests/end_to_end/test_task_lifecycle_end_to_end.py."""
from __future__ import annotations

import pytest

from test_task_tokens import Room, TOKENS
from test_tasks_core import BrokerClock, Clock, HTTP, T0
from zstalk.broker.config_file import ConfigError, functions
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.components.limits import MIN_SAMPLES
from zstalk.broker.core.tasks.store import SUCCESS, ApiPolicy
from zstalk.protocol.schema import Op, R


# -- the config ------------------------------------------------------------------------------
def test_both_keys_are_durations_per_function_or_for_every_function():
    config = functions({"base_url": "http://h", "expected_duration": "2s",
                        "keep_result_after_read": "20s",
                        "mine": {"expected_duration": "500ms", "keep_result_after_read": "0s"},
                        "plain": {}})
    mine, plain = config.named
    assert (mine.expected_duration_ms, mine.keep_result_after_read_ms) == (500, 0)
    assert (plain.expected_duration_ms, plain.keep_result_after_read_ms) == (2000, 20_000)
    unset = functions({"f": {"url": "http://h/f"}}).named[0]
    assert (unset.expected_duration_ms, unset.keep_result_after_read_ms) == (0, None)


@pytest.mark.parametrize("entry, message", [
    ({"expected_duration": "2"}, "[functions.f]: expected_duration: a duration is"),
    ({"expected_duration": "0s"}, "[functions.f]: expected_duration must be above 0"),
    ({"keep_result_after_read": 20}, "[functions.f]: keep_result_after_read: a duration is"),
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


# -- keep_result_after_read ------------------------------------------------------------------
class Keeper(Room):
    """A room whose visitors end at once (done): finished tasks kept 300 s (keepResult's
    default), 20 s once read by their owner."""

    def __init__(self, **spec) -> None:
        super().__init__(**{"keep_result_after_read_ms": 20_000, "concurrency": 5, **spec})

    def visit(self, uid: str, token: str) -> None:
        assert self.join(uid, token)[2]["status"] == "admitted"
        [(_, code, info)] = self.send(HTTP, (Op.T_DONE, 1, uid))[HTTP]
        assert code == R.T_TASK and info["status"] == SUCCESS

    def later(self, seconds: float) -> None:
        self.now += seconds
        self.broker.fronts[HTTP].last_seen = self.now
        self.broker.expire(self.now)
        self.broker.flush()

    def expires(self, uid: str) -> float:
        return self.broker.tasking.store.tasks[uid].expires

    def gone(self, uid: str) -> bool:
        return self.info(uid)[1] == R.T_ERROR


def test_a_read_by_the_tasks_token_shortens_its_keep_to_keep_result_after_read():
    k = Keeper()
    k.visit("t1", TOKENS[0])
    assert k.expires("t1") == T0 + 300
    k.later(5)
    assert k.read("t1", TOKENS[0])[2]["status"] == SUCCESS
    assert k.expires("t1") == T0 + 5 + 20
    k.later(19.9)
    assert k.read("t1", TOKENS[0])[1] == R.T_TASK, "read again within its 20 s"
    assert k.expires("t1") == T0 + 25, "a later read does not lengthen it"
    k.later(0.2)
    assert k.gone("t1")


def test_a_read_by_the_master_key_shortens_it_and_one_by_id_alone_or_a_listing_does_not():
    k = Keeper()
    for uid, token in zip(("keyed", "plain", "listed"), TOKENS):
        k.visit(uid, token)
    assert k.read("keyed", None, keyed=True)[2]["status"] == SUCCESS
    assert k.read("plain", None, keyed=False)[2]["status"] == SUCCESS
    [(_, code, infos, _)] = k.send(HTTP, (Op.T_LIST, 1, None, None, 100, 0))[HTTP]
    assert code == R.T_LIST and {i["uniqueId"] for i in infos} == {"keyed", "plain", "listed"}
    assert [k.expires(u) for u in ("keyed", "plain", "listed")] == [T0 + 20, T0 + 300, T0 + 300]
    k.later(21)
    assert k.gone("keyed") and not k.gone("plain") and not k.gone("listed")


def test_a_read_never_lengthens_a_shorter_keep_result_and_a_queued_task_is_not_shortened():
    k = Keeper(pass_ttl_ms=60_000)
    [(_, _, info)] = k.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", {"keepResult": 5000},
                                   "short", True, {"type": "online"}))[HTTP]
    assert info["status"] == "admitted"
    k.send(HTTP, (Op.T_DONE, 1, "short"))
    k.read("short", None, keyed=True)
    assert k.expires("short") == T0 + 5, "min(its expiry, now + 20 s)"
    k = Keeper(concurrency=1)
    k.join("in", TOKENS[0])
    k.join("waiting", TOKENS[1])
    assert k.read("waiting", TOKENS[1])[2]["status"] == "queued"
    assert k.read("in", TOKENS[0])[2]["status"] == "admitted"
    assert k.expires("waiting") == k.expires("in") == 0.0, "not finished: nothing kept yet"


def test_without_keep_result_after_read_a_read_keeps_keep_result():
    k = Keeper()
    k.broker.tasking.configure({"f": k.broker.tasking.store.functions["f"]._replace(
        keep_result_after_read_ms=None)}, None, ApiPolicy(), k.now)
    k.visit("t1", TOKENS[0])
    k.read("t1", TOKENS[0])
    assert k.expires("t1") == T0 + 300


def test_a_cancelled_or_failed_task_read_by_its_owner_is_shortened_too():
    b = BrokerClock(keep_result_after_read_ms=1000)
    b.enqueue("t1", {"delay": 60_000})
    [(_, code, info)] = b.send(HTTP, (Op.T_CANCEL, 1, "t1"))[HTTP]
    assert code == R.T_TASK and info["status"] == "cancelled"
    b.info("t1")
    assert b.broker.tasking.store.tasks["t1"].expires == T0 + 1
