"""Active health checks end to end: a real broker, HTTP front and two dispatcher processes,
and two real HTTP servers that count the probes they get by User-Agent (each dispatcher
names itself there) and the calls they get.  A server whose check starts failing is
skipped by every dispatcher within `interval × fails` (plus generous slack: CI runs with
a CPU hog) and takes calls again after `passes`; each server is probed by one dispatcher
only, and the two servers are spread over the two dispatchers.  The rules on a fake clock: tests/core/test_upstreams_health.py and
tests/core/test_health_probes.py."""
from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servers import LOOPBACK, self_check, wait_for
from test_upstreams_end_to_end import cluster, enqueue, finished, servers

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")

INTERVAL_S, FAILS, PASSES = 0.5, 2, 2
SLACK_S = 10.0      # (generous: a loaded CI machine)


class Checked:
    """An HTTP server: GET /health answers `health` (200 or 503), anything else 200;
    it counts probes by User-Agent and calls."""

    def __init__(self) -> None:
        self.health = 200
        self.probes: Counter[str] = Counter()
        self.last_agent = ""
        self.calls = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    owner.last_agent = agent = self.headers.get("User-Agent", "")
                    owner.probes[agent] += 1
                    self._answer(owner.health)
                else:
                    self._answer(404)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.calls += 1
                self._answer(200, b'{"ok": true}')

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return "http://%s:%d" % self.httpd.server_address

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def config(a: Checked, b: Checked) -> str:
    return (f'[upstreams.gpu]\nservers = [{{ url = "{a.url}" }}, {{ url = "{b.url}" }}]\n'
            f'health_check = {{ path = "/health", interval = "{int(INTERVAL_S * 1000)}ms", '
            f'fails = {FAILS}, passes = {PASSES}, timeout = "1s" }}\n'
            f'[functions.gen]\nupstream = "gpu"\npath = "/"\n')


def health(api: str, url: str) -> str:
    return servers(api)[url].get("health", {}).get("status")


def test_a_failing_server_is_skipped_by_every_dispatcher_and_back_after_its_passes(tmp_path):
    a, b = Checked(), Checked()
    try:
        with cluster(tmp_path, config(a, b), dispatchers=2) as api:
            # the first dispatcher gets both servers, and hands one to the second when it
            # comes (an even spread): from then on, each is probed by one dispatcher
            assert wait_for(lambda: a.last_agent and b.last_agent
                            and a.last_agent != b.last_agent, SLACK_S, step=0.05)
            time.sleep(2 * INTERVAL_S)          # (a probe of the handover in flight)
            a.probes.clear()
            b.probes.clear()
            assert health(api, a.url) == health(api, b.url) == "up"
            a.health = 503
            failing_since = time.monotonic()
            assert wait_for(lambda: health(api, a.url) == "down", INTERVAL_S * FAILS + SLACK_S,
                            step=0.05)
            took = time.monotonic() - failing_since
            assert took <= INTERVAL_S * (FAILS + 1) + SLACK_S
            calls_on_a = a.calls
            infos = finished(api, enqueue(api, 20))
            assert [i["status"] for i in infos] == ["success"] * 20
            assert a.calls == calls_on_a and servers(api)[a.url]["state"] == "unhealthy"
            why = servers(api)[a.url]["health"]["error"]      # (a loaded machine: a timeout)
            assert why.endswith(" answered 503") or "no answer from" in why, why
            a.health = 200
            assert wait_for(lambda: health(api, a.url) == "up", INTERVAL_S * PASSES + SLACK_S,
                            step=0.05)
            finished(api, enqueue(api, 20))
            assert a.calls > calls_on_a
            shown = servers(api)[a.url]["health"]
            assert "error" not in shown, shown
            assert shown["lastCheck"].endswith("Z") or "+" in shown["lastCheck"]
            # (before the cluster stops: a stopping dispatcher hands its server over)
            probed = [Counter(a.probes), Counter(b.probes)]
    finally:
        a.close()
        b.close()
    for agents in probed:           # (one dispatcher probed each, named in its User-Agent)
        assert len(agents) == 1, agents
        [agent] = agents
        assert agent.startswith("zstalk-health-check/") and "(dispatcher " in agent
    assert set(probed[0]) != set(probed[1])     # (spread: one server for each dispatcher)
