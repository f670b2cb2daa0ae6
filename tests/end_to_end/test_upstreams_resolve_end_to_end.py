"""Servers from DNS end to end (`resolve = true`, broker/resolver.py): a broker, an HTTP
front and a dispatcher run in a network namespace this test makes (tests/support/netns.py),
started with `ip netns exec`, which binds the namespace's own /etc/netns/NAME/hosts over
/etc/hosts for them.  Their config is docs/kubernetes.md's headless.toml as written but
for a lookup every second (the test's pace); the Service name it calls, from that page's
gpu-service.yaml, is written in the hosts file, and two recording backends listen on the
Service's port at 127.0.0.2 and 127.0.0.3 on the namespace's loopback, as two pods would.
Rewriting the hosts file (in place: the bind mount follows the file, not its name) adds
and drops servers without a reload, and the calls follow, each with the name as Host."""
from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

import yaml

from netns import Lan, netns_missing
from nginx import Backend
from servers import (LOOPBACK, ServerProcess, find_zstalk, free_port, self_check,
                     unavailable, wait_for)
from test_task_limits_end_to_end import docs_block

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")

#: a lookup every second: each change is followed within a few, CI's CPU hog or not
CHANGE_WINDOW_S = 30


@pytest.fixture
def host():
    """A host (a network namespace) with a hosts file of its own."""
    why = netns_missing()
    if why:
        unavailable(why)
    with Lan() as lan:
        host = lan.host("dns")
        etc = Path("/etc/netns") / host.ns
        etc.mkdir(parents=True, exist_ok=True)
        try:
            yield host, etc / "hosts"
        finally:
            shutil.rmtree(etc, ignore_errors=True)


def service() -> tuple[str, int]:
    """The name and port of docs/kubernetes.md's headless Service."""
    doc = yaml.safe_load(docs_block("kubernetes.md", "# gpu-service.yaml"))
    assert doc["spec"]["clusterIP"] == "None"       # (YAML's None: a string, as k8s wants)
    name = f"{doc['metadata']['name']}.default.svc.cluster.local"
    return name, doc["spec"]["ports"][0]["port"]


NAME, PORT = service()


def write_hosts(path: Path, *addresses: str) -> None:
    """The Service's name at `addresses` (rewritten in place: the file the mount shows)."""
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n" + "".join(f"{a} {NAME}\n" for a in addresses))


@contextlib.contextmanager
def cluster(host, tmp_path: Path, config: str):
    """Broker, HTTP front and dispatcher in `host`'s namespace (the caller is in it too)."""
    path = tmp_path / "zstalk.toml"
    path.write_text(config)
    zstalk, port, http = find_zstalk(), free_port(), free_port()
    endpoint = f"tcp://{LOOPBACK}:{port}"
    procs = [ServerProcess(host.argv([zstalk, "broker", "--bind", endpoint, "--config",
                                      str(path)]), (LOOPBACK, port), name="broker").start()]
    try:
        procs.append(ServerProcess(host.argv([zstalk, "front", "http", "--broker", endpoint,
                                              "--listen", f"{LOOPBACK}:{http}"]),
                                   (LOOPBACK, http), name="front").start())
        procs.append(ServerProcess(host.argv([zstalk, "dispatcher", "--broker", endpoint]),
                                   (LOOPBACK, port), name="dispatcher").start())
        yield f"http://{LOOPBACK}:{http}/v1", procs[0]
    finally:
        for proc in reversed(procs):
            proc.stop()


def call(api: str, count: int) -> None:
    """`count` tasks of render, waited for until each has succeeded."""
    req = urllib.request.Request(f"{api}/tasks", json.dumps(
        [{"function": "render", "params": i} for i in range(count)]).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        uids = [item["uniqueId"] for item in json.loads(resp.read())]
    statuses: list[str] = []

    def done() -> bool:
        statuses[:] = [get(f"{api}/tasks/{uid}")["status"] for uid in uids]
        return all(s in ("success", "failed") for s in statuses)
    assert wait_for(done, 60, step=0.1) and set(statuses) == {"success"}, statuses


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def servers(api: str) -> list[tuple[str, str | None]]:
    return [(s["url"], s.get("name")) for s in get(f"{api}/functions/render")["servers"]]


def test_a_resolved_name_follows_its_hosts_file_without_a_reload(host, tmp_path):
    ns, hosts = host
    config = docs_block("kubernetes.md", "# headless.toml")
    assert f'url = "http://{NAME}:{PORT}", resolve = true' in config
    config = config.replace('resolve_interval = "5s"', 'resolve_interval = "1s"')
    name, host_header = f"http://{NAME}:{PORT}", f"{NAME}:{PORT}"
    write_hosts(hosts, "127.0.0.2")
    with ns.inside():       # (sockets made here live in the namespace)
        two = Backend("two", address=("127.0.0.2", PORT))
        three = Backend("three", address=("127.0.0.3", PORT))
        try:
            with cluster(ns, tmp_path, config) as (api, broker):
                call(api, 1)        # (builds the broker's task family: lookups begin)
                at = [(f"http://127.0.0.2:{PORT}", name)]
                assert wait_for(lambda: servers(api) == at, CHANGE_WINDOW_S), servers(api)
                call(api, 4)
                assert len(two.requests) == 5 and not three.requests
                assert {(r.path, r.headers["Host"]) for r in two.requests} == {
                    ("/render", host_header)}

                write_hosts(hosts, "127.0.0.2", "127.0.0.3")       # a pod added
                both = [(f"http://127.0.0.2:{PORT}", name), (f"http://127.0.0.3:{PORT}", name)]
                assert wait_for(lambda: servers(api) == both, CHANGE_WINDOW_S), servers(api)
                call(api, 6)
                assert len(three.requests) == 3, (len(two.requests), len(three.requests))

                write_hosts(hosts, "127.0.0.3")                    # ... and one gone
                only = [(f"http://127.0.0.3:{PORT}", name)]
                assert wait_for(lambda: servers(api) == only, CHANGE_WINDOW_S), servers(api)
                before = len(two.requests)
                call(api, 4)
                assert len(two.requests) == before and len(three.requests) == 7
                assert {r.headers["Host"] for r in three.requests} == {host_header}

                write_hosts(hosts)          # the name resolves to nothing: the last set stays
                warning = f"upstream gpu: {name} resolves to no address"
                assert wait_for(lambda: warning in broker.output(), CHANGE_WINDOW_S)
                call(api, 2)
                assert servers(api) == only and len(three.requests) == 9
                time.sleep(3)               # (three more failed lookups: still said once)
                assert broker.output().count(warning) == 1, broker.output()
        finally:
            two.stop()
            three.stop()
