"""The cloud-task store with a fake clock: options, order, concurrency, retries, delivery
modes, cancel and keepResult, without HTTP or sleeping."""
from __future__ import annotations

import pytest

from zstalk.broker.config_file import TaskConfig
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import (CALL_GRACE_S, CANCELLED, FAILED, QUEUED, RUNNING,
                                            SUCCESS, TASK_OVERHEAD_BYTES, ApiPolicy,
                                            TaskBackoff as Backoff,
                                            FunctionSpec, Outcome, Task, TaskError, Tasks)

T0 = 1000.0
WALL = 1_700_000_000.0 - T0       # wall clock = now + WALL


class Clock:
    """A store and a clock that moves only when told; ids are t1, t2, ..."""

    def __init__(self, **functions) -> None:
        specs = functions or {"f": {}}
        self.store = Tasks({name: FunctionSpec(name, f"http://fn/{name}", **spec)
                            for name, spec in specs.items()}, wall_offset=WALL,
                           rand=lambda: 0.5)
        self.now = T0
        self.n = 0

    def enqueue(self, function: str = "f", options=None, params: bytes = b"{}"):
        self.n += 1
        return self.store.enqueue(function, params, options, self.now, uid=f"t{self.n}")

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.store.expire(self.now)

    def take(self, holder="d1"):
        return self.store.take(holder, self.now)

    def report(self, task: Task, kind: str, **kw) -> bool:
        return self.store.outcome(task.uid, task.attempt, Outcome(kind, **kw), self.now)

    def status(self, uid: str):
        info = views.info(self.store, uid, self.now)
        return None if info is None else info["status"]


@pytest.fixture
def c() -> Clock:
    return Clock()


# -- enqueue and options ---------------------------------------------------------------------
def test_a_task_is_queued_with_the_cloud_queue_defaults(c):
    task = c.enqueue()
    assert (task.status, task.attempts, task.timeout_ms, task.keep_result_ms) == (
        QUEUED, 1, 15000, 300000)
    assert task.backoff == Backoff("fixed", 60000)
    assert task.priority == int((T0 + WALL) * 1000), "default priority: enqueue time in ms"


@pytest.mark.parametrize("options, message", [
    ({"colour": 1}, "unknown option 'colour'"),
    ({"delay": -1}, "delay must be between"),
    ({"delay": True}, "delay must be an integer"),
    ({"attempts": 1.5}, "attempts must be an integer"),
    ({"timeout": 0}, "timeout must be between"),
    ({"timeout": 15 * 60 * 1000 + 1}, "timeout must be between"),
    ({"priority": 1 << 63}, "priority must be between"),
    ({"uniqueId": "x" * 33}, "uniqueId must be 1 to 32"),
    ({"uniqueId": "a/b"}, "uniqueId must be 1 to 32"),
    ({"deliveryMode": "once"}, "deliveryMode must be"),
    ({"backoff": {"type": "linear"}}, "backoff type must be"),
    ({"backoff": {"delay": 10, "step": 2}}, "unknown backoff field 'step'"),
    ({"backoff": {"jitter": 1}}, "backoff jitter must be true or false"),
    ([1, 2], "options must be an object"),
])
def test_a_bad_option_is_a_400_and_enqueues_nothing(c, options, message):
    error = c.enqueue(options=options)
    assert isinstance(error, TaskError) and error.code == "bad_request" and message in error.message
    assert c.store.tasks == {} and c.take() is None


def test_an_unknown_function_is_a_404(c):
    error = c.enqueue("nosuch")
    assert isinstance(error, TaskError) and error.code == "unknown_function" and "nosuch" in error.message


def test_a_function_timeout_caps_what_a_task_may_ask_for():
    c = Clock(f={"timeout_ms": 1000, "max_timeout_ms": 2000})
    assert c.enqueue().timeout_ms == 1000
    assert c.enqueue(options={"timeout": 2000}).timeout_ms == 2000
    assert c.enqueue(options={"timeout": 2001}).code == "bad_request"


