"""Functions on an upstream end to end: a real broker, HTTP front and dispatcher processes
call recording backends (tests/support/nginx.py) that refuse, hang, answer 502 or count their
calls in flight; and the sequence of servers zstalk's calls pick, one at a time, against
the sequence Debian's nginx picks for the same upstream block."""
from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from nginx import Backend, Reply
from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check, wait_for
from test_upstreams_nginx import (backends, names, nginx_for, nginx_sequence,  # noqa: F401
                                  require_loopback_sources, spec_of)

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")


def server_lines(spec) -> str:
    """A zstalk [upstreams.gpu] table for a core UpstreamSpec (tests/support/nginx.py writes the
    same spec as nginx's block)."""
    rows = []
    for s in spec.servers:
        params = [f'url = "{s.url}"', f"weight = {s.weight}", f"max_fails = {s.max_fails}",
                  f'fail_timeout = "{int(s.fail_timeout_s)}s"']
        params += [f"max_conns = {s.max_conns}"] * bool(s.max_conns)
        params += ["backup = true"] * s.backup + ["down = true"] * s.down
        rows.append("  { " + ", ".join(params) + " },")
    return f'[upstreams.gpu]\nbalance = "{spec.balance}"\nservers = [\n' + "\n".join(rows) + "\n]\n"


@contextlib.contextmanager
def cluster(tmp_path: Path, config: str, dispatchers: int = 1):
    """`zstalk broker --config`, an HTTP front and `dispatchers` dispatcher processes:
    yields the task API's base URL."""
    path = tmp_path / "zstalk.toml"
    path.write_text(config)
    zstalk, port, http = find_zstalk(), free_port(), free_port()
    endpoint = f"tcp://{LOOPBACK}:{port}"
    procs = [ServerProcess([zstalk, "broker", "--bind", endpoint, "--config", str(path)],
                           (LOOPBACK, port), name="broker").start()]
    try:
        procs.append(ServerProcess([zstalk, "front", "http", "--broker", endpoint, "--listen",
                                    f"{LOOPBACK}:{http}"], (LOOPBACK, http), name="front").start())
        for n in range(dispatchers):
            procs.append(ServerProcess([zstalk, "dispatcher", "--broker", endpoint],
                                       (LOOPBACK, port), name=f"dispatcher-{n}").start())
        yield f"http://{LOOPBACK}:{http}/v1"
    finally:
        for proc in reversed(procs):
            proc.stop()


