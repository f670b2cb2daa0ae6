"""The README's native-worker examples run as written: the Python blocks are taken from the
README itself, written to files and run against a real server on the ports the README
names (11300 for beanstalk, tcp://127.0.0.1:11400 for workers)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servers import LOOPBACK, RawClient, ServerProcess, find_zstalk, self_check

pytestmark = pytest.mark.skipif(self_check(), reason="runs zstalk's own examples")

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def block(marker: str) -> str:
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"one README python block holds {marker!r}"
    return found[0]


def run_python(code: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_local_broker_example_passes_with_the_emails_worker(tmp_path):
    (tmp_path / "emails.py").write_text(block("# emails.py"))
    (tmp_path / "test_emails.py").write_text(block("LocalBroker"))
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
    (tmp_path / "emails.py").write_text(block("# emails.py"))
    server = ServerProcess([find_zstalk(), "serve", "-l", LOOPBACK, "--counter-port", "0",
                            "--worker-bind", "tcp://127.0.0.1:11400"], (LOOPBACK, 11300),
                           name="readme-serve").start()
    worker = None
    try:
        out = run_python(block("import greenstalk"), tmp_path)
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