def test_a_unique_id_is_taken_until_its_finished_task_is_forgotten(c):
    first = c.enqueue(options={"uniqueId": "order-1", "keepResult": 1000})
    assert c.enqueue(options={"uniqueId": "order-1"}).code == "duplicate"
    assert c.report(c.take(), "success", status_code=200, result=b'{"ok":true}')
    assert c.enqueue(options={"uniqueId": "order-1"}).code == "duplicate", "still kept"
    c.advance(1.0)
    assert views.info(c.store, "order-1", c.now) is None
    again = c.enqueue(options={"uniqueId": "order-1"})
    assert isinstance(again, Task) and again is not first


# -- order and concurrency ---------------------------------------------------------------------
def test_tasks_run_by_priority_then_enqueue_order(c):
    c.store.functions["f"] = FunctionSpec("f", "http://fn/f", concurrency=10)
    ids = [c.enqueue(options={"priority": p}).uid for p in (5, 1, 5, -3)]
    assert [c.take().uid for _ in ids] == [ids[3], ids[1], ids[0], ids[2]]


def test_wait_num_counts_the_tasks_ahead_in_the_functions_queue(c):
    a, b = c.enqueue(options={"priority": 1}), c.enqueue(options={"priority": 2})
    first = c.enqueue(options={"priority": 0})
    assert [views.info(c.store, t.uid, c.now)["waitNum"] for t in (first, a, b)] == [0, 1, 2]


def test_a_function_runs_no_more_calls_than_its_concurrency_across_dispatchers():
    c = Clock(f={"concurrency": 2}, g={})
    for _ in range(3):
        c.enqueue("f")
    g = c.enqueue("g")
    taken = [c.take("d1"), c.take("d2"), c.take("d1")]
    assert [t.function for t in taken] == ["f", "f", "g"] and taken[2] is g
    assert c.take("d2") is None, "f is at its concurrency, g has nothing left"
    c.report(taken[0], "success", status_code=200)
    assert c.take("d2").function == "f"


def test_a_delayed_task_is_not_handed_out_before_its_delay(c):
    task = c.enqueue(options={"delay": 1500})
    assert c.take() is None
    c.advance(1.4)
    assert c.take() is None
    c.advance(0.1)
    assert c.take() is task


# -- outcomes ------------------------------------------------------------------------------------
def test_a_successful_call_records_status_code_result_and_times(c):
    task = c.enqueue()
    c.advance(1.0)
    assert c.take() is task and c.status(task.uid) == RUNNING
    c.advance(0.25)
    assert c.report(task, "success", status_code=201, result=b'{"id":7}')
    info = views.info(c.store, task.uid, c.now)
    assert info["status"] == SUCCESS and info["statusCode"] == 201
    assert info["result"] == b'{"id":7}' and info["attempt"] == 1
    assert info["createdAt"] == T0 + WALL and info["startedAt"] == T0 + 1.0 + WALL
    assert info["finishedAt"] == T0 + 1.25 + WALL
    assert "waitNum" not in info and "error" not in info


def test_a_failing_task_is_retried_after_its_backoff_then_fails(c):
    task = c.enqueue(options={"attempts": 1, "backoff": 2000})
    assert c.report(c.take(), "failure", status_code=500, error="HTTP 500")
    info = views.info(c.store, task.uid, c.now)
    assert info["status"] == QUEUED and info["error"] == "HTTP 500"
    assert info["retryAt"] == T0 + 2.0 + WALL
    c.advance(1.9)
    assert c.take() is None
    c.advance(0.1)
    assert c.report(c.take(), "failure", status_code=500, error="HTTP 500 again")
    assert c.status(task.uid) == FAILED and task.attempt == 2 and task.error == "HTTP 500 again"


def test_a_fatal_outcome_fails_the_task_without_a_retry(c):
    task = c.enqueue(options={"attempts": 5})
    c.report(c.take(), "fatal", status_code=200, error="result over the limit")
    assert c.status(task.uid) == FAILED and task.attempt == 1


def test_attempts_zero_means_one_call_and_no_retry(c):
    task = c.enqueue(options={"attempts": 0})
    c.report(c.take(), "failure", error="refused")
    assert c.status(task.uid) == FAILED


