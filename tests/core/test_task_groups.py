"""Tenant groups (issue 44) in the task store, on a fake clock: a task's `group` option,
how it is shown and kept; the rotation that serves a function's groups in turn and every
task's waitNum under it (a Hypothesis model of the hand-out order: test_rotation_model.py)."""
from __future__ import annotations

import pytest

from zstalk.broker.core.tasks import views
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
