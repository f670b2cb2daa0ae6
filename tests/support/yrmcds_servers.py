# Counter servers and a counter client for end-to-end and differential tests.
#
# The reference is Debian's yrmcds 1.1.9 with its counter extension on (the
# `counter.*` keys of yrmcds docs/counter.md). It reads everything from a config file,
# so each start writes one into a per-test directory: `counter.enable = true`,
# three free ports (memcache `port`, `repl_port`, `counter.port`), and
# `virtual_ip = 127.0.0.1` with a *different* `bind_ip = 127.0.0.2` — yrmcds
# binds virtual_ip plus every bind_ip, so equal ones collide, and it only serves
# as master (and so serves counters) when it owns virtual_ip. `yrmcdsd -f FILE`
# stays in the foreground and logs to stderr, which ServerProcess captures;
# 1.1.9 has no pid file setting, the pid is the Popen's. Tables are kept small
# (10000 buckets, 4 workers) so a start takes milliseconds.
#
# zstalk's side: `zstalk serve -l 127.0.0.1 -p B --counter-port C` or a cluster of
# `zstalk broker` + N × `zstalk front counter`. Every counter server here is
# ready once its counter port answers a Noop with its opaque.
#
# CounterClient cuts the byte stream into yrmcds frames (12-byte header, body
# length at offset 4); a Dump answer is a series of records ended by a frame
# with an empty body (docs/counter.md, "Dump"), so read_answer() returns one frame or one series.
# Request frames are built here from the codec's own header layout.
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from servers import (
    LOOPBACK, READY_TIMEOUT_S, Address, RawClient, ServerProcess, find_zstalk, free_port,
    start_on_a_free_port,
)
from zstalk.protocol.codecs.yrmcds import (ACQUIRE_FIXED, HEADER, HEADER_SIZE, RELEASE_FIXED,
                                           REQUEST_MAGIC, RESPONSE_MAGIC, U16, U32, Opcode,
                                           Status, noop_response)

#: the opaque requests carry unless told otherwise: b"OPQ1", as in the captured yrmcds replies
OPAQUE = 0x4F505131
#: opaque of the readiness Noop (b"RDY?")
READY_OPAQUE = 0x5244593F
#: yrmcds needs a bind_ip different from its virtual_ip (equal ones: "Address already in use")
BIND_IP = "127.0.0.2"
#: worker threads per yrmcds (few: a start takes milliseconds); see YrmcdsProcess
YRMCDS_WORKERS = 4
YRMCDS_STOP_GRACE_S = 1.0
#: where zstalk's command line takes the counter options (one place to adapt if it
#: spells them differently): serve, broker, front counter
ZSTALK_SERVE_FLAGS = {"stat_interval": "--stat-interval",
                      "max_connections": "--counter-max-connections"}
ZSTALK_BROKER_FLAGS = {"stat_interval": "--stat-interval"}
ZSTALK_FRONT_FLAGS = {"max_connections": "--max-connections"}


# -- request frames ----------------------------------------------------------------


def request(opcode: int, body: bytes = b"", *, opaque: int = OPAQUE, magic: int = REQUEST_MAGIC,
            flags: int = 0, reserved: int = 0, length: int | None = None) -> bytes:
    """One request frame; `length` overrides the declared body length."""
    size = len(body) if length is None else length
    return HEADER.pack(magic, opcode, flags, reserved, size, opaque) + body


def noop(**header) -> bytes:
    return request(Opcode.NOOP, **header)


def get(name: bytes, *, name_len: int | None = None, extra: bytes = b"", **header) -> bytes:
    size = len(name) if name_len is None else name_len
    return request(Opcode.GET, U16.pack(size) + name + extra, **header)


def acquire(resources: int, maximum: int, name: bytes, *, name_len: int | None = None,
            extra: bytes = b"", **header) -> bytes:
    size = len(name) if name_len is None else name_len
    return request(Opcode.ACQUIRE, ACQUIRE_FIXED.pack(resources, maximum, size) + name + extra,
                   **header)


def release(resources: int, name: bytes, *, name_len: int | None = None, extra: bytes = b"",
            **header) -> bytes:
    size = len(name) if name_len is None else name_len
    return request(Opcode.RELEASE, RELEASE_FIXED.pack(resources, size) + name + extra, **header)


def stats(**header) -> bytes:
    return request(Opcode.STATS, **header)


def dump(**header) -> bytes:
    return request(Opcode.DUMP, **header)


# -- the client ------------------------------------------------------------------------


def is_dump_record(frame: bytes) -> bool:
    """A successful Dump frame with a body: more of the series follows."""
    return (len(frame) > HEADER_SIZE and frame[0] == RESPONSE_MAGIC and frame[1] == Opcode.DUMP
            and frame[2] == Status.OK)


