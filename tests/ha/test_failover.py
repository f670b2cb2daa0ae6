"""Warm standbys on one journal (issue 43, first slice), with real processes: instances of
`zstalk serve --journal` on a 3-node nats-server cluster on loopback (R3, sync_interval
always, tests/support/nats_cluster.py), every one run with the same command; the lease
(broker/wal/lease.py) decides which leads.

  * two instances started at once: exactly one leads (/leader 200, stats journal-role
    leader); the other answers /leader 503 and refuses beanstalk connections;
  * kill -9 of the leader while a producer puts with acknowledgement: the standby
    answers within a few seconds, every acknowledged job is there (all reserved again),
    none acknowledged as deleted comes back;
  * a leader stopped (SIGSTOP) until the standby leads, then SIGCONT: with no traffic it
    exits 12 within 2 s; a command sent to it while it was stopped is never answered;
    nothing it appends lands after the new leader's EPOCH message;
  * SIGTERM of the leader: the standby leads well within the lease (it was released),
    and a job a client held is kept for it;
  * SIGTERM of a standby (`zstalk serve`, and `zstalk broker`, which stands by before its
    loop runs): exit 0, the leader unaffected;
  * a leader whose loop is stuck (its lease's `turned` stamp frozen, as a stuck loop
    leaves it: the lease itself runs on a thread, so no signal can stop only the loop)
    stops renewing: a standby claims the lease, and once the loop turns again the old
    leader is told it lost it; --journal-stall-ms between 1 and 999 is a usage error.
Times are asserted with room for a loaded 2-core machine; the figures are printed (-s).
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from nats_cluster import Cluster, cluster  # noqa: F401 (a fixture)
from servers import LOOPBACK, RawClient, ServerProcess, find_zstalk, free_port, self_check, wait_for
from test_binlog_end_to_end import Pipeline, check_durable
from test_metrics import label_values, parse, values
from test_metrics_end_to_end import one, promtool_accepts, scrape_text

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own journal")
DEPOSED_EXIT = 12
LEAD_S = 20.0           # the longest a test waits for an instance to lead (a loaded machine)


@pytest.fixture
def name() -> str:
    return "f" + os.urandom(4).hex()


class Instance(ServerProcess):
    """One `zstalk serve --journal` instance, its health port beside it; `launch()` starts
    it without waiting (a standby's beanstalk port stays closed)."""

    def __init__(self, urls: str, name: str, *extra: str) -> None:
        port, self.health = free_port(), free_port()
        argv = [find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port), "--counter-port", "0",
                "--worker-bind", "none", "--health-port", str(self.health),
                "--health-listen", LOOPBACK, "--journal", urls, "--journal-name", name, *extra]
        super().__init__(argv, (LOOPBACK, port), name=f"zstalk-{name}")

    def launch(self) -> "Instance":
        self._log = tempfile.TemporaryFile(prefix=f"{self.name}-")
        self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=self._log, start_new_session=True)
        return self

    def leader(self) -> tuple[int, str]:
        """GET /leader: (status, body); (0, why) while the health port does not answer."""
        return self.health_get("/leader")

    def ready(self) -> tuple[int, str]:
        return self.health_get("/readyz")

    def health_get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.health}{path}",
                                        timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def leads(self) -> bool:
        return self.leader()[0] == 200

    def stands_by_for(self, other: "Instance") -> bool:
        """Standing by, having seen `other`'s lease (not merely started)."""
        status, body = self.leader()
        return status == 503 and "leads (epoch" in body

    def refuses_clients(self) -> bool:
        try:
            socket.create_connection(self.address, timeout=1).close()
        except ConnectionRefusedError:
            return True
        return False

    def signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)


def stats(address) -> dict[bytes, bytes]:
    with RawClient(address, 15) as c:
        c.send(b"stats\r\n")
        return dict(re.findall(rb"\n([a-z-]+): ([^\n]*)", c.read_reply()))


def answers(address) -> bool:
    """A beanstalk command is answered now (the instance leads)."""
    try:
        with RawClient(address, 2) as c:
            c.send(b"list-tube-used\r\n")
            return c.read_reply().startswith(b"USING")
    except (OSError, TimeoutError, ConnectionError):
        return False


