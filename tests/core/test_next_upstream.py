"""Next upstream within an attempt, with a fake clock: a failed call on an upstream's
server moves to a server its attempt has not tried, as nginx's proxy_next_upstream,
_tries and _timeout say (broker/core/upstreams/next.py, broker/core/tasks/moves.py),
spending no attempt, keeping its slot, taking its rate's turn."""
from __future__ import annotations

import pytest

from test_tasks_core import T0, WALL
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import (FAILED, MOVED, QUEUED, RUNNING, SUCCESS,
                                            FunctionSpec, Outcome, Tasks)
from zstalk.broker.core.upstreams import ServerSpec, UpstreamGroup, UpstreamSpec
from zstalk.broker.core.upstreams.next import failure_class, may_move, tries

A, B, C, D = (f"http://10.0.0.{i}:8000" for i in range(1, 5))
REFUSED = Outcome("failure", error="could not connect", failure="error", sent=False)
TIMED_OUT = Outcome("unknown", error="no answer", failure="timeout")
OK = Outcome("success", 200, b"{}")


class Upstream:
    """A store whose function `gen` is on upstream `gpu`; `report` is a dispatcher's."""

    def __init__(self, *servers: ServerSpec, **spec) -> None:
        self.function = FunctionSpec("gen", "", spec.pop("concurrency", 10), upstream="gpu",
                                     path="/generate", **spec)
        self.store = Tasks({"gen": self.function}, wall_offset=WALL, rand=lambda: 0.5,
                           upstreams=(UpstreamSpec("gpu", servers),))
        self.now = T0

    def enqueue(self, uid: str = "t1", **options):
        return self.store.enqueue("gen", b"{}", options or None, self.now, uid=uid)

    def server(self, task) -> str:
        return self.store.call_url(task, self.function).removesuffix("/generate")

    def report(self, task, result: Outcome, move: int | None = None, moves: bool = True):
        """The dispatcher "d" reports the call (its move number as the T_CALL said)."""
        move = max(0, len(task.tried) - 1) if move is None else move
        return self.store.outcome(task.uid, task.attempt, result._replace(move=move),
                                  self.now, holder="d", moves=moves)

    def moved(self) -> list:
        return self.store.moves.take_ready()

    def info(self, task) -> dict:
        return views.info(self.store, task.uid, self.now)


def test_a_refused_call_moves_to_the_next_server_and_spends_no_attempt():
    u = Upstream(ServerSpec(A), ServerSpec(B))
    task = u.enqueue(attempts=0)
    assert u.store.take("d", u.now) is task and u.server(task) == A
    assert u.report(task, REFUSED) == MOVED
    assert u.moved() == [task] and u.server(task) == B
    assert (task.status, task.attempt) == (RUNNING, 1)
    assert u.report(task, OK) is True
    info = u.info(task)
    assert (info["status"], info["calls"], info["upstreamAddr"]) == (SUCCESS, 1, f"{A}, {B}")


def test_a_move_keeps_its_slot_and_gets_a_fresh_call_timeout():
    u = Upstream(ServerSpec(A), ServerSpec(B), concurrency=1)
    task = u.enqueue(timeout=10_000)
    u.store.take("d", u.now)
    first_deadline = task.deadline
    u.now += 4
    u.enqueue("t2")
    u.report(task, REFUSED)
    assert u.store.running == {"gen": 1}, "the moved call holds the function's one slot"
    assert u.store.take("d", u.now) is None
    assert task.deadline == pytest.approx(first_deadline + 4)


def test_an_attempt_never_goes_back_to_a_server_it_tried_and_ends_when_none_is_left():
    u = Upstream(ServerSpec(A, max_fails=0), ServerSpec(B, max_fails=0),
                 ServerSpec(C, max_fails=0))
    task = u.enqueue(attempts=1, backoff=0)
    u.store.take("d", u.now)
    servers = [u.server(task)]
    while u.report(task, REFUSED) == MOVED:
        u.moved()
        servers.append(u.server(task))
    assert sorted(servers) == [A, B, C]
    assert (task.status, task.attempt) == (QUEUED, 1), "the attempt failed: a retry is due"
    assert u.info(task)["upstreamAddr"] == ", ".join(servers)


