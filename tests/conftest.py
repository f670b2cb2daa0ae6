# Fixtures that start real servers for end-to-end tests.
#
# Every fixture here is a factory (or is built on one) that remembers each
# process it starts and stops them all at teardown, so nothing outlives a test,
# failed or not. Servers bind a free loopback port and are ready when it accepts.
#
#   beanstalkd_server / beanstalkd_factory  the reference beanstalkd (1.12 on
#       Debian, scripts/test's reference group). Missing → skip locally, fail when CI=true.
#   zstalk_server / zstalk_factory          `zstalk serve` (its counter front off, or
#       on a free port with counter=True: then server.counter_address).
#   zstalk_cluster                          `zstalk broker` + N × `zstalk front beanstalk`
#       (+ M × `zstalk front counter` with counter_fronts=M).
#   raw_client                              RawClient connections, closed at teardown.
#
# The tests live in folders by what they test (core, codecs, fronts, wal, workers,
# end_to_end, differential, deploy, project); the helpers they share are in support/.
# Every one of those folders is put on sys.path here, so a test imports a helper, or
# another test's fixtures, by its module name (`from servers import ...`, `from
# test_tasks_end_to_end import serve`) wherever either lives (the names are unique).
#
# ZSTALK_TEST_SELF_CHECK=1 swaps zstalk for a second beanstalkd (a cluster then
# becomes one beanstalkd that every "front" points at). Differential tests must
# pass in that mode: it proves the scripts and the normalisation are stable.
from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import pytest

sys.path[:0] = [str(folder) for folder in sorted(Path(__file__).resolve().parent.iterdir())
                if folder.is_dir() and folder.name not in ("greenstalk", "__pycache__")]

from servers import (  # noqa: E402 (the path above first)
    BEANSTALK_PROBE, LOOPBACK, Address, RawClient, ServerProcess, beanstalkd_version, counter_probe,
    find_beanstalkd, find_zstalk, free_port, not_installed, self_check, start_on_a_free_port,
    unavailable, wait_counter_ready, wait_for,
)


def pytest_configure(config: pytest.Config) -> None:
    # `zstalk serve` binds tcp://127.0.0.1:11400 for native workers by default; servers
    # under test run side by side, so they bind it only where a test asks (--worker-bind)
    os.environ["ZSTALK_WORKER_BIND"] = "none"
    config.addinivalue_line("markers", "cluster: runs against a zstalk broker with several fronts")
    config.addinivalue_line("markers", "zstalk_only: checks zstalk where it deliberately differs "
                                       "from beanstalkd 1.12 (skipped in self-check mode)")


def require_beanstalkd() -> str:
    """Path of the reference server; skip without it, or fail on CI."""
    path = find_beanstalkd()
    if path is None:
        unavailable(not_installed("reference", ["beanstalkd"]))
    return path


def _options(param) -> dict:
    """An indirect param may be a dict of factory options or just a max job size."""
    if param is None:
        return {}
    if isinstance(param, dict):
        return dict(param)
    return {"max_job_size": int(param)}


_socket_numbers = itertools.count()


def _listen(tmp_dir: Path, unix: bool, label: str) -> tuple[Address, list[str]]:
    """Where a beanstalk listener goes, as an address and as beanstalkd's -l/-p args."""
    if unix:
        path = str(tmp_dir / f"{label}-{next(_socket_numbers)}.sock")
        return path, ["-l", f"unix:{path}"]
    port = free_port()
    return (LOOPBACK, port), ["-l", LOOPBACK, "-p", str(port)]


class _Processes:
    """Every process a test starts, stopped in reverse order at teardown."""

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
        errors = []
        for process in reversed(self.started):
            try:
                process.stop()
            except Exception as error:  # keep stopping the others
                errors.append(error)
        if errors:
            raise errors[0]


@pytest.fixture
def _processes():
    processes = _Processes()
    yield processes
    processes.stop_all()


