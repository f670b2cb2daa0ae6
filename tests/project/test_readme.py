# Every example of the README and of the manual (docs/**/*.md) runs as written, in a fresh
# shell: `env -i HOME=<new> PATH=/usr/bin:/bin bash` in a directory that holds what a clone
# holds after the two set-up commands (scripts/ and .venv, linked; k8s/ copied, since an
# example writes an overlay into it), after the one line the README says to run first
# (`source .venv/bin/activate`).
#
# A block is code unless it is `text` or has no language (diagrams, the synopsis). A code
# block whose first line is `# NAME` is a file the example writes (`# zstalk.toml`, `#
# emails.py`); the others run. Every code block is either run by a test here (RUN_BY says
# which) or marked `<!-- not run: reason -->` on the line above it, and then still checked:
# `bash -n` for a shell block, and the check its test names; their number may not grow
# (NOT_RUN).  The examples use the ports the pages name (11300, 11215, 11400, 8080, 3000,
# 11500, 11301, 8000, 8081, 8090, 9090, and NATS's 4222 and 8222): a test skips when one is
# taken here, as none is on CI.  An HTML block (`<!-- NAME -->` first) is a page a real
# browser opens (tests/support/browser.py).
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import zoneinfo
from pathlib import Path
from typing import NamedTuple

import pytest

from nats_cluster import needs_nats_server
from servers import LOOPBACK, RawClient, free_port, needs_group, self_check, wait_for