@pytest.mark.parametrize("limit, servers", [(2, 2), (0, 4), (9, 4)])
def test_next_upstream_tries_caps_the_servers_one_attempt_tries(limit, servers):
    u = Upstream(*(ServerSpec(url, max_fails=0) for url in (A, B, C, D)),
                 next_upstream_tries=limit)
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    while u.report(task, REFUSED) == MOVED:
        u.moved()
    assert task.status == FAILED and len(task.tried) == servers


def test_off_moves_nothing_and_a_dispatcher_without_moves_gets_none():
    u = Upstream(ServerSpec(A), ServerSpec(B), next_upstream=frozenset({"off"}))
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    assert u.report(task, REFUSED) is True and task.status == FAILED
    v = Upstream(ServerSpec(A), ServerSpec(B))
    task = v.enqueue(attempts=0)
    v.store.take("d", v.now)
    assert v.report(task, REFUSED, moves=False) is True and task.status == FAILED


@pytest.mark.parametrize("delivery, sent, moves", [
    ("atLeastOnce", True, True),        # idempotent by its contract
    ("atMostOnce", True, False),        # it may have run: never twice
    ("atMostOnce", False, True),        # nothing left: another server may take it
])
def test_whether_a_call_whose_request_may_have_been_sent_moves_is_its_delivery_modes(
        delivery, sent, moves):
    u = Upstream(ServerSpec(A), ServerSpec(B))
    task = u.enqueue(attempts=0, deliveryMode=delivery)
    u.store.take("d", u.now)
    assert (u.report(task, TIMED_OUT._replace(sent=sent)) == MOVED) is moves


@pytest.mark.parametrize("listed, moves", [(("error", "timeout"), False),
                                           (("error", "timeout", "http_502"), True)])
def test_a_status_moves_its_call_only_when_next_upstream_lists_it(listed, moves):
    u = Upstream(ServerSpec(A), ServerSpec(B), next_upstream=frozenset(listed))
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    assert (u.report(task, Outcome("failure", 502, error="HTTP 502")) == MOVED) is moves


def test_no_move_once_next_upstream_timeout_has_passed_since_the_attempt_began():
    u = Upstream(ServerSpec(A), ServerSpec(B), ServerSpec(C), next_upstream_timeout_ms=5000)
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    u.now += 3
    assert u.report(task, REFUSED) == MOVED
    u.moved()
    u.now += 2
    assert u.report(task, REFUSED) is True and task.status == FAILED
    assert len(task.tried) == 2


def test_a_move_waits_for_a_shut_rate_gate_holding_its_slot_within_the_timeout():
    u = Upstream(ServerSpec(A), ServerSpec(B), rate=1, per_s=2.0, concurrency=1,
                 next_upstream_timeout_ms=5000)
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    assert u.report(task, REFUSED) == MOVED and u.moved() == []
    assert u.store.running == {"gen": 1}
    assert u.store.next_deadline() == pytest.approx(u.now + 2.0)
    u.now += 2.0
    u.store.expire(u.now)
    assert u.moved() == [task] and u.server(task) == B
    assert u.report(task, REFUSED) is True and task.status == FAILED


def test_a_waiting_move_that_finds_no_server_when_its_gate_opens_ends_its_attempt():
    u = Upstream(ServerSpec(A), ServerSpec(B), rate=1, per_s=2.0)
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    assert u.report(task, REFUSED) == MOVED
    group = u.store.upstream.groups["gpu"]
    group.pause(group.peers[1], u.now + 60)       # (B asked to be left alone meanwhile)
    u.now += 2.0
    u.store.expire(u.now)
    assert u.moved() == [] and task.status == FAILED
    assert task.error == REFUSED.error and u.store.running == {}


