"""Tenant groups (issue 44) in the task store, on a fake clock: a task's `group` option,
how it is shown and kept; the rotation that serves a function's groups in turn and every
task's waitNum under it (a Hypothesis model of the hand-out order: test_rotation_model.py)."""
from __future__ import annotations

import pytest
from sortedcontainers import SortedList

from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.components.rotation import Rotation
from zstalk.broker.core.tasks.enqueue import allowed
from zstalk.broker.core.tasks.store import ApiPolicy, FunctionSpec, TaskError
from zstalk.broker.core.shared import Admission
from zstalk.protocol.schema.task_messages import TaskEnqueue

from test_tasks_core import Clock


@pytest.fixture
def c() -> Clock:
    return Clock()


def info(c: Clock, uid: str) -> dict:
    return views.info(c.store, uid, c.now)


# -- the option ------------------------------------------------------------------------------
def test_a_task_enqueued_with_a_group_keeps_it_and_its_info_shows_it(c):
    task = c.enqueue(options={"group": "acme-corp:eu@1.x_y"})
    assert task.group == "acme-corp:eu@1.x_y"
    assert info(c, task.uid)["group"] == "acme-corp:eu@1.x_y"


def test_a_task_enqueued_without_a_group_is_in_the_group_of_no_name_and_shows_none(c):
    task = c.enqueue()
    assert task.group == ""
    assert "group" not in info(c, task.uid)


@pytest.mark.parametrize("group", ["", "a b", "a/b", "x" * 65, 7, None, ["acme"]])
def test_a_group_outside_its_pattern_is_a_400_and_enqueues_nothing(c, group):
    error = c.enqueue(options={"group": group})
    assert isinstance(error, TaskError) and error.code == "bad_request"
    assert "group must be 1 to 64 characters" in error.message
    assert not c.store.tasks


def test_only_the_master_key_sets_a_group():
    order = TaskEnqueue("f", b"{}", {"group": "acme"}, "t1", keyed=False)
    refused = allowed(order, lambda name: FunctionSpec(name, "http://fn/f"),
                      ApiPolicy(public_enqueue=True), Admission(0))
    assert isinstance(refused, TaskError) and refused.code == "unauthorized"


# -- the rotation ----------------------------------------------------------------------------
def put(c: Clock, group: str | None, **options):
    if group is not None:
        options["group"] = group
    return c.enqueue(options=options or None)


def handed_out(c: Clock) -> list[str]:
    """Take every task there is (each call succeeds at once), in order."""
    uids = []
    while (task := c.take()) is not None:
        uids.append(task.uid)
        c.report(task, "success")
    return uids


def wait_nums(c: Clock) -> dict[str, int]:
    return {uid: info(c, uid)["waitNum"] for uid, task in c.store.tasks.items()
            if task.status == "queued"}


@pytest.fixture
def many() -> Clock:
    return Clock(f={"concurrency": 1000}, g={"concurrency": 1000})


def test_groups_are_served_in_turn_one_task_each_in_the_order_they_joined(many):
    for group in ("acme", "acme", "acme", "beta", "beta", None):
        put(many, group)        # t1-t3 acme, t4-t5 beta, t6 the group ""
    assert wait_nums(many) == {"t1": 0, "t4": 1, "t6": 2, "t2": 3, "t5": 4, "t3": 5}
    assert handed_out(many) == ["t1", "t4", "t6", "t2", "t5", "t3"]


def test_levels_come_first_across_groups_and_each_group_sends_its_best_by_priority(many):
    put(many, "acme", priority=5)           # t1
    put(many, "acme", priority=1)           # t2
    put(many, "beta", priority=0)           # t3
    put(many, "beta", level=2, priority=9)  # t4
    put(many, "acme", level=2, priority=9)  # t5
    assert handed_out(many) == ["t4", "t5", "t2", "t3", "t1"]


