"""Warm standbys (issue 43, item 2; broker/wal/follow.py), with real processes on a 3-node
nats-server cluster (tests/support/nats_cluster.py), as tests/ha/test_failover.py runs them:

  * a standby follows the stream while it stands by and says how far (/leader's body);
    killed, the leader is replaced by a standby that reads only the tail after what it
    folded in (its log says so, -V) and has every job as the leader left it;
  * a standby stopped (SIGSTOP) while compaction purges the messages it had not folded in,
    among them the DELETE of a job it holds, folds the stream again from its first message
    and, leading, has no deleted job back;
  * a standby following while the stream's NATS leader is killed goes on and loses nothing;
  * a standby that followed for longer than the grace timers still starts them at the
    takeover: a job held at the kill is kept from other clients;
  * `zstalk journal status` prints the leader, its epoch, the stream's last sequence and
    each standby's lag, and exits 1 once no instance holds the lease; the leader's
    /metrics give its epoch, its takeover's time and each standby's lag.
"""
from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import urllib.request

import pytest

from nats_cluster import Cluster, cluster, needs_nats_server, wait_stream_leader  # noqa: F401
from servers import RawClient, find_zstalk, self_check, wait_for
from test_binlog_end_to_end import job_map
from test_failover import (LEAD_S, Instance, answers, first_answer_after, name,  # noqa: F401
                           stats)

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own journal")
FOLDED = re.compile(r"folded in through (\d+), (\d+) behind")


def verbose(instance: Instance) -> Instance:
    """The instance with -V: its log says how it took over."""
    instance.argv.insert(1, "-V")
    return instance


def folded(instance: Instance) -> tuple[int, int] | None:
    """(sequence folded in, messages behind) as the standby's /leader says, or None."""
    found = FOLDED.search(instance.leader()[1])
    return (int(found.group(1)), int(found.group(2))) if found else None


def caught_up(standby: Instance, leader: Instance) -> bool:
    seq = int(stats(leader.address)[b"journal-seq"])
    said = folded(standby)
    return said is not None and said[0] >= seq and said[1] == 0


def put_many(address, count: int, body: bytes = b"x" * 100, batch: int = 100) -> list[int]:
    ids = []
    with RawClient(address, 30) as c:
        for first in range(0, count, batch):
            n = min(batch, count - first)
            c.send(b"put 0 0 600 %d\r\n%s\r\n" % (len(body), body) * n)
            ids += [int(r.split()[1]) for r in c.read_replies(n)]
    return ids


def churn(client: RawClient, rounds: int) -> None:
    """1.2 MB a round put and deleted: compaction's matter."""
    body = b"x" * 30000
    for _ in range(rounds):
        client.send(b"put 0 0 60 30000\r\n%s\r\n" % body * 40)
        ids = [int(r.split()[1]) for r in client.read_replies(40)]
        client.send(b"".join(b"delete %d\r\n" % i for i in ids))
        assert set(client.read_replies(40)) == {b"DELETED\r\n"}


def _stat(client: RawClient, key: bytes) -> int:
    client.send(b"stats\r\n")
    return int(re.search(rb"\n%s: (\d+)" % key, client.read_reply()).group(1))