def test_a_move_whose_gate_opens_after_next_upstream_timeout_ends_its_attempt_at_once():
    u = Upstream(ServerSpec(A), ServerSpec(B), rate=1, per_s=10.0,
                 next_upstream_timeout_ms=5000)
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    assert u.report(task, REFUSED) is True and task.status == FAILED


def test_a_late_report_of_the_server_an_attempt_left_is_not_taken_for_the_moved_call():
    u = Upstream(ServerSpec(A), ServerSpec(B))
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    u.report(task, REFUSED)
    u.moved()
    assert u.report(task, REFUSED, move=0) is False, "(a resent report of A's call)"
    assert task.status == RUNNING and u.report(task, OK) is True


def test_a_group_of_one_server_never_moves():
    u = Upstream(ServerSpec(A))
    task = u.enqueue(attempts=0)
    u.store.take("d", u.now)
    assert u.report(task, REFUSED) is True and task.status == FAILED


def test_a_move_takes_the_backup_once_every_primary_was_tried():
    group = UpstreamGroup(UpstreamSpec("u", (ServerSpec(A), ServerSpec(B),
                                             ServerSpec(C, backup=True))))
    a = group.pick(None, 0)
    b = group.pick(None, 0, tried=[a])
    c = group.pick(None, 0, tried=[a, b])
    assert [p.url for p in (a, b, c)] == [A, B, C]
    assert group.pick(None, 0, tried=[a, b, c]) is None
    assert not any(p.down for p in group.peers), "the tried are down for one pick only"


def test_nginx_counts_tries_from_the_servers_that_are_not_down():
    servers = [ServerSpec(A), ServerSpec(B, down=True), ServerSpec(C, backup=True)]
    assert (tries(servers, 0), tries(servers, 1)) == (2, 1)
    assert failure_class("failure", None, 502) == "http_502"
    assert failure_class("unknown", "", None) is None, "the broker's own verdict"
    assert not may_move(frozenset({"error"}), "error", False, False, 1, 1, 0.0, 0.0, 5.0)


# -- through the broker: the move is a T_CALL to the same dispatcher, in the same slot ----
def broker_with_upstream():
    from test_tasks_core import D1, HTTP
    from zstalk.broker.core.broker import Broker, Config
    from zstalk.protocol.schema import Batch, Hello, Op
    broker = Broker(Config(functions=(FunctionSpec("gen", "", 10, upstream="gpu", path="/g"),),
                           upstreams=(UpstreamSpec("gpu", (ServerSpec(A), ServerSpec(B))),)), T0)
    for peer, kind, front_id in ((HTTP, "http", 1), (D1, "dispatcher", 2)):
        broker.handle(peer, Hello(front_id, kind, 1, 0, []), T0)
        broker.handle(peer, Batch([(Op.OPEN, 1)]), T0)
    broker.handle(HTTP, Batch([(Op.T_ENQUEUE, 1, "gen", b"{}", {"attempts": 0}, uid, True)
                               for uid in ("t1", "t2")]), T0)
    broker.flush()
    return broker


def replies_to(broker, peer, *ops) -> list:
    from zstalk.protocol.schema import Batch, Replies
    broker.handle(peer, Batch(list(ops)), T0)
    return [item for p, msg in broker.flush() if p == peer and isinstance(msg, Replies)
            for item in msg.items]


