"""Each group's own limits within its function (issue 44), in the task store on a fake
clock: group_concurrency and group_rate pass a group over in its place, it has its turn
where the rotation stands once it is free, the broker's timer wakes when a group's gate
opens, waitNum stays what it would be if every group could start now, and what is kept
of a group's limits goes with its calls.  The config keys, and group_by = "header:…"."""
from __future__ import annotations

import pytest

from zstalk.broker import config_file as cf
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import TaskError

from test_tasks_core import Clock

SPEC = {"concurrency": 1000, "timeout_ms": 600_000}


def put(c: Clock, group: str | None, **options):
    if group is not None:
        options["group"] = group
    return c.enqueue(options=options or None)


def take_all(c: Clock) -> list:
    """Every task a dispatcher may take now (left running)."""
    out = []
    while (task := c.take()) is not None:
        out.append(task)
    return out


def uids(tasks) -> list[str]:
    return [t.uid for t in tasks]


def wait_nums(c: Clock) -> dict[str, int]:
    return {uid: views.info(c.store, uid, c.now)["waitNum"]
            for uid, task in c.store.tasks.items() if task.status == "queued"}


def kept(c: Clock) -> tuple:
    limits = c.store.group_limits
    return limits.running, limits.gates, limits.shut_at


# -- group_concurrency -------------------------------------------------------------------------
def test_a_group_at_its_group_concurrency_is_passed_over_and_the_others_go_on():
    c = Clock(f={**SPEC, "group_concurrency": 2})
    for group in ("acme",) * 4 + ("beta",) * 2:
        put(c, group)                       # t1-t4 acme, t5-t6 beta
    assert uids(take_all(c)) == ["t1", "t5", "t2", "t6"]
    assert c.take() is None                 # acme has 2 calls, beta none left queued
    c.report(c.store.tasks["t1"], "success")
    assert uids(take_all(c)) == ["t3"]


def test_a_group_held_back_keeps_its_place_and_once_free_has_one_turn_per_round():
    c = Clock(f={**SPEC, "group_concurrency": 1})
    for group in ("acme",) * 4 + ("beta",) * 4 + ("gamma",) * 4:
        put(c, group)                       # t1-t4 acme, t5-t8 beta, t9-t12 gamma
    assert uids(take_all(c)) == ["t1", "t5", "t9"]
    for _ in range(2):                      # beta and gamma go on; acme's call lasts
        for task in list(c.store.tasks.values()):
            if task.status == "running" and task.group != "acme":
                c.report(task, "success")
        take_all(c)
    assert {t.uid for t in c.store.tasks.values() if t.status == "running"} == {
        "t1", "t7", "t11"}
    # every group could start now: acme's next at its place in the round going on
    assert wait_nums(c) == {"t2": 0, "t8": 1, "t12": 2, "t3": 3, "t4": 4}
    c.report(c.store.tasks["t1"], "success")
    c.report(c.store.tasks["t7"], "success")
    c.report(c.store.tasks["t11"], "success")
    order = []
    while (task := c.take()) is not None:   # each call ends at once: one turn each
        order.append(task.uid)
        c.report(task, "success")
    assert order == ["t2", "t8", "t12", "t3", "t4"]


def test_a_group_freed_after_the_turn_passed_it_waits_for_the_turn_to_come_round():
    c = Clock(f={**SPEC, "group_concurrency": 1})
    for group in ("acme", "acme", "beta", "beta", "beta", "gamma", "gamma", "gamma"):
        put(c, group)                       # t1-t2 acme, t3-t5 beta, t6-t8 gamma
    assert uids(take_all(c)) == ["t1", "t3", "t6"]
    c.report(c.store.tasks["t3"], "success")
    assert uids(take_all(c)) == ["t4"]      # (acme passed over: its call lasts)
    c.report(c.store.tasks["t1"], "success")
    c.report(c.store.tasks["t6"], "success")
    # the round going on is at gamma: gamma, then acme, then beta (still running)
    assert wait_nums(c) == {"t7": 0, "t2": 1, "t5": 2, "t8": 3}
    assert uids(take_all(c)) == ["t7", "t2"]


def test_a_function_without_named_groups_holds_its_group_of_no_name_to_the_limit_too():
    c = Clock(f={**SPEC, "group_concurrency": 2})
    for _ in range(4):
        put(c, None)
    assert uids(take_all(c)) == ["t1", "t2"]
    c.report(c.store.tasks["t2"], "success")
    assert uids(take_all(c)) == ["t3"]
    assert wait_nums(c) == {"t4": 0}


def test_levels_come_first_but_a_held_back_group_of_a_higher_level_holds_up_no_one():
    c = Clock(f={**SPEC, "group_concurrency": 1})
    put(c, "acme", level=2), put(c, "acme", level=2), put(c, "beta")    # t1, t2, t3
    assert uids(take_all(c)) == ["t1", "t3"]
    assert wait_nums(c) == {"t2": 0}