def test_exponential_backoff_doubles_up_to_its_cap_and_jitter_scales_it():
    backoff = Backoff("exponential", 1000, 5000)
    assert [backoff.wait_ms(n, lambda: 0.5) for n in (1, 2, 3, 4)] == [1000, 2000, 4000, 5000]
    assert Backoff("exponential", 1000, 5000, jitter=True).wait_ms(2, lambda: 0.5) == 1000


def test_a_503s_retry_after_waits_longer_than_the_backoff(c):
    task = c.enqueue(options={"backoff": 1000})
    c.report(c.take(), "failure", status_code=503, retry_after_ms=30000)
    assert views.info(c.store, task.uid, c.now)["retryAt"] == T0 + 30.0 + WALL
    # (a 429 does not retry: the task keeps its place, tests/core/test_task_limits.py)


def test_an_unknown_outcome_is_retried_at_least_once_but_fails_at_most_once():
    c = Clock(f={"concurrency": 2})
    retried = c.enqueue(options={"backoff": 0})
    c.report(c.take(), "unknown", error="timed out after sending")
    assert c.status(retried.uid) == QUEUED
    once = c.enqueue(options={"deliveryMode": "atMostOnce", "backoff": 0})
    assert c.take() is retried
    assert c.take() is once
    c.report(once, "unknown", error="timed out after sending")
    assert c.status(once.uid) == FAILED and "atMostOnce" in once.error


def test_a_call_whose_dispatcher_never_reports_times_out_as_unknown(c):
    task = c.enqueue(options={"timeout": 2000, "backoff": 0})
    c.take()
    c.advance(2.0 + CALL_GRACE_S - 0.01)
    assert c.status(task.uid) == RUNNING
    c.advance(0.01)
    assert c.status(task.uid) == QUEUED and "no report" in task.error
    late = c.store.outcome(task.uid, 1, Outcome("success", 200), c.now)
    assert late is False and c.status(task.uid) == QUEUED, "a late report changes nothing"


def test_a_lost_dispatcher_gives_its_calls_unknown_outcomes_and_spares_the_others(c):
    c.store.functions["f"] = FunctionSpec("f", "http://fn/f", concurrency=2)
    mine, theirs = c.enqueue(options={"backoff": 0}), c.enqueue()
    c.take("dead"), c.take("alive")
    c.store.lost("dead", c.now)
    assert c.status(mine.uid) == QUEUED and "went away" in mine.error
    assert c.status(theirs.uid) == RUNNING


# -- failed calls are logged, rate-limited by function ---------------------------------------
def failed_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "zstalk.tasks" and r.levelname == "WARNING"]


def test_a_failed_call_is_logged_with_its_function_url_status_and_what_comes_next(caplog):
    c = Clock(f={"concurrency": 2})
    retried = c.enqueue(options={"attempts": 1, "backoff": 2000})
    c.report(c.take(), "failure", status_code=404, error="HTTP 404 Not Found")
    assert failed_lines(caplog) == [
        "function f: a call to http://fn/f failed: HTTP 404 Not Found "
        f"(task {retried.uid}, attempt 1: retried in 2 s)"]
    c.advance(10.0)
    c.report(c.take(), "unknown", error="no answer from http://fn/f within 15000 ms")
    assert failed_lines(caplog)[1] == (
        "function f: a call to http://fn/f failed: no answer from http://fn/f within 15000 ms "
        f"(task {retried.uid}, attempt 2: the task failed)")


def test_failed_calls_of_a_function_are_logged_once_per_ten_seconds_with_the_count_since(caplog):
    c = Clock(f={"concurrency": 100}, g={})
    for t in (0.0, 1.0, 2.0, 9.9, 10.0, 10.5):
        c.now = T0 + t
        c.enqueue(options={"attempts": 0})
        c.report(c.take(), "failure", status_code=500, error="HTTP 500 Internal Server Error")
    c.enqueue("g", options={"attempts": 0})
    c.report(c.take(), "failure", error="could not connect to http://fn/g: refused")
    lines = failed_lines(caplog)
    assert [line.split(" (task")[0] for line in lines] == [
        "function f: a call to http://fn/f failed: HTTP 500 Internal Server Error",
        "function f: a call to http://fn/f failed: HTTP 500 Internal Server Error",
        "function g: a call to http://fn/g failed: could not connect to http://fn/g: refused"]
    assert lines[1].endswith("(task t5, attempt 1: the task failed) "
                             "(3 more failed since the last such line)")


