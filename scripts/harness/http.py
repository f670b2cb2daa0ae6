# HTTP for the benchmarks of zstalk's task and schedule API: readiness probes with the
# standard library, and the load generator's aiohttp sessions on a uvloop event loop (the
# loop zstalk's own processes run, taken from uvloop directly: a benchmark imports no
# zstalk module).  aiohttp and uvloop are imported on first use, after the benchmark has
# re-exec'd itself under the project's .venv.  And the task bodies the generators POST.
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

JSON_HEADERS = {"Content-Type": "application/json"}
REQUEST_TIMEOUT_S = 5.0     # any one HTTP request of the generator (they take ~20 ms)


def http_status(url: str) -> int | None:
    """The status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def loop_factory():
    """A new uvloop event loop (asyncio's where uvloop is not installed)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_async(coro):
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(coro)


def client(limit: int):
    """An aiohttp session with a keep-alive pool of `limit` connections."""
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))


def task_body(name: str, i: int, delay_ms: int | None, group: str | None = None) -> dict:
    """One task: params {"i": i}; with a group, the option and "g" in the params too (so
    the function host sees whose call it is)."""
    task = {"function": name, "params": {"i": i}}
    options = {"delay": delay_ms} if delay_ms else {}
    if group is not None:
        task["params"]["g"] = options["group"] = group
    if options:
        task["options"] = options
    return task


def batches(name: str, n: int, delay_ms: int | None, size: int, group=None) -> list[bytes]:
    """The JSON arrays of `size` tasks (the last one shorter) that make n tasks; `group(i)`,
    when given, names task i's group."""
    return [json.dumps([task_body(name, i, delay_ms, group and group(i))
                        for i in range(lo, min(n, lo + size))]).encode()
            for lo in range(0, n, size)]
