"""/metrics of real processes during a real run, read with prometheus-client's parser,
checked with `promtool check metrics`, and scraped by a real Prometheus (Debian's, started
here on loopback) whose HTTP API must give back the values the run produced."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from servers import (LOOPBACK, RawClient, ServerProcess, find_zstalk, free_port, needs_group,
                     readme_block, self_check, wait_for)
from test_metrics import label_values, parse, values
from test_tasks_end_to_end import host  # noqa: F401 (the function host fixture)

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
TOKEN = "scrape-me-3141"


def scrape_text(port: int, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{LOOPBACK}:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def scrape(port: int, token: str | None = None) -> dict:
    status, text = scrape_text(port, token)
    assert status == 200, text
    return parse(text)


def probe(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def one(samples: dict, name: str, **labels) -> float:
    [value] = values(samples, name, **labels).values()
    return value


def health_args(port: int) -> list[str]:
    return ["--health-port", str(port), "--health-listen", LOOPBACK]


def beanstalk(port: int, *commands: bytes) -> list[bytes]:
    with RawClient((LOOPBACK, port), 10) as c:
        c.send(b"".join(commands))
        return c.read_replies(len(commands))


def promtool_accepts(text: bytes) -> None:
    out = subprocess.run([needs_group("prometheus", "promtool"), "check", "metrics"], input=text,
                         capture_output=True, timeout=30)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()


# -- one process ------------------------------------------------------------------------------
@pytest.fixture
def served(tmp_path, host):
    """`zstalk serve` with functions, the HTTP API and a health port: (server, ports)."""
    config = tmp_path / "zstalk.toml"
    config.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
    port, http, health = free_port(), free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none", "--config",
                            str(config), "--http-port", str(http), *health_args(health)],
                           (LOOPBACK, port), name="zstalk-metrics").start()
    assert wait_for(lambda: scrape_text(health)[0] == 200, 10), server.output()
    yield server, {"beanstalk": port, "http": http, "health": health}
    server.stop()


def enqueue(http: int, function: str, **options) -> str:
    req = urllib.request.Request(f"http://{LOOPBACK}:{http}/v1/tasks", method="POST",
                                 data=json.dumps({"function": function, "params": {},
                                                  "options": options}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["uniqueId"]


def test_a_serve_process_counts_puts_fills_histograms_and_ages_its_oldest_ready_job(served):
    server, ports = served
    beanstalk(ports["beanstalk"], b"use mail\r\n", *[b"put 0 0 60 2\r\nhi\r\n"] * 5)
    first = scrape(ports["health"])
    assert one(first, "zstalk_tube_puts_total", tube="mail") == 5
    assert one(first, "zstalk_tube_jobs", tube="mail", state="ready") == 5
    beanstalk(ports["beanstalk"], b"watch mail\r\n", b"reserve\r\n")   # (closes: released)
    time.sleep(1.2)
    second = scrape(ports["health"])
    age = one(second, "zstalk_tube_oldest_ready_age_seconds", tube="mail")
    assert age >= one(first, "zstalk_tube_oldest_ready_age_seconds", tube="mail") + 1.0
    assert one(second, "zstalk_job_wait_seconds_count", tube="mail") == 1
    assert one(second, "zstalk_commands_total", command="put") == 5
    assert one(second, "zstalk_front_commands_total", kind="beanstalk") == 8
    assert one(second, "zstalk_front_connections", kind="beanstalk") == 0
    assert label_values(second, "zstalk_build_info", "role") == {"serve"}
    promtool_accepts(scrape_text(ports["health"])[1])


def test_a_failed_task_is_counted_by_outcome_and_a_held_call_is_in_flight(served, host):
    server, ports = served
    host.script["broken"] = [{"status": 500, "text": "no"}]
    uid = enqueue(ports["http"], "broken", attempts=0)     # (0: one call, no retry)
    host.held.add("slow")
    enqueue(ports["http"], "slow")

    def counted() -> dict | None:
        got = scrape(ports["health"])
        failed = values(got, "zstalk_tasks_finished_total", function="broken", outcome="failed")
        running = values(got, "zstalk_tasks", function="slow", state="running")
        return got if sum(failed.values()) == 1 and sum(running.values()) == 1 else None
    assert wait_for(counted, 10), (uid, server.output())
    got = counted()
    assert one(got, "zstalk_tasks_enqueued_total", function="broken") == 1
    assert one(got, "zstalk_task_call_seconds_count", function="broken") == 1
    assert one(got, "zstalk_dispatcher_calls_in_flight") == 1
    assert one(got, "zstalk_front_commands_total", kind="http") == 2
    host.held.clear()


# -- every role in its own process ------------------------------------------------------------
def test_each_role_in_its_own_process_serves_its_own_metrics(tmp_path):
    broker_port = free_port()
    endpoint = f"tcp://{LOOPBACK}:{broker_port}"
    ports = {name: free_port() for name in ("broker", "beanstalk", "counter", "dispatcher",
                                            "beanstalk-h", "counter-h", "dispatcher-h")}
    zstalk = find_zstalk()
    procs = [ServerProcess([zstalk, "broker", "--bind", endpoint,
                            *health_args(ports["broker"])], (LOOPBACK, broker_port),
                           name="broker").start()]
    try:
        for kind in ("beanstalk", "counter"):
            procs.append(ServerProcess(
                [zstalk, "front", kind, "--broker", endpoint, "--listen",
                 f"{LOOPBACK}:{ports[kind]}", *health_args(ports[f"{kind}-h"])],
                (LOOPBACK, ports[kind]), name=kind).start())
        procs.append(ServerProcess([zstalk, "dispatcher", "--broker", endpoint,
                                    *health_args(ports["dispatcher-h"])],
                                   (LOOPBACK, ports["dispatcher-h"]), name="dispatcher").start())
        assert wait_for(lambda: beanstalk(ports["beanstalk"], b"put 0 0 60 1\r\nx\r\n")
                        [0].startswith(b"INSERTED"), 10)
        roles = {"broker": "broker", "beanstalk-h": "front", "counter-h": "front",
                 "dispatcher-h": "dispatcher"}
        for name, role in roles.items():
            # (a role's health port may open a moment after the port it serves on)
            assert wait_for(lambda: scrape_text(ports[name])[0] == 200, 10), name
            got = scrape(ports[name])
            assert label_values(got, "zstalk_build_info", "role") == {role}, name
        assert one(scrape(ports["broker"]), "zstalk_tube_puts_total", tube="default") >= 1
        front = scrape(ports["beanstalk-h"])
        assert one(front, "zstalk_front_commands_total", kind="beanstalk") >= 1
        assert values(front, "zstalk_front_link_round_trip_seconds_count", kind="beanstalk")
        assert one(scrape(ports["dispatcher-h"]), "zstalk_dispatcher_calls_in_flight") == 0
        fronts = scrape(ports["broker"])
        assert one(fronts, "zstalk_fronts", kind="counter") == 1
        assert one(fronts, "zstalk_fronts", kind="dispatcher") == 1
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_a_front_without_its_broker_counts_the_commands_it_held_and_failed():
    port, health = free_port(), free_port()
    dead = f"tcp://{LOOPBACK}:{free_port()}"
    front = ServerProcess([find_zstalk(), "front", "beanstalk", "--broker", dead, "--listen",
                           f"{LOOPBACK}:{port}", "--hold-s", "1", *health_args(health)],
                          (LOOPBACK, port), name="front").start()
    try:
        assert beanstalk(port, b"put 0 0 60 1\r\nx\r\n", b"bogus\r\n") == [
            b"INTERNAL_ERROR\r\n", b"UNKNOWN_COMMAND\r\n"]
        got = scrape(health)
        assert one(got, "zstalk_front_held_total", kind="beanstalk") == 1
        assert one(got, "zstalk_front_own_replies_total", kind="beanstalk") == 2
        assert one(got, "zstalk_front_commands_total", kind="beanstalk") == 2
    finally:
        front.stop()


# -- serve --fronts N ---------------------------------------------------------------------------
def every_child_up(health: int) -> bytes | None:
    """The supervisor's scrape if it reached every child (zstalk_child_up 1 for each)."""
    status, text = scrape_text(health, TOKEN)
    if status != 200:
        return None
    up = values(parse(text), "zstalk_child_up")
    return text if up and all(v == 1 for v in up.values()) else None