class CounterClient(RawClient):
    """A blocking counter connection: send bytes, read whole frames (with timeouts).

    read_reply() (from RawClient) returns exactly one frame, b"" on a clean EOF,
    raises ReplyTimeout with what had arrived, or ConnectionError when the server
    closes the connection inside a frame.
    """

    def _complete_reply_size(self) -> int | None:
        if len(self._buffer) < HEADER_SIZE:
            return None
        total = HEADER_SIZE + U32.unpack_from(self._buffer, 4)[0]
        return total if len(self._buffer) >= total else None

    def read_response(self, timeout: float | None = None) -> bytes:
        return self.read_reply(timeout)

    def read_responses(self, count: int, timeout: float | None = None) -> list[bytes]:
        return self.read_replies(count, timeout)

    def read_answer(self, timeout: float | None = None) -> list[bytes]:
        """One response frame, or a whole Dump series (records, then the empty
        terminator); [] on EOF. EOF inside a series raises ConnectionError."""
        frames = [self.read_reply(timeout)]
        while is_dump_record(frames[-1]):
            frame = self.read_reply(timeout)
            if not frame:
                raise ConnectionError(
                    f"connection closed inside a Dump after {len(frames)} records")
            frames.append(frame)
        return frames if frames[0] else []

    def read_dump(self, timeout: float | None = None) -> list[bytes]:
        """The frames of one Dump answer, the terminator last."""
        frames = self.read_answer(timeout)
        if not frames:
            raise ConnectionError("connection closed before a Dump answer")
        return frames

    def __enter__(self) -> "CounterClient":
        return self


# -- processes -------------------------------------------------------------------------


class CounterServerProcess(ServerProcess):
    """A ServerProcess that is ready once its counter port answers a Noop."""

    def _answers(self, probe: bytes | None) -> bool:
        with CounterClient(self.address, timeout=1.0) as client:
            client.send(noop(opaque=READY_OPAQUE))
            return client.read_response() == noop_response(READY_OPAQUE)


class YrmcdsProcess(CounterServerProcess):
    """yrmcdsd 1.1.9, started and stopped so that its worker race cannot strike.

    A yrmcds worker thread stores "not running" each time it goes back to wait
    (cybozu/worker.hpp `run()`), so a job or a stop posted just before that store
    is overwritten: the thread then spins for ever. Posted before a new worker's
    thread first ran, the job is a connection's read: that connection is accepted
    but never read again (its requests sit in the socket, and it keeps its
    max_connections slot). Posted while a worker finishes its last job, the stop
    is lost and the process never exits. Seen here in about 1 start in 150 when a
    client connected right after the readiness probe, and in 2-8% of SIGTERMs
    sent right after start-up or right after a client closed. So nothing is sent
    until every worker thread is asleep (all threads in state S, at least
    1 + YRMCDS_WORKERS of them, twice in a row), no SIGTERM either, and a stop
    still falls back to SIGKILL after a short grace (the counters live in memory
    only; a kill spoils nothing).
    """

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        self._wait_asleep(deadline)  # super() reports an exit or a time-out, with the output
        super().wait_ready(max(0.1, deadline - time.monotonic()))

    def stop(self, grace: float = YRMCDS_STOP_GRACE_S) -> int | None:
        self._wait_asleep(time.monotonic() + grace)
        return super().stop(grace)

    def _wait_asleep(self, deadline: float) -> bool:
        asleep = 0  # consecutive observations: a thread just started may sleep on a lock
        while asleep < 2:
            if not self.running or time.monotonic() >= deadline:
                return False
            asleep = asleep + 1 if self._threads_asleep() else 0
            time.sleep(0.005)
        return True

    def _threads_asleep(self) -> bool:
        try:
            tasks = Path(f"/proc/{self.pid}/task")
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for task in tasks.iterdir()]
        except (OSError, IndexError):
            return False
        return len(states) >= 1 + YRMCDS_WORKERS and all(state == "S" for state in states)


def find_yrmcdsd() -> str | None:
    """Path of the reference yrmcdsd, or None. $YRMCDSD, when set, is the only place looked at."""
    override = os.environ.get("YRMCDSD")
    candidates = [override] if override else [
        shutil.which("yrmcdsd"), "/usr/sbin/yrmcdsd", "/usr/bin/yrmcdsd"]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]     # (free_port gives none twice)


def yrmcds_config(*, counter_port: int, port: int, repl_port: int, temp_dir: Path,
                  stat_interval: int | None = None, max_connections: int | None = None) -> str:
    lines = [
        "# written by tests/support/yrmcds_servers.py",
        f"virtual_ip = {LOOPBACK}",
        f'bind_ip = "{BIND_IP}"',
        f"port = {port}",
        f"repl_port = {repl_port}",
        f'temp_dir = "{temp_dir}"',
        "log.threshold = warning",
        "buckets = 10000",
        f"workers = {YRMCDS_WORKERS}",
        "counter.enable = true",
        f"counter.port = {counter_port}",
        "counter.buckets = 10000",
    ]
    if stat_interval is not None:
        lines.append(f"counter.stat_interval = {stat_interval}")
    if max_connections is not None:
        lines.append(f"counter.max_connections = {max_connections}")
    return "\n".join(lines) + "\n"


