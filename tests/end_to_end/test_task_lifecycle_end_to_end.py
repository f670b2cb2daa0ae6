"""expected_duration and keep_result_after_read end to end (issue 45 items 2 and 4): a real
`zstalk serve` on free ports with docs/tasks.md's lifecycle.toml as written (its
keep_result_after_read shortened to a second, a function of the test's beside it).  The
second visitor of a fresh room with expected_duration gets a waitTime in its 201, of a
room without none; a finished task read with its token is gone (404) a second after
the read, one only listed, or read by id alone, is not.  The broker's side on a fake
clock, and the binlog: tests/core/test_task_lifecycle.py, tests/wal/test_tasks_binlog.py."""
from __future__ import annotations

import time

import pytest

from servers import self_check, wait_for
from test_task_limits_end_to_end import docs_block
from test_waiting_room_end_to_end import call, serve

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = "s3cret-master-key"
MASTER = {"Authorization": f"Bearer {KEY}"}
#: a room like checkout, without expected_duration
PLAIN = '''
[functions.plain]
online = "only"
concurrency = 1
'''


@pytest.fixture
def shop(tmp_path):
    config = docs_block("tasks.md", "# lifecycle.toml").replace(
        'keep_result_after_read = "20s"', 'keep_result_after_read = "1s"')
    assert 'keep_result_after_read = "1s"' in config
    served = serve(tmp_path, "1/s", 1, "--master-key", KEY, config_text=config + PLAIN)
    yield served.base
    served.server.stop()


def visit(base: str, function: str = "checkout") -> dict:
    code, _, body = call("POST", f"{base}/v1/tasks", {"function": function, "type": "online"})
    assert code == 201, body
    return body


def done(base: str, visitor: dict) -> None:
    code, _, info = call("POST", f"{base}/v1/tasks/{visitor['uniqueId']}/done", {},
                         {"Authorization": f"Bearer {visitor['pass']}"})
    assert code == 200 and info["status"] == "success", info


def test_a_fresh_room_with_expected_duration_has_a_wait_time_in_its_first_queued_201(shop):
    for function, wait in (("checkout", 180_000), ("plain", None)):
        first, second = visit(shop, function), visit(shop, function)
        assert first["status"] == "admitted" and "waitTime" not in first, first
        assert second["status"] == "queued" and second["waitNum"] == 0, second
        assert second.get("waitTime") == wait, (function, second)


def test_a_task_read_with_its_token_is_gone_after_keep_result_after_read_a_listed_one_not(
        shop):
    visitors = []
    for _ in range(3):                  # (each admitted at once: the slot is free again)
        visitors.append(visit(shop))
        done(shop, visitors[-1])
    read, listed, by_id = visitors
    url = f"{shop}/v1/tasks/{{}}".format
    code, _, info = call("GET", url(read["uniqueId"]),
                         headers={"Authorization": f"Bearer {read['token']}"})
    assert code == 200 and info["status"] == "success"
    was_read = time.monotonic()
    code, _, page = call("GET", f"{shop}/v1/tasks?function=checkout", headers=MASTER)
    assert code == 200 and {t["uniqueId"] for t in page["tasks"]} >= {
        listed["uniqueId"], by_id["uniqueId"]}
    assert call("GET", url(by_id["uniqueId"]))[0] == 200       # (no key: private_results off)
    assert wait_for(lambda: call("GET", url(read["uniqueId"]), headers=MASTER)[0] == 404, 10)
    assert time.monotonic() - was_read >= 0.9, "gone a second after the read, not before"
    for visitor in (listed, by_id):
        code, _, info = call("GET", f"{shop}/v1/tasks/{visitor['uniqueId']}",
                             headers={"Authorization": f"Bearer {visitor['token']}"})
        assert code == 200 and info["status"] == "success", "kept its keepResult"
