"""Cancelling a running task in the broker core, on a fake clock: it is cancelled at once,
its slots are free, its dispatcher is pushed R.T_ABORT (schema 8; an older one is sent
nothing), and the call's report, when it comes, is read only for possiblyExecuted: a
success, or for an atMostOnce task a report that the request reached the host.  The
server of an aborted call is charged nothing.  End to end, with a real host that sees its
connection close: tests/end_to_end/test_host_down_and_abort_end_to_end.py."""
from __future__ import annotations

import hashlib

from test_tasks_core import D1, D2, HTTP, BrokerClock, Clock
from test_upstream_calls import A, B, Upstream
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import CANCELLED, RUNNING, Outcome
from zstalk.broker.core.upstreams import ServerSpec
from zstalk.protocol.schema import Op, R
from zstalk.protocol.schema.messages import ABORT_SINCE


def cancel(b: BrokerClock, uid: str, token: bytes | None = None) -> dict[bytes, list]:
    return b.send(HTTP, (Op.T_CANCEL, 1, uid, token))


def running(b: BrokerClock, uid: str = "t1", **options) -> None:
    b.send(D1, (Op.T_SUBSCRIBE, 1, 4, False))
    b.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", options or None, uid, True,
                  {"token_sha256": hashlib.sha256(b"own").digest()}))
    assert b.info(uid)[2]["status"] == RUNNING


def test_cancelling_a_running_task_answers_cancelled_at_once_and_tells_its_dispatcher():
    b = BrokerClock()
    running(b)
    out = cancel(b, "t1")
    [(_, code, info)] = out[HTTP]
    assert code == R.T_TASK and info["status"] == CANCELLED
    assert out[D1] == [(1, R.T_ABORT, "t1", 1)]
    assert "possiblyExecuted" not in info


def test_the_tasks_own_token_aborts_its_call_as_the_master_key_does():
    b = BrokerClock()
    running(b)
    wrong = cancel(b, "t1", hashlib.sha256(b"other").digest())
    assert wrong[HTTP][0][1:3] == (R.T_ERROR, "forbidden") and D1 not in wrong
    out = cancel(b, "t1", hashlib.sha256(b"own").digest())
    assert out[HTTP][0][2]["status"] == CANCELLED and out[D1] == [(1, R.T_ABORT, "t1", 1)]


def test_the_slot_of_an_aborted_call_is_free_at_once_and_the_next_task_runs():
    b = BrokerClock(concurrency=1)
    running(b)
    b.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", None, "t2", True))
    assert b.info("t2")[2]["status"] == "queued"
    out = cancel(b, "t1")
    assert [item[1:3] for item in out[D1]] == [(R.T_ABORT, "t1"), (R.T_CALL, "t2")]


def test_a_late_success_is_ignored_but_recorded_as_possibly_executed():
    b = BrokerClock()
    running(b)
    cancel(b, "t1")
    noted = b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b'"ok"', None, -1, None))
    assert noted[D1] == [(1, R.T_NOTED, "t1", 1)]
    info = b.info("t1")[2]
    assert info["status"] == CANCELLED and info["possiblyExecuted"] is True
    assert "result" not in info


def test_an_aborted_report_of_an_at_least_once_task_says_nothing_more():
    b = BrokerClock()
    running(b)
    cancel(b, "t1")
    b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "unknown", None, None, "aborted", -1, None))
    assert "possiblyExecuted" not in b.info("t1")[2]


def test_an_at_most_once_task_whose_request_was_sent_shows_possibly_executed():
    for kind, status, failure, shown in (("unknown", None, None, True),
                                         ("failure", 500, None, True),
                                         ("failure", None, "error", False)):
        b = BrokerClock()
        running(b, deliveryMode="atMostOnce")
        cancel(b, "t1")
        b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, kind, status, None, "x", -1,
                    {"failure": failure} if failure else None))
        assert b.info("t1")[2].get("possiblyExecuted", False) is shown, (kind, status)


def test_a_dispatcher_older_than_version_8_is_sent_no_abort_and_its_call_runs_on():
    b = BrokerClock()
    b.broker.tasking.old_peers[D1] = ABORT_SINCE - 1
    running(b)
    out = cancel(b, "t1")
    assert out[HTTP][0][2]["status"] == CANCELLED and D1 not in out
    b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b'"ok"', None, -1, None))
    assert b.info("t1")[2]["possiblyExecuted"] is True


def test_a_finished_task_is_still_not_cancellable():
    b = BrokerClock()
    running(b)
    b.send(D1, (Op.T_OUTCOME, 1, "t1", 1, "success", 200, b'"ok"', None, -1, None))
    out = cancel(b, "t1")
    assert out[HTTP][0][1:3] == (R.T_ERROR, "not_cancellable") and D2 not in out


def test_an_aborted_call_is_no_failure_of_its_server_and_frees_its_connection():
    u = Upstream(ServerSpec(A, max_conns=1), ServerSpec(B))
    first, second = u.enqueue(2)
    taken = u.take()
    assert u.server(taken) == A
    peer = u.store.upstream.groups["gpu"].peers[0]
    assert u.store.cancel(taken.uid, u.now) is taken
    assert (peer.conns, peer.fails) == (0, 0)
    u.end(taken, "unknown", error="aborted", failure="")
    assert peer.fails == 0, "its late report counts nothing either"


def test_an_aborted_probe_of_a_shut_host_neither_reopens_nor_charges_it():
    c = Clock(f={"concurrency": 5, "fail_timeout_s": 10.0})
    first, second = c.enqueue(options={"attempts": 0}), c.enqueue(options={"attempts": 0})
    c.report(c.take(), "failure", error="refused", failure="error")
    c.advance(10)
    probe = c.take()
    c.store.cancel(probe.uid, c.now)
    c.report(probe, "unknown", error="aborted")
    assert c.take() is None and second.status == "queued"
    assert views.function_stats(c.store, "f", c.now)["host"]["fails"] == 1
    assert probe.status == CANCELLED and not probe.possibly_executed