def first_answer_after(address, since: float, limit_s: float = LEAD_S) -> float:
    """Seconds from `since` until `address` answers a command (polled every 20 ms)."""
    assert wait_for(lambda: answers(address), limit_s, 0.02), f"{address} never answered"
    return time.monotonic() - since


def leader_and_standby(cluster: Cluster, name: str, *extra: str) -> tuple[Instance, Instance]:
    """One instance leading, then a second standing by for it."""
    a = Instance(cluster.urls, name, *extra).launch()
    assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
    b = Instance(cluster.urls, name, *extra).launch()
    assert wait_for(lambda: b.stands_by_for(a), LEAD_S, 0.05), (b.leader(), b.output())
    return a, b


def stream_messages(urls: str, name: str) -> list[tuple[int, dict, bytes]]:
    """Every message of the journal's stream: (sequence, headers, payload)."""
    async def read() -> list:
        import nats
        nc = await nats.connect(urls.split(","))
        try:
            js = nc.jetstream()
            info = await js.stream_info(f"ZSTALK_{name}")
            return [(seq, m.headers or {}, m.data) for seq in range(
                info.state.first_seq, info.state.last_seq + 1)
                for m in [await js.get_msg(f"ZSTALK_{name}", seq)]]
        finally:
            await nc.close()
    return asyncio.run(read())


def assert_nothing_after_the_epoch(urls: str, name: str, epoch: int) -> None:
    """The EPOCH message of `epoch` is in the stream, and every later message was
    appended under it (by its leader)."""
    messages = stream_messages(urls, name)
    starts = [i for i, (_, h, _) in enumerate(messages)
              if h.get("Zstalk-Leader") and int(h["Zstalk-Epoch"]) == epoch]
    assert starts, f"no EPOCH message for epoch {epoch}"
    leader = messages[starts[0]][1]["Zstalk-Leader"]
    for seq, headers, _ in messages[starts[0]:]:
        assert int(headers.get("Zstalk-Epoch", 0)) == epoch and \
            headers["Nats-Msg-Id"].startswith(leader + "-"), \
            f"message {seq} came after epoch {epoch}'s EPOCH from another writer: {headers}"


def test_two_instances_started_at_once_exactly_one_leads(cluster, name):
    both = [Instance(cluster.urls, name), Instance(cluster.urls, name)]
    try:
        for i in both:
            i.launch()
        assert wait_for(lambda: any(i.leads() for i in both), LEAD_S, 0.05), \
            [i.output() for i in both]
        for _ in range(8):                  # for 2 s: still exactly one
            leading = [i for i in both if i.leads()]
            assert len(leading) == 1, [i.leader() for i in both]
            time.sleep(0.25)
        leader, standby = leading[0], next(i for i in both if i is not leading[0])
        status, body = standby.leader()
        assert status == 503 and "standby" in body, body
        assert standby.refuses_clients(), "a standby answered a beanstalk connection"
        said = stats(leader.address)
        assert said[b"journal-role"] == b"leader" and said[b"journal-epoch"] == b"1", said
        assert int(said[b"journal-seq"]) >= 1
        assert all(i.running for i in both)
    finally:
        for i in both:
            i.stop()


def test_the_leader_s_metrics_say_it_leads_and_a_standby_s_say_it_does_not_with_its_lag(
        cluster, name):
    a, b = leader_and_standby(cluster, name)
    try:
        with RawClient(a.address, 10) as c:
            c.send(b"put 0 0 60 5\r\nhello\r\n" * 20)
            assert len(c.read_replies(20)) == 20
        status, text = scrape_text(a.health)
        led = parse(text)
        assert status == 200 and one(led, "zstalk_journal_leading") == 1
        assert one(led, "zstalk_journal_epoch") == 1
        status, text = scrape_text(b.health)
        assert status == 200, text
        stood = parse(text)
        assert one(stood, "zstalk_journal_leading") == 0
        assert one(stood, "zstalk_journal_epoch") == 1              # (the leader's, seen)
        [lag] = values(stood, "zstalk_journal_standby_lag_messages").values()
        assert lag >= 0
        [me] = label_values(stood, "zstalk_journal_standby_lag_messages", "standby")
        # the leader lists the same standby (it says every 2 s)
        assert wait_for(lambda: me in label_values(
            parse(scrape_text(a.health)[1]), "zstalk_journal_standby_lag_messages", "standby"),
            10), (me, scrape_text(a.health)[1])
        promtool_accepts(text)
    finally:
        a.stop()
        b.stop()


