"""scripts/ha-local, the local try of docs/ha.md, run as a newcomer runs it (on free ports):
it starts three NATS nodes and two instances, says where each listens and which leads;
a job put on the leader is there on the other after a kill -9 of the leader, the killed
one is started again and stands by; SIGTERM stops everything (exit 0, no process left).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nats_cluster import needs_nats_server
from servers import RawClient, self_check, wait_for

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own journal")
ROOT = Path(__file__).resolve().parents[2]
START_S = 90.0          # three NATS nodes and two instances on a loaded machine
INSTANCE = re.compile(r"instance (\w) \(pid (\d+)\): beanstalk ([\d.]+):(\d+), counters "
                      r"\S+, workers tcp://\S+, health http://\S+/leader; (leads|stands by)")


class Lines(threading.Thread):
    """The script's output, line by line, read on a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, []

    def run(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, part: str) -> bool:
        return any(part in line for line in self.lines)

    def text(self) -> str:
        return "\n".join(self.lines)


def test_ha_local_starts_three_nats_nodes_and_two_instances_and_a_kill_9_loses_nothing(
        tmp_path):
    needs_nats_server()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "ha-local"),
                             "--free-ports", "--dir", str(tmp_path), "--for", "300"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = Lines(proc)
    out.start()
    pids: set[int] = {proc.pid}
    try:
        assert wait_for(lambda: out.has("Ctrl-C stops everything") or proc.poll() is not None,
                        START_S), out.text()
        assert proc.poll() is None, out.text()
        nats = [line for line in out.lines if line.startswith("ha-local: NATS n")]
        assert len(nats) == 3 and all("nats://127.0.0.1:" in line for line in nats), out.text()
        pids |= {int(p) for line in nats for p in re.findall(r"\(pid (\d+)\)", line)}
        instances = {m[1]: m for line in out.lines if (m := INSTANCE.search(line))}
        assert sorted(instances) == ["A", "B"], out.text()
        leader = next(m for m in instances.values() if m[5] == "leads")
        other = next(m for m in instances.values() if m[5] == "stands by")
        pids |= {int(m[2]) for m in instances.values()}
        with RawClient((leader[3], int(leader[4])), 15) as c:
            c.send(b"put 0 0 60 4\r\nkept\r\n")
            assert c.read_reply() == b"INSERTED 1\r\n"
        os.kill(int(leader[2]), signal.SIGKILL)

        def peeked() -> bool:
            with RawClient((other[3], int(other[4])), 15) as c:
                c.send(b"peek 1\r\n")
                return c.read_reply() == b"FOUND 1 4\r\nkept\r\n"
        assert wait_for(peeked, 30.0, 0.1), out.text()
        assert wait_for(lambda: out.has(f"instance {other[1]} leads"), 10.0), out.text()
        again = f"instance {leader[1]} started again"
        assert wait_for(lambda: out.has(f"instance {leader[1]} stands by"), 60.0), out.text()
        pids |= {int(p) for line in out.lines if again in line
                 for p in re.findall(r"\(pid (\d+)\)", line)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, out.text()
        out.join(10)
        assert out.lines[-1] == "ha-local: stopped", out.text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)
    left = [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert left == [], f"processes left: {left}"
    assert tmp_path.exists()            # (--dir is kept, with the logs)
    assert {"n1.log", "zstalk-A.log", "zstalk-B.log"} <= {p.name for p in tmp_path.iterdir()}
