"""A task's own token end to end (issue 45): real `zstalk serve` processes with a master
key, and a broker with a binlog behind a front of its own (the digest crosses ZeroMQ).
The 201 carries the token (and each item of an array's answer); Bearer zt1_... reads,
cancels or leaves that task only, another task's token and a wrong one are 403, and the
master key and requests without Authorization are answered as before; a visitor who
leaves frees the place at once; an online task admitted in its enqueue's turn gets its
pass in the 201; a restart with the binlog keeps the token as its digest only.  The
broker's side on a fake clock: tests/core/test_task_tokens.py."""
from __future__ import annotations

import re

import pytest

from servers import self_check, wait_for
from test_waiting_room_end_to_end import FUNCTION, call, serve, split

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = "s3cret-master-key"
MASTER = {"Authorization": f"Bearer {KEY}"}
TOKEN = re.compile(r"zt1_[A-Za-z0-9_-]{43}")
#: a room of one slot, no rate (the second visitor waits), and an offline function whose
#: calls go nowhere (its tasks are delayed: they stay queued)
CONFIG = f'''
[functions.{FUNCTION}]
online = "only"
concurrency = 1
pass_ttl = "60s"
online_heartbeat = "60s"
max_waiting_per_client = 100
admit_url = "https://shop.example/in"

[functions.report]
url = "http://127.0.0.1:9/report"
'''


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def later(base: str) -> dict:
    """An offline task, delayed a minute (the master key sets options)."""
    code, _, body = call("POST", f"{base}/v1/tasks", {"function": "report",
                                                      "options": {"delay": 60_000}}, MASTER)
    assert code == 201, body
    return body


def visitor(base: str) -> dict:
    code, _, body = call("POST", f"{base}/v1/tasks", {"function": FUNCTION, "type": "online"})
    assert code == 201, body
    return body


@pytest.fixture
def shop(tmp_path):
    served = serve(tmp_path, "1/s", 1, "--master-key", KEY, config_text=CONFIG)
    yield served.base
    served.server.stop()


def test_the_201_carries_a_token_that_reads_and_cancels_its_task_and_no_other(shop):
    mine, other = later(shop), later(shop)
    assert TOKEN.fullmatch(mine["token"]) and mine["token"] != other["token"]
    assert mine["status"] == "queued" and mine["createdAt"].endswith("Z")
    url = f"{shop}/v1/tasks/{mine['uniqueId']}"
    code, _, info = call("GET", url, headers=bearer(mine["token"]))
    assert code == 200 and info["createdAt"] == mine["createdAt"], "as the 201 said"
    for wrong in (other["token"], "zt1_" + "A" * 43, mine["token"][:-1]):
        for method in ("GET", "DELETE"):
            code, headers, body = call(method, url, headers=bearer(wrong))
            assert (code, body["error"]) == (403, "forbidden"), (method, wrong)
            assert headers["Content-Type"].startswith("application/json")
    code, _, info = call("DELETE", url, headers=bearer(mine["token"]))
    assert code == 200 and info["status"] == "cancelled"
    code, _, body = call("DELETE", url, headers=bearer(mine["token"]))
    assert (code, body["error"]) == (409, "not_cancellable")
    code, _, info = call("GET", f"{shop}/v1/tasks/{other['uniqueId']}")
    assert code == 200 and info["status"] == "queued", "the other task is untouched"


def test_the_master_key_and_requests_without_authorization_are_answered_as_before(shop):
    task = later(shop)
    url = f"{shop}/v1/tasks/{task['uniqueId']}"
    assert call("GET", url)[0] == 200, "reading by id needs no key"
    code, _, body = call("DELETE", url)
    assert (code, body["error"]) == (401, "unauthorized")
    code, _, body = call("DELETE", url, headers=bearer("not-the-key"))
    assert (code, body["message"]) == (403, "wrong master key")
    code, _, info = call("DELETE", url, headers=MASTER)
    assert code == 200 and info["status"] == "cancelled"


def test_a_token_is_not_a_pass_for_done_or_verify(shop):
    admitted = visitor(shop)
    code, _, _ = call("POST", f"{shop}/v1/tasks/{admitted['uniqueId']}/done", {},
                      bearer(admitted["token"]))
    assert code == 403
    code, _, _ = call("GET", f"{shop}/v1/passes/verify?function={FUNCTION}",
                      headers=bearer(admitted["token"]))
    assert code in (401, 403)
    code, _, _ = call("POST", f"{shop}/v1/tasks/{admitted['uniqueId']}/done", {},
                      bearer(admitted["pass"]))
    assert code == 200, "its pass does"