@pytest.mark.parametrize("version, moves", [(8, True), (7, False)])
def test_a_dispatcher_of_schema_8_gets_the_move_in_the_same_slot_and_an_older_one_none(
        version, moves):
    from test_tasks_core import D1
    from zstalk.protocol.schema import Op, R
    broker = broker_with_upstream()
    if version < 8:
        broker.old_peers[D1] = version          # (the actor's note of an older peer)
    [call] = [r for r in replies_to(broker, D1, (Op.T_SUBSCRIBE, 1, 1, False)) if r[1] == R.T_CALL]
    assert call[2:5] == ("t1", 1, A + "/g")
    refused = REFUSED.fields()
    out = replies_to(broker, D1, (Op.T_OUTCOME, 1, "t1", 1, *refused))
    moved = [r for r in out if r[1] == R.T_CALL]
    assert (R.T_NOTED, "t1", 1) in [r[1:4] for r in out]
    if moves:       # (its one slot stays with the moved call: t2 is not pushed)
        assert [m[2:5] + (m[7],) for m in moved] == [("t1", 1, B + "/g", {
            "result_headers": [], "move": 1, "pool": ["gpu", 32, 60_000, 1000]})]
        assert broker.tasks.tasks["t1"].status == RUNNING
    else:           # (the slot is free again: t2 takes it)
        assert [m[2] for m in moved] == ["t2"] and broker.tasks.tasks["t1"].status == FAILED


def test_a_task_cancelled_while_its_move_waits_for_the_rate_gives_its_dispatcher_the_slot_back():
    from test_tasks_core import D1, HTTP
    from zstalk.broker.core.broker import Broker, Config
    from zstalk.protocol.schema import Batch, Hello, Op, R
    broker = Broker(Config(functions=(FunctionSpec("gen", "", 10, rate=1, per_s=2.0,
                                                   upstream="gpu", path="/g",
                                                   next_upstream_timeout_ms=5000),),
                           upstreams=(UpstreamSpec("gpu", (ServerSpec(A), ServerSpec(B))),)), T0)
    for peer, kind, front_id in ((HTTP, "http", 1), (D1, "dispatcher", 2)):
        broker.handle(peer, Hello(front_id, kind, 1, 0, []), T0)
        broker.handle(peer, Batch([(Op.OPEN, 1)]), T0)
    broker.handle(HTTP, Batch([(Op.T_ENQUEUE, 1, "gen", b"{}", {"attempts": 0}, uid, True)
                               for uid in ("t1", "t2")]), T0)
    broker.flush()
    [call] = [r for r in replies_to(broker, D1, (Op.T_SUBSCRIBE, 1, 1, False)) if r[1] == R.T_CALL]
    assert call[2] == "t1"
    out = replies_to(broker, D1, (Op.T_OUTCOME, 1, "t1", 1, *REFUSED.fields()))
    assert [r for r in out if r[1] == R.T_CALL] == []       # (the move waits for the gate)
    assert broker.tasks.moves.is_waiting(broker.tasks.tasks["t1"])
    broker.handle(HTTP, Batch([(Op.T_CANCEL, 1, "t1")]), T0)
    to_dispatcher = [item for p, msg in broker.flush() if p == D1 for item in msg.items]
    assert [r for r in to_dispatcher if r[1] == R.T_ABORT] == []    # (no call runs there)
    assert broker.tasks.tasks["t1"].status == "cancelled"
    broker.expire(T0 + 2.0)                                  # (the gate opens: t2 takes the slot)
    pushed = [item for p, msg in broker.flush() if p == D1 for item in msg.items]
    assert [r[2] for r in pushed if r[1] == R.T_CALL] == ["t2"]


@pytest.mark.parametrize("version, ext", [(8, {"result_headers": [],
                                              "pool": ["gpu", 32, 60_000, 1000]}), (7, None)])
def test_a_dispatcher_of_schema_8_is_told_the_upstreams_pool_and_an_older_one_is_not(
        version, ext):
    from test_tasks_core import D1
    from zstalk.protocol.schema import Op, R
    broker = broker_with_upstream()
    if version < 8:
        broker.old_peers[D1] = version
    [call] = [r for r in replies_to(broker, D1, (Op.T_SUBSCRIBE, 1, 1, False)) if r[1] == R.T_CALL]
    assert call[7] == ext