def test_successful_and_declined_calls_are_not_logged(c, caplog):
    c.enqueue(), c.enqueue()
    c.report(c.take(), "declined", error="the dispatcher is stopping")
    c.report(c.take(), "success", status_code=200)
    c.report(c.take(), "success", status_code=200)
    assert failed_lines(caplog) == []


def test_a_failed_call_kept_quiet_makes_no_line_not_even_its_url(caplog, monkeypatch):
    c = Clock(f={"concurrency": 10})
    made = []
    url = c.store._url
    monkeypatch.setattr(c.store, "_url", lambda *a: made.append(1) or url(*a))
    for _ in range(5):
        c.enqueue(options={"attempts": 0})
        c.report(c.take(), "failure", status_code=500, error="HTTP 500")
    assert len(made) == 1 and len(failed_lines(caplog)) == 1


# -- cancel and memory -----------------------------------------------------------------------------
def test_cancel_takes_a_queued_retrying_or_running_task_and_refuses_a_finished_one(c):
    queued, delayed, running = c.enqueue(), c.enqueue(options={"delay": 5000}), c.enqueue()
    c.store.functions["f"] = FunctionSpec("f", "http://fn/f", concurrency=5)
    assert c.take() is queued          # (first come) -- now running
    assert c.store.cancel(delayed.uid, c.now) is delayed and c.status(delayed.uid) == CANCELLED
    assert c.store.cancel(queued.uid, c.now) is queued and c.status(queued.uid) == CANCELLED
    assert c.store.cancel(queued.uid, c.now).code == "not_cancellable"
    assert c.store.cancel(running.uid, c.now) is running
    assert c.take() is None
    c.advance(10)
    assert c.take() is None, "a cancelled delayed task never comes due"
    assert c.store.cancel("nosuch", c.now).code == "not_found"


def test_params_and_results_are_counted_until_the_task_is_forgotten(c):
    task = c.enqueue(params=b'{"id": 1234}', options={"keepResult": 0})
    assert c.store.bytes == TASK_OVERHEAD_BYTES + 12
    c.report(c.take(), "success", status_code=200, result=b"done")
    assert c.store.bytes == TASK_OVERHEAD_BYTES + 16
    c.advance(0)
    assert c.store.bytes == 0 and views.info(c.store, task.uid, c.now) is None


def test_the_next_deadline_is_the_soonest_of_delays_calls_and_expiries(c):
    assert c.store.next_deadline() is None
    c.enqueue(options={"delay": 9000})
    c.enqueue(options={"timeout": 1000})
    c.take()
    assert c.store.next_deadline() == T0 + 1.0 + CALL_GRACE_S
    c.store.functions["f"] = FunctionSpec("f", "http://fn/f", concurrency=2)
    c.enqueue(options={"keepResult": 500})
    c.report(c.take(), "success", status_code=200)
    assert c.store.next_deadline() == T0 + 0.5


# -- through the broker: an HTTP front and dispatchers as the broker sees them -----------------
from zstalk.broker.core.broker import Broker, Config                          # noqa: E402
from zstalk.protocol.schema import Batch, Hello, Op, R, Replies, Settings, Welcome

HTTP, D1, D2, BEANSTALK = b"http", b"disp-1", b"disp-2", b"bean"