def test_a_killed_leader_s_standby_takes_over_reading_only_the_tail_it_had_not_folded_in(
        cluster, name):
    a = Instance(cluster.urls, name).launch()
    b = None
    try:
        assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
        ids = put_many(a.address, 3000)
        b = verbose(Instance(cluster.urls, name)).launch()
        assert wait_for(lambda: caught_up(b, a), LEAD_S, 0.1), (b.leader(), b.output())
        with RawClient(a.address, 10) as c:         # (the tail: folded in live, or read)
            c.send(b"delete %d\r\nput 0 0 600 4\r\ntail\r\n" % ids[0])
            assert c.read_reply() == b"DELETED\r\n"
            tail = int(c.read_reply().split()[1])
        killed = time.monotonic()
        a.kill()
        took = first_answer_after(b.address, killed)
        print(f"\nkill -9 of the leader (3,000 jobs) -> the warm standby's first answer: "
              f"{took:.2f} s")
        said = re.search(r"taking over warm: (\d+) messages folded in while standing by, "
                         r"through (\d+) of (\d+)", b.output())
        assert said, b.output()
        applied, through, last = map(int, said.groups())
        assert applied >= 30 and last - through <= 5, said.group(0)
        jobs = job_map(b.address, tail + 1)
        assert set(jobs) == set(ids[1:]) | {tail}
        assert jobs[tail][3] == b"tail" and stats(b.address)[b"journal-epoch"] == b"2"
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_a_standby_whose_next_message_was_purged_folds_the_stream_again_from_its_first(
        cluster, name):
    a, b = Instance(cluster.urls, name).launch(), None
    try:
        assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
        with RawClient(a.address, 30) as c:
            c.send(b"put 1 0 60 6\r\nkeep-1\r\nput 2 0 60 6\r\ngone-2\r\n"
                   b"put 3 3600 60 6\r\nkeep-3\r\nreserve\r\nbury 1 5\r\n")
            assert c.read_replies(5)[-1] == b"BURIED\r\n"
            b = Instance(cluster.urls, name).launch()
            assert wait_for(lambda: caught_up(b, a), LEAD_S, 0.1), (b.leader(), b.output())
            b.signal(signal.SIGSTOP)
            try:
                churn(c, 4)
                c.send(b"delete 2\r\n")
                assert c.read_reply() == b"DELETED\r\n"
                deleted_in = _stat(c, b"binlog-current-index")
                churn(c, 10)            # (beyond COMPACT_SLACK: the DELETE is purged)
                assert wait_for(lambda: _stat(c, b"binlog-oldest-index") > deleted_in, 30), \
                    "the stream was never purged past the DELETE"
            finally:
                b.signal(signal.SIGCONT)
        assert wait_for(lambda: "folded again from the stream's first" in b.leader()[1]
                        and caught_up(b, a), LEAD_S, 0.1), (b.leader(), b.output())
        a.kill()
        first_answer_after(b.address, time.monotonic())
        jobs = job_map(b.address, 10)
        assert {i: (state, body) for i, (_, state, _, body) in jobs.items()} == {
            1: (b"buried", b"keep-1"), 3: (b"delayed", b"keep-3")}
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_a_standby_goes_on_following_after_the_stream_s_nats_leader_is_killed(name):
    """The ordered consumer lives on one NATS node: killed (with the stream's leader, the
    worst case: an election of 4 to 9 s), the standby's consumer is made again and it
    folds in what the leader appended meanwhile and after, losing nothing."""
    needs_nats_server()
    with Cluster(3) as own:
        a, b = Instance(own.urls, name).launch(), None
        try:
            assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
            ids = put_many(a.address, 500)
            b = Instance(own.urls, name).launch()
            assert wait_for(lambda: caught_up(b, a), LEAD_S, 0.1), (b.leader(), b.output())
            wait_stream_leader(own, f"ZSTALK_{name}").kill()
            ids += put_many(a.address, 500)     # (they wait while NATS elects)
            assert wait_for(lambda: caught_up(b, a), 3 * LEAD_S, 0.2), (b.leader(),
                                                                        b.output())
            a.kill()
            first_answer_after(b.address, time.monotonic(), 3 * LEAD_S)
            assert set(job_map(b.address, max(ids) + 1)) == set(ids)
        finally:
            a.stop()
            if b is not None:
                b.stop()


def test_the_leader_killed_with_the_stream_s_nats_leader_is_replaced_by_a_standby_that_waits(
        name):
    """The leader's machine lost with the NATS node that led its stream: the standby
    claims the lease while NATS still elects (4 to 9 s), waits for the stream to answer
    (--journal-timeout, 30 s) instead of exiting, and leads with every job."""
    needs_nats_server()
    with Cluster(3) as own:
        a, b = Instance(own.urls, name).launch(), None
        try:
            assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
            ids = put_many(a.address, 300)
            b = Instance(own.urls, name).launch()
            assert wait_for(lambda: caught_up(b, a), LEAD_S, 0.1), (b.leader(), b.output())
            node = wait_stream_leader(own, f"ZSTALK_{name}")
            a.kill()
            node.kill()
            first_answer_after(b.address, time.monotonic(), 30.0)
            assert b.process.poll() is None, b.output()
            assert set(job_map(b.address, max(ids) + 1)) == set(ids)
        finally:
            a.stop()
            if b is not None:
                b.stop()