def post(url: str, doc) -> object:
    req = urllib.request.Request(url, json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def enqueue(api: str, count: int, **options) -> list[str]:
    items = post(f"{api}/tasks", [{"function": "gen", "params": i, "options": options}
                                  for i in range(count)])
    assert all(item["status"] == 201 for item in items), items
    return [item["uniqueId"] for item in items]


def finished(api: str, uids: list[str], timeout: float = 30) -> list[dict]:
    infos: list[dict] = []

    def done() -> bool:
        infos[:] = [get(f"{api}/tasks/{uid}") for uid in uids]
        return all(i["status"] in ("success", "failed") for i in infos)
    assert wait_for(done, timeout, step=0.1), [i["status"] for i in infos]
    return infos


def servers(api: str) -> dict[str, dict]:
    return {s["url"]: s for s in get(f"{api}/functions/gen")["servers"]}


# -- the same servers, one call at a time, as nginx ----------------------------------------
@pytest.mark.parametrize("balance, layout", [
    ("round_robin", "a b:3 c:down d:2 e"),
    ("round_robin", "x:3:max_fails=3 b:2 c"),     # x refuses: failures shift the weights
    ("least_conn", "a:3 b:2 c:down d"),
])
def test_one_call_at_a_time_zstalk_calls_the_servers_nginx_picks(tmp_path, backends, balance,
                                                                 layout):
    spec = spec_of(balance, backends, layout)
    name_of = names(spec, backends)
    nginx = nginx_for(tmp_path, spec)
    try:
        expected = nginx_sequence(nginx, name_of, 30)
    finally:
        nginx.stop()
    for backend in backends.values():
        backend.requests.clear()
    order: list[str] = []
    replies = {name: backend.reply for name, backend in backends.items()}
    for name, backend in backends.items():      # (one call at a time: a global order)
        backend.reply = (lambda n: lambda request: (order.append(n), Reply(200, {}, b"{}"))[1])(
            name)
    config = server_lines(spec) + ('[functions.gen]\nupstream = "gpu"\npath = "/"\n'
                                   'concurrency = 1\nnext_upstream = ["off"]\n')  # (nginx's)
    try:
        with cluster(tmp_path, config) as api:
            uids = enqueue(api, 30, attempts=0)
            infos = finished(api, uids)
    finally:
        for name, backend in backends.items():
            backend.reply = replies[name]
    picked = [name_of[i["error"].split("http://")[1].split("/")[0]] if i["status"] == "failed"
              else None for i in infos]
    answered = iter(order)
    sequence = [p if p is not None else next(answered) for p in picked]
    assert sequence == expected


# -- failure accounting ------------------------------------------------------------------------
def refusing_url() -> str:
    return f"http://{LOOPBACK}:{free_port()}"


class Hanging:
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((LOOPBACK, 0))
        self.sock.listen(64)
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return "http://%s:%d" % self.sock.getsockname()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.accepted.append(self.sock.accept()[0])

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def failing_config(urls: list[str], fail_timeout: str = "30s", extra: str = "") -> str:
    """One call at a time (concurrency 1), so each failure is known before the next
    pick, as with nginx's one request at a time."""
    rows = "\n".join(f'  {{ url = "{u}", fail_timeout = "{fail_timeout}" }},' for u in urls)
    return (f"[upstreams.gpu]\nservers = [\n{rows}\n]\n"
            f'[functions.gen]\nupstream = "gpu"\npath = "/"\nconcurrency = 1\n'
            f'timeout = "1s"\n{extra}')


def test_a_server_refusing_connections_is_failed_and_every_task_succeeds_on_the_other(
        tmp_path):
    good, refusing = Backend("good"), refusing_url()
    try:
        with cluster(tmp_path, failing_config([refusing, f"http://{good.server}"])) as api:
            infos = finished(api, enqueue(api, 12, attempts=2, backoff=0))
            state = servers(api)
    finally:
        good.stop()
    assert [i["status"] for i in infos] == ["success"] * 12
    # one call went to the refusing server, and moved on to the other within its attempt
    assert sum(i["attempt"] for i in infos) == 12
    assert sum(i.get("upstreamAddr", "").startswith(refusing) for i in infos) == 1
    assert state[refusing]["state"] == "failed" and state[refusing]["fails"] == 1
    assert "could not connect" in state[refusing]["lastError"]


def test_a_server_that_never_answers_is_failed_after_its_first_timeout(tmp_path):
    good, hanging = Backend("good"), Hanging()
    url = hanging.url
    try:
        with cluster(tmp_path, failing_config([url, f"http://{good.server}"])) as api:
            infos = finished(api, enqueue(api, 8, attempts=2, backoff=0))
            state = servers(api)
    finally:
        good.stop()
        hanging.close()
    assert [i["status"] for i in infos] == ["success"] * 8
    assert len(hanging.accepted) == 1
    assert state[url]["state"] == "failed"
    assert "no answer" in state[url]["lastError"]


def test_with_one_server_refusing_every_single_attempt_task_succeeds_on_the_other(tmp_path):
    good, refusing = Backend("good"), refusing_url()
    config = failing_config([refusing, f"http://{good.server}"], fail_timeout="1s")
    try:
        with cluster(tmp_path, config) as api:
            infos = finished(api, enqueue(api, 10, attempts=0))
    finally:
        good.stop()
    assert [i["status"] for i in infos] == ["success"] * 10
    assert all(i["attempt"] == 1 for i in infos), "a move spends no attempt"
    moved = [i for i in infos if i.get("upstreamAddr", "").count(",")]
    assert moved and all(i["upstreamAddr"] == f"{refusing}, http://{good.server}"
                         for i in moved), [i.get("upstreamAddr") for i in infos]


@pytest.mark.parametrize("listed, counted", [(False, False), (True, True)])
def test_a_502_fails_its_server_only_when_next_upstream_lists_http_502(tmp_path, listed,
                                                                         counted):
    bad = Backend("bad", lambda request: Reply(502, {}, b"bad gateway"))
    good = Backend("good")
    extra = 'next_upstream = ["error", "timeout", "http_502"]\n' if listed else ""
    try:
        with cluster(tmp_path, failing_config([f"http://{bad.server}", f"http://{good.server}"],
                                              extra=extra)) as api:
            finished(api, enqueue(api, 6, attempts=3, backoff=0))
    finally:
        bad.stop()
        good.stop()
    assert (len(bad.requests) == 1) is counted, len(bad.requests)


def test_every_server_failed_at_once_holds_the_tasks_then_they_run_spending_nothing(tmp_path):
    answers = {"n": 0}

    def flaky(request):                 # the first two calls fail, then all is well
        answers["n"] += 1
        return Reply(502 if answers["n"] <= 2 else 200, {}, b"{}")
    a, b = Backend("a", flaky), Backend("b", flaky)
    extra = 'next_upstream = ["error", "timeout", "http_502"]\n'
    try:
        config = failing_config([f"http://{a.server}", f"http://{b.server}"], "2s", extra)
        with cluster(tmp_path, config) as api:
            uids = enqueue(api, 6, attempts=3, backoff=0)
            assert wait_for(lambda: answers["n"] >= 2, 10)
            time.sleep(0.5)
            held = [get(f"{api}/tasks/{uid}") for uid in uids]
            assert answers["n"] == 2, "no server usable: nothing is called"
            # (the first call's 502 moved to the other server within its attempt)
            assert sum(i["attempt"] for i in held) == 1
            assert {s["state"] for s in servers(api).values()} == {"failed"}
            infos = finished(api, uids)
    finally:
        a.stop()
        b.stop()
    assert [i["status"] for i in infos] == ["success"] * 6
    assert sum(i["attempt"] for i in infos) == 7, "only the failed attempt was extra"


def test_max_conns_holds_for_every_dispatcher_process_together(tmp_path):
    lock, most = threading.Lock(), {}

    def slow(name):
        flying = {"now": 0}

        def reply(request):
            with lock:
                flying["now"] += 1
                most[name] = max(most.get(name, 0), flying["now"])
            time.sleep(0.2)
            with lock:
                flying["now"] -= 1
            return Reply(200, {}, b"{}")
        return reply
    hosts = [Backend(n, slow(n)) for n in "abc"]
    rows = "\n".join(f'  {{ url = "http://{h.server}", max_conns = 2 }},' for h in hosts)
    config = (f'[upstreams.gpu]\nbalance = "least_conn"\nservers = [\n{rows}\n]\n'
              '[functions.gen]\nupstream = "gpu"\npath = "/"\nconcurrency = 32\n')
    try:
        with cluster(tmp_path, config, dispatchers=4) as api:
            infos = finished(api, enqueue(api, 60), timeout=60)
    finally:
        for host in hosts:
            host.stop()
    assert [i["status"] for i in infos] == ["success"] * 60
    assert max(most.values()) <= 2 and len(most) == 3, most


def test_ip_hash_sends_each_enqueuers_tasks_where_nginx_sends_that_client(tmp_path, backends):
    require_loopback_sources()
    spec = spec_of("ip_hash", backends, "a:2 b c:down d:3 e")
    clients = [f"127.{a}.{b}.1" for a in (0, 34, 119, 255) for b in (0, 13, 200)]
    nginx = nginx_for(tmp_path, spec)
    try:
        expected = {}
        for source in clients:
            conn = http.client.HTTPConnection(*nginx.address, timeout=5,
                                              source_address=(source, 0))
            conn.request("GET", "/backend/")
            expected[source] = conn.getresponse().read().decode()
            conn.close()
    finally:
        nginx.stop()
    config = server_lines(spec) + '[functions.gen]\nupstream = "gpu"\npath = "/"\n'
    got = {}
    with cluster(tmp_path, config) as api:
        host, port = api.split("//")[1].split("/")[0].split(":")
        for source in clients:
            conn = http.client.HTTPConnection(host, int(port), timeout=5,
                                              source_address=(source, 0))
            conn.request("POST", "/v1/tasks", json.dumps({"function": "gen"}),
                         {"Content-Type": "application/json"})
            uid = json.loads(conn.getresponse().read())["uniqueId"]
            conn.close()
            got[source] = uid
        infos = finished(api, list(got.values()))
    assert all(i["status"] == "success" for i in infos)
    by_uid = {}
    for name, backend in backends.items():
        for request in backend.requests:
            uid = request.headers.get("X-Zstalk-Task-Id")
            if uid:
                by_uid[uid] = name
    assert {source: by_uid[uid] for source, uid in got.items()} == expected
    assert len(set(expected.values())) > 1      # (the clients do spread: a real check)


@pytest.mark.parametrize("consistent", [False, True])
def test_hash_on_a_params_field_sends_each_key_where_nginx_sends_it(tmp_path, backends,
                                                                    consistent):
    spec = spec_of("hash", backends, "a:2 b c:down d:3 e", key="params.user",
                   consistent=consistent)
    users = [f"user{i}" for i in range(40)] + ["x" * 300, "A-b_c.9"]   # (as $arg_key has them)
    nginx = nginx_for(tmp_path, spec)
    try:
        expected = {}
        for user in users:
            conn = http.client.HTTPConnection(*nginx.address, timeout=5)
            conn.request("GET", "/backend/?key=" + urllib.parse.quote(user))
            expected[user] = conn.getresponse().read().decode()
            conn.close()
    finally:
        nginx.stop()
    config = (server_lines(spec).replace('balance = "hash"', 'balance = "hash"\n'
                                         f'key = "params.user"\nconsistent = {str(consistent).lower()}')
              + '[functions.gen]\nupstream = "gpu"\npath = "/"\n')
    with cluster(tmp_path, config) as api:
        items = post(f"{api}/tasks", [{"function": "gen", "params": {"user": u}} for u in users])
        uids = [item["uniqueId"] for item in items]
        assert all(i["status"] == "success" for i in finished(api, uids))
    by_uid = {request.headers.get("X-Zstalk-Task-Id"): name
              for name, backend in backends.items() for request in backend.requests}
    assert {u: by_uid[uid] for u, uid in zip(users, uids)} == expected


# -- slow start (nginx Plus's slow_start): a server back from down ramps its share up --------
def slow_start_config(a: Backend, b: Backend, b_down: bool) -> str:
    return (f'[upstreams.gpu]\nservers = [\n  {{ url = "http://{a.server}" }},\n'
            f'  {{ url = "http://{b.server}", slow_start = "10s"'
            f'{", down = true" if b_down else ""} }},\n]\n'
            '[functions.gen]\nupstream = "gpu"\npath = "/gen"\nconcurrency = 1\n')


def test_a_server_a_sighup_brings_back_from_down_takes_a_growing_share_over_its_slow_start(
        tmp_path):
    a, b = Backend("a"), Backend("b")
    config = tmp_path / "zstalk.toml"
    config.write_text(slow_start_config(a, b, b_down=True))
    http = free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(free_port()),
                            "--counter-port", "0", "--config", str(config),
                            "--http-port", str(http)], (LOOPBACK, http), name="serve").start()
    api = f"http://{LOOPBACK}:{http}/v1"
    try:
        config.write_text(slow_start_config(a, b, b_down=False))
        server.process.send_signal(signal.SIGHUP)
        url_b = f"http://{b.server}"
        assert wait_for(lambda: servers(api)[url_b]["state"] == "usable", 10), server.output()
        reloaded = time.monotonic()
        ramping = servers(api)[url_b]
        assert 0 < ramping["weightShare"] < 0.5 and ramping["slowStartUntil"].endswith("Z"), \
            ramping
        early = finished(api, enqueue(api, 20))     # (a second or two into its ten)
        early_took = time.monotonic() - reloaded
        time.sleep(max(0.0, 10.5 - (time.monotonic() - reloaded)))
        assert "weightShare" not in servers(api)[url_b]     # (the ramp is over)
        late = finished(api, enqueue(api, 20))
    finally:
        server.stop()
        a.stop()
        b.stop()
    on_b = [sum(i["result"] == "b" for i in batch) for batch in (early, late)]
    # (its weight early is at most early_took / 10 of a's: a share of 1 in 5 even after 2.5 s;
    # after the ramp, round robin between two equal weights alternates exactly)
    assert on_b[0] <= 6 and on_b[1] == 10, (on_b, f"{early_took:.1f} s")