class BrokerClock:
    def __init__(self, max_jobs_bytes: int = 0, api: ApiPolicy = ApiPolicy(),
                 config: Config | None = None, **spec) -> None:
        """A broker of function `f` (with `spec`), or of `config`, and its fronts."""
        self.now = T0
        self.broker = Broker(config or Config(functions=(FunctionSpec("f", "http://fn/f", **spec),),
                                              max_jobs_bytes=max_jobs_bytes, api=api), self.now)
        for peer, kind, front_id in ((HTTP, "http", 1), (D1, "dispatcher", 2),
                                     (D2, "dispatcher", 3), (BEANSTALK, "beanstalk", 4)):
            self.broker.handle(peer, Hello(front_id, kind, 1, 0, []), self.now)
            self.send(peer, (Op.OPEN, 1))

    def send(self, peer: bytes, *ops) -> dict[bytes, list]:
        self.broker.handle(peer, Batch(list(ops)), self.now)
        out: dict[bytes, list] = {}
        for p, msg in self.broker.flush():
            if isinstance(msg, Replies):
                out.setdefault(p, []).extend(msg.items)
        return out

    def enqueue(self, uid: str, options=None, keyed: bool = True) -> tuple:
        [reply] = self.send(HTTP, (Op.T_ENQUEUE, 1, "f", b'{"n":1}', options, uid, keyed))[HTTP]
        return reply

    def info(self, uid: str, keyed: bool = True) -> tuple:
        [reply] = self.send(HTTP, (Op.T_INFO, 1, uid, keyed))[HTTP]
        return reply


def test_an_enqueued_task_is_pushed_to_a_dispatcher_and_its_outcome_recorded():
    b = BrokerClock()
    assert b.send(D1, (Op.T_SUBSCRIBE, 1, 4, False)) == {}
    b.broker.handle(HTTP, Batch([(Op.T_ENQUEUE, 1, "f", b'{"n":1}', None, "t1", True)]), b.now)
    out = {p: m.items for p, m in b.broker.flush() if isinstance(m, Replies)}
    # (the 201 is made after the turn's hand-out: it says what a GET would)
    assert out[HTTP][0][1] == R.T_TASK and out[HTTP][0][2]["status"] == RUNNING
    assert out[D1] == [(1, R.T_CALL, "t1", 1, "http://fn/f", b'{"n":1}', 15000, None)]
    b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b'"ok"', None, 0))
    [(_, code, info)] = b.send(HTTP, (Op.T_INFO, 1, "t1", True))[HTTP]
    assert code == R.T_TASK and info["status"] == SUCCESS and info["result"] == b'"ok"'


def test_an_enqueue_is_answered_with_the_fields_of_the_201_only():
    from zstalk.protocol.fronts.http.api import ENQUEUED_FIELDS
    b = BrokerClock(concurrency=1)
    first, second = b.enqueue("t1"), b.enqueue("t2", options={"delay": 60_000})
    assert first[2] == {"uniqueId": "t1", "status": QUEUED, "createdAt": 1000.0, "waitNum": 0}
    assert second[2] == {"uniqueId": "t2", "status": QUEUED, "createdAt": 1000.0,
                         "waitNum": 1, "waitTime": 60_000}
    assert set(first[2]) | set(second[2]) <= set(ENQUEUED_FIELDS)
    assert {"createdAt", "function"} <= set(b.info("t1")[2]), "T_INFO: the whole TaskInfo"


def test_enqueue_errors_come_back_as_error_codes():
    b = BrokerClock()
    assert b.enqueue("t1")[1] == R.T_TASK
    assert b.enqueue("t1")[1:3] == (R.T_ERROR, "duplicate")
    assert b.enqueue("t2", {"delay": "soon"})[1:3] == (R.T_ERROR, "bad_request")
    [reply] = b.send(HTTP, (Op.T_ENQUEUE, 1, "nosuch", b"{}", None, "t3", True))[HTTP]
    assert reply[1:3] == (R.T_ERROR, "unknown_function")
    [reply] = b.send(HTTP, (Op.T_ENQUEUE, 1, "f", "not bytes", None, "t4", True))[HTTP]
    assert reply[1:3] == (R.T_ERROR, "bad_request")


def test_a_function_s_concurrency_holds_across_dispatchers_and_calls_go_round():
    b = BrokerClock(concurrency=2)
    for uid in ("t1", "t2", "t3"):
        b.enqueue(uid)
    out = b.send(D1, (Op.T_SUBSCRIBE, 1, 8, False))
    out.update(b.send(D2, (Op.T_SUBSCRIBE, 1, 8, False)))
    calls = [item[2] for items in out.values() for item in items if item[1] == R.T_CALL]
    assert calls == ["t1", "t2"]
    out = b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b"", None, 0))
    assert (1, R.T_NOTED, "t1", 1) in out[D1]   # the report arrived: it may be forgotten
    assert [i[2] for items in out.values() for i in items if i[1] == R.T_CALL] == ["t3"]