def reserve_all(address, upto_s: float = 30.0) -> dict[int, bytes]:
    """Reserve every ready job: id -> body."""
    got: dict[int, bytes] = {}
    until = time.monotonic() + upto_s
    with RawClient(address, 15) as c:
        while time.monotonic() < until:
            c.send(b"reserve-with-timeout 0\r\n" * 64)
            replies = c.read_replies(64)
            for reply in replies:
                if reply.startswith(b"RESERVED "):
                    head, body = reply.split(b"\r\n", 1)
                    got[int(head.split()[1])] = body[:-2]
            if replies[-1] == b"TIMED_OUT\r\n":
                return got
    raise AssertionError("reserving every job did not end")


def test_kill_9_of_the_leader_under_acknowledged_puts_the_standby_leads_losing_nothing(
        cluster, name):
    a, b = leader_and_standby(cluster, name)
    try:
        killed: list[float] = []

        def kill() -> None:
            killed.append(time.monotonic())
            a.kill()
        p = Pipeline(a.address)
        p.run(kill, after_s=1.0)
        assert not p.errors, p.errors[:5]
        took = first_answer_after(b.address, killed[0])
        print(f"\nkill -9 of the leader -> the standby's first answer: {took:.2f} s "
              f"(lease 1.5 s)")
        assert took < 8.0, f"the standby took {took:.1f} s to lead"
        assert stats(b.address)[b"journal-epoch"] == b"2"
        check_durable(b.address, p)
        reserved = reserve_all(b.address)
        for job_id, body in p.acked_puts.items():
            if job_id in p.acked_deletes:
                assert job_id not in reserved, f"job {job_id} was DELETED but came back"
            elif job_id not in p.delete_sent:
                assert reserved.get(job_id) == body, f"acknowledged job {job_id} not reserved"
        assert_nothing_after_the_epoch(cluster.urls, name, 2)
    finally:
        a.stop()
        b.stop()


def stop_until_the_standby_leads(a: Instance, b: Instance) -> None:
    a.signal(signal.SIGSTOP)
    try:
        first_answer_after(b.address, time.monotonic())
    except BaseException:
        a.signal(signal.SIGCONT)
        raise


def test_a_leader_stopped_until_the_standby_leads_exits_12_within_2_s_with_no_traffic(
        cluster, name):
    a, b = leader_and_standby(cluster, name)
    try:
        with RawClient(a.address, 10) as c:
            c.send(b"put 0 0 60 6\r\nbefore\r\n")
            assert c.read_reply() == b"INSERTED 1\r\n"
        stop_until_the_standby_leads(a, b)
        resumed = time.monotonic()
        a.signal(signal.SIGCONT)
        assert a.process.wait(10) == DEPOSED_EXIT, a.output()
        took = time.monotonic() - resumed
        print(f"\nSIGCONT of a deposed leader with no traffic -> its exit: {took:.2f} s")
        assert took < 2.0, f"the deposed leader took {took:.1f} s to exit"
        assert "deposed" in a.output()
        assert_nothing_after_the_epoch(cluster.urls, name, 2)
        with RawClient(b.address, 10) as c:
            c.send(b"peek 1\r\n")
            assert c.read_reply() == b"FOUND 1 6\r\nbefore\r\n"
    finally:
        a.signal(signal.SIGCONT) if a.running else None
        a.stop()
        b.stop()


def test_a_deposed_leader_answers_no_command_sent_to_it_while_it_was_stopped(cluster, name):
    a, b = leader_and_standby(cluster, name)
    try:
        c = RawClient(a.address, 10)
        c.send(b"put 0 0 60 6\r\nbefore\r\n")
        assert c.read_reply() == b"INSERTED 1\r\n"
        stop_until_the_standby_leads(a, b)
        c.send(b"put 0 0 60 4\r\nlate\r\nstats\r\npeek 1\r\n")   # (read once it goes on)
        a.signal(signal.SIGCONT)
        data, eof = c.read_available(5.0)
        c.close()
        assert data == b"" and eof, f"a deposed leader answered {data!r}"
        assert a.process.wait(10) == DEPOSED_EXIT, a.output()
        assert_nothing_after_the_epoch(cluster.urls, name, 2)
        with RawClient(b.address, 10) as d:
            d.send(b"peek-ready\r\npeek 2\r\n")
            assert d.read_replies(2) == [b"FOUND 1 6\r\nbefore\r\n", b"NOT_FOUND\r\n"]
    finally:
        a.signal(signal.SIGCONT) if a.running else None
        a.stop()
        b.stop()


