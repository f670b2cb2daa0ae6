"""The views of tubes, jobs and counters end to end: a real `zstalk serve` with a master key,
jobs put by a plain beanstalk client, the HTTP views and their actions asked with urllib,
and `zstalk stats` run against it (over HTTP, and over the plain protocols), and against
Debian's beanstalkd, where no HTTP front runs."""
from __future__ import annotations

import json

import pytest

from servers import (LOOPBACK, RawClient, ServerProcess, acquire_request, find_zstalk,
                     free_port, self_check)
from test_operator_end_to_end import KEY, run_block, zstalk
from test_tasks_end_to_end import Api

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")


def start_server(tmp_path, *args: str, name: str = "zstalk-views") -> Api:
    """A started `zstalk serve` with functions (their host out of reach), a counter port
    (`.counter_port`), the master key KEY and `args`; the caller stops `.server`."""
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:9/fn"\n')
    port, http_port, counter_port = free_port(), free_port(), free_port()
    process = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                             "--counter-port", str(counter_port), "--worker-bind", "none",
                             "--config", str(config), "--http-port", str(http_port),
                             "--master-key", KEY, *args], (LOOPBACK, port), name=name).start()
    api = Api(f"http://{LOOPBACK}:{http_port}", process)
    api.key = KEY
    api.wait_listening()
    api.counter_port = counter_port
    return api


@pytest.fixture
def server(tmp_path):
    api = start_server(tmp_path)
    yield api
    api.server.stop()


def put(address, tube: str, *bodies: bytes) -> list[int]:
    with RawClient(address, 10) as c:
        c.send(b"use %s\r\n" % tube.encode())
        c.read_reply()
        ids = []
        for body in bodies:
            c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
            ids.append(int(c.read_reply().split()[1]))
        return ids


def cmd_counts(address) -> dict:
    with RawClient(address, 10) as c:
        c.send(b"stats\r\n")
        reply = c.read_reply()
    lines = reply.decode().splitlines()[2:]
    return {k: v for k, _, v in (line.partition(": ") for line in lines) if k.startswith("cmd-")}


def test_looking_through_the_views_counts_no_beanstalk_command(server):
    [job] = put(server.server.address, "emails", b"hello")
    before = cmd_counts(server.server.address)
    assert server.request("GET", "/v1/tubes?sort=activity")[0] == 200
    assert server.request("GET", "/v1/tubes/emails")[0] == 200
    assert server.request("GET", f"/v1/jobs/{job}")[0] == 200
    assert server.request("GET", "/v1/counters")[0] == 200
    assert server.request("GET", "/v1/tubes/emails/peek")[0] == 200
    after = cmd_counts(server.server.address)
    assert after == {**before, "cmd-stats": str(int(before["cmd-stats"]) + 1)}


def test_tubes_come_busiest_first_and_a_tube_shows_its_stats(server):
    put(server.server.address, "quiet", b"1")
    put(server.server.address, "busy", b"1", b"2", b"3")
    code, page = server.request("GET", "/v1/tubes?sort=activity&limit=2")
    assert code == 200 and [t["name"] for t in page["tubes"]] == ["busy", "quiet"]
    assert page["next"] == "quiet"
    code, tube = server.request("GET", "/v1/tubes/busy")
    assert (tube["currentJobsReady"], tube["totalJobs"], tube["paused"]) == (3, 3, False)
    assert server.request("GET", "/v1/tubes?q=qui")[1]["tubes"][0]["name"] == "quiet"


def test_a_jobs_body_is_shown_only_with_the_master_key(server):
    [job] = put(server.server.address, "emails", b"secret body")
    server.key = None
    code, info = server.request("GET", f"/v1/jobs/{job}")
    assert code == 200 and info["tube"] == "emails" and "body" not in info
    server.key = KEY
    assert server.request("GET", f"/v1/jobs/{job}")[1]["body"] == "secret body"


def test_a_peek_shows_the_next_ready_delayed_and_buried_job_and_bodies_only_to_the_master_key(
        server):
    address = server.server.address
    [ready] = put(address, "work", b"\xff\x00 not text")
    with RawClient(address, 10) as c:
        c.send(b"use work\r\nput 5 30 60 7\r\ndelayed\r\n")
        c.read_reply()
        delayed = int(c.read_reply().split()[1])
    code, peek = server.request("GET", "/v1/tubes/work/peek")
    assert code == 200 and (peek["tube"], peek["buried"]) == ("work", None)
    assert (peek["ready"]["id"], peek["ready"]["body"], peek["ready"]["bodyEncoding"]) == (
        ready, "/wAgbm90IHRleHQ=", "base64")
    assert (peek["delayed"]["id"], peek["delayed"]["pri"], peek["delayed"]["body"]) == (
        delayed, 5, "delayed")
    assert 25 <= peek["delayed"]["delayLeft"] <= 30 and peek["ready"]["delayLeft"] == 0
    server.key = None
    code, peek = server.request("GET", "/v1/tubes/work/peek")
    assert code == 200 and "body" not in peek["ready"] and "body" not in peek["delayed"]
    assert server.request("GET", "/v1/tubes/nope/peek")[0] == 404
    server.key = "wrong"
    assert server.request("GET", "/v1/tubes/work/peek")[0] == 403


