"""The waiting room end to end: `zstalk serve` with a pass key file and a function of
online tasks; a user's whole way (in line, admitted with a pass, verified, done,
revoked); Debian's nginx with k8s/gateway's auth_request in front of a test API, asking
the real front; and 200 users at 20/s with 5 admitted at most."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import NamedTuple

import aiohttp
import pytest
import zmq

from nginx import Backend
from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check, wait_for
from test_pass_gateway_nginx import forge, get, start_gateway
from test_task_limits_end_to_end import docs_block
from zstalk.protocol.codecs.passes import PassKeys, sign_pass
from zstalk.protocol.schema import Heartbeat, Hello, Welcome, decode, encode

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
KEY = b"room-" + b"0123456789abcdef" * 2
KEYS = PassKeys([("k1", KEY)])
FUNCTION = "checkout"
#: this environment without a pass key file or --insecure
NO_KEYS_ENV = {k: v for k, v in os.environ.items()
               if k not in ("ZSTALK_PASS_KEY_FILE", "ZSTALK_INSECURE")}


class Served(NamedTuple):
    base: str
    port: int
    server: ServerProcess

    @property
    def server_string(self) -> str:      # (what start_gateway asks of a backend)
        return f"{LOOPBACK}:{self.port}"


def room_files(tmp_path, rate: str = "100/s", concurrency: int = 5,
               config_text: str | None = None) -> tuple[str, str]:
    """The pass key file and `config_text` (by default a room of FUNCTION with that rate
    and concurrency) in tmp_path/zstalk.toml."""
    keys = tmp_path / "passes"
    keys.write_text(f"k1:{KEY.decode()}\n")
    keys.chmod(0o400)
    config = tmp_path / "zstalk.toml"
    config.write_text(config_text or (
        f'[functions.{FUNCTION}]\nonline = "only"\nconcurrency = {concurrency}\n'
        f'rate = "{rate}"\npass_ttl = "60s"\nonline_heartbeat = "30s"\n'
        'max_waiting_per_client = 1000\n'))
    return str(keys), str(config)


def serve(tmp_path, rate: str = "100/s", concurrency: int = 5, *extra: str,
          config_text: str | None = None, keyed: bool = True) -> Served:
    """`zstalk serve` with `config_text` (room_files) and the pass keys (unless not
    `keyed`: then none, not even from the environment)."""
    keys, config = room_files(tmp_path, rate, concurrency, config_text)
    port, http = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none", "--config",
                            config, "--http-port", str(http),
                            *(["--pass-key-file", keys] if keyed else []), *extra],
                           (LOOPBACK, port), name="zstalk-room",
                           env=None if keyed else NO_KEYS_ENV).start()
    base = f"http://{LOOPBACK}:{http}"
    assert wait_for(lambda: call("GET", f"{base}/v1/tasks/nosuch")[0] == 404, 20), \
        server.output()
    return Served(base, http, server)


@pytest.fixture
def room(tmp_path):
    served = serve(tmp_path)
    yield served
    served.server.stop()


def call(method: str, url: str, body=None, headers: dict | None = None,
         timeout: float = 10) -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json",
                                             **(headers or {})}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
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


# -- a rolling restart: `zstalk broker` and `zstalk front http` apart ---------------------------
def split(tmp_path, hold_s: float, config_text: str | None = None,
          front_args: tuple = ()) -> tuple[ServerProcess, ServerProcess, str]:
    """A broker with a binlog (tmp_path/wal) and an HTTP front holding requests `hold_s`
    for a broker; `config_text` as room_files takes it, `front_args` the front's more."""
    keys, config = room_files(tmp_path, config_text=config_text)
    port, http = free_port(), free_port()
    broker = ServerProcess([find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{port}",
                            "--config", config, "--pass-key-file", keys,
                            "-b", str(tmp_path / "wal")],
                           (LOOPBACK, port), name="zstalk-broker").start()
    front = ServerProcess([find_zstalk(), "-V", "front", "http", "--broker",
                           f"tcp://{LOOPBACK}:{port}",
                           "--listen", f"{LOOPBACK}:{http}", "--pass-key-file", keys,
                           "--hold-s", str(hold_s), *front_args], (LOOPBACK, http),
                          name="zstalk-front-http")
    base = f"http://{LOOPBACK}:{http}"
    try:
        front.start()
        assert wait_for(lambda: call("GET", f"{base}/v1/tasks/nosuch")[0] == 404, 20), \
            front.output()
    except BaseException:
        broker.stop()
        raise
    return broker, front, base


