"""Functions on an upstream in the task store, with a fake clock: the broker picks the
server of every call (nginx's methods, broker/core/upstreams), counts failures as
next_upstream says, holds a function back while no server is usable and fails an
attempt only when every server is down (broker/core/tasks/components/upstream_calls.py)."""
from __future__ import annotations

import pytest

from test_tasks_core import T0, WALL
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import (FAILED, QUEUED, SUCCESS, FunctionSpec, Outcome,
                                            Tasks)
from zstalk.broker.core.upstreams import ServerSpec, UpstreamSpec

A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


class Upstream:
    """A store whose function `gen` (at path /generate) is on upstream `gpu`."""

    def __init__(self, *servers: ServerSpec, balance: str = "round_robin", key=None,
                 concurrency: int = 100, **spec) -> None:
        self.specs = (UpstreamSpec("gpu", servers, balance, key),)
        self.function = FunctionSpec("gen", "", concurrency, upstream="gpu", path="/generate",
                                     **spec)
        self.store = Tasks({"gen": self.function}, wall_offset=WALL, rand=lambda: 0.5,
                           upstreams=self.specs)
        self.now, self.n = T0, 0

    def enqueue(self, count: int = 1, params: bytes = b"{}", client_ip=None, **options):
        tasks = []
        for _ in range(count):
            self.n += 1
            tasks.append(self.store.enqueue("gen", params, options or None, self.now,
                                            uid=f"t{self.n}", client_ip=client_ip))
        return tasks

    def take(self):
        return self.store.take("d", self.now)

    def server(self, task) -> str:
        return self.store.call_url(task, self.function).removesuffix("/generate")

    def call(self, kind: str = "success", **outcome) -> str | None:
        """Take one task, end its call; the server it went to."""
        task = self.take()
        if task is None:
            return None
        server = self.server(task)
        self.end(task, kind, **outcome)
        return server

    def end(self, task, kind: str = "success", **outcome) -> None:
        defaults = {"status_code": 200, "result": b"{}"} if kind == "success" else {}
        self.store.outcome(task.uid, task.attempt, Outcome(kind, **{**defaults, **outcome}),
                           self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.store.expire(self.now)


def test_calls_go_round_the_servers_by_smooth_weighted_round_robin():
    u = Upstream(ServerSpec(A, weight=5), ServerSpec(B), ServerSpec(C))
    u.enqueue(14)
    picks = [u.call() for _ in range(14)]
    assert "".join("abc"[[A, B, C].index(p)] for p in picks) == "aabacaa" * 2   # nginx's


def test_the_call_goes_to_the_servers_url_and_the_functions_path():
    u = Upstream(ServerSpec(A))
    [task] = u.enqueue()
    assert u.take() is task
    assert u.store.call_url(task, u.function) == A + "/generate"


def test_a_server_that_refuses_connections_is_skipped_for_fail_timeout_then_probed_once():
    u = Upstream(ServerSpec(A, fail_timeout_s=10.0), ServerSpec(B))
    u.enqueue(20, attempts=3, backoff=0)
    assert u.call("failure", failure="error", error="could not connect") == A
    assert [u.call() for _ in range(4)] == [B] * 4
    u.advance(10.0)
    # usable again: its lowered effective weight comes back one per pick, so the probe
    # is among the next calls, not necessarily the first
    probe = []
    for _ in range(3):                              # A still refuses; B answers
        task = u.take()
        probe.append(u.server(task))
        u.end(task, *(("failure",) if probe[-1] == A else ()),
              **({"failure": "error"} if probe[-1] == A else {}))
    assert probe.count(A) == 1, probe
    assert [u.call() for _ in range(3)] == [B] * 3, "a failed probe shuts it again"
    u.advance(10.0)
    assert A in [u.call() for _ in range(3)]
    assert {u.call() for _ in range(4)} == {A, B}, "a good probe opens it"
    stats = views.function_stats(u.store, "gen", u.now)
    assert stats["upstream"] == "gpu"
    assert stats["servers"][0] == {"url": A, "state": "usable", "inFlight": 0, "fails": 0,
                                   "lastError": "could not connect"}


@pytest.mark.parametrize("listed, counted", [(("error", "timeout"), False),
                                             (("error", "timeout", "http_502"), True)])
def test_a_status_counts_against_its_server_only_when_next_upstream_lists_it(listed, counted):
    u = Upstream(ServerSpec(A), ServerSpec(B), next_upstream=frozenset(listed))
    u.enqueue(4, attempts=3, backoff=0)
    assert u.call("failure", status_code=502, error="HTTP 502") == A
    assert [u.call() for _ in range(2)] == ([B, B] if counted else [B, A])


def test_a_call_the_broker_gave_up_on_is_not_its_servers_failure():
    u = Upstream(ServerSpec(A), ServerSpec(B))
    u.enqueue(4, attempts=3, backoff=0)
    task = u.take()
    u.store.lost("d", u.now)                        # the dispatcher went away
    assert task.status == QUEUED
    assert [u.call() for _ in range(3)] == [B, A, B]


def test_every_server_failed_holds_the_function_back_spending_nothing_until_one_is_usable():
    u = Upstream(ServerSpec(A, fail_timeout_s=5.0), ServerSpec(B, fail_timeout_s=8.0))
    first, second, waiting = u.enqueue(3)
    u.end(u.take(), "failure", failure="error")
    u.end(u.take(), "failure", failure="timeout")
    assert (first.attempt, second.attempt) == (1, 1) and first.status == QUEUED
    assert u.take() is None
    assert waiting.attempt == 0 and waiting.status == QUEUED
    assert u.store.next_deadline() == pytest.approx(T0 + 5.0), "the timer, not a poll"
    u.advance(5.0)
    assert u.server(u.take()) == A


def test_every_server_down_fails_the_attempt_with_no_live_upstreams():
    u = Upstream(ServerSpec(A, down=True), ServerSpec(B, down=True))
    [task] = u.enqueue(attempts=1, backoff=1000)
    assert u.take() is None
    assert (task.status, task.attempt, task.error) == (QUEUED, 1, "no live upstreams")
    u.advance(1.0)
    assert u.take() is None and task.status == FAILED


def test_max_conns_bounds_each_server_whoever_asks_and_a_full_group_waits_for_a_call_end():
    u = Upstream(ServerSpec(A, max_conns=2), ServerSpec(B, max_conns=2), ServerSpec(C, max_conns=2))
    u.enqueue(8)
    running = [u.store.take(f"d{i % 4}", u.now) for i in range(8)]
    assert running[6:] == [None, None]
    assert sorted(u.server(t) for t in running[:6]) == [A, A, B, B, C, C]
    assert u.store.next_deadline() is None or u.store.next_deadline() > u.now + 1
    freed = u.server(running[1])
    u.end(running[1])
    nxt = u.take()
    assert nxt is not None and u.server(nxt) == freed


def test_a_429_with_retry_after_pauses_that_server_only():
    u = Upstream(ServerSpec(A), ServerSpec(B))
    [task, *_] = u.enqueue(4)
    u.end(u.take(), "failure", status_code=429, retry_after_ms=30000, error="HTTP 429")
    assert task.status == QUEUED and task.attempt == 0, "back in its place, nothing spent"
    assert [u.call() for _ in range(3)] == [B, B, B]
    states = {s["url"]: s["state"] for s in views.function_stats(u.store, "gen", u.now)["servers"]}
    assert states == {A: "paused", B: "usable"}
    assert "pausedUntil" not in views.function_stats(u.store, "gen", u.now)


def test_the_hash_key_is_taken_at_enqueue_from_the_params_and_keeps_a_key_on_one_server():
    u = Upstream(ServerSpec(A), ServerSpec(B), ServerSpec(C), balance="hash",
                 key="params.user")
    for user in ("ann", "bob", "cy", "dee"):
        u.enqueue(3, params=b'{"user": "%s"}' % user.encode())
        assert len({u.call() for _ in range(3)}) == 1
    [keyless] = u.enqueue(params=b'{"other": 1}')
    assert keyless.balance_key is None          # (round robin for it)


def test_a_reload_keeps_a_servers_state_while_its_url_stays():
    u = Upstream(ServerSpec(A, fail_timeout_s=60.0), ServerSpec(B))
    u.enqueue(4, attempts=3, backoff=0)
    u.call("failure", failure="error")
    u.store.configure({"gen": u.function}, None, u.now, (UpstreamSpec(
        "gpu", (ServerSpec(A, fail_timeout_s=60.0), ServerSpec(B), ServerSpec(C))),))
    assert [u.call() for _ in range(3)] == [B, C, B], "A is still failed"
    assert [s["state"] for s in views.function_stats(u.store, "gen", u.now)["servers"]] == [
        "failed", "usable", "usable"]


def test_clients_address_is_kept_and_shown_to_the_master_key_only():
    u = Upstream(ServerSpec(A), ServerSpec(B), balance="ip_hash")
    [task] = u.enqueue(client_ip="127.3.4.1")
    assert task.balance_key == "127.3.4.1"
    assert views.info(u.store, task.uid, u.now, keyed=True)["clientIp"] == "127.3.4.1"
    assert "clientIp" not in views.info(u.store, task.uid, u.now)
    assert u.call() in (A, B) and task.status == SUCCESS


def two_functions(**limits) -> Tasks:
    spec = UpstreamSpec("gpu", (ServerSpec(A), ServerSpec(B)), **limits)
    functions = {n: FunctionSpec(n, "", 10, upstream="gpu", path=f"/{n}") for n in ("f", "g")}
    return Tasks(functions, wall_offset=WALL, upstreams=(spec,), started_at=T0)


def test_an_upstreams_concurrency_holds_for_all_its_functions_together():
    store = two_functions(concurrency=3)
    for i in range(4):
        store.enqueue("f", b"{}", None, T0, uid=f"f{i}")
        store.enqueue("g", b"{}", None, T0, uid=f"g{i}")
    running = [store.take("d", T0) for _ in range(4)]
    assert running[3] is None and len({t.function for t in running[:3]}) == 2
    store.outcome(running[0].uid, 1, Outcome("success", 200, b"{}"), T0)
    assert store.take("d", T0) is not None, "a call's end lets the next one of either start"
    assert store.take("d", T0) is None


def test_an_upstreams_rate_holds_for_all_its_functions_together():
    store = two_functions(rate=2)                       # 2 a second, so one per 0.5 s
    for i in range(3):
        store.enqueue("f", b"{}", None, T0, uid=f"f{i}")
        store.enqueue("g", b"{}", None, T0, uid=f"g{i}")
    starts = []
    now = T0
    while now < T0 + 2.6:
        while (task := store.take("d", now)) is not None:
            starts.append(round(now - T0, 6))
            store.outcome(task.uid, 1, Outcome("success", 200, b"{}"), now)
        wake = store.next_deadline()
        if wake is None:
            break
        now = max(now, wake)
        store.expire(now)
    assert starts == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]


def test_a_call_in_flight_when_a_reload_moves_its_function_ends_on_the_upstream_it_went_to():
    store = two_functions(concurrency=1)
    store.enqueue("f", b"{}", None, T0, uid="f1")
    store.enqueue("g", b"{}", None, T0, uid="g1")
    running = store.take("d", T0)
    moved = {"f": FunctionSpec("f", "http://elsewhere/f", 10),
             "g": FunctionSpec("g", "", 10, upstream="gpu", path="/g")}
    store.configure(moved, None, T0)
    store.outcome(running.uid, 1, Outcome("success", 200, b"{}"), T0)
    assert store.upstream.running == {} and all(p.conns == 0
                                                for p in store.upstream.groups["gpu"].peers)
    assert store.take("d", T0) is not None, "the upstream's one slot is free again"


def test_params_that_cannot_be_encoded_are_no_hash_key():
    from zstalk.broker.core.tasks.components.upstream_calls import _param
    assert _param('{"user": "\\ud800"}'.encode("utf-8", "surrogatepass"), "user") is None
    assert _param(b'{"user": "ann"}', "user") == "ann"
