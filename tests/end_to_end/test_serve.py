"""`zstalk serve` and `zstalkd` as whole programs: start-up, signals, ports, flags, limits."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from servers import RawClient, children_of, free_port, self_check
from zstalk.broker.run.dropin import Usage, parse_args

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own programs")

BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
ZSTALKD = str(BIN / "zstalkd") if (BIN / "zstalkd").exists() else "zstalkd"
ZSTALK = str(BIN / "zstalk") if (BIN / "zstalk").exists() else "zstalk"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_until(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def ask(address, line: bytes, timeout: float = 10.0) -> bytes:
    c = RawClient(address, timeout)
    try:
        c.send(line)
        return c.read_reply()
    finally:
        c.close()


class Program:
    """A zstalk program started for one test and always stopped at its end."""

    def __init__(self, argv, **kw) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    def wait_answering(self, address, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ask(address, b"list-tube-used\r\n", 2) == b"USING default\r\n":
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.monotonic() < deadline, "server did not answer"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start():
    programs: list[Program] = []

    def run(argv, **kw) -> Program:
        p = Program(argv, **kw)
        programs.append(p)
        return p

    yield run
    for p in programs:
        p.stop()


def test_sigterm_stops_the_supervisor_and_every_child_within_a_few_seconds(start):
    port = free_port()
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0", "--fronts", "2"])
    p.wait_answering(("127.0.0.1", port))
    kids = children_of(p.proc.pid)
    assert len(kids) == 3
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    assert p.proc.wait(10) == 0
    assert wait_until(lambda: not any(alive(k) for k in kids), 5)
    assert time.monotonic() - t0 < 5


def test_children_never_outlive_a_supervisor_killed_with_9(start):
    port = free_port()
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0",
               "--fronts", "1"])
    p.wait_answering(("127.0.0.1", port))
    kids = children_of(p.proc.pid)
    p.proc.kill()
    p.proc.wait()
    assert wait_until(lambda: not any(alive(k) for k in kids), 5)


def test_a_second_server_on_a_busy_port_fails_with_address_in_use(start):
    port = free_port()
    first = start([ZSTALKD, "-l", "127.0.0.1", "-p", str(port)])
    first.wait_answering(("127.0.0.1", port))
    second = subprocess.run([ZSTALKD, "-l", "127.0.0.1", "-p", str(port)],
                            capture_output=True, text=True, timeout=10)
    assert second.returncode == 111
    assert "Address already in use" in second.stderr


def test_sigusr1_puts_the_whole_cluster_in_drain_mode(start):
    port = free_port()
    address = ("127.0.0.1", port)
    p = start([ZSTALKD, "-l", "127.0.0.1", "-p", str(port)])
    p.wait_answering(address)
    assert ask(address, b"put 0 0 1 1\r\nx\r\n") == b"INSERTED 1\r\n"
    p.proc.send_signal(signal.SIGUSR1)
    assert wait_until(lambda: ask(address, b"put 0 0 1 1\r\nx\r\n") == b"DRAINING\r\n", 5)
    assert b"draining: true" in ask(address, b"stats\r\n")
    assert ask(address, b"reserve-with-timeout 0\r\n").startswith(b"RESERVED 1 1")


def test_several_fronts_share_one_port_and_one_broker(start):
    port = free_port()
    address = ("127.0.0.1", port)
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0", "--fronts", "3"])
    p.wait_answering(address)
    clients = [RawClient(address) for _ in range(12)]
    for i, c in enumerate(clients):
        c.send(b"put 0 0 10 1\r\nx\r\n")
        assert c.read_reply().startswith(b"INSERTED ")
    clients[0].send(b"stats\r\n")
    stats = clients[0].read_reply()
    assert b"current-connections: 12\n" in stats and b"total-jobs: 12\n" in stats
    for c in clients:
        c.close()


def test_zstalkd_listens_at_once_and_answers_its_first_command_within_a_second(start):
    port = free_port()
    t0 = time.monotonic()
    p = start([ZSTALKD, "-l", "127.0.0.1", "-p", str(port)])
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() - t0 < 5
            time.sleep(0.002)
    listening = time.monotonic() - t0
    p.wait_answering(("127.0.0.1", port))
    answered = time.monotonic() - t0
    # generous windows for a noisy machine; precise start-up time is measured in scripts/
    assert listening < 1.0 and answered < 3.0


def test_zstalkd_replaces_a_stale_unix_socket_file(start, tmp_path):
    path = tmp_path / "beanstalk.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()                                  # the file stays, nobody listens
    p = start([ZSTALKD, "-l", f"unix:{path}"])
    p.wait_answering(str(path))


def test_two_zstalkd_run_side_by_side_on_different_ports(start):
    ports = [free_port(), free_port()]
    progs = [start([ZSTALKD, "-l", "127.0.0.1", "-p", str(port)]) for port in ports]
    for prog, port in zip(progs, ports):
        prog.wait_answering(("127.0.0.1", port))
    assert ask(("127.0.0.1", ports[0]), b"put 0 0 1 1\r\na\r\n") == b"INSERTED 1\r\n"
    assert ask(("127.0.0.1", ports[1]), b"peek 1\r\n") == b"NOT_FOUND\r\n"


def test_zstalkd_takes_its_socket_from_systemd_socket_activation(start):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    address = listener.getsockname()

    def as_fd_3():
        os.dup2(listener.fileno(), 3)

    p = start(["sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" -p 1', ZSTALKD],
              pass_fds=[listener.fileno(), 3], preexec_fn=as_fd_3)
    listener.close()
    p.wait_answering(address)


def test_max_job_size_flag_limits_puts(start):
    port = free_port()
    address = ("127.0.0.1", port)
    p = start([ZSTALKD, "-l", "127.0.0.1", f"-p{port}", "-z", "10"])
    p.wait_answering(address)
    assert ask(address, b"put 0 0 1 11\r\n0123456789X\r\n") == b"JOB_TOO_BIG\r\n"
    assert b"max-job-size: 10\n" in ask(address, b"stats\r\n")


def user_can_run_this_python(user: str) -> bool:
    import sys
    return subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", "import ctypes"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to change user")
def test_zstalkd_becomes_the_user_it_is_told(start):
    if not user_can_run_this_python("nobody"):
        pytest.skip("user nobody cannot run this Python (it lives in a private home)")
    port = free_port()
    p = start([ZSTALKD, "-l", "127.0.0.1", "-p", str(port), "-u", "nobody"])
    p.wait_answering(("127.0.0.1", port))
    uids = {Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0]
            for pid in [p.proc.pid, *children_of(p.proc.pid)]}
    assert uids == {str(65534)}


def test_max_connections_accepts_then_closes_the_extra_connection(start):
    port = free_port()
    address = ("127.0.0.1", port)
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0", "--max-connections", "2"])
    p.wait_answering(address)
    kept = [RawClient(address), RawClient(address)]
    for c in kept:
        c.send(b"list-tube-used\r\n")
        assert c.read_reply() == b"USING default\r\n"
    extra = RawClient(address)
    data, closed = extra.read_available(3)
    assert (data, closed) == (b"", True)


# -- beanstalkd's command line ---------------------------------------------------------
@pytest.mark.parametrize("argv, expected", [
    ([], {"port": 11300, "addr": "0.0.0.0", "max_job_size": 65535, "verbose": 0}),
    (["-p11301"], {"port": 11301}),
    (["-p", "11302", "-l", "127.0.0.2"], {"port": 11302, "addr": "127.0.0.2"}),
    (["-VV"], {"verbose": 2}),
    (["-VVu", "nobody"], {"verbose": 2, "user": "nobody"}),
    (["-V", "-z", "99999999999"], {"verbose": 1, "max_job_size": 1073741824}),
    (["-lunix:/tmp/x.sock"], {"addr": "unix:/tmp/x.sock"}),
    (["-b", "/tmp/wal", "-f0"], {"binlog": "/tmp/wal", "fsync_ms": 0}),
    (["-Fb/tmp/wal", "-s", "4096"], {"binlog": "/tmp/wal", "no_fsync": True, "binlog_size": 4096}),
])
def test_zstalkd_parses_flags_as_beanstalkd_does(argv, expected):
    opts = parse_args(argv)
    assert {k: opts[k] for k in expected} == expected


@pytest.mark.parametrize("argv, code", [
    (["-x"], 5), (["-"], 5), (["extra"], 5), (["-p"], 5), (["-h"], 0), (["-b"], 5),
    (["-f", "often"], 5), (["-s"], 5),
])
def test_zstalkd_rejects_what_beanstalkd_rejects(argv, code):
    with pytest.raises(Usage) as err:
        parse_args(argv)
    assert err.value.code == code


#: run with the capabilities to change user dropped, so even root cannot (util-linux setpriv)
NO_SETID = ["setpriv", "--bounding-set=-setgid,-setuid", "--inh-caps=-setgid,-setuid"]


@pytest.mark.reference
@pytest.mark.parametrize("prefix, user", [([], "nosuchuser"), (NO_SETID, "nobody")],
                         ids=["no_such_user", "setgid_refused"])
def test_zstalkd_fails_to_change_user_with_beanstalkds_message_and_exit_code(prefix, user):
    from conftest import require_beanstalkd
    if prefix and (os.geteuid() != 0 or not shutil.which("setpriv")):
        pytest.skip("needs root and setpriv to refuse a change of user")
    runs = {name: subprocess.run(prefix + [path, "-l", "127.0.0.1", "-p", str(free_port()),
                                           "-u", user], capture_output=True, text=True,
                                 timeout=10)
            for name, path in (("beanstalkd", require_beanstalkd()), ("zstalkd", ZSTALKD))}
    # beanstalkd's message names its path and source line (main.c:22 in su: ...); ours not
    expected = re.sub(r"^\S*beanstalkd: \S+:\d+ in \w+: ", "zstalkd: ", runs["beanstalkd"].stderr)
    assert runs["beanstalkd"].returncode in (33, 34)
    assert (runs["zstalkd"].returncode, runs["zstalkd"].stderr) == (
        runs["beanstalkd"].returncode, expected)


def test_zstalkd_prints_its_version():
    out = subprocess.run([ZSTALKD, "-v"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and out.stdout.startswith("zstalkd ")


def child_pid(supervisor: int, word: bytes) -> int:
    for pid in children_of(supervisor):
        if word in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no {word!r} child")


def test_serve_restarts_a_broker_killed_with_9_and_clients_start_over(start):
    port = free_port()
    address = ("127.0.0.1", port)
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0",
               "--fronts", "1"])
    p.wait_answering(address)
    old = RawClient(address)
    old.send(b"put 0 0 10 1\r\nx\r\n")
    assert old.read_reply() == b"INSERTED 1\r\n"
    os.kill(child_pid(p.proc.pid, b"broker"), signal.SIGKILL)
    assert old.read_available(10)[1], "clients of a broker that lost its state are closed"
    p.wait_answering(address)
    assert ask(address, b"put 0 0 10 1\r\ny\r\n") == b"INSERTED 1\r\n"


def test_serve_restarts_a_front_killed_with_9(start):
    port = free_port()
    address = ("127.0.0.1", port)
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0",
               "--fronts", "1"])
    p.wait_answering(address)
    held = RawClient(address)
    held.send(b"put 0 0 100 1\r\nx\r\nreserve\r\n")
    assert held.read_replies(2) == [b"INSERTED 1\r\n", b"RESERVED 1 1\r\nx\r\n"]
    os.kill(child_pid(p.proc.pid, b"front"), signal.SIGKILL)
    p.wait_answering(address)
    # the dead front's session is closed by heartbeat: its job is ready again
    assert wait_until(lambda: ask(address, b"reserve-with-timeout 0\r\n").startswith(b"RESERVED 1"), 8)


# -- ports: 0 to 65535, or exit 2 naming the flag (getaddrinfo and ZeroMQ would wrap them) --
RANGE = "is not in the range 0<=x<=65535."


@pytest.mark.parametrize("argv, said", [
    (["serve", "-p", "99999"], "Invalid value for '-p' / '--port': 99999 " + RANGE),
    (["serve", "--counter-port", "70000"], "Invalid value for '--counter-port': 70000 " + RANGE),
    (["serve", "--http-port", "99999"], "Invalid value for '--http-port': 99999 " + RANGE),
    (["serve", "--health-port", "65536"], "Invalid value for '--health-port': 65536 " + RANGE),
    (["serve", "-l", "127.0.0.1:99999"],
     "Invalid value for '-l' / '--listen': 127.0.0.1:99999: the port 99999 " + RANGE),
    (["serve", "--counter-listen", "[::1]:99999"],
     "Invalid value for '--counter-listen': [::1]:99999: the port 99999 " + RANGE),
    (["serve", "--worker-bind", "127.0.0.1:99999"],
     "Invalid value for '--worker-bind': 127.0.0.1:99999: the port 99999 " + RANGE),
    (["broker", "--bind", "tcp://127.0.0.1:99999"],
     "Invalid value for '--bind': tcp://127.0.0.1:99999: the port 99999 " + RANGE),
    (["broker", "--also-bind", "tcp://127.0.0.1:port"],
     "Invalid value for '--also-bind': tcp://127.0.0.1:port: the port 'port' is not a number."),
    (["front", "beanstalk", "--listen", "127.0.0.1:99999"],
     "Invalid value for '--listen': 127.0.0.1:99999: the port 99999 " + RANGE),
    (["front", "counter", "--listen", "127.0.0.1:abc"],
     "Invalid value for '--listen': 127.0.0.1:abc: the port is not a number."),
    (["front", "http", "--broker", "tcp://127.0.0.1:99999"],
     "Invalid value for '--broker': tcp://127.0.0.1:99999: the port 99999 " + RANGE),
    (["dispatcher", "--health-port", "99999"],
     "Invalid value for '--health-port': 99999 " + RANGE),
    (["worker", "tests.support.workers_app:shared", "--broker", "tcp://127.0.0.1:99999"],
     "Invalid value for '--broker': tcp://127.0.0.1:99999: the port 99999 " + RANGE),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_port_above_65535_ends_the_command_with_exit_2_naming_the_flag(argv, said):
    done = subprocess.run([ZSTALK, *argv], capture_output=True, text=True, timeout=30,
                          cwd=Path(__file__).resolve().parents[2])
    assert (done.returncode, done.stderr.splitlines()[-1]) == (2, f"Error: {said}")


@pytest.mark.reference
def test_zstalkd_wraps_a_port_above_65535_as_beanstalkd_does(start):
    from conftest import require_beanstalkd
    for server in (require_beanstalkd(), ZSTALKD):
        port = free_port()
        p = start([server, "-l", "127.0.0.1", "-p", str(port + 65536)])
        p.wait_answering(("127.0.0.1", port))
        p.stop()


def connectable(port: int, timeout: float = 10.0) -> None:
    """Wait until the port accepts (the kernel's backlog: bound, maybe not yet served)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "never listened"
            time.sleep(0.002)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1], ids=["SIGHUP", "SIGUSR1"])