def pass_of(base: str, uid: str) -> str:
    """The pass of task `uid` once it is admitted (100/s: the second waits 10 ms)."""
    info: dict = {}

    def admitted() -> bool:
        info.update(call("GET", f"{base}/v1/tasks/{uid}")[2])
        return "pass" in info
    assert wait_for(admitted, 5), info
    return info["pass"]


def verify(base: str, token: str) -> tuple[int, str | None, dict, float]:
    """GET /v1/passes/verify: its status, X-Zstalk-Pass-Check, body, and seconds taken."""
    started = time.monotonic()
    code, headers, body = call("GET", f"{base}/v1/passes/verify?function={FUNCTION}",
                               headers={"Authorization": f"Bearer {token}"})
    return code, headers.get("X-Zstalk-Pass-Check"), body, time.monotonic() - started


class SlowFront:
    """A front that registers with the broker and heartbeats but never answers Stopping,
    so a broker told SIGTERM stays in its stop (test_graceful_stop: up to STOP_WAIT_S)."""

    def __init__(self, broker_endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(broker_endpoint)
        self.sock.send(encode(Hello(12345, "beanstalk", os.getpid(), 0, [])))
        assert self.sock.poll(5000) and isinstance(decode(self.sock.recv()), Welcome)
        self.quiet = threading.Event()
        self.beats = threading.Thread(target=self._beat, daemon=True)
        self.beats.start()

    def _beat(self) -> None:
        while not self.quiet.wait(0.3):
            self.sock.send(encode(Heartbeat(12345)))

    def close(self) -> None:
        self.quiet.set()            # (silent, it is dropped and the broker's stop ends)
        self.beats.join()
        self.sock.close()


def test_while_the_broker_stops_and_is_away_verify_answers_offline_at_once_then_asks_the_next(
        tmp_path):
    broker, front, base = split(tmp_path, hold_s=5.0)
    slow = None
    try:
        good, revoked = join(base), join(base)
        passes = {uid: pass_of(base, uid) for uid in (good, revoked)}
        call("POST", f"{base}/v1/tasks/{revoked}/done", {},
             {"Authorization": f"Bearer {passes[revoked]}"})
        assert verify(base, passes[revoked])[:2] == (403, None)
        slow = SlowFront(f"tcp://{LOOPBACK}:{broker.address[1]}")
        broker.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: "holding commands" in front.output(), 5), front.output()
        code, checked, _, took = verify(base, passes[good])          # the broker is stopping
        assert (code, checked, broker.running) == (204, "offline", True) and took < 2.0, took
        slow.close()
        assert broker.process.wait(10) == 0, broker.output()         # ... and is gone
        for uid in (good, good, revoked):   # (offline, a revoked pass holds until it expires)
            code, checked, _, took = verify(base, passes[uid])
            assert (code, checked) == (204, "offline") and took < 2.0, (uid, code, took)
        broker.start()                                               # the next broker
        assert wait_for(lambda: verify(base, passes[good])[:2] == (204, "broker"), 15), \
            front.output()
        code, _, body, _ = verify(base, passes[revoked])
        assert (code, body["error"]) == (403, "revoked")
    finally:
        if slow is not None:
            slow.close()
        front.stop()
        broker.stop()


# -- a room without pass keys: refused at start and on SIGHUP, or run with --insecure ---------
@pytest.mark.parametrize("role", ["serve", "broker"])
def test_a_room_without_a_pass_key_file_does_not_start_and_names_the_file_and_its_key(
        tmp_path, role):
    _, config = room_files(tmp_path)
    argv = {"serve": ["serve", "-l", LOOPBACK, "-p", str(free_port()), "--counter-port", "0",
                      "--worker-bind", "none"],
            "broker": ["broker", "--bind", f"tcp://{LOOPBACK}:{free_port()}"]}[role]
    done = subprocess.run([find_zstalk(), *argv, "--config", config], capture_output=True,
                          text=True, timeout=30, env=NO_KEYS_ENV)
    assert (done.returncode, done.stderr) == (2, (
        f"zstalk: {config}: [functions.{FUNCTION}] online makes a waiting room, whose admitted "
        "users need passes: give --pass-key-file (ZSTALK_PASS_KEY_FILE), or --insecure to run "
        "it without passes\n"))