def test_an_online_task_admitted_at_once_gets_its_pass_in_the_201_as_a_get_shows_it(shop):
    first, second = visitor(shop), visitor(shop)
    assert first["status"] == "admitted" and first["pass"].startswith("zp1.")
    assert first["admitUrl"] == f"https://shop.example/in#zstalk_pass={first['pass']}"
    code, _, info = call("GET", f"{shop}/v1/tasks/{first['uniqueId']}")
    assert code == 200 and {k: info[k] for k in ("pass", "passExpiresAt", "admitUrl",
                                                   "createdAt")} == {
        k: first[k] for k in ("pass", "passExpiresAt", "admitUrl", "createdAt")}
    code, _, _ = call("GET", f"{shop}/v1/passes/verify?function={FUNCTION}",
                      headers=bearer(first["pass"]))
    assert code == 204, "the 201's pass opens the gate"
    assert (second["status"], second["waitNum"]) == ("queued", 0) and "pass" not in second


def test_a_visitor_who_leaves_with_its_token_moves_everyone_behind_up_at_once(shop):
    users = [visitor(shop) for _ in range(4)]
    places = [call("GET", f"{shop}/v1/tasks/{u['uniqueId']}")[2].get("waitNum") for u in users]
    assert places == [None, 0, 1, 2]
    code, _, body = call("DELETE", f"{shop}/v1/tasks/{users[1]['uniqueId']}",
                         headers=bearer(users[2]["token"]))
    assert code == 403, "another visitor's token does not make it leave"
    code, _, info = call("DELETE", f"{shop}/v1/tasks/{users[1]['uniqueId']}",
                         headers=bearer(users[1]["token"]))
    assert code == 200 and info["status"] == "cancelled"
    after = [call("GET", f"{shop}/v1/tasks/{u['uniqueId']}",
                  headers=bearer(u["token"]))[2]["waitNum"] for u in users[2:]]
    assert after == [0, 1], "each moved up by one, at once"
    code, _, info = call("DELETE", f"{shop}/v1/tasks/{users[0]['uniqueId']}",
                         headers=bearer(users[0]["token"]))
    assert code == 200 and info["status"] == "cancelled", "the admitted one leaves too"
    assert wait_for(lambda: call("GET", f"{shop}/v1/tasks/{users[2]['uniqueId']}")[2][
        "status"] == "admitted", 5), "its slot went to the next"


def test_each_item_of_an_arrays_answer_carries_its_own_token(shop):
    code, _, items = call("POST", f"{shop}/v1/tasks",
                          [{"function": "report", "options": {"delay": 60_000}}] * 2
                          + [{"function": "nosuch"}], MASTER)
    assert code == 200 and [i["status"] for i in items] == [201, 201, 404]
    assert all(TOKEN.fullmatch(i["token"]) for i in items[:2]) and "token" not in items[2]
    assert items[0]["createdAt"].endswith("Z")
    first, second = items[:2]
    assert call("GET", f"{shop}/v1/tasks/{first['uniqueId']}", headers=bearer(
        first["token"]))[0] == 200
    assert call("GET", f"{shop}/v1/tasks/{first['uniqueId']}", headers=bearer(
        second["token"]))[0] == 403


def test_a_restart_with_the_binlog_keeps_tokens_as_digests_and_they_still_work(tmp_path):
    wal, front_args = tmp_path / "wal", ("--master-key", KEY)
    broker, front, base = split(tmp_path, 5.0, CONFIG, front_args)     # (the binlog: wal)
    try:
        task, users = later(base), [visitor(base) for _ in range(2)]
    finally:
        front.stop()
        broker.stop()
    stored = b"".join(p.read_bytes() for p in wal.rglob("*") if p.is_file())
    assert stored, "the binlog holds the tasks"
    for token in (task["token"], *(u["token"] for u in users)):
        assert token.encode() not in stored and token[4:].encode() not in stored
    broker, front, base = split(tmp_path, 5.0, CONFIG, front_args)
    try:
        url = f"{base}/v1/tasks/{task['uniqueId']}"
        code, _, info = call("GET", url, headers=bearer(task["token"]))
        assert code == 200 and info["status"] == "queued", "the token works after the restart"
        assert call("GET", url, headers=bearer(users[0]["token"]))[0] == 403
        code, _, info = call("DELETE", f"{base}/v1/tasks/{users[1]['uniqueId']}",
                             headers=bearer(users[1]["token"]))
        assert code == 200 and info["status"] == "cancelled", "the waiting visitor leaves"
        code, _, info = call("DELETE", url, headers=bearer(task["token"]))
        assert code == 200 and info["status"] == "cancelled"
    finally:
        front.stop()
        broker.stop()