# -- group_rate ---------------------------------------------------------------------------------
def test_a_group_whose_gate_is_shut_is_passed_over_and_the_timer_wakes_when_it_opens():
    c = Clock(f={**SPEC, "group_rate": 2, "group_burst": 1})     # T = 0.5 s, 2 at once
    for group in ("acme",) * 4 + ("beta",) * 2:
        put(c, group)                       # t1-t4 acme, t5-t6 beta
    started = take_all(c)
    assert uids(started) == ["t1", "t5", "t2", "t6"]
    for task in started:
        c.report(task, "success")
    assert c.take() is None
    assert c.store.next_deadline() == pytest.approx(c.now + 0.5, abs=0.003)
    c.advance(0.49)
    assert c.take() is None
    c.advance(0.01)
    assert uids(take_all(c)) == ["t3"]
    c.advance(0.5)
    assert uids(take_all(c)) == ["t4"]


def test_the_starts_of_a_group_in_any_window_stay_within_its_gcra_bound():
    c = Clock(f={**SPEC, "group_rate": 5, "group_burst": 2})     # T = 0.2 s
    for n in range(30):
        put(c, "acme" if n % 3 else "beta")
    starts: dict[str, list[float]] = {"acme": [], "beta": []}
    for _ in range(100):                    # 5 s on the fake clock, 50 ms a step
        for task in take_all(c):
            starts[task.group].append(c.now)
            c.report(task, "success")
        c.advance(0.05)
    for times in starts.values():
        for i, t in enumerate(times):       # burst + 1 + floor(window / T), window 1 s
            assert sum(t <= u <= t + 1.0 for u in times[i:]) <= 2 + 1 + 5


def test_a_group_that_is_both_full_and_shut_waits_for_both():
    c = Clock(f={**SPEC, "group_concurrency": 1, "group_rate": 1})
    put(c, "acme"), put(c, "acme")
    [first] = take_all(c)
    c.advance(1.0)                          # its gate opens: still its call runs
    assert c.take() is None
    c.report(first, "success")
    assert uids(take_all(c)) == ["t2"]


# -- waitNum ------------------------------------------------------------------------------------
def test_wait_num_is_the_place_if_every_group_could_start_now_whatever_holds_one_back():
    free = Clock(f=SPEC)
    held = Clock(f={**SPEC, "group_concurrency": 1, "group_rate": 1})
    for c in (free, held):
        for group in ("acme", "acme", "acme", "beta", "beta", None):
            put(c, group)
        first = c.take()
        assert first.uid == "t1"
    assert wait_nums(held) == wait_nums(free) == {"t4": 0, "t6": 1, "t2": 2, "t5": 3, "t3": 4}


# -- what is kept -------------------------------------------------------------------------------
def test_a_groups_count_and_gate_go_once_it_has_no_call_and_its_gate_is_full_again():
    c = Clock(f={**SPEC, "group_concurrency": 3, "group_rate": 10, "group_burst": 5})
    for n in range(200):
        put(c, f"g{n}")
    running = take_all(c)
    assert len(running) == 200 and len(c.store.group_limits.gates) == 200
    for task in running:
        c.report(task, "success")
    assert c.store.group_limits.running == {}
    c.advance(0.2)                          # every TAT (now + T at the start) has passed
    assert kept(c) == ({}, {}, {}) and not c.store.group_limits.timers


def test_a_shut_gate_of_a_group_with_nothing_queued_is_dropped_once_it_opens():
    c = Clock(f={**SPEC, "group_rate": 1})
    put(c, "acme")
    c.report(c.take(), "success")
    assert set(c.store.group_limits.shut_at) == {("f", "acme")}
    c.advance(1.0)
    assert kept(c) == ({}, {}, {})


# -- a new config, a restart --------------------------------------------------------------------
def test_a_new_config_with_a_group_concurrency_counts_the_calls_already_in_flight():
    from zstalk.broker.core.tasks.store import FunctionSpec
    c = Clock(f=SPEC)
    for _ in range(4):
        put(c, "acme")
    assert len(take_all(c)) == 4            # (no group limits: not counted)
    c.store.configure({"f": FunctionSpec("f", "http://fn/f", **SPEC, group_concurrency=5)},
                      None, c.now)
    assert c.store.group_limits.running == {("f", "acme"): 4}
    put(c, "acme"), put(c, "acme")
    assert uids(take_all(c)) == ["t5"]
    c.store.configure({"f": FunctionSpec("f", "http://fn/f", **SPEC)}, None, c.now)
    assert uids(take_all(c)) == ["t6"] and c.store.group_limits.running == {}


# -- the config ---------------------------------------------------------------------------------
def load(tmp_path, text: str):
    path = tmp_path / "z.toml"
    path.write_text(text)
    return {spec.name: spec for spec in cf.load(str(path)).named}


