# Process and socket helpers shared by every end-to-end test.
#
# A server under test is a real process started in its own session, so that
# stop() can signal the whole process group (SIGTERM, then SIGKILL after a grace
# period) and nothing outlives a failed test. Readiness is polled: the server
# is ready once its TCP port or UNIX socket accepts a connection, and a server
# that exits early or is not ready in time raises with its own stderr.
#
# RawClient speaks the beanstalk wire format (beanstalkd's doc/protocol.txt) just far
# enough to cut the byte stream into replies: a reply is one CRLF-terminated
# line, and RESERVED/FOUND/OK lines announce a body of <bytes> plus CRLF.
#
# CounterClient speaks yrmcds' binary counter protocol: requests are packed with
# the structs of zstalk.protocol.codecs.yrmcds (a 12-byte header, then the body), and
# replies are cut at 12 bytes + the header's body length.
#
# needs_group("browser", "chromium") is how a test asks for a program that scripts/test
# installs from Debian in one of its named groups: it skips, naming the group, when the
# program is missing or ZSTALK_TEST_SKIP names the group, and fails instead under CI=true.
from __future__ import annotations

import collections
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, NoReturn, Sequence, Union

from zstalk.protocol.codecs.yrmcds import (ACQUIRE_FIXED, DUMP_FIXED, HEADER, HEADER_SIZE,
                                           RELEASE_FIXED, REQUEST_MAGIC, STAT_LENGTHS, U16,
                                           Opcode)

# A TCP address is (host, port); a UNIX socket address is its path.
Address = Union[tuple[str, int], str]

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0
REPLY_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.01

# Replies whose line ends with the length of a body that follows it.
_REPLIES_WITH_BODY = {b"RESERVED": 2, b"FOUND": 2, b"OK": 1}


