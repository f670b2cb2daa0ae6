"""A plain url's host in the task store, with a fake clock: a call that never reached it
puts its task back in its place without spending an attempt; its host is counted as nginx
counts a server (broker/core/tasks/components/hosts.py), so while it is shut its
functions' tasks wait in place, spending nothing, until one probe call reopens it;
`max_fails = 0` keeps the old fail-fast."""
from __future__ import annotations

from test_tasks_core import T0, WALL
from zstalk.broker.config_file import ConfigError, functions
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.components.hosts import Hosts
from zstalk.broker.core.tasks.store import (FAILED, QUEUED, RUNNING, SUCCESS, FunctionSpec,
                                            Outcome, Tasks)

import pytest

REFUSED = Outcome("failure", error="could not connect to http://fn:3000/f: refused",
                  failure="error")
CONNECT_TIMEOUT = Outcome("failure", error="could not connect within 5000 ms",
                          failure="timeout")
NO_ANSWER = Outcome("unknown", error="no answer within 15000 ms", failure="timeout")
OK = Outcome("success", 200, b"{}")


class Host:
    """A store whose functions `f` (and `g`, on the same host) call http://fn:3000."""

    def __init__(self, **spec) -> None:
        spec = {"concurrency": 10, **spec}
        self.store = Tasks({"f": FunctionSpec("f", "http://fn:3000/f", **spec),
                            "g": FunctionSpec("g", "http://fn:3000/g", **spec),
                            "other": FunctionSpec("other", "http://elsewhere/o", **spec)},
                           wall_offset=WALL, rand=lambda: 0.5)
        self.now, self.n = T0, 0

    def enqueue(self, function: str = "f", count: int = 1, **options):
        tasks = []
        for _ in range(count):
            self.n += 1
            tasks.append(self.store.enqueue(function, b"{}", options or None, self.now,
                                            uid=f"t{self.n}"))
        return tasks

    def take(self):
        return self.store.take("d", self.now)

    def end(self, task, outcome: Outcome) -> bool:
        return self.store.outcome(task.uid, task.attempt, outcome, self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.store.expire(self.now)


def test_a_refused_call_puts_its_task_back_in_its_place_without_spending_an_attempt():
    h = Host()
    first, second = h.enqueue(count=2, attempts=0)
    h.end(h.take(), REFUSED)
    assert (first.status, first.attempt, first.error) == (QUEUED, 0, REFUSED.error)
    assert h.store.lines.wait_num(first) == 0 and h.store.lines.wait_num(second) == 1


def test_while_the_host_is_shut_its_tasks_wait_and_one_probe_reopens_it_after_fail_timeout():
    h = Host(fail_timeout_s=10.0)
    tasks = h.enqueue(count=5, attempts=0)
    h.end(h.take(), REFUSED)
    assert h.take() is None, "the host is shut: nothing is handed out"
    h.advance(9.9)
    assert h.take() is None
    h.advance(0.1)
    probe = h.take()
    assert probe is tasks[0] and h.take() is None, "one probe, the others wait"
    h.end(probe, OK)
    started = [h.take() for _ in range(4)]
    assert started == tasks[1:] and all(t.status == RUNNING for t in started)
    for task in started:
        h.end(task, OK)
    assert [(t.status, t.attempt) for t in tasks] == [(SUCCESS, 1)] * 5


def test_a_failed_probe_shuts_the_host_for_another_fail_timeout():
    h = Host(fail_timeout_s=2.0)
    task, = h.enqueue(attempts=0)
    h.end(h.take(), REFUSED)
    h.advance(2.0)
    h.end(h.take(), CONNECT_TIMEOUT)
    assert task.attempt == 0
    h.advance(1.9)
    assert h.take() is None
    h.advance(0.1)
    assert h.take() is task


def test_a_waiting_function_spends_no_rate_token_while_its_host_is_shut():
    h = Host(rate=1, per_s=1.0, fail_timeout_s=5.0)
    tasks = h.enqueue(count=3, attempts=0)
    h.end(h.take(), REFUSED)
    gate = h.store.limits.gates["f"]
    tat = gate.tat
    for _ in range(4):
        h.advance(1.0)
        assert h.take() is None
    assert gate.tat == tat, "no start, no token"
    h.advance(1.0)
    assert h.take() is tasks[0]


def test_the_functions_under_one_host_share_its_state_and_another_host_is_not_held():
    h = Host()
    f, = h.enqueue("f")
    g, = h.enqueue("g")
    o, = h.enqueue("other")
    h.end(h.take(), REFUSED)
    assert h.take() is o, "g waits with f: the same scheme, host and port"
    assert g.status == QUEUED and f.status == QUEUED


def test_a_successful_probe_lets_every_function_on_the_host_go_at_once():
    h = Host(fail_timeout_s=10.0)
    f1, f2 = h.enqueue("f", count=2)
    g, = h.enqueue("g")
    h.end(h.take(), REFUSED)
    h.advance(3.0)
    assert h.take() is None
    h.advance(7.0)
    probe = h.take()
    assert h.take() is None
    h.end(probe, OK)
    assert {h.take(), h.take()} == {f2, g}


def test_a_call_that_may_have_run_spends_its_attempt_and_still_shuts_the_host():
    h = Host()
    sent, waiting = h.enqueue(count=2, attempts=1, backoff=0)
    h.end(h.take(), NO_ANSWER)
    assert (sent.status, sent.attempt) == (QUEUED, 1), "a retry, as before"
    assert h.take() is None, "the host timed out: shut"
    assert views.function_stats(h.store, "f", h.now)["host"] == {
        "url": "http://fn:3000", "state": "failed", "fails": 1, "usableAt": h.now + 10 + WALL}


def test_with_max_fails_above_one_the_host_shuts_at_the_max_and_refused_calls_still_wait():
    h = Host(max_fails=3)
    tasks = h.enqueue(count=4, attempts=0)
    for _ in range(3):
        h.end(h.take(), REFUSED)
    assert h.take() is None and all(t.attempt == 0 for t in tasks)


def test_max_fails_zero_keeps_the_old_fail_fast():
    h = Host(max_fails=0)
    first, second = h.enqueue(count=2, attempts=0)
    h.end(h.take(), REFUSED)
    assert (first.status, first.attempt) == (FAILED, 1)
    assert h.take() is second, "nothing is counted against the host"
    assert "host" not in views.function_stats(h.store, "f", h.now)


def test_a_status_the_function_does_not_list_neither_counts_nor_waits():
    h = Host()
    first, second = h.enqueue(count=2, attempts=0)
    h.end(h.take(), Outcome("failure", 500, error="HTTP 500"))
    assert first.status == FAILED and h.take() is second


def test_a_listed_status_shuts_the_host_but_spends_the_attempt():
    h = Host(next_upstream=frozenset({"error", "timeout", "http_502"}))
    first, second = h.enqueue(count=2, attempts=0)
    h.end(h.take(), Outcome("failure", 502, error="HTTP 502"))
    assert first.status == FAILED and h.take() is None and second.status == QUEUED


def test_a_report_that_does_not_say_how_it_failed_spends_its_attempt_and_shuts_nothing():
    h = Host()
    first, second = h.enqueue(count=2, attempts=0)
    h.end(h.take(), Outcome("failure", error="could not connect"))   # (a version-3 dispatcher)
    assert first.status == FAILED and h.take() is second


def test_a_probe_that_says_nothing_of_the_host_neither_reopens_nor_charges_it():
    h = Host(fail_timeout_s=1.0)
    h.enqueue(count=2)
    h.end(h.take(), REFUSED)
    for said in (Outcome("declined", error="the dispatcher is stopping"),
                 Outcome("unknown", error="the dispatcher went away", failure="")):
        h.advance(1.0)
        h.end(h.take(), said)
        assert h.take() is None, said
        assert h.store.limits.hosts.failing["http://fn:3000"].fails == 1


def test_a_success_started_before_the_failure_does_not_reopen_the_host():
    h = Host()
    early, late, waiting = h.enqueue(count=3)
    early, late = h.take(), h.take()
    h.end(late, REFUSED)
    h.end(early, OK)
    assert h.take() is None, "nginx: only a pick after the failure can reset fails"


def test_hosts_fill_in_the_default_port_and_tell_schemes_apart():
    hosts = Hosts()
    assert hosts.origin("http://fn/f") == hosts.origin("http://fn:80/g") == "http://fn:80"
    assert hosts.origin("https://fn/f") == "https://fn:443"
    assert hosts.origin("http://[::1]:3000/f") == "http://[::1]:3000"


def test_the_config_reads_max_fails_and_fail_timeout_per_function_with_nginx_defaults():
    config = functions({"max_fails": 2, "f": {"url": "http://a/f"},
                        "g": {"url": "http://a/g", "max_fails": 0, "fail_timeout": "30s"}})
    specs = {s.name: s for s in config.named}
    assert (specs["f"].max_fails, specs["f"].fail_timeout_s) == (2, 10.0)
    assert (specs["g"].max_fails, specs["g"].fail_timeout_s) == (0, 30.0)
    with pytest.raises(ConfigError, match=r"\[functions.f\]: max_fails"):
        functions({"f": {"url": "http://a/f", "max_fails": -1}}, "zstalk.toml")
    with pytest.raises(ConfigError, match=r"\[functions.f\]: fail_timeout"):
        functions({"f": {"url": "http://a/f", "fail_timeout": "0s"}}, "zstalk.toml")