def test_the_group_limits_are_read_beside_the_functions_own_and_none_by_default(tmp_path):
    specs = load(tmp_path, '[functions]\nbase_url = "http://h:1"\ngroup_concurrency = 2\n'
                           'group_rate = "5/s"\ngroup_burst = 3\n[functions.f]\n'
                           '[functions.g]\ngroup_rate = "30/m"\n[functions.h]\n'
                           'group_concurrency = 7\ngroup_burst = 0\n')
    f, g, h = specs["f"], specs["g"], specs["h"]
    assert (f.group_concurrency, f.group_rate, f.group_per_s, f.group_burst) == (2, 5, 1.0, 3)
    assert (g.group_rate, g.group_per_s, g.group_interval) == (30, 60.0, 2.0)
    assert (h.group_concurrency, h.group_rate, h.group_burst) == (7, 5, 0)
    plain = load(tmp_path, '[functions.f]\nurl = "http://h:1/f"\n')["f"]
    assert (plain.group_concurrency, plain.group_rate, plain.group_burst) == (0, 0, 0)


@pytest.mark.parametrize("line, message", [
    ("group_concurrency = 0", "group_concurrency must be an integer from 1 to 100000"),
    ("group_concurrency = \"2\"", "group_concurrency must be an integer"),
    ("group_rate = \"5\"", "group_rate: a rate is \"N/s\""),
    ("group_rate = \"0/s\"", "group_rate: a rate is"),
    ("group_burst = -1", "group_burst must be an integer from 0"),
])
def test_a_bad_group_limit_is_refused_naming_the_file_and_the_key(tmp_path, line, message):
    with pytest.raises(cf.ConfigError, match=r"z\.toml: \[functions\.f\]: ") as refused:
        load(tmp_path, f'[functions.f]\nurl = "http://h:1/f"\n{line}\n')
    assert message in str(refused.value)


def test_a_functions_stats_show_its_group_limits():
    c = Clock(f={**SPEC, "group_concurrency": 2, "group_rate": 30, "group_per_s": 60.0,
                 "group_burst": 1})
    stats = views.function_stats(c.store, "f", c.now)
    assert (stats["groupConcurrency"], stats["groupRate"], stats["groupBurst"]) == (2, "30/m", 1)
    assert "groupRate" not in views.function_stats(Clock().store, "f", c.now)


# -- group_by = "header:…" ----------------------------------------------------------------------
def from_headers(c: Clock, headers: dict | None, options=None):
    c.n += 1
    return c.store.enqueue("f", b"{}", options, c.now, uid=f"t{c.n}", client_ip="10.0.0.1",
                           headers=headers)


def test_with_group_by_a_header_a_task_is_in_the_group_its_value_names():
    c = Clock(f={**SPEC, "group_by": "header:X-Tenant"})
    assert from_headers(c, {"x-tenant": "acme"}).group == "acme"
    assert from_headers(c, None).group == ""                # no such header: none
    assert from_headers(c, {"x-other": "beta"}).group == ""
    assert from_headers(c, {"x-tenant": "acme"}, {"group": "beta"}).group == "beta"


@pytest.mark.parametrize("value", ["", "a b", "a/b", "x" * 65, "ümlaut"])
def test_a_header_value_no_group_may_have_is_a_400_naming_the_header(value):
    c = Clock(f={**SPEC, "group_by": "header:X-Tenant"})
    error = from_headers(c, {"x-tenant": value})
    assert isinstance(error, TaskError) and error.code == "bad_request"
    assert "X-Tenant" in error.message and "1 to 64 characters" in error.message
    assert not c.store.tasks


def test_the_broker_tells_http_fronts_the_group_headers_and_groups_an_enqueue_by_its_value():
    from zstalk.protocol.schema import Op, R
    from zstalk.protocol.schema.task_messages import TaskEnqueue
    from test_tasks_core import HTTP, BrokerClock
    b = BrokerClock(group_by="header:X-Tenant", concurrency=10)
    assert b.broker.settings().group_headers == ["x-tenant"]
    for uid, headers, options in (("a", {"x-tenant": "acme"}, None), ("n", None, None),
                                  ("o", {"x-tenant": "acme"}, {"group": "beta"})):
        op = TaskEnqueue("f", b"{}", options, uid, True, headers=headers).op(1)
        [(_, code, _)] = b.send(HTTP, op)[HTTP]
        assert code == R.T_TASK
    assert [b.broker.tasks.tasks[uid].group for uid in "ano"] == ["acme", "", "beta"]
    op = TaskEnqueue("f", b"{}", None, "bad", True, headers={"x-tenant": "a b"}).op(1)
    [(_, code, error, message)] = b.send(HTTP, op)[HTTP]
    assert (code, error) == (R.T_ERROR, "bad_request") and "X-Tenant" in message
    assert BrokerClock().broker.settings().group_headers == []
