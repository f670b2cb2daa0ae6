"""Servers from DNS end to end (`resolve = true`, broker/resolver.py): a broker, an HTTP
front and a dispatcher run in a network namespace this test makes (tests/support/netns.py),
started with `ip netns exec`, which binds the namespace's own /etc/netns/NAME/hosts over
/etc/hosts for them.  The name `api.test` is written there; two recording backends listen
on one port at 127.0.0.2 and 127.0.0.3 on the namespace's loopback.  Rewriting the hosts
file (in place: the bind mount follows the file, not its name) adds and drops servers
without a reload, and the calls follow, each with the name as its Host."""
from __future__ import annotations

import contextlib
import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from netns import Lan, netns_missing
from nginx import Backend
from servers import (LOOPBACK, ServerProcess, find_zstalk, free_port, self_check,
                     unavailable, wait_for)

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


def write_hosts(path: Path, *addresses: str) -> None:
    """api.test at `addresses` (rewritten in place: the same file the bind mount shows)."""
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n" + "".join(f"{a} api.test\n" for a in addresses))


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
    """`count` tasks of gen, waited for until each has succeeded."""
    req = urllib.request.Request(f"{api}/tasks", json.dumps(
        [{"function": "gen", "params": i} for i in range(count)]).encode(), method="POST",
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
    return [(s["url"], s.get("name")) for s in get(f"{api}/functions/gen")["servers"]]


def test_a_resolved_name_follows_its_hosts_file_without_a_reload(host, tmp_path):
    ns, hosts = host
    write_hosts(hosts, "127.0.0.2")
    with ns.inside():       # (sockets made here live in the namespace)
        two = Backend("two", address=("127.0.0.2", 0))
        port = two.address[1]
        three = Backend("three", address=("127.0.0.3", port))
        name = f"http://api.test:{port}"
        config = (f'[upstreams.api]\nresolve_interval = "1s"\n'
                  f'servers = [{{ url = "{name}", resolve = true }}]\n'
                  f'[functions.gen]\nupstream = "api"\npath = "/"\n')
        try:
            with cluster(ns, tmp_path, config) as (api, broker):
                call(api, 1)        # (builds the broker's task family: lookups begin)
                at = [(f"http://127.0.0.2:{port}", name)]
                assert wait_for(lambda: servers(api) == at, CHANGE_WINDOW_S), servers(api)
                call(api, 4)
                assert len(two.requests) == 5 and not three.requests
                assert {r.headers["Host"] for r in two.requests} == {f"api.test:{port}"}

                write_hosts(hosts, "127.0.0.2", "127.0.0.3")       # a server added
                both = [(f"http://127.0.0.2:{port}", name), (f"http://127.0.0.3:{port}", name)]
                assert wait_for(lambda: servers(api) == both, CHANGE_WINDOW_S), servers(api)
                call(api, 6)
                assert len(three.requests) == 3, (len(two.requests), len(three.requests))

                write_hosts(hosts, "127.0.0.3")                    # ... and one dropped
                only = [(f"http://127.0.0.3:{port}", name)]
                assert wait_for(lambda: servers(api) == only, CHANGE_WINDOW_S), servers(api)
                before = len(two.requests)
                call(api, 4)
                assert len(two.requests) == before and len(three.requests) == 7
                assert {r.headers["Host"] for r in three.requests} == {f"api.test:{port}"}

                write_hosts(hosts)          # the name resolves to nothing: the last set stays
                warning = f"upstream api: {name} resolves to no address"
                assert wait_for(lambda: warning in broker.output(), CHANGE_WINDOW_S)
                call(api, 2)
                assert servers(api) == only and len(three.requests) == 9
                time.sleep(3)               # (three more failed lookups: still said once)
                assert broker.output().count(warning) == 1, broker.output()
        finally:
            two.stop()
            three.stop()
