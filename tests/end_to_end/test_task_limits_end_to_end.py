"""A function's rate and concurrency hold across dispatchers: a real broker, HTTP front and
four `zstalk dispatcher` processes, 600 tasks of a function with `rate = "50/s"` and
`concurrency = 8`, and a function host (aiohttp on loopback, in a thread) that stamps
every call's start and end.  Then each group's own limits (issue 44): three groups of a
function with `group_concurrency = 2` and `group_rate = "10/s"`, over four dispatchers."""
from __future__ import annotations

import asyncio
import datetime
import json
import math
import re
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from app_thread import AppThread
from servers import LOOPBACK, ServerProcess, find_zstalk, free_port, self_check, wait_for
from test_upstreams_end_to_end import cluster

pytestmark = pytest.mark.skipif(self_check(), reason="needs zstalk")
RATE, BURST, CONCURRENCY, TASKS, CALL_S = 50, 2, 8, 600, 0.12
CONFIG = f'''[functions.render]
url = "http://{LOOPBACK}:{{port}}/render"
rate = "{RATE}/s"
burst = {BURST}
concurrency = {CONCURRENCY}
'''


class Host(AppThread):
    """The function: each call waits CALL_S; (task id, start, end) per call, and the most
    calls in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float, float]] = []
        self.in_flight = self.most = 0

    async def render(self, request: web.Request) -> web.Response:
        start = time.monotonic()
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await request.read()
        await asyncio.sleep(CALL_S)
        self.in_flight -= 1
        self.calls.append((request.headers["X-Zstalk-Task-Id"], start, time.monotonic()))
        return web.json_response({"ok": True})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/render", self.render)


def post(url: str, doc, **headers: str) -> tuple[int, object]:
    req = urllib.request.Request(url, json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def most_in_any_window(starts: list[float], t: float) -> int:
    """The most starts in any closed window [a, a + t]."""
    most, j = 0, 0
    for i in range(len(starts)):
        while starts[i] - starts[j] > t:
            j += 1
        most = max(most, i - j + 1)
    return most


def test_a_rate_and_a_concurrency_hold_across_four_dispatchers(tmp_path):
    with Host() as host:
        config = tmp_path / "zstalk.toml"
        config.write_text(CONFIG.format(port=host.port))
        zstalk, broker_port, http = find_zstalk(), free_port(), free_port()
        endpoint = f"tcp://{LOOPBACK}:{broker_port}"
        procs = [ServerProcess([zstalk, "broker", "--bind", endpoint, "--config", str(config)],
                               (LOOPBACK, broker_port), name="broker").start()]
        try:
            procs.append(ServerProcess([zstalk, "front", "http", "--broker", endpoint, "--listen",
                                        f"{LOOPBACK}:{http}"], (LOOPBACK, http),
                                       name="front").start())
            api = f"http://{LOOPBACK}:{http}/v1"
            status, items = post(f"{api}/tasks", [{"function": "render", "params": i}
                                                  for i in range(TASKS)])
            assert status == 200 and all(item["status"] == 201 for item in items)
            waits = [item.get("waitTime") for item in items]
            assert waits[-1] == pytest.approx((TASKS - BURST - 1) * 1000 / RATE, rel=0.05)
            for n in range(4):      # the dispatchers come after the backlog: they race for it
                procs.append(ServerProcess([zstalk, "dispatcher", "--broker", endpoint],
                                           (LOOPBACK, broker_port), name=f"dispatcher-{n}").start())
            assert wait_for(lambda: len(host.calls) >= TASKS, TASKS / RATE + 30, step=0.2), (
                len(host.calls))
            infos = [get(f"{api}/tasks/{item['uniqueId']}") for item in items]
        finally:
            for proc in reversed(procs):
                proc.stop()
    uids = [uid for uid, _, _ in host.calls]
    assert len(uids) == len(set(uids)) == TASKS, "a task was called twice"
    assert host.most <= CONCURRENCY
    starts = sorted(start for _, start, _ in host.calls)
    for t in (0.2, 0.5, 1.0, 3.0):          # what the function host saw
        assert most_in_any_window(starts, t) <= BURST + 1 + RATE * (t + 0.02), t
    mean = (len(starts) - BURST - 1) / (starts[-1] - starts[0])
    assert mean == pytest.approx(RATE, rel=0.02)
    # what the broker did: its start times (ms precision) obey GCRA exactly
    broker_starts = sorted(datetime.datetime.fromisoformat(i["startedAt"].replace(
        "Z", "+00:00")).timestamp() for i in infos)
    for t in (0.1, 0.2, 1.0):
        assert most_in_any_window(broker_starts, t - 0.002) <= BURST + 1 + math.floor(t * RATE)


GROUPS, PER_GROUP, GROUP_RATE, GROUP_BURST, GROUP_CONCURRENCY = ("acme", "beta", "gamma"), 40, \
    10, 1, 2
#: what the function host sees of the broker's starts comes late by what a dispatcher and
#: the loopback take, more on a loaded machine: a window of t there is one of t + JITTER_S
#: of the broker's (whose own start times are checked exactly)
JITTER_S = 0.25
GROUP_CONFIG = f'''[functions.render]
url = "http://{LOOPBACK}:{{port}}/render"
concurrency = 12
group_concurrency = {GROUP_CONCURRENCY}
group_rate = "{GROUP_RATE}/s"
group_burst = {GROUP_BURST}
'''


class GroupHost(Host):
    """As Host, and the most calls of each group (its params) in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, list[float]] = {group: [] for group in GROUPS}   # starts
        self.group_in_flight = dict.fromkeys(GROUPS, 0)
        self.group_most = dict.fromkeys(GROUPS, 0)

    async def render(self, request: web.Request) -> web.Response:
        group = json.loads(await request.read())
        self.groups[group].append(time.monotonic())
        self.group_in_flight[group] += 1
        self.group_most[group] = max(self.group_most[group], self.group_in_flight[group])
        try:
            return await super().render(request)
        finally:
            self.group_in_flight[group] -= 1


