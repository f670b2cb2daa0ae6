"""The README's native-worker examples run as written: the Python blocks are taken from the
README itself, written to files and run against a real server on the ports the README
names (11300 for beanstalk, tcp://127.0.0.1:11400 for workers)."""
from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import time
import zoneinfo
from pathlib import Path

import pytest

from servers import LOOPBACK, RawClient, ServerProcess, find_zstalk, readme_block, self_check

pytestmark = pytest.mark.skipif(self_check(), reason="runs zstalk's own examples")

def run_python(code: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_local_broker_example_passes_with_the_emails_worker(tmp_path):
    (tmp_path / "emails.py").write_text(readme_block("python", "# emails.py"))
    (tmp_path / "test_emails.py").write_text(readme_block("python", "LocalBroker"))
    out = run_python("import emails, test_emails\n"
                     "test_emails.test_send_delivers()\n"
                     "print(emails.outbox)\n", tmp_path)
    assert out.returncode == 0, out.stderr
    assert "('x@example.com', 'hi')" in out.stdout


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def test_the_producers_and_the_worker_command_work_on_the_readme_ports(tmp_path):
    if not (_free(11300) and _free(11400)):
        pytest.skip("the README's ports 11300 / 11400 are taken on this machine")
    (tmp_path / "emails.py").write_text(readme_block("python", "# emails.py"))
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "--counter-port", "0",
                            "--worker-bind", "tcp://127.0.0.1:11400"], (LOOPBACK, 11300),
                           name="readme-serve").start()
    worker = None
    try:
        out = run_python(readme_block("python", "import greenstalk"), tmp_path)
        assert out.returncode == 0, out.stderr
        worker = subprocess.Popen([find_zstalk(), "worker", "emails:worker"], cwd=tmp_path,
                                  env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        with RawClient((LOOPBACK, 11300), 10) as c:
            while True:
                c.send(b"stats-tube emails\r\n")
                stats = c.read_reply()
                if b"\ncmd-delete: 1002\n" in stats:
                    break
                assert time.monotonic() < deadline, stats
                time.sleep(0.2)
        assert b"\ntotal-jobs: 1002\n" in stats and b"current-jobs-buried: 0\n" in stats
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        server.stop()


def json_documents(text: str) -> list:
    import json
    decoder, docs, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(text, i)
        docs.append(doc)
    return docs


def test_the_cloud_task_example_runs_as_written(tmp_path):
    ports = (11300, 11215, 11400, 8080, 3000)
    if not all(_free(p) for p in ports):
        pytest.skip(f"the README's ports {ports} are not all free on this machine")
    (tmp_path / "zstalk.toml").write_text(readme_block("toml", "[functions]"))
    (tmp_path / "functions.py").write_text(readme_block("python", "# functions.py"))
    host = ServerProcess([sys.executable, "functions.py"], (LOOPBACK, 3000), cwd=str(tmp_path),
                         name="readme-functions").start()
    server = ServerProcess([find_zstalk(), "serve", "--config", "zstalk.toml"], (LOOPBACK, 11300),
                           cwd=str(tmp_path), name="readme-tasks").start()
    try:
        deadline = time.monotonic() + 10
        while _free(8080) or "http on" not in server.output():
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.05)
        out = subprocess.run(["bash", "-c", readme_block("sh", "/v1/tasks")], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        enqueued, info = json_documents(out.stdout)
        assert enqueued == {"uniqueId": "close-1234", "status": "queued", "waitNum": 0}
        get = readme_block("sh", "/v1/tasks").strip().splitlines()[-1]
        while info["status"] in ("queued", "running") and time.monotonic() < deadline + 10:
            time.sleep(0.2)         # (a slow machine: the README's sleep was not enough)
            [info] = json_documents(subprocess.run(["bash", "-c", get], capture_output=True,
                                                   text=True, timeout=30).stdout)
        assert info["status"] == "success" and info["result"] == {"closed": 1234}
        assert info["statusCode"] == 200 and info["attempt"] == 1
        (tmp_path / "enqueue.py").write_text(readme_block("python", "# enqueue.py"))
        out = subprocess.run([sys.executable, "enqueue.py"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "success {'closed': 42}"
        check_the_schedule_example()
    finally:
        server.stop()
        host.stop()


def check_the_schedule_example() -> None:
    """The README's schedule requests, against the server of the cloud-task example."""
    out = subprocess.run(["bash", "-c", readme_block("sh", "v1/schedules")], capture_output=True,
                         text=True, timeout=60)
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


def test_the_curve_example_runs_as_written(tmp_path):
    if not all(_free(p) for p in (11500, 11301)):
        pytest.skip("the README's ports 11500 / 11301 are taken on this machine")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZSTALK_")}
    env["PATH"] = f"{Path(find_zstalk()).parent}:{env['PATH']}"
    shell = subprocess.Popen(["bash", "-c", readme_block("sh", "zstalk keygen") + "\nwait"],
                             cwd=tmp_path, env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while _free(11301):
            assert shell.poll() is None and time.monotonic() < deadline, shell.stdout.read()
            time.sleep(0.05)
        with RawClient((LOOPBACK, 11301)) as client:
            for _ in range(200):        # (the front says Hello once the broker answers)
                client.send(b"put 0 0 60 6\r\nsealed\r\n")
                reply = client.read_reply()
                if reply.startswith(b"INSERTED"):
                    break
                time.sleep(0.05)
            assert reply.startswith(b"INSERTED"), reply
    finally:
        os.killpg(shell.pid, signal.SIGTERM)
        shell.wait(10)