def wait_for(predicate: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """Whether `predicate` came true within `timeout` s; an OSError (a server not yet
    listening) counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(step)
    return False


#: the ports free_port handed out lately: a test that takes several before any server binds
#: them must not get one twice (the JSON-logs test, ten roles at once, once did in CI)
_GIVEN: collections.deque[int] = collections.deque(maxlen=512)


def free_port() -> int:
    """A loopback TCP port that is free right now, and not one of the last 512 given.

    Ports come from just below the kernel's ephemeral range: a port from
    inside it (what binding port 0 gives) can be taken by any client socket's
    connect() before the server binds it.
    """
    low = _ephemeral_range_start()
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        if port not in _GIVEN and _bindable(port):
            _GIVEN.append(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        _GIVEN.append(probe.getsockname()[1])
        return _GIVEN[-1]


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def reference_required() -> bool:
    """On CI a missing reference server fails the test instead of skipping it."""
    return os.environ.get("CI", "").strip().lower() == "true"


def readme_block(language: str, marker: str) -> str:
    """The one fenced `language` block of the README or the manual (docs/) that holds
    `marker` (the suite runs their examples as written)."""
    root = Path(__file__).resolve().parents[2]
    found = [b for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
             for b in re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)
             if marker in b]
    assert len(found) == 1, f"one {language} block of the README and docs/ holds {marker!r}"
    return found[0]


def unavailable(reason: str) -> NoReturn:
    """What a test needs (a tool, root, a reference server) is missing: skip with the
    reason, or fail under CI=true, where nothing may be skipped for that."""
    import pytest
    if reference_required():
        pytest.fail(f"{reason} (CI=true: this test must not be skipped)")
    pytest.skip(reason)


#: scripts/test's groups of Debian packages that ZSTALK_TEST_SKIP may name (its `reference`
#: group, the servers most tests compare against, cannot be skipped)
SKIPPABLE_GROUPS = ("browser", "image", "prometheus", "terminal")
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


def find_program(name: str) -> str | None:
    """The path of a program, also in the sbin directories (Debian puts nginx, yrmcdsd and
    runc there, and a user's PATH may not name them)."""
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def group_skipped(group: str) -> bool:
    """Whether ZSTALK_TEST_SKIP names scripts/test's `group` (whose tests then skip)."""
    return group in re.split(r"[,\s]+", os.environ.get("ZSTALK_TEST_SKIP", ""))


def group_missing(group: str, programs: Sequence[str]) -> str | None:
    """Why a test cannot have all of `programs`, which scripts/test installs from Debian with
    its `group` of packages: ZSTALK_TEST_SKIP names the group, or some are not installed."""
    if group_skipped(group):
        value = os.environ["ZSTALK_TEST_SKIP"].strip()
        return f"needs {', '.join(programs)} (the {group} group): ZSTALK_TEST_SKIP={value} " \
               f"skipped its install"
    missing = [program for program in programs if find_program(program) is None]
    return not_installed(group, missing) if missing else None


def not_installed(group: str, programs: Sequence[str]) -> str:
    """The reason for a skip (or a CI failure) when `programs` of `group` are missing."""
    return (f"needs {', '.join(programs)} (the {group} group), which is not installed: "
            f"scripts/test installs it from Debian when run as root")


def needs_group(group: str, program: str, *elsewhere: str) -> str:
    """The path of `program` (or of the first of its names `elsewhere` found), which scripts/test
    installs with its `group` of Debian packages; skips when it is missing or ZSTALK_TEST_SKIP
    names the group, and fails instead under CI=true (unavailable)."""
    found = None if group_skipped(group) else next(
        filter(None, map(find_program, (program, *elsewhere))), None)
    if found is None:
        unavailable(group_missing(group, [program]))
    return found


def self_check() -> bool:
    """ZSTALK_TEST_SELF_CHECK=1: the zstalk fixtures start a second beanstalkd instead."""
    return os.environ.get("ZSTALK_TEST_SELF_CHECK", "").strip().lower() in {"1", "true", "yes"}


def find_beanstalkd() -> str | None:
    """Path of the reference beanstalkd, or None.

    $BEANSTALKD, when set, is the only place looked at (so setting it to a
    missing path shows how the suite behaves without the reference).
    """
    override = os.environ.get("BEANSTALKD")
    candidates = [override] if override else [
        shutil.which("beanstalkd"), "/usr/bin/beanstalkd", "/usr/sbin/beanstalkd"]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def beanstalkd_version(path: str) -> tuple[int, ...]:
    """`beanstalkd -v` prints `beanstalkd 1.12`; give back (1, 12)."""
    out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10).stdout
    numbers = out.split()[-1].split("+")[0] if out.split() else ""
    return tuple(int(part) for part in numbers.split(".") if part.isdigit())


def find_zstalk() -> str:
    """The zstalk console script: $ZSTALK, else the one beside this interpreter."""
    import sys

    override = os.environ.get("ZSTALK")
    if override:
        return override
    beside = Path(sys.executable).parent / "zstalk"
    if beside.exists():
        return str(beside)
    return shutil.which("zstalk") or str(beside)


def children_of(pid: int) -> list[int]:
    """The pids of a process's children (a supervisor's broker and fronts)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(p) for p in task.read_text().split()]
    return out


def connect(address: Address, timeout: float) -> socket.socket:
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


#: a command whose reply shows a beanstalk server (its broker included) is serving; job 0
#: never exists, and beanstalkd counts reserve-job only in a stat it never reports
BEANSTALK_PROBE = b"reserve-job 0\r\n"


class ServerNotReady(RuntimeError):
    pass


class ServerProcess:
    """One server process; ready when `address` accepts a connection.

    `address` is what the readiness probe connects to: (host, port) or a UNIX
    socket path. stderr and stdout go to a temporary file so a chatty server
    can never block on a full pipe, and so failures can quote them.
    """

    def __init__(self, argv: Sequence[str], address: Address, *, name: str | None = None,
                 env: dict[str, str] | None = None, cwd: str | None = None,
                 probe: bytes | Callable[[socket.socket], bool] | None = None):
        self.argv = [str(arg) for arg in argv]
        # with a probe, ready means "answers it": zstalk's supervisor accepts connections
        # before its front has registered with the broker.  A beanstalk probe is a
        # command line; a callable probe gets the connected socket (counter_probe).
        self.probe = probe
        self.address = address
        self.counter_address: Address | None = None   # `zstalk serve`'s counter front, if any
        self.name = name or Path(self.argv[0]).name
        self.env = env
        self.cwd = cwd
        self.process: subprocess.Popen | None = None
        self._log = None

    # -- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT_S) -> "ServerProcess":
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile(prefix=f"{self.name}-")
        self.process = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            env=self.env, cwd=self.cwd, start_new_session=True)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        last_error: OSError | None = None
        while True:
            if self.process.poll() is not None:
                raise ServerNotReady(
                    f"{self.name} exited with status {self.process.returncode} before it "
                    f"accepted connections on {self.address!r}\n"
                    f"command: {' '.join(self.argv)}\noutput:\n{self.output()}")
            try:
                if self._answers(self.probe):
                    return
            except OSError as error:
                last_error = error
            if time.monotonic() >= deadline:
                raise ServerNotReady(
                    f"{self.name} did not accept connections on {self.address!r} within "
                    f"{timeout:g} s (last error: {last_error})\n"
                    f"command: {' '.join(self.argv)}\noutput:\n{self.output()}")
            time.sleep(_POLL_INTERVAL_S)

    def _answers(self, probe: bytes | Callable[[socket.socket], bool] | None) -> bool:
        sock = connect(self.address, timeout=1.0)
        try:
            if probe is None:
                return True
            if callable(probe):
                return probe(sock)
            sock.sendall(probe)
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(256)
                if not chunk:
                    return False
                reply += chunk
            return not reply.startswith(b"INTERNAL_ERROR")
        finally:
            sock.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL it if still alive after `grace` s."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
        # Children that ignored SIGTERM while the leader exited still go.
        self._signal_group(signal.SIGKILL)
        return self.process.returncode

    def kill(self) -> int | None:
        """kill -9 the process group at once (a crash, not a shutdown)."""
        if self.process is None:
            return None
        self._signal_group(signal.SIGKILL)
        return self.process.wait()

    def restart(self, timeout: float = READY_TIMEOUT_S) -> "ServerProcess":
        self.stop()
        return self.start(timeout)

    def _signal_group(self, sig: int) -> None:
        # start_new_session=True made the child the leader of its own group,
        # so its pid is the group id; signal only that group.
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def output(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def __enter__(self) -> "ServerProcess":
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ServerProcess {self.name} {self.address!r} pid={self.pid}>"


def start_on_a_free_port(build: Callable[[], ServerProcess], attempts: int = 3) -> ServerProcess:
    """Start build() (which picks its own free port); if another process took
    that port before the server could bind it, try again with a new one."""
    for attempt in range(attempts):
        server = build()
        try:
            return server.start()
        except ServerNotReady:
            if attempt + 1 == attempts or "in use" not in server.output().lower():
                raise
    raise AssertionError("unreachable")


class ReplyTimeout(TimeoutError):
    def __init__(self, message: str, partial: bytes):
        super().__init__(message)
        self.partial = partial


class RawClient:
    """A blocking beanstalk connection that sends bytes and cuts replies apart."""

    def __init__(self, address: Address, timeout: float = REPLY_TIMEOUT_S):
        self.address = address
        self.timeout = timeout
        self.sock = connect(address, timeout)
        self._buffer = b""
        self._eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- replies -----------------------------------------------------------

    def read_reply(self, timeout: float | None = None) -> bytes:
        """Exactly one reply; b"" if the server closed the connection cleanly.

        Raises ReplyTimeout (with what had arrived) if the reply is incomplete
        after `timeout` seconds, and ConnectionError if the server closes the
        connection in the middle of a reply.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            size = self._complete_reply_size()
            if size is not None:
                reply, self._buffer = self._buffer[:size], self._buffer[size:]
                return reply
            if self._eof:
                if not self._buffer:
                    return b""
                raise ConnectionError(f"connection closed inside a reply: {self._buffer!r}")
            self._receive(deadline)

    def read_replies(self, count: int, timeout: float | None = None) -> list[bytes]:
        return [self.read_reply(timeout) for _ in range(count)]

    def read_available(self, seconds: float = 0.0) -> tuple[bytes, bool]:
        """Whatever arrives within `seconds` (buffered bytes first), and whether EOF was seen."""
        deadline = time.monotonic() + seconds
        while not self._eof:
            try:
                self._receive(deadline)
            except ReplyTimeout:
                break
        data, self._buffer = self._buffer, b""
        return data, self._eof

    def expect_silence(self, seconds: float) -> None:
        data, eof = self.read_available(seconds)
        if data or eof:
            raise AssertionError(
                f"expected silence for {seconds:g} s, got {data!r}" + (" then EOF" if eof else ""))

    def _complete_reply_size(self) -> int | None:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            return None
        line_size = end + 2
        words = self._buffer[:end].split(b" ")
        body_word = _REPLIES_WITH_BODY.get(words[0])
        if body_word is None or len(words) != body_word + 1 or not words[body_word].isdigit():
            return line_size
        total = line_size + int(words[body_word]) + 2
        return total if len(self._buffer) >= total else None

    def _receive(self, deadline: float) -> None:
        remaining = max(0.0, deadline - time.monotonic())
        if not select.select([self.sock], [], [], remaining)[0]:
            raise ReplyTimeout(f"no complete reply from {self.address!r} in time; "
                               f"received so far: {self._buffer!r}", self._buffer)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True


def silence_on_all(clients: Iterable[RawClient], seconds: float) -> list[tuple[bytes, bool]]:
    """One shared silence window for many connections: wait once, then collect."""
    clients = list(clients)
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(remaining, 0.02))
    return [client.read_available(0.0) for client in clients]