def test_a_dispatcher_may_only_report_its_own_calls():
    b = BrokerClock()
    b.enqueue("t1")
    b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    b.send(D2, (Op.T_SUBSCRIBE, 1, 1, False))
    b.send(D2, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b"forged", None, 0))
    [(_, _, info)] = b.send(HTTP, (Op.T_INFO, 1, "t1", True))[HTTP]
    assert info["status"] == RUNNING


def test_a_dispatcher_that_goes_away_gives_its_call_to_the_next_one():
    b = BrokerClock()
    b.enqueue("t1", {"backoff": 0})
    assert [i[2] for i in b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))[D1]] == ["t1"]
    assert b.send(D1, (Op.CLOSE, 1)) == {}, "no dispatcher left to take the retry"
    [(_, _, info)] = b.send(HTTP, (Op.T_INFO, 1, "t1", True))[HTTP]
    assert info["status"] == QUEUED and "went away" in info["error"]
    out = b.send(D2, (Op.T_SUBSCRIBE, 1, 1, False))
    assert out == {D2: [(1, R.T_CALL, "t1", 2, "http://fn/f", b'{"n":1}', 15000, None)]}
    [(_, _, info)] = b.send(HTTP, (Op.T_INFO, 1, "t1", True))[HTTP]
    assert info["attempt"] == 2 and "error" not in info, "the last attempt's error is gone"


def test_a_beanstalk_client_cannot_send_task_ops_nor_a_task_front_beanstalk_ones():
    b = BrokerClock()
    [reply] = b.send(BEANSTALK, (Op.T_INFO, 1, "t1", True))[BEANSTALK]
    assert reply == (1, R.INTERNAL_ERROR)
    [reply] = b.send(HTTP, (Op.PEEK_READY, 1))[HTTP]
    assert reply == (1, R.INTERNAL_ERROR)


def test_task_sessions_are_not_counted_as_beanstalk_connections():
    b = BrokerClock()
    [(_, _, pairs)] = b.send(BEANSTALK, (Op.STATS, 1))[BEANSTALK]
    assert dict(pairs)["current-connections"] == 1


def test_tasks_and_jobs_share_the_memory_limit_and_draining_refuses_new_tasks():
    b = BrokerClock(max_jobs_bytes=2 * TASK_OVERHEAD_BYTES + 300)
    assert b.enqueue("t1")[1] == R.T_TASK
    [reply] = b.send(BEANSTALK, (Op.PUT, 1, 0, 0, 60, b"x" * 200))[BEANSTALK]
    assert reply[1] == R.INSERTED
    assert b.enqueue("t2")[1:3] == (R.T_ERROR, "out_of_memory")
    [reply] = b.send(BEANSTALK, (Op.PUT, 1, 0, 0, 60, b"x" * 300))[BEANSTALK]
    assert reply[1] == R.OUT_OF_MEMORY
    b.broker.draining = True
    b.send(BEANSTALK, (Op.DELETE, 1, 1))
    assert b.enqueue("t3")[1:3] == (R.T_ERROR, "draining")


def test_a_listing_pages_through_tasks_in_enqueue_order_with_filters():
    c = Clock(f={}, g={})
    ids = [c.enqueue("f" if n % 2 else "g").uid for n in range(7)]
    infos, cursor = views.page(c.store, None, None, 3, 0, c.now)
    assert [i["uniqueId"] for i in infos] == ids[:3]
    infos, cursor = views.page(c.store, None, None, 3, cursor, c.now)
    assert [i["uniqueId"] for i in infos] == ids[3:6]
    infos, cursor = views.page(c.store, None, None, 3, cursor, c.now)
    assert [i["uniqueId"] for i in infos] == ids[6:] and cursor is None
    infos, _ = views.page(c.store, "f", None, 10, 0, c.now)
    assert [i["uniqueId"] for i in infos] == ids[1::2]
    c.take()
    infos, _ = views.page(c.store, None, "running", 10, 0, c.now)
    assert [i["status"] for i in infos] == ["running"]