pytestmark = pytest.mark.skipif(self_check(), reason="runs zstalk's own examples")
ROOT = Path(__file__).resolve().parents[2]
#: where the examples are: the README, then the manual's pages
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: the blocks marked not run, which only a test of their own may change: the two set-up
#: commands, pushing an image, building and pushing a worker image, applying to a cluster,
#: installing the gateway into this machine's nginx
NOT_RUN = 5
CODE = {"sh", "python", "toml", "yaml", "dockerfile", "json", "promql", "html"}
#: a marker found in each run block -> the test that runs it (or the test file elsewhere)
RUN_BY = {
    "source .venv/bin/activate": "every test here (the first line of each shell)",
    "# greet.py": "test_the_hello_world_runs_as_written",
    "# hello_worker.py": "test_the_hello_world_runs_as_written",
    "# hello.toml": "test_the_hello_world_runs_as_written",
    "zstalk worker hello_worker:worker": "test_the_hello_world_runs_as_written",
    "# hello.py": "test_the_hello_world_runs_as_written",
    "/v1/tasks/hello-1": "test_the_hello_world_runs_as_written",
    "zstalk keygen secrets broker": "test_the_keys_example_makes_keys_a_server_takes",
    "--master-key-file secrets/master-key": "test_the_keys_example_makes_keys_a_server_takes",
    "envsubst '${GATEWAY_LISTEN}": "test_the_gateway_steps_run_in_nginx_before_a_real_room",
    "python -m http.server 3000": "test_the_gateway_steps_run_in_nginx_before_a_real_room",
    "gate=http://127.0.0.1:8090": "test_the_gateway_steps_run_in_nginx_before_a_real_room",
    "# prometheus.yml": "test_the_prometheus_config_scrapes_zstalk_in_a_real_prometheus",
    "# zstalk.toml": "test_the_cloud_task_examples_run_as_written",
    "# functions.py": "test_the_cloud_task_examples_run_as_written",
    "/v1/tasks/close-1234": "test_the_cloud_task_examples_run_as_written",
    "# enqueue.py": "test_the_cloud_task_examples_run_as_written",
    "# own_token.py": "test_the_cloud_task_examples_run_as_written",
    "# tenant_host.py": "test_the_groups_example_runs_as_written",
    "# groups.toml": "test_the_groups_example_runs_as_written",
    "# tenants.py": "test_the_groups_example_runs_as_written",
    "# tenant_limits.toml": "tests/end_to_end/test_task_limits_end_to_end.py",
    "# lifecycle.toml": "tests/end_to_end/test_task_lifecycle_end_to_end.py",
    "# launch.toml": "tests/end_to_end/test_waiting_room_end_to_end.py",
    "# check_draw.py": "tests/end_to_end/test_waiting_room_end_to_end.py",
    "# shop-room.toml": "tests/fronts/test_room_page.py",
    "<!-- shop-room.html -->": "tests/fronts/test_room_page.py",
    "# protect.toml": "test_the_limits_example_runs_as_written",
    "# limits.py": "test_the_limits_example_runs_as_written",
    "# reports.py": "test_the_request_task_example_runs_as_written",
    "# reports.toml": "test_the_request_task_example_runs_as_written",
    "# report.py": "test_the_request_task_example_runs_as_written",
    "# shared.toml": "test_the_function_counter_example_runs_as_written",
    "# batch.py": "test_the_function_counter_example_runs_as_written",
    "# gpus.toml": "test_the_upstream_example_runs_as_written",
    "# gpu_servers.py": "test_the_upstream_example_runs_as_written",
    "# render.py": "test_the_upstream_example_runs_as_written",
    "# gpu-service.yaml": "tests/end_to_end/test_upstreams_resolve_end_to_end.py (its name "
                          "and port, in a network namespace's hosts file)",
    "# headless.toml": "tests/end_to_end/test_upstreams_resolve_end_to_end.py (as written, "
                       "its name in a network namespace's hosts file)",
    "# room.toml": "test_the_waiting_room_example_runs_as_written",
    "# passes.keys": "test_the_waiting_room_example_runs_as_written",
    "# room.py": "test_the_waiting_room_example_runs_as_written",
    "<!-- shop.html": "test_the_shop_page_joins_the_line_from_a_browser",
    "curl -si -X OPTIONS http://127.0.0.1:8080/v1/tasks":
        "test_the_waiting_room_example_runs_as_written",
    "curl -sN $api/v1/tasks/$id/events":
        "tests/end_to_end/test_event_stream_end_to_end.py (on a free port)",
    "# verify_signature.py": "test_the_signature_check_example_agrees_with_signing",
    "api=http://127.0.0.1:8080/v1/schedules": "test_the_cloud_task_examples_run_as_written",
    "# emails.py": "test_the_native_worker_examples_run_as_written",
    "scripts/zstalk worker emails:worker": "test_the_native_worker_examples_run_as_written",
    "# producers.py": "test_the_native_worker_examples_run_as_written",
    "# semaphore.py": "test_the_native_worker_examples_run_as_written",
    "# test_emails.py": "test_the_unit_test_example_passes_under_pytest",
    "zstalk keygen keys broker": "test_the_curve_example_runs_as_written",
    "scripts/build-image": "test_the_image_example_runs_as_written",
    "# Dockerfile.worker": "tests/deploy/test_multihost.py (builds it FROM the local image)",
    "# k8s/overlays/mine/kustomization.yaml": "test_the_kustomize_line_renders_the_readme_overlay",
    "curl -s http://127.0.0.1:8081/metrics": "test_the_metrics_example_runs_as_written",
    "nats-server -c nats.conf": "test_the_journal_example_keeps_a_job_through_a_kill_9",
    "scripts/ha-local            # Ctrl-C": "tests/ha/test_ha_local.py (on free ports, a kill -9)",
    "kubectl kustomize k8s/overlays/ha": "test_the_ha_overlay_renders_as_docs_ha_says",
    "zstalk functions pause resize":
        "tests/end_to_end/test_operator_end_to_end.py (on free ports, through ZSTALK_URL)",
    "zstalk stats --beanstalk": "tests/end_to_end/test_operator_views_end_to_end.py (on free "
                                "ports, and against Debian's beanstalkd)",
    "max by (tube) (zstalk_tube_oldest_ready_age_seconds)":
        "tests/end_to_end/test_metrics_end_to_end.py (each query, on a real Prometheus)",
}