def test_with_insecure_a_room_admits_without_passes_and_a_warning_says_none_are_issued(
        tmp_path):
    served = serve(tmp_path, "100/s", 5, "--insecure", keyed=False)
    try:
        config = str(tmp_path / "zstalk.toml")
        assert (f"zstalk.config[{served.server.pid}] WARNING {config}: [functions.{FUNCTION}] "
                f"online: no --pass-key-file (ZSTALK_PASS_KEY_FILE), so passes are not "
                f"issued") in served.server.output()
        uid = join(served.base)
        info: dict = {}
        assert wait_for(lambda: info.update(call("GET", f"{served.base}/v1/tasks/{uid}")[2])
                        or info["status"] == "admitted", 10), info
        assert "pass" not in info and info["passError"].startswith("no pass key file")
    finally:
        served.server.stop()


def test_sighup_keeps_the_config_in_use_when_the_new_one_adds_a_room_without_pass_keys(
        tmp_path):
    served = serve(tmp_path, config_text='[functions.mail]\nurl = "http://127.0.0.1:9/m"\n',
                   keyed=False)
    try:
        config = tmp_path / "zstalk.toml"
        config.write_text(f'[functions.{FUNCTION}]\nonline = "only"\n')
        served.server.process.send_signal(signal.SIGHUP)
        said = (f"zstalk.broker[{served.server.pid}] WARNING SIGHUP: kept the config in use: "
                f"{config}: [functions.{FUNCTION}] online makes a waiting room")
        assert wait_for(lambda: said in served.server.output(), 10), served.server.output()
        code, _, body = call("POST", f"{served.base}/v1/tasks",
                             {"function": FUNCTION, "type": "online"})
        assert code == 404, body            # (the function the refused file would add)
    finally:
        served.server.stop()


# -- room events: a pre-line drawn at the opening, closed, max_waiting -------------------------
def event_config(concurrency: int = 1, **keys) -> str:
    """A room of FUNCTION, `concurrency` admitted at a time, with the room event's `keys`
    (TOML values as written)."""
    lines = "".join(f"{name} = {value}\n" for name, value in keys.items())
    return (f'[functions.{FUNCTION}]\nonline = "only"\nconcurrency = {concurrency}\n'
            f'pass_ttl = "60s"\n'
            f'online_heartbeat = "60s"\nmax_waiting_per_client = 1000\n'
            f'admit_url = "https://shop.example/in"\n{lines}')