def test_a_standby_up_longer_than_the_grace_keeps_a_held_job_from_the_takeover_on(
        cluster, name):
    """The grace timers count from the takeover, not from the standby's start, however
    long it followed: a job held at the kill is kept from other clients (RECLAIM_S, 5 s)."""
    a = Instance(cluster.urls, name).launch()
    b = None
    try:
        assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
        b = Instance(cluster.urls, name).launch()
        with RawClient(a.address, 10) as holder:
            holder.send(b"put 0 0 120 4\r\nheld\r\nreserve\r\n")
            assert holder.read_replies(2) == [b"INSERTED 1\r\n", b"RESERVED 1 4\r\nheld\r\n"]
            time.sleep(7.0)             # (the standby follows for longer than the grace)
            assert caught_up(b, a), b.leader()
            a.kill()
            first_answer_after(b.address, time.monotonic())
        with RawClient(b.address, 10) as other:
            other.send(b"reserve-with-timeout 0\r\nstats-job 1\r\n")
            timed_out, job = other.read_replies(2)
            assert timed_out == b"TIMED_OUT\r\n", "another client got the held job"
            assert b"state: delayed" in job, job
    finally:
        a.stop()
        if b is not None:
            b.stop()


def journal_status(urls: str, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([find_zstalk(), "journal", "status", "--journal", urls,
                           "--journal-name", name], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def metrics(instance: Instance) -> dict[str, float]:
    """The zstalk_journal_* samples of the instance's /metrics: 'name{labels}' -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{instance.health}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(zstalk_journal_\S+) (\S+)$", text, re.M)}


def said_status(said: list, urls: str, name: str) -> str:
    """`zstalk journal status`'s output, the run kept in `said`."""
    said.append(journal_status(urls, name))
    return said[-1].stdout


def test_journal_status_prints_the_leader_its_epoch_and_each_standby_s_lag(cluster, name):
    a = Instance(cluster.urls, name).launch()
    b = None
    try:
        assert wait_for(lambda: answers(a.address), LEAD_S, 0.05), a.output()
        put_many(a.address, 50)
        b = Instance(cluster.urls, name).launch()
        assert wait_for(lambda: caught_up(b, a), LEAD_S, 0.1), (b.leader(), b.output())
        # (a standby publishes where it is every 2 s; a stats appends a barrier: not here);
        # the status that said so is the one read
        said: list = []
        assert wait_for(lambda: "lag 0 messages" in said_status(said, cluster.urls, name),
                        10, 0.5), said[-1:]
        done = said[-1]
        assert done.returncode == 0, done
        last = re.search(rf"stream ZSTALK_{name}: sequences 1\.\.(\d+) ", done.stdout).group(1)
        assert f"folded in through {last}, lag 0 messages" in done.stdout, done.stdout
        assert re.search(r"leader: instance [0-9a-f]+, epoch 1, acknowledged through", done.stdout)
        assert len(re.findall(r"^standby: ", done.stdout, re.M)) == 1, done.stdout
        standby = re.search(r"^standby: instance ([0-9a-f]+),", done.stdout, re.M).group(1)
        said = metrics(a)
        assert said["zstalk_journal_epoch"] == 1 and \
            said[f'zstalk_journal_standby_lag_messages{{standby="{standby}"}}'] <= 2, said
        a.stop()                        # (SIGTERM: the lease is released, b leads)
        first_answer_after(b.address, time.monotonic())
        done = journal_status(cluster.urls, name)
        assert "epoch 2" in done.stdout and "standbys: none" in done.stdout, done.stdout
        said = metrics(b)
        assert said["zstalk_journal_epoch"] == 2 and \
            0 < said["zstalk_journal_takeover_seconds"] < LEAD_S, said
        assert not [k for k in said if k.startswith("zstalk_journal_standby_lag")], said
        b.stop()
        done = journal_status(cluster.urls, name)
        assert done.returncode == 1 and "leader: none" in done.stdout, done
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_journal_status_without_a_stream_exits_10_naming_it(cluster, name):
    done = journal_status(cluster.urls, name)
    assert done.returncode == 10 and f"no stream ZSTALK_{name}" in done.stderr, done


async def _status_while_keys_are_rewritten(urls: str, name: str, rounds: int) -> list[int]:
    """How many standbys each of `rounds` status reads listed, while three standby keys and
    the leader's are rewritten as fast as NATS takes them (a standby says where it is every
    2 s, the leader renews every 250 ms: this is both, far oftener)."""
    import nats
    from nats.js import api
    from broker.wal import status
    from broker.wal import stream as S
    from broker.wal.lease import KEY, Holder, Standby, bucket_name
    opts = S.Options(tuple(urls.split(",")), name)
    nc = await nats.connect(list(opts.urls))
    try:
        js = nc.jetstream()
        await js.add_stream(api.StreamConfig(name=opts.stream, subjects=[f"zstalk.{name}.journal"],
                                             num_replicas=3, storage=api.StorageType.FILE))
        kv = await js.create_key_value(api.KeyValueConfig(bucket=bucket_name(opts), history=1,
                                                          replicas=3))
        instances = ["a1", "b2", "c3"]

        async def rewrite() -> None:
            n = 0
            while True:
                n += 1
                await kv.put(KEY, Holder(1, "leader", "", n).encode())
                await kv.put(Standby.key(instances[n % 3]),
                             Standby(instances[n % 3], n, n, time.time()).encode())

        for instance in instances:
            await kv.put(Standby.key(instance), Standby(instance, 0, 0, time.time()).encode())
        writer = asyncio.ensure_future(rewrite())
        try:
            return [len((await status.read(opts)).standbys) for _ in range(rounds)]
        finally:
            writer.cancel()
    finally:
        await nc.close()


def test_journal_status_lists_every_standby_while_their_keys_are_rewritten(cluster, name):
    listed = asyncio.run(_status_while_keys_are_rewritten(cluster.urls, name, 30))
    assert listed == [3] * 30, listed


async def _keys_left(urls: str, name: str, said: list[str], refreshed: str,
                     for_s: float) -> list[str]:
    """Which of the standby keys `said` (put once) and `refreshed` (put every 0.2 s) are in
    the bucket after `for_s`."""
    import nats
    from nats.js.errors import KeyNotFoundError
    from broker.wal.lease import Standby, bucket_name
    from broker.wal import stream as S
    nc = await nats.connect(urls.split(","))
    try:
        kv = await nc.jetstream().key_value(bucket_name(S.Options((), name)))
        for instance in said + [refreshed]:
            await kv.put(Standby.key(instance), Standby(instance, 0, 0, time.time()).encode())
        until = time.monotonic() + for_s
        while time.monotonic() < until:
            await kv.put(Standby.key(refreshed), Standby(refreshed, 1, 1, time.time()).encode())
            await asyncio.sleep(0.2)
        left = []
        for instance in said + [refreshed]:
            try:
                await kv.get(Standby.key(instance))
                left.append(instance)
            except KeyNotFoundError:
                pass
        return left
    finally:
        await nc.close()


def test_the_leader_purges_the_keys_of_standbys_long_silent_and_keeps_the_others(
        cluster, name, monkeypatch):
    from broker.wal import lease as L
    from broker.wal import stream as S
    monkeypatch.setattr(L, "FORGET_S", 2.0)     # (10 minutes in earnest; a purge each 0.2 s)
    leader = L.Lease(S.Options(tuple(cluster.urls.split(",")), name), "leader")
    try:
        leader.start(1 << 16)
        assert leader.won.result(15) == 1
        left = asyncio.run(_keys_left(cluster.urls, name, ["gone1", "gone2"], "alive", 6.0))
    finally:
        leader.close()
    assert left == ["alive"], left