@pytest.fixture
def _socket_dir():
    # UNIX socket paths must stay under ~107 bytes; pytest's tmp_path can be longer.
    directory = Path(tempfile.mkdtemp(prefix="zst-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


# -- reference beanstalkd -----------------------------------------------------


def _start_beanstalkd(processes: _Processes, socket_dir: Path, *, max_job_size: int | None = None,
                      extra_args: Sequence[str] = (), unix: bool = False,
                      label: str = "beanstalkd") -> ServerProcess:
    path = require_beanstalkd()

    def build() -> ServerProcess:
        address, listen_args = _listen(socket_dir, unix, label)
        argv = [path, *listen_args]
        if max_job_size is not None:
            argv += ["-z", str(max_job_size)]
        return ServerProcess([*argv, *extra_args], address, name=label)

    return processes.start(build)


@pytest.fixture
def beanstalkd_factory(_processes, _socket_dir) -> Callable[..., ServerProcess]:
    """start(max_job_size=None, extra_args=(), unix=False) -> a fresh reference beanstalkd."""

    def start(**options) -> ServerProcess:
        return _start_beanstalkd(_processes, _socket_dir, **options)

    return start


@pytest.fixture
def beanstalkd_server(request, beanstalkd_factory) -> ServerProcess:
    """A fresh beanstalkd; parametrise indirectly with {"max_job_size": 10} (or just 10)."""
    return beanstalkd_factory(**_options(getattr(request, "param", None)))


@pytest.fixture(scope="session")
def beanstalkd_dialect() -> tuple[int, ...]:
    """Version of the reference beanstalkd, e.g. (1, 12)."""
    return beanstalkd_version(require_beanstalkd())


# -- zstalk -------------------------------------------------------------------


def _start_zstalk(processes: _Processes, socket_dir: Path, *, max_job_size: int | None = None,
                  extra_args: Sequence[str] = (), unix: bool = False, counter: bool = False,
                  label: str = "zstalk") -> ServerProcess:
    if self_check():
        if counter:
            pytest.skip("the counter front has no beanstalkd stand-in")
        return _start_beanstalkd(processes, socket_dir, max_job_size=max_job_size,
                                 extra_args=extra_args, unix=unix, label=f"{label}-selfcheck")

    def build() -> ServerProcess:
        address, listen = _listen(socket_dir, unix, label)  # same -l/-p flags as beanstalkd
        argv = [find_zstalk(), "serve", *listen]
        if max_job_size is not None:
            argv += ["-z", str(max_job_size)]
        # never the fixed port 11215: tests run side by side
        counter_address = (LOOPBACK, free_port()) if counter else None
        argv += ["--counter-port", str(counter_address[1]) if counter else "0"]
        if counter:
            argv += ["--counter-listen", LOOPBACK]
        server = ServerProcess([*argv, *extra_args], address, name=label, probe=BEANSTALK_PROBE)
        server.counter_address = counter_address
        return server

    server = processes.start(build)
    if counter:
        wait_counter_ready(server.counter_address)
    return server


@pytest.fixture
def zstalk_factory(_processes, _socket_dir) -> Callable[..., ServerProcess]:
    """start(max_job_size=None, extra_args=(), unix=False, counter=False) -> a fresh `zstalk serve`."""

    def start(**options) -> ServerProcess:
        return _start_zstalk(_processes, _socket_dir, **options)

    return start


@pytest.fixture
def zstalk_server(request, zstalk_factory) -> ServerProcess:
    """A fresh `zstalk serve`; parametrise indirectly like beanstalkd_server."""
    return zstalk_factory(**_options(getattr(request, "param", None)))


@dataclass
class Cluster:
    """A broker and its beanstalk fronts, each a separate process.

    In self-check mode there is no broker: one beanstalkd stands in, and every
    front address points at it (kill/restart are then not available).
    """

    broker: ServerProcess | None
    fronts: list[ServerProcess]
    broker_address: str
    front_addresses: list[Address]
    stand_in: ServerProcess | None = None
    counter_fronts: list[ServerProcess] = field(default_factory=list)

    @property
    def counter_addresses(self) -> list[Address]:
        return [front.address for front in self.counter_fronts]

    def _real(self, what: str) -> None:
        if self.stand_in is not None:
            pytest.skip(f"{what} needs a real zstalk cluster, not the self-check stand-in")

    def kill_front(self, index: int) -> None:
        self._real("killing a front")
        self.fronts[index].kill()

    def restart_front(self, index: int) -> ServerProcess:
        self._real("restarting a front")
        return self.fronts[index].restart()

    def kill_counter_front(self, index: int) -> None:
        self._real("killing a counter front")
        self.counter_fronts[index].kill()

    def kill_broker(self) -> None:
        self._real("killing the broker")
        self.broker.kill()

    def restart_broker(self) -> ServerProcess:
        self._real("restarting the broker")
        return self.broker.restart()

    @property
    def processes(self) -> list[ServerProcess]:
        if self.stand_in is not None:
            return [self.stand_in]
        return [self.broker, *self.fronts, *self.counter_fronts]


def _start_cluster(processes: _Processes, socket_dir: Path, *, fronts: int = 2,
                   max_job_size: int | None = None, unix: bool = False,
                   broker_args: Sequence[str] = (), front_args: Sequence[str] = (),
                   counter_fronts: int = 0, counter_front_args: Sequence[str] = (),
                   verbose: bool = False) -> Cluster:
    if self_check():
        if counter_fronts:
            pytest.skip("counter fronts have no beanstalkd stand-in")
        stand_in = _start_beanstalkd(processes, socket_dir, max_job_size=max_job_size, unix=unix,
                                     label="cluster-selfcheck")
        return Cluster(None, [], "tcp://stand-in", [stand_in.address] * fronts, stand_in)
    zstalk = find_zstalk()
    # The broker owns the job size limit; a front's -z only holds until the
    # broker tells it, so both get it.
    size_args = [] if max_job_size is None else ["-z", str(max_job_size)]
    zstalk = [zstalk, *(["-V"] if verbose else [])]     # -V: INFO lines too (normal events)

    health = free_port()

    def build_broker() -> ServerProcess:
        port = free_port()
        return ServerProcess(
            [*zstalk, "broker", "--bind", f"tcp://{LOOPBACK}:{port}", *size_args, *broker_args,
             "--health-port", str(health), "--health-listen", LOOPBACK],
            (LOOPBACK, port), name="zstalk-broker")

    broker = processes.start(build_broker)
    broker_address = f"tcp://{LOOPBACK}:{broker.address[1]}"

    def build_front(index: int) -> ServerProcess:
        address, _ = _listen(socket_dir, unix, f"front{index}")
        listen = f"unix:{address}" if unix else f"{LOOPBACK}:{address[1]}"
        argv = [*zstalk, "front", "beanstalk", "--broker", broker_address, "--listen", listen,
                *size_args, *front_args]
        return ServerProcess(argv, address, name=f"zstalk-front{index}",
                             probe=BEANSTALK_PROBE)

    def build_counter_front(index: int) -> ServerProcess:
        address = (LOOPBACK, free_port())
        argv = [*zstalk, "front", "counter", "--broker", broker_address,
                "--listen", f"{LOOPBACK}:{address[1]}", *counter_front_args]
        return ServerProcess(argv, address, name=f"zstalk-counter{index}", probe=counter_probe)

    started = [processes.start(lambda index=index: build_front(index)) for index in range(fronts)]
    counters = [processes.start(lambda index=index: build_counter_front(index))
                for index in range(counter_fronts)]
    # the readiness probes' connections close through their fronts, and a test's first
    # command may reach the broker through another front before those CLOSEs do: wait
    # until the broker holds no client session (its /metrics opens none)
    assert wait_for(lambda: _client_sessions(health) == 0, 10), (
        f"the broker still holds {_client_sessions(health)} client sessions after the probes")
    return Cluster(broker, started, broker_address, [front.address for front in started],
                   counter_fronts=counters)


def _client_sessions(health_port: int) -> float | None:
    """Client sessions the broker holds, from its /metrics (None: no answer)."""
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{health_port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("zstalk_sessions{"))


@pytest.fixture
def zstalk_cluster(_processes, _socket_dir) -> Callable[..., Cluster]:
    """start(fronts=2, max_job_size=None, unix=False, broker_args=(), front_args=(),
    counter_fronts=0, counter_front_args=(), verbose=False) -> Cluster."""

    def start(**options) -> Cluster:
        return _start_cluster(_processes, _socket_dir, **options)

    return start


# -- clients ------------------------------------------------------------------


@pytest.fixture
def raw_client() -> Callable[..., RawClient]:
    """connect(address, timeout=5.0) -> RawClient; all are closed at teardown."""
    clients: list[RawClient] = []

    def connect(address: Address, timeout: float = 5.0) -> RawClient:
        client = RawClient(address, timeout)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()