class Block(NamedTuple):
    lang: str
    text: str
    not_run: str | None     # the reason, for a block marked not run
    line: int
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in PAGES:
        page, text = str(path.relative_to(ROOT)), path.read_text()
        for m in re.finditer(r"(?:<!-- not run: (.*?) -->\n)?( *)```(\w*)\n(.*?)\n\2```", text,
                             re.S):
            code = "\n".join(line[len(m[2]):] for line in m[4].split("\n"))
            found.append(Block(m[3], code + "\n", m[1], text[:m.start()].count("\n") + 1, page))
    return found


def block(marker: str) -> Block:
    [found] = [b for b in blocks() if marker in b.text]
    return found


def file_name(b: Block) -> str | None:
    """`NAME` of a block whose first line is `# NAME` or `# NAME: what it is` (in HTML,
    `<!-- NAME: what it is -->`)."""
    first = b.text.split("\n", 1)[0]
    if b.lang == "html":
        first = re.sub(r"^<!-- (.*) -->$", r"# \1", first)
    m = re.fullmatch(r"# ([\w./-]+\.\w+|Dockerfile[\w.]*)(:.*)?", first)
    return m[1] if m and b.lang != "sh" else None


# -- the fresh shell -----------------------------------------------------------------------
class Shell:
    """Fresh shells in one example directory."""

    def __init__(self, where: Path) -> None:
        self.where = where
        (where / "home").mkdir()
        self.env = {"HOME": str(where / "home"), "PATH": "/usr/bin:/bin"}
        self.first = block("source .venv/bin/activate").text
        self.started: list[subprocess.Popen] = []

    def write(self, b: Block) -> Path:
        path = self.where / file_name(b)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(b.text)
        return path

    def run(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["env", "-i", *self._env(), "bash", "-c", self.first + script],
                              cwd=self.where, capture_output=True, text=True, timeout=timeout)

    def start(self, script: str) -> subprocess.Popen:
        """A script left running (a server, a worker pool), in a process group of its own."""
        proc = subprocess.Popen(["env", "-i", *self._env(), "bash", "-c", self.first + script],
                                cwd=self.where, start_new_session=True, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.started.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.started):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            # what it left running in the background (`zstalk serve &`) stops after the
            # shell, and holds its ports until it has: the next test needs them free
            if not wait_for(lambda: not group_alive(proc.pid), 20):
                os.killpg(proc.pid, signal.SIGKILL)

    def _env(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.env.items()]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def shell(tmp_path):
    for name in ("scripts", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    sh = Shell(tmp_path)
    yield sh
    sh.stop()


def free(*ports: int) -> None:
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # (as servers bind)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                pytest.skip(f"the examples' port {port} is taken on this machine")


def listening(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    def up() -> bool:
        # (its output is read only once it is stopped: a server it left running in the
        # background keeps the pipe open)
        assert proc.poll() is None, f"the example's shell exited with {proc.returncode}"
        with socket.create_connection((LOOPBACK, port), timeout=1):
            return True
    assert wait_for(up, timeout), f"nothing listens on {port}"


def json_documents(text: str) -> list:
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(text, i)
        docs.append(doc)
    return docs


# -- the examples --------------------------------------------------------------------------
def test_the_hello_world_runs_as_written(shell):
    needs_group("reference", "curl")
    free(11300, 11215, 11400, 8080, 3000)
    for marker in ("# greet.py", "# hello_worker.py", "# hello.toml", "# hello.py"):
        shell.write(block(marker))
    three = shell.start(block("zstalk worker hello_worker:worker").text + "wait\n")
    for port in (3000, 8080, 11300):
        listening(port, three)
    out = shell.run("python hello.py")
    assert (out.returncode, out.stdout) == (0, "reserved hello\n"), out.stderr

    def handled() -> bool:
        with RawClient((LOOPBACK, 11300), 10) as c:
            c.send(b"stats-tube hello\r\n")
            return b"\ncmd-delete: 1\n" in c.read_reply()
    assert wait_for(handled, 30), "the worker pool did not delete the job of tube hello"
    out = shell.run(block("/v1/tasks/hello-1").text)
    assert out.returncode == 0, out.stderr
    enqueued, info = json_documents(out.stdout)
    token, created = enqueued.pop("token"), enqueued.pop("createdAt")
    # (the idle dispatcher takes it in the turn of its enqueue, so the 201 says running)
    assert enqueued == {"uniqueId": "hello-1", "status": "running"}
    assert re.fullmatch(r"zt1_[A-Za-z0-9_-]{43}", token) and created.endswith("Z")
    get = block("/v1/tasks/hello-1").text.strip().splitlines()[-1]
    deadline = time.monotonic() + 20
    while info["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.2)
        [info] = json_documents(shell.run(get).stdout)
    assert (info["status"], info["result"]) == ("success", {"greeting": "hello, world"})
    shell.stop()
    assert "handled world\n" in three.stdout.read()


def test_the_cloud_task_examples_run_as_written(shell):
    needs_group("reference", "curl")
    free(11300, 11215, 11400, 8080, 3000)
    for marker in ("# zstalk.toml", "# functions.py", "# enqueue.py", "# own_token.py"):
        shell.write(block(marker))
    listening(3000, shell.start("python functions.py"))          # as the README's text says
    listening(8080, shell.start("zstalk serve --config zstalk.toml"))
    out = shell.run(block("/v1/tasks/close-1234").text)
    assert out.returncode == 0, out.stderr
    enqueued, info = json_documents(out.stdout)
    token, created = enqueued.pop("token"), enqueued.pop("createdAt")
    assert enqueued == {"uniqueId": "close-1234", "status": "queued", "waitNum": 0,
                        "waitTime": 1000}
    assert re.fullmatch(r"zt1_[A-Za-z0-9_-]{43}", token) and created.endswith("Z")
    get = block("/v1/tasks/close-1234").text.strip().splitlines()[-1]
    deadline = time.monotonic() + 20
    while info["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.2)             # (a slow machine: the README's sleep was not enough)
        [info] = json_documents(shell.run(get).stdout)
    assert info["status"] == "success" and info["result"] == {"closed": 1234}
    assert (info["statusCode"], info["calls"], info["maxCalls"]) == (200, 1, 4)
    out = shell.run("python enqueue.py")
    assert (out.returncode, out.stdout.strip()) == (0, "success {'closed': 42}"), out.stderr
    out = shell.run("python own_token.py")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "zt1_ 47", "queued",
        "(403, {'error': 'forbidden', 'message': \"this token is not the task's own\"})",
        "cancelled"]
    check_the_schedule_example(shell.run(block("api=http://127.0.0.1:8080/v1/schedules").text))


def test_the_groups_example_runs_as_written(shell):
    free(11300, 11215, 11400, 8080, 3000)
    for marker in ("# tenant_host.py", "# groups.toml", "# tenants.py"):
        shell.write(block(marker))
    listening(3000, shell.start("python tenant_host.py"))
    listening(8080, shell.start("zstalk serve --config groups.toml"))
    out = shell.run("python tenants.py", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["globex waits behind: [1, 3]",
                                       "acme acme globex acme globex acme"], out.stdout


def test_the_limits_example_runs_as_written(shell):
    free(11300, 11215, 11400, 8080, 3000)
    for marker in ("# protect.toml", "# functions.py", "# limits.py"):
        shell.write(block(marker))
    listening(3000, shell.start("python functions.py"))
    listening(8080, shell.start("zstalk serve --config protect.toml"))
    out = shell.run("python limits.py", timeout=60)
    assert out.returncode == 0, out.stderr
    vip, last, before, stats = out.stdout.splitlines()
    assert re.fullmatch(r"VIP: 0 ahead, about \d+ ms", vip), vip
    ahead, ms = map(int, re.fullmatch(r"last one: (\d+) ahead, about (\d+) ms", last).groups())
    assert 12 <= ahead <= 19 and abs(ms - ahead * 200 - 200) <= 600, last
    assert int(before.rsplit(" ", 1)[1]) <= 6, before
    assert "'rate': '5/s'" in stats and "'burst': 2" in stats, stats


def test_the_request_task_example_runs_as_written(shell):
    free(11300, 11215, 11400, 8080, 3001)
    for marker in ("# reports.py", "# reports.toml", "# report.py"):
        shell.write(block(marker))
    listening(3001, shell.start("python reports.py"))
    listening(8080, shell.start("zstalk serve --config reports.toml"))
    out = shell.run("python report.py", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("success /reports/daily,2026-11-26,text/csv "
                                  "{'Content-Type': 'text/csv; charset=utf-8', "
                                  "'ETag': '\"2026-11-26\"'}")


def test_the_function_counter_example_runs_as_written(shell):
    free(11300, 11215, 11400, 8080)
    for marker in ("# shared.toml", "# batch.py"):
        shell.write(block(marker))
    listening(8080, shell.start("zstalk serve --config shared.toml"))
    out = shell.run("python batch.py", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["in use: 1 held by counters: 1", "in use after: 0"]


def test_the_upstream_example_runs_as_written(shell):
    free(11300, 11215, 11400, 8080, 3101, 3102, 3103)
    for marker in ("# gpus.toml", "# gpu_servers.py", "# render.py"):
        shell.write(block(marker))
    servers = shell.start("python gpu_servers.py")
    listening(3101, servers)
    listening(3102, servers)
    listening(8080, shell.start("zstalk serve --config gpus.toml"))
    out = shell.run("python render.py", timeout=60)
    assert out.returncode == 0, out.stderr
    ran, moved, *states = out.stdout.splitlines()
    # smooth weighted round robin over weights 2, 1, 1 picks 3101 3102 then 3103, which
    # refuses: it is failed and skipped, that call moves to the next pick within its
    # attempt, and 3101 and 3102 take the rest (the sequence is nginx's:
    # test_upstreams_end_to_end.py, test_upstreams_nginx.py)
    assert ran.split() == ["3101", "3102", "3101", "3101", "3101", "3102", "3101", "3101"], ran
    assert moved == "http://127.0.0.1:3103, http://127.0.0.1:3101", moved
    assert states == ["http://127.0.0.1:3101 usable 0", "http://127.0.0.1:3102 usable 0",
                      "http://127.0.0.1:3103 failed 1"], states


def test_the_waiting_room_example_runs_as_written(shell):
    needs_group("reference", "curl")
    free(11300, 11215, 11400, 8080)
    for marker in ("# room.toml", "# passes.keys", "# room.py"):
        shell.write(block(marker))
    listening(8080, shell.start("zstalk serve --config room.toml --pass-key-file passes.keys"))
    out = shell.run("python room.py", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "[('admitted', None), ('queued', 0), ('queued', 1), ('queued', 2)]", "204",
        "cancelled", "1", "admitted"]
    preflight = block("curl -si -X OPTIONS http://127.0.0.1:8080/v1/tasks").text
    out = shell.run(preflight)
    assert out.returncode == 0, out.stderr
    assert cors_lines(out.stdout) == [
        "HTTP/1.1 204 No Content", "Access-Control-Allow-Origin: http://localhost:8000",
        "Access-Control-Allow-Methods: POST", "Access-Control-Allow-Headers: Content-Type",
        "Access-Control-Max-Age: 600"]
    out = shell.run(preflight.replace("http://localhost:8000", "https://elsewhere.example"))
    assert cors_lines(out.stdout) == ["HTTP/1.1 403 Forbidden"]


def cors_lines(response: str) -> list[str]:
    """The status line and the Access-Control-* headers of a `curl -si` answer."""
    lines = [line.rstrip("\r") for line in response.splitlines()]
    return [lines[0]] + [line for line in lines if line.startswith("Access-Control-")]


def test_the_shop_page_joins_the_line_from_a_browser(shell):
    from browser import chromium, page_text
    chromium()                          # (skipped, or failed on CI, before anything starts)
    free(11300, 11215, 11400, 8080, 8000)
    for marker in ("# room.toml", "# passes.keys", "<!-- shop.html"):
        shell.write(block(marker))
    listening(8080, shell.start("zstalk serve --config room.toml --pass-key-file passes.keys"))
    listening(8000, shell.start("python -m http.server 8000"))     # as its first line says
    text = page_text("http://localhost:8000/shop.html", "line")
    assert text.startswith("your turn until 20"), text


SIGNED_LINE = ("GET", "/fn/report%2Fdaily", "day=2026-11-26&note=a+b%20c")
KEY = b"k" * 32


def signature_example():
    """The README's verify_signature(), run from the README's text."""
    example: dict = {}
    exec(compile(block("# verify_signature.py").text, "README: verify_signature.py", "exec"),
         example)
    return example["verify_signature"]


def test_the_signature_check_example_agrees_with_signing():
    from zstalk.workers import signing
    check, now = signature_example(), time.time()
    assert check(KEY, signing.sign(KEY, "t1", b"{}", now, *SIGNED_LINE), *SIGNED_LINE, "t1",
                 b"{}")
    stale = signing.sign(KEY, "t1", b"{}", now - 301, *SIGNED_LINE)
    assert not check(KEY, stale, *SIGNED_LINE, "t1", b"{}")
    v1_only = signing.sign(KEY, "t1", b"{}", now)
    assert not check(KEY, v1_only, *SIGNED_LINE, "t1", b"{}")     # it needs v2


@pytest.mark.parametrize("method, path, query, task_id, body", [
    ("POST", *SIGNED_LINE[1:], "t1", b"{}"),
    ("GET", "/fn/report/daily", SIGNED_LINE[2], "t1", b"{}"),
    (*SIGNED_LINE[:2], "day=2026-11-27&note=a+b%20c", "t1", b"{}"),
    (*SIGNED_LINE[:2], "", "t1", b"{}"),
    (*SIGNED_LINE, "t2", b"{}"),
    (*SIGNED_LINE, "t1", b"{ }"),
], ids=["method", "path", "query", "no-query", "task-id", "body"])
def test_the_signature_check_example_refuses_a_tampered_call_as_signing_does(
        method, path, query, task_id, body):
    from zstalk.workers import signing
    now = time.time()
    header = signing.sign(KEY, "t1", b"{}", now, *SIGNED_LINE)
    assert not signature_example()(KEY, header, method, path, query, task_id, body)
    assert signing.verify(KEY, header, task_id, body, now, method=method, path=path,
                          query=query) == signing.BAD_SIGNATURE


def check_the_schedule_example(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, out.stderr
    sweep, report, paused, listing, deleted = json_documents(out.stdout)
    fire = datetime.datetime.fromisoformat(sweep["nextFireAt"].replace("Z", "+00:00"))
    assert (fire.minute % 5, fire.second, fire.microsecond) == (0, 0, 0)
    berlin = datetime.datetime.fromisoformat(report["nextFireAt"].replace("Z", "+00:00"))
    berlin = berlin.astimezone(zoneinfo.ZoneInfo("Europe/Berlin"))
    assert berlin.strftime("%a") in ("Wed", "Fri") and (berlin.minute, berlin.second) == (30, 0)
    assert 10 <= berlin.hour <= 13 and report["options"] == {"attempts": 3}
    assert paused["paused"] is True and "nextFireAt" not in paused
    assert [s["name"] for s in listing["schedules"]] == ["report", "sweep"]
    assert deleted["name"] == "report"


def test_the_native_worker_examples_run_as_written(shell):
    free(11300, 11215, 11400)
    for marker in ("# emails.py", "# producers.py", "# semaphore.py"):
        shell.write(block(marker))
    pool = shell.start(block("scripts/zstalk worker emails:worker").text)
    listening(11300, pool)
    out = shell.run("python producers.py")
    assert out.returncode == 0, out.stderr

    def drained() -> bytes | None:
        with RawClient((LOOPBACK, 11300), 10) as c:
            c.send(b"stats-tube emails\r\n")
            stats = c.read_reply()
        return stats if b"\ncmd-delete: 1002\n" in stats else None
    assert wait_for(drained, 60), "the worker pool did not delete the 1,002 jobs"
    assert b"\ntotal-jobs: 1002\n" in drained() and b"current-jobs-buried: 0\n" in drained()
    out = shell.run("python semaphore.py")
    assert (out.returncode, out.stdout) == (0, "rendering; renders in use: 1\n"), out.stderr


def test_the_unit_test_example_passes_under_pytest(shell):
    shell.write(block("# emails.py"))
    shell.write(block("# test_emails.py"))
    out = shell.run("pytest -q -p no:cacheprovider test_emails.py")
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr


def test_the_curve_example_runs_as_written(shell):
    free(11500, 11301)
    shell.start(block("zstalk keygen keys broker").text + "wait\n")
    with_front = wait_for(lambda: socket.create_connection((LOOPBACK, 11301), timeout=1), 30)
    assert with_front, "the example's front never listened on 11301"

    def sealed() -> bool:           # (the front says Hello once the broker answers)
        with RawClient((LOOPBACK, 11301)) as client:
            client.send(b"put 0 0 60 6\r\nsealed\r\n")
            return client.read_reply().startswith(b"INSERTED")
    assert wait_for(sealed, 20)


def test_the_image_example_runs_as_written(shell):
    from image import require_image
    require_image()
    free(11300, 11215, 11400)       # (serve on the host's network: all three are its own)
    server = shell.start(block("scripts/build-image").text)
    listening(11300, server, timeout=600)       # (a first build takes ~40 s)

    def answers() -> bool:
        with RawClient((LOOPBACK, 11300), 10) as client:
            client.send(b"put 0 0 60 5\r\nimage\r\n")
            return client.read_reply() == b"INSERTED 1\r\n"
    assert wait_for(answers, 30)


def test_the_kustomize_line_renders_the_readme_overlay(shell):
    overlay = shell.write(block("# k8s/overlays/mine/kustomization.yaml")).parent
    shutil.copy(shell.write(block("# zstalk.toml")), overlay / "zstalk.toml")
    kustomize = block("kubectl kustomize k8s/overlays/mine").text.splitlines()[0]
    out = shell.run(kustomize)
    assert out.returncode == 0, out.stderr
    assert "image: registry.example.com/my-workers:1.0" in out.stdout
    assert "image: registry.example.com/zstalk:0.2.0" in out.stdout


def test_the_ha_overlay_renders_as_docs_ha_says(shell):
    out = shell.run(block("kubectl kustomize k8s/overlays/ha").text)
    assert out.returncode == 0, out.stderr
    assert "name: zstalk-nats\n" in out.stdout and "- --journal\n" in out.stdout


def test_the_metrics_example_runs_as_written(shell):
    needs_group("reference", "curl")
    free(11300, 11215, 11400, 8081)
    out = shell.run(block("curl -s http://127.0.0.1:8081/metrics").text, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'zstalk_tube_jobs{tube="emails",state="ready"} 1\n' in out.stdout, out.stdout


def test_the_journal_example_keeps_a_job_through_a_kill_9(shell):
    needs_nats_server()
    needs_group("reference", "curl")
    free(11300, 11215, 11400, 4222, 8222)
    example = shell.start(block("nats-server -c nats.conf").text)
    out = example.communicate(timeout=120)[0]
    assert example.returncode == 0, out
    assert re.findall(r"^(?:1|kept)$", out, re.M) == ["1", "kept"], out
    assert out.count("has 1 replica: a local try") == 2, out
    assert "(restored 1 jobs, 0 tasks); sync_interval always;" in out, out


def test_every_readme_code_block_is_run_or_marked_not_run():
    unrun = [(str(b), b.text.splitlines()[0]) for b in blocks() if b.lang in CODE
             and b.not_run is None and not any(marker in b.text for marker in RUN_BY)]
    assert unrun == []
    for marker in RUN_BY:           # each marker names exactly one block
        block(marker)


@pytest.mark.parametrize("b", [b for b in blocks() if b.not_run and b.lang == "sh"],
                         ids=str)
def test_a_shell_block_that_is_not_run_is_still_valid_bash(b):
    out = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_readme_has_no_code_block_in_a_language_nobody_checks():
    assert {b.lang for b in blocks()} <= CODE | {"text", ""}


def test_the_number_of_examples_not_run_does_not_grow():
    """A new example runs in a test here: one marked not run needs a reason this cannot."""
    not_run = [f"{b}: {b.not_run}" for b in blocks() if b.not_run]
    assert len(not_run) <= NOT_RUN, "\n".join(not_run)


def test_the_keys_example_makes_keys_a_server_takes(shell):
    from zstalk.workers import verify_pass
    free(11300, 11215, 11400, 8080)
    out = shell.run(block("zstalk keygen secrets broker").text)
    assert out.returncode == 0, out.stderr
    secrets = shell.where / "secrets"
    assert sorted(p.name for p in secrets.iterdir()) == [
        "broker.key", "broker.key_secret", "master-key", "passes.keys", "signing-key"]
    for name in ("broker.key_secret", "master-key", "passes.keys", "signing-key"):
        assert (secrets / name).stat().st_mode & 0o077 == 0, name       # (umask 077)
    for marker in ("# room.toml", "# passes.keys"):
        shell.write(block(marker))
    listening(8080, shell.start(block("--master-key-file secrets/master-key").text + "wait\n"))
    api, key = "http://127.0.0.1:8080", (secrets / "master-key").read_text().strip()
    joined = http_json("POST", f"{api}/v1/tasks", {"function": "checkout", "type": "online"})
    task = http_json("GET", f"{api}/v1/tasks/{joined['uniqueId']}")
    assert task["status"] == "admitted"
    assert verify_pass(task["pass"], str(secrets / "passes.keys"), "checkout") == task["uniqueId"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        http_json("GET", f"{api}/v1/tasks")
    assert refused.value.code == 401
    assert "tasks" in http_json("GET", f"{api}/v1/tasks", token=key)


def http_json(method: str, url: str, body=None, token: str | None = None):
    request = urllib.request.Request(url, json.dumps(body).encode() if body else None,
                                     {"Content-Type": "application/json"}, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def test_the_gateway_steps_run_in_nginx_before_a_real_room(shell):
    from nginx import NGINX_CONF, Nginx, require_nginx
    binary = require_nginx()
    needs_group("reference", "curl")
    free(11300, 11215, 11400, 8080, 3000, 8090)
    out = shell.run(block("envsubst '${GATEWAY_LISTEN}").text)
    assert (out.returncode, out.stdout) == (0, "2\n"), out.stderr
    # step 3 in an nginx of its own: the page's block installs the file in the machine's
    prefix, port = shell.where / "nginx", free_port()
    prefix.mkdir()
    conf = NGINX_CONF.format(prefix=prefix, host=LOOPBACK, port=port, locations="",
                             http=f"    include {shell.where / 'zstalk-gateway.conf'};")
    nginx = Nginx(binary, prefix, conf, port).start()
    try:
        for marker in ("# room.toml", "# passes.keys"):
            shell.write(block(marker))
        listening(8080, shell.start("zstalk serve --config room.toml --pass-key-file passes.keys"))
        listening(3000, shell.start(block("python -m http.server 3000").text + "wait\n"))
        out = shell.run(block("gate=http://127.0.0.1:8090").text)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["401", "the protected API", "200", "403"], out.stdout
    finally:
        nginx.stop()


def test_the_prometheus_config_scrapes_zstalk_in_a_real_prometheus(shell):
    prometheus = needs_group("prometheus", "prometheus")
    free(11300, 11215, 11400, 8081, 9090)
    config = shell.write(block("# prometheus.yml"))
    out = subprocess.run([needs_group("prometheus", "promtool"), "check", "config", str(config)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    listening(8081, shell.start("zstalk serve --health-port 8081"))
    scraper = shell.start(f"{prometheus} --config.file=prometheus.yml --storage.tsdb.path=data "
                          f"--web.listen-address=127.0.0.1:9090 --log.level=warn")
    listening(9090, scraper)

    def up() -> bool:
        query = urllib.parse.quote('up{job="zstalk"}')
        answer = http_json("GET", f"http://127.0.0.1:9090/api/v1/query?query={query}")
        return [r["value"][1] for r in answer["data"]["result"]] == ["1"]
    assert wait_for(up, 45, step=1), "Prometheus did not scrape zstalk's health port"
