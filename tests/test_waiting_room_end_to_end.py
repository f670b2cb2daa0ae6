"""The waiting room end to end: `zstalk serve` with a pass key file and a function of
online tasks; a user's whole way (in line, admitted with a pass, verified, done,
revoked); Debian's nginx with k8s/gateway's auth_request in front of a test API, asking
the real front; and 200 users at 20/s with 5 admitted at most."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import NamedTuple

import aiohttp
import pytest

from nginx import Backend
from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check, wait_for
from test_pass_gateway_nginx import forge, get, start_gateway
from zstalk.protocol.codecs.passes import PassKeys, sign_pass

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = b"room-" + b"0123456789abcdef" * 2
KEYS = PassKeys([("k1", KEY)])
FUNCTION = "checkout"


class Served(NamedTuple):
    base: str
    port: int
    server: ServerProcess

    @property
    def server_string(self) -> str:      # (what start_gateway asks of a backend)
        return f"{LOOPBACK}:{self.port}"


def serve(tmp_path, rate: str = "100/s", concurrency: int = 5, *extra: str,
          config_text: str | None = None) -> Served:
    """`zstalk serve` with the pass keys and `config_text` (by default a room of
    FUNCTION with that rate and concurrency) in tmp_path/zstalk.toml."""
    keys = tmp_path / "passes"
    keys.write_text(f"k1:{KEY.decode()}\n")
    keys.chmod(0o400)
    config = tmp_path / "zstalk.toml"
    config.write_text(config_text or (
        f'[functions.{FUNCTION}]\nonline = "only"\nconcurrency = {concurrency}\n'
        f'rate = "{rate}"\npass_ttl = "60s"\nonline_heartbeat = "30s"\n'
        'max_waiting_per_client = 1000\n'))
    port, http = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none", "--config",
                            str(config), "--http-port", str(http), "--pass-key-file", str(keys),
                            *extra],
                           (LOOPBACK, port), name="zstalk-room").start()
    base = f"http://{LOOPBACK}:{http}"
    assert wait_for(lambda: call("GET", f"{base}/v1/tasks/nosuch")[0] == 404, 20), \
        server.output()
    return Served(base, http, server)


@pytest.fixture
def room(tmp_path):
    served = serve(tmp_path)
    yield served
    served.server.stop()


def call(method: str, url: str, body=None, headers: dict | None = None) -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json",
                                             **(headers or {})}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, dict(resp.headers), json.loads(raw) if raw else {}
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, dict(err.headers), json.loads(raw) if raw else {}


def join(base: str) -> str:
    code, _, body = call("POST", f"{base}/v1/tasks", {"function": FUNCTION, "type": "online"})
    assert code == 201, body
    return body["uniqueId"]


def test_a_users_way_through_the_room_from_line_to_pass_to_done(room):
    uid = join(room.base)
    code, _, info = call("GET", f"{room.base}/v1/tasks/{uid}")
    assert code == 200 and info["status"] == "admitted" and info["type"] == "online"
    token = info["pass"]
    bearer = {"Authorization": f"Bearer {token}"}
    code, headers, _ = call("GET", f"{room.base}/v1/passes/verify?function={FUNCTION}",
                            headers=bearer)
    assert code == 204 and headers["X-Zstalk-Task-Id"] == uid
    assert headers["X-Zstalk-Pass-Check"] == "broker"
    other = join(room.base)
    code, _, body = call("POST", f"{room.base}/v1/tasks/{other}/done", {}, bearer)
    assert code == 403 and "another task's" in body["message"]
    code, _, done = call("POST", f"{room.base}/v1/tasks/{uid}/done", {}, bearer)
    assert code == 200 and (done["status"], done["endedBy"]) == ("success", "done")
    code, headers, body = call("GET", f"{room.base}/v1/passes/verify", headers=bearer)
    assert (code, body["error"]) == (403, "revoked")
    assert call("POST", f"{room.base}/v1/tasks/{uid}/done", {}, bearer)[0] == 409


def test_an_online_task_refuses_a_chosen_id_and_an_online_only_function_offline_ones(room):
    code, _, body = call("POST", f"{room.base}/v1/tasks", {
        "function": FUNCTION, "type": "online", "options": {"uniqueId": "mine"}})
    assert code == 400 and "server-made uniqueId" in body["message"]
    code, _, body = call("POST", f"{room.base}/v1/tasks", {"function": FUNCTION})
    assert code == 400 and "online tasks only" in body["message"]


def test_nginx_auth_request_lets_a_good_pass_through_to_the_api_and_nothing_else(
        tmp_path, room):
    api = Backend("api")
    nginx, gateway = start_gateway(tmp_path, type("V", (), {"server": room.server_string})(),
                                   api)
    try:
        uid = join(room.base)
        token = call("GET", f"{room.base}/v1/tasks/{uid}")[2]["pass"]
        assert get(gateway, {}).status == 401
        reply = get(gateway, {"Authorization": f"Bearer {token}"})
        assert reply.status == 200 and len(api.requests) == 1
        expired = sign_pass(KEYS, uid, FUNCTION, int(time.time()) - 1)
        elsewhere = sign_pass(KEYS, uid, "other", int(time.time()) + 60)
        for bad in (expired, forge(token), elsewhere):
            assert get(gateway, {"Authorization": f"Bearer {bad}"}).status == 403
        call("POST", f"{room.base}/v1/tasks/{uid}/done", {}, {"Authorization": f"Bearer {token}"})
        assert get(gateway, {"Authorization": f"Bearer {token}"}).status == 403
        assert len(api.requests) == 1, "no refused request reached the API"
    finally:
        nginx.stop()
        api.stop()


def test_200_users_at_20_a_second_are_admitted_in_order_5_at_most_each_once(tmp_path):
    served = serve(tmp_path, rate="20/s", concurrency=5)
    try:
        infos, seen_nums = asyncio.run(crowd(served.base, 200))
    finally:
        served.server.stop()
    assert [i["status"] for i in infos] == ["success"] * 200
    assert all(i["endedBy"] == "done" and i["calls"] == 1 for i in infos), "admitted once"
    events = sorted([(i["startedAt"], 1) for i in infos] + [(i["finishedAt"], -1) for i in infos])
    most, now = 0, 0
    for _, step in events:
        now += step
        most = max(most, now)
    assert most <= 5
    for nums in seen_nums:
        assert nums == sorted(nums, reverse=True), nums      # each user's place only falls
    admitted_at = sorted(i["startedAt"] for i in infos)
    assert 8.5 <= _seconds(admitted_at[-1]) - _seconds(admitted_at[0]) <= 30, "about 20/s"


def _seconds(rfc3339: str) -> float:
    import datetime
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


async def crowd(base: str, n: int) -> tuple[list[dict], list[list[int]]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as http:
        async def post(url, body=None, headers=None):
            async with http.post(url, json=body, headers=headers) as resp:
                return resp.status, await resp.json()

        async def fetch(url):
            async with http.get(url) as resp:
                return await resp.json()

        uids = []
        for _ in range(n):          # in order, so their places are their order
            status, body = await post(f"{base}/v1/tasks", {"function": FUNCTION,
                                                           "type": "online"})
            assert status == 201, body
            uids.append(body["uniqueId"])

        async def user(uid: str) -> tuple[dict, list[int]]:
            nums = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                info = await fetch(f"{base}/v1/tasks/{uid}")
                if info["status"] == "admitted":
                    status, done = await post(f"{base}/v1/tasks/{uid}/done", {},
                                              {"Authorization": f"Bearer {info['pass']}"})
                    assert status == 200, done
                    return await fetch(f"{base}/v1/tasks/{uid}"), nums
                nums.append(info["waitNum"])
                await asyncio.sleep(0.2)
            raise AssertionError(f"{uid} was never admitted")
        results = await asyncio.gather(*(user(uid) for uid in uids))
    return [r[0] for r in results], [r[1] for r in results]


def test_with_a_master_key_a_user_ends_the_task_with_its_pass_as_a_bearer_token(tmp_path):
    served = serve(tmp_path, "100/s", 5, "--master-key", "s3cret")
    try:
        uid = join(served.base)                     # (online = "only": no key needed)
        token = call("GET", f"{served.base}/v1/tasks/{uid}")[2]["pass"]
        code, _, done = call("POST", f"{served.base}/v1/tasks/{uid}/done", {},
                             {"Authorization": f"Bearer {token}"})
        assert code == 200 and done["endedBy"] == "done"
        other = join(served.base)
        code, _, body = call("POST", f"{served.base}/v1/tasks/{other}/done", {},
                             {"Authorization": "Bearer wrong"})
        assert code == 403
    finally:
        served.server.stop()


def test_a_new_key_put_first_in_the_key_file_signs_from_then_on_and_old_passes_still_hold(
        tmp_path, room):
    uid = join(room.base)
    old = call("GET", f"{room.base}/v1/tasks/{uid}")[2]["pass"]
    keys = tmp_path / "passes"
    keys.chmod(0o600)
    keys.write_text(f"k2:{'n' * 40}\nk1:{KEY.decode()}\n")        # rotation: no restart
    new = call("GET", f"{room.base}/v1/tasks/{uid}")[2]["pass"]
    assert old.split(".")[1] == "k1" and new.split(".")[1] == "k2"
    for token in (old, new):
        code, headers, _ = call("GET", f"{room.base}/v1/passes/verify",
                                headers={"Authorization": f"Bearer {token}"})
        assert code == 204, token
    keys.write_text(f"k2:{'n' * 40}\n")                              # k1's line dropped
    code, _, body = call("GET", f"{room.base}/v1/passes/verify",
                         headers={"Authorization": f"Bearer {old}"})
    assert (code, body["error"]) == (403, "unknown_kid")