def test_sigterm_of_the_leader_hands_over_to_the_standby_well_within_the_lease(cluster, name):
    lease = ("--journal-lease-ms", "5000")      # a takeover by lapse would take 5 s
    a, b = leader_and_standby(cluster, name, *lease)
    try:
        with RawClient(a.address, 10) as holder:
            holder.send(b"put 0 0 120 4\r\nheld\r\nreserve\r\nput 0 0 60 4\r\nfree\r\n")
            assert holder.read_replies(3) == [b"INSERTED 1\r\n", b"RESERVED 1 4\r\nheld\r\n",
                                              b"INSERTED 2\r\n"]
            stopped = time.monotonic()
            a.signal(signal.SIGTERM)
            assert a.process.wait(10) == 0, a.output()
            took = first_answer_after(b.address, stopped)
        print(f"\nSIGTERM of the leader -> the standby's first answer: {took:.2f} s "
              f"(lease 5 s)")
        assert took < 2.5, (f"the standby took {took:.1f} s: the lease was not released\n"
                            f"{a.output()[-3000:]}")
        with RawClient(b.address, 10) as other:
            other.send(b"stats-job 1\r\nreserve-with-timeout 0\r\nreserve-with-timeout 0\r\n")
            job, free, none = other.read_replies(3)
            assert b"state: delayed" in job, "the held job was not kept for its holder"
            assert free == b"RESERVED 2 4\r\nfree\r\n" and none == b"TIMED_OUT\r\n"
        assert_nothing_after_the_epoch(cluster.urls, name, 2)
    finally:
        a.stop()
        b.stop()


def test_standbys_stopped_with_sigterm_exit_0_and_the_leader_goes_on(cluster, name):
    a, b = leader_and_standby(cluster, name)
    broker = subprocess.Popen([find_zstalk(), "broker", "--bind", f"tcp://{LOOPBACK}:{free_port()}",
                               "--journal", cluster.urls, "--journal-name", name],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(2.0)                 # (connected and standing by: a leads and renews)
        assert broker.poll() is None, broker.communicate()[0]
        for sig_to in (b.signal, broker.send_signal):
            sig_to(signal.SIGTERM)
        assert b.process.wait(10) == 0, b.output()
        assert broker.wait(10) == 0, broker.communicate()[0]
        assert answers(a.address) and a.leads()
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
        a.stop()
        b.stop()


def test_a_leader_whose_loop_is_stuck_lets_the_lease_lapse_and_learns_it_lost_it_after(
        cluster, name):
    from broker.wal import stream as S
    from broker.wal.lease import Lease
    opts = S.Options(tuple(cluster.urls.split(",")), name, lease_s=1.0, stall_s=1.0)
    a, b, lost, stuck_at = Lease(opts, "a"), Lease(opts, "b"), [], []
    try:
        a.start(1 << 16)
        assert a.won.result(15) == 1
        a.turned = lambda: stuck_at[0] if stuck_at else time.monotonic()
        a.on_lost(lost.append)
        b.start(1 << 16)
        time.sleep(3 * opts.lease_s)            # (a's loop turns: b stands by)
        assert not b.won.done() and not lost
        stuck_at.append(time.monotonic())
        assert b.won.result(20) == 2            # (stall 1 s, then the lease 1 s, on a busy box)
        took = time.monotonic() - stuck_at[0]
        print(f"\nthe leader's loop stuck -> the standby claims the lease: {took:.2f} s "
              f"(stall 1 s, lease 1 s)")
        assert not lost                         # (a stuck loop learns nothing)
        stuck_at.clear()                        # (it turns again: its renewal is refused)
        assert wait_for(lambda: lost, 10, 0.05)
        assert "instance b leads (epoch 2)" in lost[0], lost
    finally:
        b.close()
        a.close()


def test_a_journal_stall_below_a_second_is_a_usage_error():
    done = subprocess.run([find_zstalk(), "serve", "-p", str(free_port()), "--journal",
                           f"nats://{LOOPBACK}:4222", "--journal-stall-ms", "500"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "--journal-stall-ms" in done.stderr and "0 (never) or 1000 and more" in done.stderr