# -- yrmcds counter protocol ----------------------------------------------------


def counter_request(opcode: int, body: bytes = b"", opaque: int = 0) -> bytes:
    """One request frame: magic 0x90, opcode, flags 0, reserved 0, body length, opaque."""
    return HEADER.pack(REQUEST_MAGIC, opcode, 0, 0, len(body), opaque) + body


def _name(name: bytes) -> bytes:
    return U16.pack(len(name)) + name


def get_request(name: bytes, opaque: int = 0) -> bytes:
    return counter_request(Opcode.GET, _name(name), opaque)


def acquire_request(name: bytes, resources: int, maximum: int, opaque: int = 0) -> bytes:
    return counter_request(Opcode.ACQUIRE, ACQUIRE_FIXED.pack(resources, maximum, len(name)) + name,
                           opaque)


def release_request(name: bytes, resources: int, opaque: int = 0) -> bytes:
    return counter_request(Opcode.RELEASE, RELEASE_FIXED.pack(resources, len(name)) + name, opaque)


class CounterResponse(NamedTuple):
    magic: int
    opcode: int
    status: int
    opaque: int
    body: bytes


def counter_probe(sock: socket.socket) -> bool:
    """Ready when a Noop comes back OK (the front has reached its broker)."""
    sock.sendall(counter_request(Opcode.NOOP, opaque=0x50524F42))
    reply = b""
    while len(reply) < HEADER_SIZE:
        chunk = sock.recv(HEADER_SIZE - len(reply))
        if not chunk:
            return False
        reply += chunk
    return reply == HEADER.pack(0x91, Opcode.NOOP, 0, 0, 0, 0x50524F42)