def rfc3339(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"


def reload(served: Served, tmp_path, config_text: str) -> None:
    """Write the config anew and SIGHUP (the caller waits for what it changes: serve
    logs no info line without -V)."""
    (tmp_path / "zstalk.toml").write_text(config_text)
    served.server.process.send_signal(signal.SIGHUP)


def documented_draw(seed: str, uids: list[str]) -> list[str]:
    """The order of a draw as docs/waiting-room.md's check_draw.py computes it, run as
    written (its own code, not the broker's)."""
    space: dict = {}
    exec(docs_block("waiting-room.md", "# check_draw.py: the order a draw gives "
                    "(docs/waiting-room.md), from its published seed"), space)
    return space["drawn_order"](seed, uids)


def launch_config(**keys) -> str:
    """docs/waiting-room.md's launch.toml as written, but for `keys` (TOML values)."""
    text = docs_block("waiting-room.md", "# launch.toml")
    for name, value in keys.items():
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", text, flags=re.M)
        assert n == 1, name
    return text.replace("[functions.drop]", f"[functions.{FUNCTION}]") + (
        'pass_ttl = "60s"\nonline_heartbeat = "60s"\nmax_waiting_per_client = 1000\n')


def places(base: str, uids: list[str]) -> list[str]:
    """Who is admitted, then the rest by waitNum (each GET keeps its visitor's place)."""
    infos = {uid: call("GET", f"{base}/v1/tasks/{uid}")[2] for uid in uids}
    admitted = [uid for uid, info in infos.items() if info["status"] == "admitted"]
    waiting = sorted((info["waitNum"], uid) for uid, info in infos.items()
                     if info["status"] == "queued")
    return admitted + [uid for _, uid in waiting]


def test_a_pre_line_is_drawn_at_the_opening_and_a_restart_with_the_binlog_keeps_the_order(
        tmp_path):
    """Visitors join before opens_at (a pre-line: no place); a SIGHUP brings the opening
    to now, the broker draws, the order is the documented one for the published seed, a
    later joiner is behind; kill -9 and a restart from the binlog keep the draw and the
    order (no new draw)."""
    later = rfc3339(time.time() + 3600)
    served = serve(tmp_path, "100/s", 1, "-b", str(tmp_path / "wal"),
                   config_text=launch_config(opens_at=f'"{later}"', concurrency=1))
    try:
        early = []
        for _ in range(8):
            code, _, body = call("POST", f"{served.base}/v1/tasks",
                                 {"function": FUNCTION, "type": "online"})
            assert code == 201 and (body["status"], body["phase"]) == ("queued", "pre-line")
            assert body["opensAt"] == later and "waitNum" not in body, body
            early.append(body["uniqueId"])
        info = call("GET", f"{served.base}/v1/tasks/{early[0]}")[2]
        assert (info["phase"], info["opensAt"]) == ("pre-line", later) and "waitNum" not in info
        time.sleep(0.01)            # (the opening after every join's createdAt)
        reload(served, tmp_path, launch_config(opens_at=rfc3339(time.time()), concurrency=1))
        stats: dict = {}
        assert wait_for(lambda: stats.update(call(
            "GET", f"{served.base}/v1/functions/{FUNCTION}")[2]) or "lastDraw" in stats, 10)
        order = documented_draw(stats["lastDraw"]["seed"], early)
        assert order != early
        latecomer = join(served.base)
        assert places(served.base, early + [latecomer]) == order + [latecomer]
        served.server.kill()
        served.server.start()
        assert wait_for(lambda: call("GET", f"{served.base}/v1/tasks/nosuch")[0] == 404, 20)
        again = call("GET", f"{served.base}/v1/functions/{FUNCTION}")[2]
        assert again["lastDraw"] == stats["lastDraw"] and "phase" not in again
        assert places(served.base, early + [latecomer]) == order + [latecomer]
    finally:
        served.server.stop()


def test_closed_admits_nobody_max_waiting_refuses_with_429_and_a_sighup_opens_the_line(
        tmp_path):
    served = serve(tmp_path, "100/s", 1, config_text=event_config(closed="true",
                                                                   max_waiting=3))
    try:
        uids = []
        for n in range(3):
            code, _, body = call("POST", f"{served.base}/v1/tasks",
                                 {"function": FUNCTION, "type": "online"})
            assert code == 201 and (body["phase"], body["waitNum"]) == ("closed", n), body
            uids.append(body["uniqueId"])
        code, headers, body = call("POST", f"{served.base}/v1/tasks",
                                   {"function": FUNCTION, "type": "online"})
        assert (code, body["error"], headers["Retry-After"]) == (429, "line_full", "5")
        assert f"'{FUNCTION}'" in body["message"] and "max_waiting" in body["message"]
        code, _, items = call("POST", f"{served.base}/v1/tasks",
                              [{"function": FUNCTION, "type": "online"}])
        assert code == 200 and (items[0]["status"], items[0]["error"]) == (429, "line_full")
        time.sleep(0.5)
        assert places(served.base, uids) == uids        # (nobody was admitted)
        reload(served, tmp_path, event_config(max_waiting=10, concurrency=3))
        info: dict = {}
        assert wait_for(lambda: info.update(call("GET", f"{served.base}/v1/tasks/{uids[0]}")[2])
                        or info["status"] == "admitted", 10), info
        assert "phase" not in info and info["pass"]
        call("POST", f"{served.base}/v1/tasks/{uids[0]}/done", {},
             {"Authorization": f"Bearer {info['pass']}"})
        code, _, items = call("POST", f"{served.base}/v1/tasks",
                              [{"function": FUNCTION, "type": "online"}] * 2)
        assert code == 200
        admitted = [item for item in items if "pass" in item]
        assert admitted, items      # (concurrency 3: the slot done freed is taken at once)
        item = admitted[0]
        assert item["status"] == 201 and item["admitUrl"] == (
            f"https://shop.example/in#zstalk_pass={item['pass']}")
        assert item["passExpiresAt"].endswith("Z") and "waitNum" in item
    finally:
        served.server.stop()


def test_an_opens_at_without_an_offset_stops_the_start_naming_the_file_and_the_key(tmp_path):
    keys, config = room_files(tmp_path, config_text=event_config(opens_at="2026-12-24T18:00:00"))
    done = subprocess.run([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(free_port()),
                           "--counter-port", "0", "--worker-bind", "none", "--config", config,
                           "--pass-key-file", keys], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.startswith(
        f"zstalk: {config}: [functions.{FUNCTION}]: opens_at: 2026-12-24T18:00:00 has no "
        "offset"), done.stderr