def test_a_listing_looks_at_a_bounded_number_of_tasks_per_request(monkeypatch):
    monkeypatch.setattr(views, "PAGE_SCAN", 5)
    c = Clock()
    for _ in range(12):
        c.enqueue()
    infos, cursor = views.page(c.store, None, "success", 10, 0, c.now)
    assert infos == [] and cursor == 5, "nothing matched in 5: go on from there"
    infos, cursor = views.page(c.store, None, None, 10, cursor, c.now)
    assert len(infos) == 5 and cursor == 10


def test_the_broker_answers_a_listing_and_refuses_a_bad_one():
    b = BrokerClock()
    b.enqueue("t1")
    [reply] = b.send(HTTP, (Op.T_LIST, 1, None, None, 10, 0))[HTTP]
    assert reply[1] == R.T_LIST and [i["uniqueId"] for i in reply[2]] == ["t1"] and reply[3] is None
    [reply] = b.send(HTTP, (Op.T_LIST, 1, None, "sleeping", 10, 0))[HTTP]
    assert reply[1:3] == (R.T_ERROR, "bad_request")


def test_names_under_the_base_url_cost_nothing_once_no_task_uses_them():
    store = Tasks({}, base=FunctionSpec("", "http://fn/"), rand=lambda: 0.5)
    assert store.enqueue("a", b"{}", {"delay": -1}, T0, uid="x").code == "bad_request"
    assert store.specs == {} and store.uses == {}, "a refused enqueue keeps nothing"
    task = store.enqueue("a", b"{}", {"keepResult": 0}, T0, uid="t1")
    assert store.take("d", T0) is task and store.specs["a"].url == "http://fn/a"
    store.outcome("t1", 1, Outcome("success", 200), T0)
    store.expire(T0)
    assert store.specs == {} and store.uses == {} and store.ready == {} and store.running == {}


def test_a_function_name_cannot_climb_out_of_the_base_url():
    store = Tasks({}, base=FunctionSpec("", "http://fn/api"))
    for name in ("..", ".hidden", "a/b", ""):
        assert store.enqueue(name, b"{}", None, T0, uid="t1").code == "unknown_function"


def test_calls_spread_over_dispatchers_one_each_in_turn():
    b = BrokerClock(concurrency=100)
    b.send(D1, (Op.T_SUBSCRIBE, 1, 10, False))
    b.send(D2, (Op.T_SUBSCRIBE, 1, 10, False))
    got = []
    for n in range(6):
        b.broker.handle(HTTP, Batch([(Op.T_ENQUEUE, 1, "f", b"{}", None, f"t{n}", True)]), b.now)
        got += [p for p, m in b.broker.flush() if p in (D1, D2) and isinstance(m, Replies)]
    assert got == [D1, D2] * 3


def test_a_declined_call_puts_the_task_back_without_using_an_attempt(c):
    task = c.enqueue(options={"attempts": 0})
    c.report(c.take(), "declined")
    assert c.status(task.uid) == QUEUED and task.attempt == 0
    assert c.take() is task and task.attempt == 1


def test_a_dispatcher_busy_on_every_slot_after_a_reconnect_is_not_stopping():
    b = BrokerClock(concurrency=10)
    b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    b.enqueue("t1")
    b.enqueue("t2")
    assert b.send(D1, (Op.T_SUBSCRIBE, 1, 0, False)) == {}     # all its slots are busy
    out = b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b"", None, 0))
    assert [i[2] for i in out[D1] if i[1] == R.T_CALL] == ["t2"]


def test_every_report_is_noted_even_one_the_broker_ignores():
    b = BrokerClock()
    assert b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b"", None, 0)) == {
        D1: [(1, R.T_NOTED, "t1", 1)]}          # not subscribed, no such task
    b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    assert b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "no-such-kind", 200, b"", None, 0)) == {
        D1: [(1, R.T_NOTED, "t1", 1)]}


@pytest.mark.parametrize("status_code, retry_after_ms", [(1 << 70, 0), ("200", 0), (99, 0),
                                                         (500, 1 << 62), (500, -5)])