def test_a_group_whose_first_task_becomes_due_joins_at_the_end_of_the_round(many):
    put(many, "acme"), put(many, "acme"), put(many, "beta"), put(many, "beta")  # t1-t4
    put(many, "gamma", delay=1000)          # t5: due in a second
    first = many.take()
    assert first.uid == "t1"
    many.report(first, "success")
    many.advance(1.0)                       # gamma joins: after beta, before acme's next
    assert wait_nums(many) == {"t3": 0, "t5": 1, "t2": 2, "t4": 3}
    assert handed_out(many) == ["t3", "t5", "t2", "t4"]


def test_a_group_whose_best_task_is_cancelled_keeps_its_turn(many):
    for group in ("acme", "acme", "beta"):
        put(many, group)                    # t1, t2 acme; t3 beta
    many.store.cancel("t1", many.now)
    assert wait_nums(many) == {"t2": 0, "t3": 1}
    assert handed_out(many) == ["t2", "t3"]


def test_a_task_not_due_yet_is_told_its_place_as_if_it_were_due_now(many):
    put(many, None), put(many, None)                    # t1, t2: the group ""
    put(many, "acme", delay=5000)                       # t3: would follow t1
    put(many, None, delay=5000, priority=0)             # t4: would be first
    assert wait_nums(many) == {"t1": 0, "t2": 1, "t3": 1, "t4": 0}
    many.advance(5.0)
    assert wait_nums(many) == {"t4": 0, "t3": 1, "t1": 2, "t2": 3}
    assert handed_out(many) == ["t4", "t3", "t1", "t2"]


def test_a_function_without_groups_keeps_its_plain_line_and_one_with_them_a_rotation(many):
    put(many, None)
    assert type(many.store.ready["f"]) is SortedList
    put(many, "acme")
    assert type(many.store.ready["f"]) is Rotation
    assert handed_out(many) == ["t1", "t2"]
    put(many, None)                         # (its line ran out: plain again)
    assert type(many.store.ready["f"]) is SortedList


def test_across_functions_the_hand_out_compares_each_functions_next_task(many):
    many.enqueue("f", {"group": "acme", "priority": 1})     # t1
    many.enqueue("f", {"group": "acme", "priority": 2})     # t2
    many.enqueue("f", {"group": "beta", "priority": 9})     # t3
    many.enqueue("g", {"priority": 5})                      # t4
    # f's rotation sends t1, then beta's t3 (9): g's t4 (5) goes before it
    assert handed_out(many) == ["t1", "t4", "t3", "t2"]


# -- what GET /v1/functions/{name} shows of them ----------------------------------------------
def groups_of(c: Clock, name: str = "f"):
    return views.function_stats(c.store, name, c.now).get("groups")


def test_a_functions_stats_count_its_named_groups_and_show_the_busiest_with_their_calls():
    c = Clock(f={"concurrency": 1})
    put(c, "acme"), put(c, "acme", delay=5000), put(c, "beta"), put(c, None)
    assert groups_of(c) == {"count": 2, "busiest": [         # (queued: due and delayed)
        {"group": "acme", "queued": 2, "running": 0},
        {"group": "beta", "queued": 1, "running": 0}]}
    running = c.take()
    assert running.uid == "t1" and groups_of(c)["busiest"][0] == {
        "group": "acme", "queued": 1, "running": 1}
    c.report(running, "failure")            # a retry: queued again (its backoff)
    assert groups_of(c)["busiest"][0] == {"group": "acme", "queued": 2, "running": 0}
    c.store.cancel("t3", c.now)
    assert groups_of(c) == {"count": 1, "busiest": [
        {"group": "acme", "queued": 2, "running": 0}]}


def test_a_function_without_named_groups_shows_none_and_the_busiest_are_ten():
    c = Clock(f={"concurrency": 1})
    put(c, None)
    assert groups_of(c) is None
    for n in range(12):
        for _ in range(n + 1):
            put(c, f"g{n}", delay=1000)
    shown = groups_of(c)
    assert shown["count"] == 12
    assert [g["group"] for g in shown["busiest"]] == [f"g{n}" for n in range(11, 1, -1)]