def test_serve_with_front_processes_serves_one_metrics_with_each_child_as_a_role(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port, health = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--fronts", "2", "--counter-port", "0", "--worker-bind", "none",
                            *health_args(health), "--metrics-token-file", str(token_file)],
                           (LOOPBACK, port), name="zstalk-fronts",
                           probe=b"list-tubes\r\n").start()
    try:
        assert wait_for(lambda: every_child_up(health), 20), server.output()
        for _ in range(4):          # the kernel spreads connections over the two fronts
            beanstalk(port, b"use jobs\r\n", b"put 0 0 60 1\r\nx\r\n")
        assert scrape_text(health)[0] == 401
        assert scrape_text(health, "wrong")[0] == 403
        # a child slower than the supervisor's scrape timeout is down in that scrape (as on
        # a loaded machine): take the first scrape that reached every child
        full = []
        assert wait_for(lambda: full.append(every_child_up(health)) or full[-1], 20), \
            server.output()
        text = full[-1]
        got = parse(text)
        assert label_values(got, "zstalk_build_info", "role") == {
            "supervisor", "broker", "front-0", "front-1"}
        assert all(v == 1 for v in values(got, "zstalk_child_up").values())
        assert one(got, "zstalk_tube_puts_total", role="broker", tube="jobs") == 4
        commands = values(got, "zstalk_front_commands_total")
        assert sum(commands.values()) >= 8 and len(commands) == 2
        promtool_accepts(text)
        assert wait_for(lambda: probe(health, "/readyz") == (200, b"ok\n"), 10), probe(
            health, "/readyz")
    finally:
        server.stop()