def yrmcds_process(path: str, work_dir: Path, *, stat_interval: int | None = None,
                   max_connections: int | None = None, label: str = "yrmcds") -> YrmcdsProcess:
    """An unstarted yrmcdsd on fresh ports, its config and temp files under work_dir."""
    counter_port, port, repl_port = free_ports(3)
    work_dir.mkdir(parents=True, exist_ok=True)
    config = work_dir / f"{label}-{counter_port}.conf"
    config.write_text(yrmcds_config(
        counter_port=counter_port, port=port, repl_port=repl_port, temp_dir=work_dir,
        stat_interval=stat_interval, max_connections=max_connections))
    return YrmcdsProcess([path, "-f", config], (LOOPBACK, counter_port), name=label)


@functools.cache
def zstalk_counter_front_missing() -> str | None:
    """Why zstalk cannot serve counters yet, or None once `serve` has --counter-port."""
    command = [find_zstalk(), "serve", "--help"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`{' '.join(command)}` failed: {error}"
    if "--counter-port" not in result.stdout:
        return ("zstalk's counter front is not there yet "
                "(`zstalk serve --help` lacks --counter-port)")
    return None


def _flags(table: dict[str, str], **options) -> list[str]:
    args: list[str] = []
    for option, value in options.items():
        if value is not None:
            args += [table[option], str(value)]
    return args


def zstalk_serve_process(*, stat_interval: int | None = None, max_connections: int | None = None,
                         extra_args: Sequence[str] = (),
                         label: str = "zstalk") -> CounterServerProcess:
    """An unstarted `zstalk serve` with its counter listener on a fresh loopback port."""
    beanstalk_port, counter_port = free_ports(2)
    argv = [find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(beanstalk_port),
            "--counter-port", str(counter_port),
            *_flags(ZSTALK_SERVE_FLAGS, stat_interval=stat_interval,
                    max_connections=max_connections),
            *extra_args]
    return CounterServerProcess(argv, (LOOPBACK, counter_port), name=label)


def zstalk_broker_process(*, stat_interval: int | None = None,
                          extra_args: Sequence[str] = ()) -> ServerProcess:
    """An unstarted `zstalk broker`; ready when its ZeroMQ port accepts TCP."""
    port = free_port()
    argv = [find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{port}",
            *_flags(ZSTALK_BROKER_FLAGS, stat_interval=stat_interval), *extra_args]
    return ServerProcess(argv, (LOOPBACK, port), name="zstalk-broker")


def zstalk_counter_front_process(broker: str, *, max_connections: int | None = None,
                                 extra_args: Sequence[str] = (),
                                 label: str = "zstalk-counter-front") -> CounterServerProcess:
    port = free_port()
    argv = [find_zstalk(), "front", "counter", "--broker", broker, "--listen", f"{LOOPBACK}:{port}",
            *_flags(ZSTALK_FRONT_FLAGS, max_connections=max_connections), *extra_args]
    return CounterServerProcess(argv, (LOOPBACK, port), name=label)


class ProcessGroup:
    """Every process a test starts; stop_all() stops them side by side (each by its
    own pid), so a teardown costs the slowest stop, not their sum."""

    def __init__(self) -> None:
        self.started: list[ServerProcess] = []

    def start(self, build: Callable[[], ServerProcess]) -> ServerProcess:
        """Start build() on a free port (retrying if the port is taken meanwhile)."""

        def tracked() -> ServerProcess:
            process = build()
            self.started.append(process)
            return process

        return start_on_a_free_port(tracked)

    def stop_all(self) -> None:
        with ThreadPoolExecutor(max_workers=max(1, len(self.started))) as pool:
            outcomes = [pool.submit(process.stop) for process in self.started]
        for outcome in outcomes:
            outcome.result()  # the first failure, once every process was stopped


@dataclass
class CounterCluster:
    broker: ServerProcess
    fronts: list[CounterServerProcess]

    @property
    def front_addresses(self) -> list[Address]:
        return [front.address for front in self.fronts]


def start_zstalk_counter_cluster(start: Callable[[Callable[[], ServerProcess]], ServerProcess], *,
                                 fronts: int = 2, stat_interval: int | None = None,
                                 max_connections: int | None = None) -> CounterCluster:
    """A broker and `fronts` counter fronts. `start(build)` starts and tracks one
    process (ProcessGroup.start, or servers.start_on_a_free_port)."""
    broker = start(lambda: zstalk_broker_process(stat_interval=stat_interval))
    address = f"tcp://{LOOPBACK}:{broker.address[1]}"

    def start_front(index: int) -> CounterServerProcess:
        return start(lambda: zstalk_counter_front_process(
            address, max_connections=max_connections, label=f"zstalk-counter-front{index}"))

    with ThreadPoolExecutor(max_workers=fronts) as pool:  # the fronts start side by side
        started = list(pool.map(start_front, range(fronts)))
    return CounterCluster(broker, started)