def test_a_malformed_report_leaves_no_task_stuck(status_code, retry_after_ms):
    b = BrokerClock()
    b.send(D1, (Op.T_SUBSCRIBE, 1, 1, False))
    b.enqueue("t1", {"attempts": 1, "backoff": 0})
    b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "failure", status_code, None, "x", retry_after_ms))
    store = b.broker.tasks
    task = store.tasks["t1"]
    timers = {seq for _, seq in [*store.calls, *store.waiting]} | set(store.by_key.values())
    assert task.seq in timers or task in timers, "a task no timer or queue will move"
    if task.status == QUEUED and task.due > b.now:      # a Retry-After: at most a year
        assert task.due - b.now <= 365 * 24 * 3600


def test_a_draining_dispatcher_finishes_its_calls_and_is_handed_no_more():
    b = BrokerClock(concurrency=10)
    b.enqueue("t1")
    b.send(D1, (Op.T_SUBSCRIBE, 1, 5, False))
    b.enqueue("t2")
    assert b.send(D1, (Op.T_SUBSCRIBE, 1, 0, True)) == {}
    b.enqueue("t3")
    out = b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b"", None, 0))
    assert out == {D1: [(1, R.T_NOTED, "t1", 1)]}, "its outcome frees no slot"
    out = b.send(D2, (Op.T_SUBSCRIBE, 1, 5, False))
    assert [i[2] for i in out[D2]] == ["t3"]


def test_a_function_gone_from_the_config_keeps_its_tasks_until_it_returns(c):
    task = c.enqueue()
    spec = c.store.functions["f"]
    c.store.configure({}, None, c.now)
    assert c.take() is None and c.status(task.uid) == QUEUED
    c.store.configure({"f": spec._replace(url="http://moved/f")}, None, c.now)
    assert c.take() is task and c.store.specs["f"].url == "http://moved/f"


# -- the [api] policy: what a request without the master key may do ------------------------
def test_by_default_an_enqueue_without_the_master_key_is_refused_and_reading_is_not():
    b = BrokerClock()
    assert b.enqueue("t1", keyed=False)[1:3] == (R.T_ERROR, "unauthorized")
    assert b.enqueue("t1")[1] == R.T_TASK
    assert b.info("t1", keyed=False)[1] == R.T_TASK


def test_public_enqueue_takes_tasks_without_the_key_but_no_options_with_them():
    b = BrokerClock(api=ApiPolicy(public_enqueue=True))
    assert b.enqueue("t1", keyed=False)[1] == R.T_TASK
    refused = b.enqueue("t2", {"delay": 1000}, keyed=False)
    assert refused[1:3] == (R.T_ERROR, "unauthorized") and "no option" in refused[3]
    assert b.info("t2")[1:3] == (R.T_ERROR, "not_found")  # nothing was enqueued
    assert b.enqueue("t3", {"delay": 1000})[1] == R.T_TASK


def test_private_results_make_reading_a_task_need_the_key():
    b = BrokerClock(api=ApiPolicy(private_results=True))
    b.enqueue("t1")
    assert b.info("t1", keyed=False)[1:3] == (R.T_ERROR, "unauthorized")
    assert b.info("t1")[1] == R.T_TASK


def test_a_new_config_changes_the_policy_at_once():
    b = BrokerClock()
    b.broker.configure_functions(TaskConfig((FunctionSpec("f", "http://fn/f"),),
                                           api=ApiPolicy(public_enqueue=True)), b.now)
    assert b.enqueue("t1", keyed=False)[1] == R.T_TASK


def test_a_new_config_sends_its_limits_to_http_fronts_and_dispatchers_only():
    b = BrokerClock()
    b.broker.configure_functions(TaskConfig((FunctionSpec("f", "http://fn/f"),),
                                            max_result_bytes=10, max_body_bytes=20), b.now)
    sent = {peer: msg for peer, msg in b.broker.flush() if isinstance(msg, Settings)}
    assert sent == {HTTP: Settings(65535, 20, 10), D1: Settings(65535, 20, 10),
                    D2: Settings(65535, 20, 10)}
    b.broker.handle(b"late", Hello(9, "http", 1, 0, []), b.now)     # and in every Welcome
    [welcome] = [msg for _, msg in b.broker.flush() if isinstance(msg, Welcome)]
    assert welcome.settings == Settings(65535, 20, 10)
