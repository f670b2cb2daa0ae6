"""The binlog with real processes: kill -9 in the middle of pipelined work, a broker that
restarts under a front that stays up, lock contention, a beanstalkd directory, a full
disk (a small tmpfs the test mounts), and the same script against `beanstalkd -b`.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from servers import (LOOPBACK, RawClient, ServerProcess, children_of, free_port, self_check,
                     wait_for)

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own binlog")


def broker_pid(server) -> int:
    for pid in children_of(server.pid):
        if b"broker" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError("no broker child")


def ask(address, line: bytes, timeout: float = 10.0) -> bytes:
    with RawClient(address, timeout) as c:
        c.send(line)
        return c.read_reply()


def job_map(address, upto: int) -> dict[int, tuple]:
    """Every job with an id below `upto`: id -> (tube, state, pri, body)."""
    jobs = {}
    with RawClient(address, 10) as c:
        for first in range(1, upto, 256):      # pipelined: each turn may wait for a journal
            ids = range(first, min(first + 256, upto))
            c.send(b"".join(b"stats-job %d\r\npeek %d\r\n" % (i, i) for i in ids))
            replies = c.read_replies(2 * len(ids))
            for job_id, stats, peek in zip(ids, replies[::2], replies[1::2]):
                if not stats.startswith(b"NOT_FOUND"):
                    jobs[job_id] = _job_fields(stats, peek)
    return jobs


def _job_fields(stats: bytes, peek: bytes) -> tuple:
    """(tube, state, pri, body) from a stats-job reply and a peek reply."""
    fields = dict(re.findall(rb"\n([a-z-]+): ([^\n]*)", stats))
    body = peek.split(b"\r\n", 1)[1][:-2]
    return (fields[b"tube"].strip(b'"'), fields[b"state"], int(fields[b"pri"]), body)


class Pipeline:
    """Pipelined puts and deletes on one connection until it breaks; which ones were
    acknowledged is read back from the replies, in order."""

    def __init__(self, address) -> None:
        self.client = RawClient(address, 15)
        self.sent: list[tuple] = []          # ("put", body) | ("delete", id), in order
        self.acked_puts: dict[int, bytes] = {}
        self.acked_deletes: set[int] = set()
        self.delete_sent: set[int] = set()    # acknowledged or not: the job may be gone
        self.errors: list[bytes] = []
        self.stop = threading.Event()

    def _send(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                block, cmds = [], []
                for _ in range(50):
                    n += 1
                    body = b"job-%08d-" % n + os.urandom(8).hex().encode()
                    block.append(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
                    cmds.append(("put", body))
                for job_id in list(self.acked_puts.copy())[-20:]:
                    if job_id not in self.delete_sent:
                        self.delete_sent.add(job_id)
                        block.append(b"delete %d\r\n" % job_id)
                        cmds.append(("delete", job_id))
                self.sent.extend(cmds)
                self.client.send(b"".join(block))
                time.sleep(0.002)
        except OSError:
            pass

    def run(self, kill, after_s: float, keep_going_s: float = 0.0) -> None:
        sender = threading.Thread(target=self._send, daemon=True)
        sender.start()
        killer = threading.Timer(after_s, kill)
        killer.start()
        deadline = time.monotonic() + after_s + keep_going_s
        i = 0
        try:
            while True:
                if keep_going_s and time.monotonic() > deadline:
                    break
                reply = self.client.read_reply(timeout=10)
                if not reply:
                    break                   # the server closed the connection
                i = self._account(i, reply)
        except (OSError, TimeoutError, EOFError, ConnectionError):
            pass
        finally:
            self.stop.set()
            killer.join()
            sender.join(5)
            self.client.close()

    def _account(self, i: int, reply: bytes) -> int:
        while i >= len(self.sent):
            time.sleep(0.001)
        kind, what = self.sent[i]
        if reply.startswith(b"INSERTED "):
            assert kind == "put"
            self.acked_puts[int(reply.split()[1])] = what
        elif reply == b"DELETED\r\n":
            assert kind == "delete"
            self.acked_deletes.add(what)
        else:
            self.errors.append(reply)
        return i + 1


def check_durable(address, p: Pipeline) -> None:
    assert len(p.acked_puts) > 100, "the kill came before any real work"
    top = max(p.acked_puts) + 200
    jobs = job_map(address, top)
    for job_id, body in p.acked_puts.items():
        if job_id in p.acked_deletes:
            assert job_id not in jobs, f"job {job_id} was DELETED but came back"
        elif job_id in p.delete_sent:
            assert jobs.get(job_id, (0, 0, 0, body))[3] == body   # its delete may have landed
        else:
            assert jobs.get(job_id, (None,) * 4)[3] == body, f"job {job_id} lost or changed"
    bodies = [j[3] for j in jobs.values()]
    assert len(bodies) == len(set(bodies)), "a job came back twice"


@pytest.fixture
def wal_dir(tmp_path) -> str:
    return str(tmp_path / "wal")


def test_kill_9_of_the_whole_server_loses_nothing_acknowledged(zstalk_factory, wal_dir):
    server = zstalk_factory(extra_args=["-b", wal_dir, "-f", "0"])
    p = Pipeline(server.address)
    p.run(server.kill, after_s=1.0)
    assert not p.errors, p.errors[:5]
    server.start()
    check_durable(server.address, p)


def test_a_front_that_stays_up_while_the_broker_restarts_loses_nothing(zstalk_factory, wal_dir):
    server = zstalk_factory(extra_args=["-b", wal_dir, "-f", "0", "--fronts", "1"])
    p = Pipeline(server.address)
    p.run(lambda: os.kill(broker_pid(server), signal.SIGKILL), after_s=1.0, keep_going_s=4.0)
    assert set(p.errors) <= {b"INTERNAL_ERROR\r\n"}, p.errors[:5]
    assert wait_for(lambda: ask(server.address, b"stats\r\n").startswith(b"OK"), 10)
    check_durable(server.address, p)


def test_a_reservation_survives_a_broker_restart_under_its_front(zstalk_factory, wal_dir):
    server = zstalk_factory(extra_args=["-b", wal_dir, "--fronts", "1"])
    with RawClient(server.address, 15) as holder:
        holder.send(b"put 5 0 120 4\r\nheld\r\nreserve\r\n")
        assert holder.read_replies(2) == [b"INSERTED 1\r\n", b"RESERVED 1 4\r\nheld\r\n"]
        os.kill(broker_pid(server), signal.SIGKILL)
        assert wait_for(lambda: b"state: reserved" in ask(server.address, b"stats-job 1\r\n"), 10)
        holder.send(b"delete 1\r\n")
        assert holder.read_reply() == b"DELETED\r\n"


def test_a_second_server_on_the_same_directory_exits_10_naming_the_lock(zstalk_factory, wal_dir):
    zstalk_factory(extra_args=["-b", wal_dir])
    second = subprocess.run([zstalk_path(), "serve", "-l", LOOPBACK, "-p", str(free_port()),
                             "--counter-port", "0", "-b", wal_dir],
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 10
    assert "locked by another zstalk broker" in second.stderr


def test_a_beanstalkd_directory_is_refused_with_the_import_command(tmp_path):
    wal = tmp_path / "beanstalkd"
    wal.mkdir()
    (wal / "binlog.3").write_bytes(b"\x07\0\0\0" + bytes(100))
    zstalkd = str(Path(zstalk_path()).with_name("zstalkd"))
    out = subprocess.run([zstalkd, "-l", LOOPBACK, "-p", str(free_port()), "-b", str(wal)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 10
    assert f"zstalk import-binlog {wal}" in out.stderr
    assert sorted(os.listdir(wal)) == ["binlog.3"]


def zstalk_path() -> str:
    from servers import find_zstalk
    return find_zstalk()


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:     # (mount needs root; CI=true must run these tests)
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a small tmpfs on CI (uid {os.geteuid()}; mount needs "
                        f"root): {mounted.stderr.strip()}")
        pytest.skip(f"mounting a small tmpfs is not permitted here (uid {os.geteuid()}): "
                    f"{mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_disk_refuses_put_keeps_delete_and_recovers(zstalk_factory, tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        server = zstalk_factory(extra_args=["-b", str(disk), "-s", "16384", "-f", "0"])
        body = b"b" * 900
        acked = []
        with RawClient(server.address, 10) as c:
            for _ in range(1000):
                c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
                reply = c.read_reply()
                if reply == b"OUT_OF_MEMORY\r\n":
                    break
                acked.append(int(reply.split()[1]))
            else:
                pytest.fail("256 KiB never filled up")
            assert len(acked) > 20
            c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
            assert c.read_reply() == b"OUT_OF_MEMORY\r\n", "still full"
            for job_id in acked[:-5]:
                c.send(b"delete %d\r\n" % job_id)
                assert c.read_reply() == b"DELETED\r\n"
            assert wait_for(lambda: ask(server.address, b"put 0 0 60 1\r\ny\r\n")
                            .startswith(b"INSERTED"), 10), "space came back, put did not"
        server.kill()
        server.start()
        jobs = job_map(server.address, max(acked) + 50)
        assert set(acked[-5:]) <= set(jobs), "acknowledged jobs survived the full disk"
        assert not set(acked[:-5]) & set(jobs)
        server.stop()


def fill(disk: Path, name: str = "filler") -> Path:
    """Write a file on `disk` until its filesystem is full (returned: remove it to free it)."""
    filler = disk / name
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def verbose_server(wal: Path, *extra: str) -> ServerProcess:
    """`zstalk -V serve -b WAL` (INFO lines too) on a free port, not yet started."""
    port = free_port()
    return ServerProcess([zstalk_path(), "-V", "serve", "-l", LOOPBACK, "-p", str(port),
                          "--counter-port", "0", "--worker-bind", "none", "-b", str(wal),
                          *extra], (LOOPBACK, port), name="zstalk-full", probe=b"stats\r\n")


def test_a_full_disk_is_logged_once_as_it_begins_and_once_when_space_returns(tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as disk, \
            verbose_server(disk / "wal", "-s", "16384", "-f", "0") as server:
        filler = fill(disk)
        body = b"b" * 900
        with RawClient(server.address, 10) as c:
            replies = []
            for _ in range(40):         # (16 KiB of segment takes a few, then none)
                c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
                replies.append(c.read_reply())
            assert replies[0].startswith(b"INSERTED")
            assert replies[-10:] == [b"OUT_OF_MEMORY\r\n"] * 10
            full = [ln for ln in server.output().splitlines() if "out of space" in ln]
            assert len(full) == 1, full
            assert " WARNING " in full[0]
            assert re.search(rf"binlog: {disk / 'wal'} is out of space "
                             r"\(No space left on device\): "
                             r"\d+ bytes free, and a put needs a new segment of 16384 bytes "
                             r"\(-s/--binlog-size sets it\)", full[0]), full[0]
            filler.unlink()
            c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
            assert c.read_reply().startswith(b"INSERTED"), "space came back, put did not"
        assert wait_for(lambda: "has space again" in server.output(), 10)
        back = [ln for ln in server.output().splitlines() if "has space again" in ln]
        assert len(back) == 1 and " INFO " in back[0], back
        refused = re.search(r"\(\d+ bytes free\): puts are accepted again \((\d+) "
                            r"reservations were refused", back[0])
        assert refused and int(refused[1]) >= 10, back[0]
        assert len([ln for ln in server.output().splitlines() if "out of space" in ln]) == 1


def test_each_disk_full_episode_warns_once_and_ends_with_one_info(tmp_path, caplog):
    from zstalk.broker.core.beanstalk.jobs import Job, Tube
    from zstalk.broker.core.shared.journal import JOB_PUT
    from zstalk.broker.wal.binlog import Binlog, Options

    caplog.set_level("INFO", "zstalk.binlog")
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        wal = Binlog(Options(str(disk / "wal"), 8192, None))
        wal.open(65535)
        job = Job(1, Tube("default"), 0, 0, 1, b"x" * 900, 0.0)
        try:
            for episode in (1, 2):
                filler = fill(disk, f"filler{episode}")
                while wal.room[JOB_PUT](job):
                    pass
                assert not any(wal.room[JOB_PUT](job) for _ in range(20))
                filler.unlink()
                assert wal.room[JOB_PUT](job), "space came back"
        finally:
            wal.close()
    said = [f"{r.levelname} {r.getMessage()}" for r in caplog.records]
    expected = [f"WARNING binlog: {disk / 'wal'} is out of space (",
                f"INFO binlog: {disk / 'wal'} has space again ("] * 2
    assert len(said) == 4 and all(map(str.startswith, said, expected)), said


def test_a_restart_on_a_full_disk_exits_10_saying_what_space_it_needs_where(tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        wal = disk / "wal"
        server = verbose_server(wal, "-s", "16384").start()
        try:
            assert ask(server.address, b"put 0 0 60 2\r\nhi\r\n") == b"INSERTED 1\r\n"
            filler = fill(disk)
            server.kill()
        finally:
            server.stop()
        again = subprocess.run(server.argv, capture_output=True, text=True, timeout=60)
        assert again.returncode == 10, again.stderr
        assert re.search(rf"{wal}: no space to start the binlog \(No space left on device\): its "
                         r"first segment needs 16384 bytes and \d+ are free there; free some "
                         r"space there, move the directory to a disk with room \(-b/--binlog\), "
                         r"or lower -s/--binlog-size \(not below 4096, the least it takes\)",
                         again.stderr), again.stderr
        assert "Errno" not in again.stderr
        filler.unlink()
        with server:                    # the advice works: with room, the job is back
            assert ask(server.address, b"peek 1\r\n") == b"FOUND 1 2\r\nhi\r\n"


def test_a_start_on_a_full_disk_says_how_low_the_segment_size_may_go(tmp_path):
    from zstalk.broker.wal import format as wf
    from zstalk.broker.wal.binlog import Binlog, BinlogError, Options

    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        wal = str(disk / "wal")
        big = Binlog(Options(wal, 4096, None))
        big.open(65535)
        assert big.log_image(wf.Image(1, "default", 0, 0, 60, time.time(), wf.S_READY, 0.0,
                                      (0,) * 5, b"x" * 20000))
        big.write({}, 2)
        big.close()
        fill(disk)
        with pytest.raises(BinlogError) as lower:
            Binlog(Options(wal, 65536, None)).open(65535)
        least = re.search(r"needs 65536 bytes and \d+ are free there; .*, or lower "
                          r"-s/--binlog-size \(not below (\d+), what the largest record here "
                          r"needs\)$", str(lower.value))
        assert least and 20000 < int(least[1]) <= 24576, str(lower.value)
        fill(disk, "more")              # (that start removed the spares nothing was written to)
        with pytest.raises(BinlogError) as cannot:
            Binlog(Options(wal, 4096, None)).open(65535)
        assert str(cannot.value).endswith(" (-s/--binlog-size cannot lower it: the largest "
                                          "record here needs it)"), str(cannot.value)


DIFF_SCRIPT = [
    b"use mail", b"put 10 0 60 5\r\nfirst", b"put 5 0 60 6\r\nsecond", b"put 7 3600 60 7\r\ndelayed",
    b"put 1 0 60 4\r\nbury", b"reserve-job 4", b"bury 4 77",
    b"put 3 0 60 4\r\nrel0", b"reserve-job 5", b"release 5 99 0",
    b"put 3 0 60 5\r\nrel60", b"reserve-job 6", b"release 6 33 60",
    b"put 2 0 60 5\r\nkickd", b"reserve-job 7", b"bury 7 8", b"kick-job 7",
    b"put 2 0 60 3\r\ngon", b"delete 8",
    b"use other", b"put 0 0 60 4\r\nheld", b"reserve-job 9",
    b"put 4 0 60 10\r\nbin\r\nary\0!", b"put 9 500 60 2\r\ndk", b"kick-job 11",
    b"put 6 0 60 2\r\nb2", b"reserve-job 12", b"bury 12 1",
    b"put 6 0 60 2\r\nb3", b"reserve-job 13", b"bury 13 2", b"kick 1",
]


def run_script(address) -> list[bytes]:
    with RawClient(address, 10) as c:
        replies = []
        for line in DIFF_SCRIPT:
            c.send(line + b"\r\n")
            replies.append(c.read_reply())
        return replies


def test_state_after_a_crash_matches_beanstalkd_b(beanstalkd_factory, zstalk_factory, tmp_path):
    """The same script against `beanstalkd -b` and zstalk, kill -9, restart: every job's
    tube, state, priority and body agree."""
    (tmp_path / "b").mkdir()            # beanstalkd does not make its directory
    servers = [beanstalkd_factory(extra_args=["-b", str(tmp_path / "b"), "-f", "0"]),
               zstalk_factory(extra_args=["-b", str(tmp_path / "z"), "-f", "0"])]
    replies = [run_script(s.address) for s in servers]
    assert replies[0] == replies[1]
    for s in servers:
        s.kill()
        s.start()
    after = [job_map(s.address, 20) for s in servers]
    assert after[0] == after[1]
    assert after[1][9][1] == b"ready", "the job reserved at the crash is ready again"
    assert after[1][4][1:3] == (b"buried", 77)
    assert after[1][5][2] == 3, "release without delay is not logged: priority as put"


def test_a_client_that_connects_during_replay_is_answered_once_it_is_done(tmp_path):
    """Fronts start only after the broker has replayed its binlog, so a client waits in the
    listen backlog (as with beanstalkd) instead of having its command held and failed."""
    from zstalk.broker.wal import format as wf
    from zstalk.broker.wal.binlog import Binlog, Options

    jobs = 200_000
    wal = Binlog(Options(str(tmp_path / "wal"), 10 << 20, None))
    wal.open(65535)
    for job_id in range(1, jobs + 1):
        wal.log_image(wf.Image(job_id, "default", 0, 0, 60, time.time(), wf.S_READY, 0.0,
                               (0,) * 5, b"%099d" % job_id))
        if len(wal.pending) >= 10_000:
            wal.write({}, job_id + 1)
    wal.write({}, jobs + 1)
    wal.close()
    port = free_port()
    server = subprocess.Popen([zstalk_path(), "serve", "-l", LOOPBACK, "-p", str(port),
                               "--counter-port", "0", "-b", str(tmp_path / "wal")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert wait_for(lambda: RawClient((LOOPBACK, port), 1).close() is None, 10)
        with RawClient((LOOPBACK, port), 60) as c:
            c.send(b"stats\r\n")
            reply = c.read_reply()
        assert reply.startswith(b"OK "), reply[:40]
        assert b"\ncurrent-jobs-ready: %d\n" % jobs in reply
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