def test_actions_need_the_master_key_and_kick_pause_and_delete_act(server):
    address = server.server.address
    ids = put(address, "work", b"a", b"b")
    with RawClient(address, 10) as c:
        c.send(b"watch work\r\nreserve\r\nbury %d 0\r\n" % ids[0])
        c.read_replies(3)
    server.key = None
    assert server.request("POST", "/v1/tubes/work/kick", {"bound": 5})[0] == 401
    assert server.request("DELETE", f"/v1/jobs/{ids[1]}")[0] == 401
    server.key = KEY
    assert server.request("POST", "/v1/tubes/work/kick", {"bound": 5}) == (
        200, {"tube": "work", "kicked": 1})
    code, tube = server.request("PATCH", "/v1/tubes/work", {"pausedFor": 30})
    assert code == 200 and tube["paused"] is True and tube["pause"] == 30
    assert server.request("DELETE", f"/v1/jobs/{ids[1]}")[1]["id"] == ids[1]
    assert server.request("GET", f"/v1/jobs/{ids[1]}")[0] == 404


@pytest.mark.parametrize("method, path, body, said", [
    ("GET", "/v1/tubes?sort=size", None, "sort is name or activity"),
    ("GET", "/v1/tubes?limit=0", None, "limit is 1 to"),
    ("GET", "/v1/jobs/x1", None, "a job id is a whole number"),
    ("GET", "/v1/jobs/%C2%B3", None, "a job id is a whole number"),    # ("³": a digit to str)
    ("POST", "/v1/tubes/work/kick", {"bound": -1}, "bound is a whole number"),
    ("PATCH", "/v1/tubes/work", {"pausedFor": 1.5}, "pausedFor is a whole number"),
    ("PATCH", "/v1/tubes/work", {"paused": True}, 'the body must be {"pausedFor"'),
])
def test_bad_input_is_a_400_with_a_json_message(server, method, path, body, said):
    put(server.server.address, "work", b"x")
    code, doc = server.request(method, path, body)
    assert code == 400 and doc["error"] == "bad_request" and said in doc["message"]


def test_zstalk_stats_shows_tubes_and_counters_from_the_http_api(server):
    put(server.server.address, "emails", b"1", b"2")
    with RawClient((LOOPBACK, server.counter_port), 10) as c:
        c.sock.sendall(acquire_request(b"gpu", 1, 4))
        c.sock.recv(100)
        done = zstalk(server, "stats")
        assert done.returncode == 0, done.stderr
        tubes, counters = done.stdout.split("\n\n")
        assert tubes.splitlines()[0].split()[:3] == ["TUBE", "READY", "RESERVED"]
        assert any(row.split()[:2] == ["emails", "2"] for row in tubes.splitlines()[1:])
        assert counters.splitlines()[1].split() == ["gpu", "1", "1"]
        said = json.loads(zstalk(server, "stats", "--json").stdout)
        assert {t["name"] for t in said["tubes"]} >= {"emails", "default"}
        assert said["counters"] == [{"name": "gpu", "current": 1, "max": 1}]


def test_zstalk_stats_reads_a_plain_beanstalk_and_counter_port_too(server):
    put(server.server.address, "emails", b"1")
    host, port = server.server.address
    said = json.loads(zstalk(None, "stats", "--beanstalk", f"{host}:{port}", "--counter",
                             f"{LOOPBACK}:{server.counter_port}", "--json").stdout)
    emails = [t for t in said["tubes"] if t["name"] == "emails"]
    assert emails[0]["currentJobsReady"] == 1 and said["counters"] == []


def test_zstalk_stats_reads_debians_beanstalkd(beanstalkd_server):
    address = beanstalkd_server.address
    put(address, "emails", b"1", b"2", b"3")
    done = zstalk(None, "stats", "--beanstalk", f"{address[0]}:{address[1]}")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[0][:2] == ["TUBE", "READY"]
    assert ["emails", "3", "0", "0", "0", "3"] in [row[:6] for row in rows]
    said = json.loads(zstalk(None, "stats", "--beanstalk", f"{address[0]}:{address[1]}",
                             "--json").stdout)
    assert [(t["name"], t["totalJobs"]) for t in said["tubes"]] == [
        ("emails", 3), ("default", 0)], "busiest first, as over the API"


def test_zstalk_stats_out_of_reach_exits_3_naming_the_address_and_port():
    port = free_port()
    done = zstalk(None, "stats", "--beanstalk", f"{LOOPBACK}:{port}")
    assert done.returncode == 3 and f"{LOOPBACK}:{port}" in done.stderr
    done = zstalk(None, "stats", "--url", f"http://{LOOPBACK}:{port}")
    assert done.returncode == 3 and f"{LOOPBACK}:{port}" in done.stderr


def test_the_operations_pages_stats_example_runs_as_written(server, beanstalkd_server):
    """docs/operations/operator.md's block: over the API, then over the plain ports of
    this server, and of Debian's beanstalkd."""
    put(server.server.address, "emails", b"1")
    for beanstalk in (server.server.address, beanstalkd_server.address):
        done = run_block(server, "zstalk stats --beanstalk", {
            "BEANSTALK": "%s:%d" % beanstalk, "COUNTER": f"{LOOPBACK}:{server.counter_port}"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("TUBE ") == 2 and '"tubes"' in done.stdout