class CounterClient:
    """A blocking yrmcds counter connection; each call sends one request and reads its reply.

    Opaques count up from 1 per connection (as libyrmcds numbers its requests), and every
    reply's opaque is checked against its request's.
    """

    def __init__(self, address: Address, timeout: float = REPLY_TIMEOUT_S):
        self.address = address
        self.timeout = timeout
        self.sock = connect(address, timeout)
        self._buffer = b""
        self._eof = False
        self._serial = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "CounterClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_opaque(self) -> int:
        self._serial += 1
        return self._serial

    # -- requests ----------------------------------------------------------

    def noop(self) -> CounterResponse:
        return self._call(lambda opaque: counter_request(Opcode.NOOP, opaque=opaque))

    def get(self, name: bytes) -> CounterResponse:
        return self._call(lambda opaque: get_request(name, opaque))

    def acquire(self, name: bytes, resources: int, maximum: int) -> CounterResponse:
        return self._call(lambda opaque: acquire_request(name, resources, maximum, opaque))

    def release(self, name: bytes, resources: int) -> CounterResponse:
        return self._call(lambda opaque: release_request(name, resources, opaque))

    def stats(self) -> dict[str, bytes]:
        reply = self._call(lambda opaque: counter_request(Opcode.STATS, opaque=opaque))
        items, body = {}, reply.body
        while body:
            name_len, value_len = STAT_LENGTHS.unpack_from(body)
            name = body[4:4 + name_len].decode()
            items[name] = body[4 + name_len:4 + name_len + value_len]
            body = body[4 + name_len + value_len:]
        return items

    def dump(self) -> list[tuple[bytes, int, int]]:
        """(name, current, max) per counter, read up to the empty terminator."""
        opaque = self.next_opaque()
        self.send(counter_request(Opcode.DUMP, opaque=opaque))
        records = []
        while True:
            reply = self.read_response()
            assert (reply.opcode, reply.status, reply.opaque) == (Opcode.DUMP, 0, opaque), reply
            if not reply.body:
                return records
            current, maximum, name_len = DUMP_FIXED.unpack_from(reply.body)
            records.append((reply.body[10:10 + name_len], current, maximum))

    def _call(self, build: Callable[[int], bytes]) -> CounterResponse:
        opaque = self.next_opaque()
        self.send(build(opaque))
        reply = self.read_response()
        if reply is None:           # (a client's own error, as a closed socket's would be)
            raise ConnectionError(f"connection closed by {self.address!r}")
        assert reply.opaque == opaque, reply
        return reply

    # -- replies -----------------------------------------------------------

    def read_response(self, timeout: float | None = None) -> CounterResponse | None:
        """One reply, parsed; None if the server closed the connection cleanly."""
        frame = self.read_frame(timeout)
        if frame is None:
            return None
        magic, opcode, status, _, _, opaque = HEADER.unpack_from(frame)
        return CounterResponse(magic, opcode, status, opaque, frame[HEADER_SIZE:])

    def read_frame(self, timeout: float | None = None) -> bytes | None:
        """One reply frame as sent; None if the server closed the connection cleanly."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self._buffer) >= HEADER_SIZE:
                size = HEADER_SIZE + HEADER.unpack_from(self._buffer)[4]
                if len(self._buffer) >= size:
                    frame, self._buffer = self._buffer[:size], self._buffer[size:]
                    return frame
            if self._eof:
                if not self._buffer:
                    return None
                raise ConnectionError(f"connection closed inside a reply: {self._buffer!r}")
            self._receive(deadline)

    def closed_within(self, seconds: float) -> bool:
        """Whether the server closes the connection within `seconds`, sending nothing more."""
        deadline = time.monotonic() + seconds
        while not self._eof:
            try:
                self._receive(deadline)
            except ReplyTimeout:
                return False
        return not self._buffer

    def _receive(self, deadline: float) -> None:
        remaining = max(0.0, deadline - time.monotonic())
        if not select.select([self.sock], [], [], remaining)[0]:
            raise ReplyTimeout(f"no complete reply from {self.address!r} in time; "
                               f"received so far: {self._buffer!r}", self._buffer)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True


def wait_counter_ready(address: Address, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll until a counter front answers a Noop (after `zstalk serve` answers on its beanstalk port)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = connect(address, timeout=1.0)
            try:
                if counter_probe(sock):
                    return
            finally:
                sock.close()
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise ServerNotReady(f"no counter front answering on {address!r} within {timeout:g} s")
        time.sleep(_POLL_INTERVAL_S)