# -- max_groups ------------------------------------------------------------------------------
def test_a_task_of_one_group_more_than_max_groups_is_refused_until_a_group_has_none_left():
    c = Clock(f={"max_groups": 2})
    put(c, "acme"), put(c, "beta")
    refused = put(c, "gamma")
    assert isinstance(refused, TaskError) and refused.code == "too_many_groups"
    assert "max_groups" in refused.message and "t3" not in c.store.tasks
    assert put(c, "acme").uid == "t4" and put(c, None).uid == "t5"  # (known, and none)
    c.store.cancel("t2", c.now)             # beta has none left: room for another
    assert put(c, "gamma").uid == "t6"


def test_max_groups_comes_from_the_config_at_10000_unless_set(tmp_path):
    from zstalk.broker import config_file as cf
    path = tmp_path / "z.toml"
    path.write_text('[functions]\nbase_url = "http://h:1"\nmax_groups = 3\n'
                    '[functions.f]\n[functions.g]\nmax_groups = 5\n')
    config = cf.load(str(path))
    specs = {s.name: s for s in config.named}
    assert (specs["f"].max_groups, specs["g"].max_groups) == (3, 5)
    path.write_text('[functions.f]\nurl = "http://h:1/f"\n')
    assert cf.load(str(path)).named[0].max_groups == 10_000


# -- group_by = "client" ---------------------------------------------------------------------
def from_ip(c: Clock, ip: str | None, options=None):
    c.n += 1
    return c.store.enqueue("f", b"{}", options, c.now, uid=f"t{c.n}", client_ip=ip)


def test_with_group_by_client_a_task_without_a_group_is_in_its_client_address_group():
    c = Clock(f={"group_by": "client", "concurrency": 1000})
    a = from_ip(c, "10.0.0.1")
    b = from_ip(c, "2001:db8:1:2::7")
    b2 = from_ip(c, "2001:db8:1:2:ffff::1")         # (the same /64)
    mapped = from_ip(c, "::ffff:10.0.0.1")
    chosen = from_ip(c, "10.0.0.1", {"group": "acme"})      # (the option wins)
    nobody = from_ip(c, None)
    assert [t.group for t in (a, b, b2, mapped, chosen, nobody)] == [
        "10.0.0.1", "2001:db8:1:2::", "2001:db8:1:2::", "10.0.0.1", "acme", ""]
    assert info(c, "t2")["group"] == "2001:db8:1:2::"
    assert handed_out(c) == ["t1", "t2", "t5", "t6", "t4", "t3"]


def test_without_group_by_a_tasks_client_address_makes_no_group(c):
    assert from_ip(c, "10.0.0.1").group == ""


@pytest.mark.parametrize("group_by, header", [
    ("client", None), ("header:X-Tenant", "x-tenant"), ("header:tenant_id.v2", "tenant_id.v2"),
    ("", None)])
def test_group_by_takes_client_a_header_name_or_nothing(tmp_path, group_by, header):
    from zstalk.broker import config_file as cf
    path = tmp_path / "z.toml"
    path.write_text(f'[functions.f]\nurl = "http://h:1/f"\ngroup_by = "{group_by}"\n')
    spec = cf.load(str(path)).named[0]
    assert (spec.group_by, spec.group_header) == (group_by, header)


@pytest.mark.parametrize("group_by", ["header:", "header:X Tenant", "header:X:T", "Header:X",
                                      "ip", 7])
def test_group_by_with_anything_else_is_refused_naming_the_file_and_the_key(tmp_path, group_by):
    from zstalk.broker import config_file as cf
    path = tmp_path / "z.toml"
    value = f'"{group_by}"' if isinstance(group_by, str) else group_by
    path.write_text(f'[functions.f]\nurl = "http://h:1/f"\ngroup_by = {value}\n')
    with pytest.raises(cf.ConfigError, match=r"z\.toml: \[functions\.f\]: group_by is "
                                             r"\"client\", \"header:NAME\""):
        cf.load(str(path))