# -- bounded labels -----------------------------------------------------------------------------
def test_ten_thousand_tubes_through_a_real_server_keep_the_label_set_bounded():
    port, health = free_port(), free_port()
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none",
                            "--metrics-top", "5", *health_args(health)],
                           (LOOPBACK, port), name="zstalk-tubes").start()
    try:
        with RawClient((LOOPBACK, port), 60) as c:
            for start in range(0, 10_000, 1000):
                c.send(b"".join(b"use tube-%d\r\nput 0 0 60 1\r\nx\r\n" % i
                                for i in range(start, start + 1000)))
                c.read_replies(2000)
        got = scrape(health)
        puts = values(got, "zstalk_tube_puts_total")
        assert len(puts) <= 2 * 5 + 1 and sum(puts.values()) == 10_000
        assert len(values(got, "zstalk_tube_jobs")) <= 4 * (2 * 5 + 1)
        assert one(got, "zstalk_jobs", state="ready") == 10_000
    finally:
        server.stop()


# -- a real Prometheus ------------------------------------------------------------------------
def query(port: int, promql: str) -> list:
    url = f"http://{LOOPBACK}:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as resp:
        answer = json.loads(resp.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_a_real_prometheus_scrapes_serve_and_answers_the_readmes_queries(tmp_path):
    prometheus = needs_group("prometheus", "prometheus")
    port, health, web = free_port(), free_port(), free_port()
    (tmp_path / "token").write_text(TOKEN)
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port),
                            "--counter-port", "0", "--worker-bind", "none", *health_args(health),
                            "--metrics-token-file", str(tmp_path / "token")],
                           (LOOPBACK, port), name="zstalk-scraped").start()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: zstalk\n"
        f"    authorization: {{credentials_file: {tmp_path / 'token'}}}\n"
        f"    static_configs: [{{targets: ['{LOOPBACK}:{health}']}}]\n")
    scraper = ServerProcess([prometheus, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address={LOOPBACK}:{web}", "--log.level=warn"],
                            (LOOPBACK, web), name="prometheus")
    try:
        scraper.start(timeout=30)
        beanstalk(port, b"use reports\r\n", *[b"put 0 0 60 1\r\nx\r\n"] * 7,
                  b"watch reports\r\n", b"reserve\r\n")

        def scraped() -> list:
            return query(web, 'zstalk_tube_puts_total{tube="reports"} == 7')
        assert wait_for(scraped, 30, step=0.5), scraper.output()
        [up] = query(web, 'up{job="zstalk"}')
        assert up["value"][1] == "1"
        [ready] = query(web, 'zstalk_tube_jobs{tube="reports",state="ready"}')
        assert ready["value"][1] in ("6", "7")      # (the reserve, then its release on close)
        for promql in readme_block("promql", "zstalk_tube_oldest_ready_age_seconds").splitlines():
            if promql.strip():
                query(web, promql)                  # each query of the manual answers
        [age] = query(web, 'max by (tube) (zstalk_tube_oldest_ready_age_seconds{tube="reports"})')
        assert float(age["value"][1]) > 0
    finally:
        scraper.stop()
        server.stop()