def test_a_reload_or_drain_signal_sent_as_soon_as_zstalkd_listens_waits_instead_of_killing_it(
        start, signum):
    port = free_port()
    p = start([ZSTALKD, "-l", "127.0.0.1", "-p", str(port)])
    connectable(port)
    p.proc.send_signal(signum)      # (before its loop has a handler: held until it has)
    p.wait_answering(("127.0.0.1", port))
    assert p.proc.poll() is None


def test_a_sighup_sent_while_serve_starts_reads_the_config_again_once_its_loop_handles_it(
        start, tmp_path):
    import json
    import urllib.request
    config = tmp_path / "zstalk.toml"
    config.write_text('[functions.first]\nurl = "http://127.0.0.1:9/first"\n')
    port, http = free_port(), free_port()
    p = start([ZSTALK, "serve", "-l", "127.0.0.1", "-p", str(port), "--counter-port", "0",
               "--worker-bind", "none", "--config", str(config), "--http-port", str(http)])
    connectable(port)
    config.write_text('[functions.second]\nurl = "http://127.0.0.1:9/second"\n')
    p.proc.send_signal(signal.SIGHUP)
    p.wait_answering(("127.0.0.1", port))

    def names() -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/functions", timeout=5) as r:
            return [f["name"] for f in json.loads(r.read())["functions"]]
    assert wait_until(lambda: names() == ["second"], 10), names()
