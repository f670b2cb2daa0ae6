"""The health port of `zstalk serve --fronts N`: its children's probes and metrics as one.

The supervisor (supervisor.py) gives each child (the broker, the fronts, the dispatcher)
a health port of its own on 127.0.0.1, a free one chosen at each start, and serves
--health-port itself from an asyncio loop in a thread (its main thread waits for
signals with sigtimedwait and runs no event loop):

* /healthz: the supervisor's main loop turned within --health-stall-s.  A child that
  died is no liveness failure: the supervisor starts it again, as it would without
  probes; a child whose loop is stuck fails its own /healthz, which shows in /readyz.
* /readyz: every child answers its /readyz 200.  The children are asked every BEAT_S
  and the last answers kept, so a probe is answered at once.  A broker child standing by
  on a journal has no health port yet: the fronts that follow the leader answer for it.
* /leader: 200 while the broker child leads (or has no journal), 503 while it stands by.
* /metrics: every child's /metrics, asked for when scraped (all at once, each within
  FETCH_TIMEOUT_S), each sample labelled role="<child>" (broker, front-0 ... front-N-1,
  counter, http, dispatcher; a child's own role label gives way), the families merged,
  and `zstalk_child_up{role}` saying which answered.  With --metrics-token-file the
  children need the token too (they are given the file), and the supervisor sends it.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Callable

from ..metrics import build_info
from ...protocol.codecs.prometheus import Sample, merge, render, with_label
from ...protocol.network.health import BEAT_S, HealthServer, health_state
from ...protocol.network.listen import HealthOptions

FETCH_TIMEOUT_S = 2.0


def free_port() -> int:
    """A port free on 127.0.0.1 now (for a child's health port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_args(name: str, port: int, health: HealthOptions) -> list[str]:
    """A child's health options: its own port on loopback, the supervisor's settings."""
    args = ["--health-port", str(port), "--health-listen", "127.0.0.1",
            "--health-stall-s", str(health.stall_s)]
    if name == "broker":
        args += ["--metrics-top", str(health.metrics_top)]
    if health.metrics_token_file:
        args += ["--metrics-token-file", health.metrics_token_file]
    return args


async def fetch(port: int, path: str, token: str | None) -> tuple[int, bytes]:
    """GET a child's probe: (status, body); (0, b"") when it does not answer in time."""
    try:
        return await asyncio.wait_for(_get(port, path, token), FETCH_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError, ValueError, IndexError):
        return 0, b""


async def _get(port: int, path: str, token: str | None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode("latin-1"))
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


class SupervisorProbes:
    """The supervisor's health port, on a loop of its own in a daemon thread.
    `ports()` gives the children's names and health ports now; `beat()` is called by the
    supervisor's main loop."""

    def __init__(self, health: HealthOptions, ports: Callable[[], dict[str, int]],
                 leader: Callable[[], str | None] = lambda: None) -> None:
        self.health = health
        self.ports = ports
        self.leader = leader            # /leader: None while the broker child leads
        self.last_beat = time.monotonic()
        self.not_ready: str | None = "children not asked yet"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: HealthServer | None = None
        self._thread: threading.Thread | None = None
        self._watching: asyncio.Task | None = None

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def start(self) -> None:
        """Bind and serve; raises protocol.network.health.HealthBindError (exit 111)."""
        started: list = []
        done = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            try:
                self.server = self.loop.run_until_complete(self._start())
            except Exception as exc:        # HealthBindError, said by the caller
                started.append(exc)
                done.set()
                return
            done.set()
            self.loop.run_forever()
            self.loop.close()

        self._thread = threading.Thread(target=run, name="zstalk-probes", daemon=True)
        self._thread.start()
        done.wait()
        if started:
            raise started[0]

    async def _start(self) -> HealthServer:
        from ...protocol.network.health import start_health
        server = await start_health(self.health, self.ready, self.alive, leader=self.leader)
        server.gather = self.gather
        self._watching = asyncio.ensure_future(self._watch_readiness())
        return server

    def close(self) -> None:
        """Stop serving and end the loop's thread, its tasks ended first (a pending task
        left to the interpreter's exit is logged as destroyed)."""
        if self.loop is None or self.server is None:
            return
        stopped = asyncio.run_coroutine_threadsafe(self._stop(), self.loop)
        try:
            stopped.result(FETCH_TIMEOUT_S + 1.0)
        except Exception:       # (a stuck loop: the daemon thread ends with the process)
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(FETCH_TIMEOUT_S)

    async def _stop(self) -> None:
        self.server.close()
        self._watching.cancel()
        await asyncio.gather(self._watching, return_exceptions=True)

    # -- probes --------------------------------------------------------------------------
    def alive(self) -> str | None:
        problem = health_state(self.last_beat, time.monotonic(), self.health.stall_s)
        return problem and f"supervisor: {problem}"

    def ready(self) -> str | None:
        return self.not_ready

    async def _watch_readiness(self) -> None:
        while True:
            ports = self.ports()
            answers = await asyncio.gather(*(fetch(port, "/readyz", None)
                                             for port in ports.values()))
            self.not_ready = next(
                (f"{name}: {body.decode(errors='replace').strip() or 'no answer'}"
                 for name, (status, body) in zip(ports, answers) if status != 200), None)
            await asyncio.sleep(BEAT_S)

    async def gather(self) -> bytes:
        ports = self.ports()
        token = self.health.metrics_token
        answers = await asyncio.gather(*(fetch(port, "/metrics", token)
                                         for port in ports.values()))
        parts = [render([build_info("supervisor"),
                         *(Sample("zstalk_child_up", (name,), int(status == 200))
                           for name, (status, _) in zip(ports, answers))])]
        parts += [with_label(body, "role", name)
                  for name, (status, body) in zip(ports, answers) if status == 200]
        return merge(parts)