def test_each_groups_own_concurrency_and_rate_hold_across_four_dispatchers(tmp_path):
    total = PER_GROUP * len(GROUPS)
    with GroupHost() as host, cluster(tmp_path, GROUP_CONFIG.format(port=host.port),
                                      dispatchers=4) as api:
        status, items = post(f"{api}/tasks", [
            {"function": "render", "params": group, "options": {"group": group}}
            for _ in range(PER_GROUP) for group in GROUPS])
        assert status == 200 and all(item["status"] == 201 for item in items)
        assert wait_for(lambda: len(host.calls) >= total, PER_GROUP / GROUP_RATE + 60,
                        step=0.2), len(host.calls)
        infos = [get(f"{api}/tasks/{item['uniqueId']}") for item in items]
    assert len({uid for uid, _, _ in host.calls}) == total, "a task was called twice"
    assert host.group_most == dict.fromkeys(GROUPS, GROUP_CONCURRENCY), host.group_most
    assert host.most > GROUP_CONCURRENCY, "the groups' calls ran side by side"
    for group, starts in host.groups.items():          # what the function host saw
        for t in (0.5, 1.0, 2.0):
            assert most_in_any_window(sorted(starts), t) <= (
                GROUP_BURST + 1 + GROUP_RATE * (t + JITTER_S)), (group, t)
    for group in GROUPS:                # the broker's start times (ms) obey GCRA exactly
        starts = sorted(started_at(i) for i in infos if i["group"] == group)
        assert len(starts) == PER_GROUP
        assert_gcra(starts, GROUP_RATE, GROUP_BURST)


def assert_gcra(starts: list[float], rate: int, burst: int) -> None:
    """A group's start times as the broker gives them (startedAt, ms) within GCRA's bound:
    at most burst + 1 + floor(t x rate) in any window of t (less a ms, their precision)."""
    for t in (0.2, 1.0, 2.0):
        assert most_in_any_window(starts, t - 0.002) <= burst + 1 + math.floor(t * rate), t


def started_at(info: dict) -> float:
    return datetime.datetime.fromisoformat(info["startedAt"].replace("Z", "+00:00")).timestamp()


def docs_block(page: str, marker: str) -> str:
    """The code block of docs/`page` whose first line is `marker`."""
    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text()
    found = [b for b in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
             if b.startswith(marker + "\n")]
    assert len(found) == 1, f"{page} has no block {marker}"
    return found[0]


def test_the_docs_group_limits_example_holds_each_tenant_its_gateway_names_to_its_limits(
        tmp_path):
    """docs/tasks.md's tenant_limits.toml as written, but for the function host's port."""
    config = docs_block("tasks.md", "# tenant_limits.toml")
    tenants, each, uids = ("acme", "beta"), 12, []
    with GroupHost() as host, cluster(tmp_path, config.replace(
            "127.0.0.1:3000/report", f"{LOOPBACK}:{host.port}/render"), dispatchers=2) as api:
        for tenant in tenants * each:       # (no option: the header names the group)
            status, task = post(f"{api}/tasks", {"function": "report", "params": tenant},
                                **{"X-Tenant": tenant})
            assert status == 201, task
            uids.append(task["uniqueId"])
        assert wait_for(lambda: len(host.calls) >= each * len(tenants), each / 5 + 60,
                        step=0.2), len(host.calls)
        stats = get(f"{api}/functions/report")
        infos = [get(f"{api}/tasks/{uid}") for uid in uids]
    assert (stats["groupConcurrency"], stats["groupRate"], stats["groupBurst"]) == (2, "5/s", 1)
    odd = [(i["group"], i["status"], i.get("error"), i["calls"]) for i in infos
           if i["status"] != "success" or i["calls"] != 1]
    assert not odd, odd
    for tenant in tenants:
        assert len(host.groups[tenant]) == each and host.group_most[tenant] <= 2, (
            host.groups[tenant], sorted(started_at(i) for i in infos if i["group"] == tenant))
        assert_gcra(sorted(started_at(i) for i in infos if i["group"] == tenant), 5, 1)
        for t in (0.5, 1.0):
            assert most_in_any_window(sorted(host.groups[tenant]), t) <= (
                1 + 1 + 5 * (t + JITTER_S)), (tenant, t)
