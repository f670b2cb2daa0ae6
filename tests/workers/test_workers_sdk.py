# The pieces of the zstalk.workers SDK on their own: codecs, backoff, the outcome rule,
# Job, handler registration, the thread runner's hand-off, and the producer Client's
# errors and round trips (against LocalBroker: the real broker actor in a thread).
from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from zstalk.workers import Backoff, Bury, Client, Job, Retry, Worker, ZstalkError, codecs
from zstalk.workers.job import BURY, DELETE, RELEASE, Outcome, decide
from zstalk.workers.runners import ThreadRunner
from zstalk.broker.testing import LocalBroker
from zstalk.workers.worker import load_worker

from servers import wait_for


def make_job(attempt: int = 1, pri: int = 100, raw: bytes = b"{}", codec=codecs.json,
             touched: list | None = None) -> Job:
    return Job(7, raw, "emails", pri, 60, attempt, codec,
               (touched.append if touched is not None else lambda _id: None))


# -- codecs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("codec, value", [
    (codecs.raw, b"\x00\xffbytes"),
    (codecs.json, {"to": "a@b.c", "n": [1, 2.5, None]}),
    (codecs.msgpack, {"to": "a@b.c", "blob": b"\x00\x01", "n": [1, 2]}),
])
def test_each_codec_gives_back_what_it_encoded(codec, value):
    data = codec.encode(value)
    assert isinstance(data, bytes)
    assert codec.decode(data) == value


def test_the_raw_codec_encodes_text_as_utf8():
    assert codecs.raw.encode("héllo") == "héllo".encode()


# -- backoff and outcomes ---------------------------------------------------------------------
def test_backoff_doubles_from_one_second_and_stops_at_an_hour():
    b = Backoff()
    assert [b.delay_s(k) for k in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 16]
    assert b.delay_s(40) == 3600
    assert isinstance(Backoff(base_s=1.5).delay_s(2), int)


def test_a_returning_handler_deletes_its_job():
    assert decide(make_job(), None, 5, Backoff()) == Outcome(DELETE)


def test_a_failure_releases_with_backoff_until_the_last_attempt_buries():
    assert decide(make_job(attempt=3), ValueError(), 5, Backoff()) == Outcome(RELEASE, 100, 4)
    assert decide(make_job(attempt=5), ValueError(), 5, Backoff()) == Outcome(BURY, 100)


def test_retry_and_bury_choose_priority_and_delay_whatever_the_attempt():
    job = make_job(attempt=9)
    assert decide(job, Retry(delay_s=30), 5, Backoff()) == Outcome(RELEASE, 100, 30)
    assert decide(job, Retry(pri=1), 5, Backoff()) == Outcome(RELEASE, 1, 0)
    assert decide(job, Bury(), 5, Backoff()) == Outcome(BURY, 100)
    assert decide(job, Bury(pri=3), 5, Backoff()) == Outcome(BURY, 3)


# -- Job and Worker ---------------------------------------------------------------------------
def test_a_job_body_is_decoded_once_on_first_use():
    calls = []

    class Counting:
        def encode(self, obj):
            return b""

        def decode(self, data):
            calls.append(data)
            return {"decoded": True}

    job = make_job(raw=b"x", codec=Counting())
    assert calls == []
    assert job.body == {"decoded": True} and job.body is job.body
    assert calls == [b"x"] and job.raw == b"x"


def test_touch_asks_the_pool_with_the_job_id():
    touched: list = []
    make_job(touched=touched).touch()
    assert touched == [7]


def test_a_handler_can_serve_several_tubes_but_a_tube_has_one_handler():
    w = Worker()

    @w.handler("a", "b")
    def handle(job):
        pass
    assert w.handlers == {"a": handle, "b": handle}
    with pytest.raises(ValueError):
        w.handler("b")(handle)
    with pytest.raises(TypeError):
        w.handler()


def test_prefetch_adapts_by_default_and_can_be_fixed():
    assert Worker(concurrency=4).prefetch is None
    assert Worker(concurrency=4, prefetch=0).prefetch == 0


@pytest.mark.parametrize("settings, said", [
    ({"prefetch": -2}, "prefetch must be None (adapt) or a whole number of jobs from 0 "
                       "(none held beyond the running handlers) up, not -2"),
    ({"prefetch": 1.5}, "prefetch must be None (adapt) or a whole number of jobs from 0 "
                        "(none held beyond the running handlers) up, not 1.5"),
    ({"concurrency": 0}, "concurrency must be at least 1, not 0"),
    ({"max_attempts": 0}, "max_attempts must be at least 1, not 0"),
    ({"grace_s": -1}, "grace_s must be 0 or more seconds, not -1"),
    ({"grace_s": float("nan")}, "grace_s must be 0 or more seconds, not nan"),
])
def test_a_worker_refuses_a_number_out_of_its_range_when_made(settings, said):
    with pytest.raises(ValueError) as err:
        Worker(**settings)
    assert str(err.value) == said


def test_a_prefetch_set_later_is_checked_too_and_processes_when_run():
    w = Worker()
    with pytest.raises(ValueError, match="^prefetch must be None"):
        w.prefetch = -1         # (as `zstalk worker --prefetch` sets it)
    assert w.prefetch is None
    with pytest.raises(ValueError, match="^processes must be at least 1, not 0$"):
        w.run(processes=0)


def test_a_pool_still_working_when_its_local_broker_closes_is_stopped_without_a_traceback(
        caplog):
    """LocalBroker.close destroys the ZeroMQ context it shares with its pools (so that a
    socket a test left open cannot hang it).  It destroyed it under a pool still working
    in another thread, as one that never gets idle does (Worker(prefetch=-2) did), and
    every later touch of its closed sockets raised ZMQError there; now it stops the pool
    first, and `work` says why it ended."""
    w = Worker()
    w.handler("later")(lambda job: None)
    ended: list[BaseException] = []

    def work(broker):
        try:
            broker.work(w, timeout_s=60, wait_delayed=True)
        except BaseException as exc:
            ended.append(exc)

    broker = LocalBroker()
    client = broker.client()
    client.put(b"x", tube="later", delay_s=600)         # never idle
    thread = threading.Thread(target=work, args=(broker,))
    thread.start()
    assert wait_for(lambda: client.stats()["current-workers"] == 1, 10)
    started = time.monotonic()
    broker.close()
    thread.join(20)
    assert time.monotonic() - started < 10.0
    assert [str(exc) for exc in ended] == [
        f"the LocalBroker at {broker.endpoint} closed while this pool still worked on later"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("timeout_s", [0, -1, float("inf"), float("nan")])
def test_a_client_refuses_a_timeout_that_would_never_wait_or_never_end(timeout_s):
    with pytest.raises(ValueError, match="^timeout_s must be a number of seconds above 0"):
        Client("tcp://127.0.0.1:1", timeout_s=timeout_s)


def test_a_counter_client_refuses_a_port_that_would_wrap():
    from zstalk.workers.counters import CounterClient
    with pytest.raises(ValueError, match=r"^port must be 1 to 65535, not 99999 \(host 127.0.0.1\)$"):
        CounterClient("127.0.0.1", 99999)


def test_a_worker_spec_must_name_a_worker():
    with pytest.raises(ValueError):
        load_worker("no_colon")
    with pytest.raises(TypeError):
        load_worker("zstalk.workers:codecs")


# -- the thread hand-off -----------------------------------------------------------------------
def test_threads_hand_results_back_in_bursts_not_one_wake_up_per_job():
    batches: list[int] = []

    async def main() -> None:
        done = asyncio.Event()
        total = [0]

        def finish(results):
            batches.append(len(results))
            total[0] += len(results)
            if total[0] == 2000:
                done.set()
        runner = ThreadRunner(4, lambda job, exc: Outcome(DELETE), finish)
        for _ in range(2000):
            runner.submit(make_job(), lambda job: None)
        await asyncio.wait_for(done.wait(), 10)
        runner.stop()

    asyncio.run(main())
    assert sum(batches) == 2000
    assert len(batches) < 1000


def test_jobs_nobody_started_can_be_taken_back():
    async def main() -> list:
        gate = threading.Event()
        runner = ThreadRunner(1, lambda job, exc: Outcome(DELETE), lambda results: None)
        runner.submit(make_job(), lambda job: gate.wait(5))
        time.sleep(0.05)                    # the thread is busy with the first job
        for _ in range(3):
            runner.submit(make_job(), lambda job: None)
        pending = runner.take_pending()
        gate.set()
        runner.stop()
        return pending

    assert len(asyncio.run(main())) == 3


# -- Client ------------------------------------------------------------------------------------
def test_a_client_with_no_broker_times_out():
    with Client("tcp://127.0.0.1:1", timeout_s=0.3) as c:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            c.put(b"x")
        assert time.monotonic() - started < 2.0


@pytest.fixture
def local():
    with LocalBroker(max_job_size=64, max_jobs_bytes=2000) as broker:
        yield broker


def test_put_peek_delete_and_kick_round_trip(local):
    c = local.client(codec=codecs.json)
    ready = c.put({"a": 1}, tube="t")
    delayed = c.put("later", tube="t", delay_s=60)
    assert c.peek(ready) == (ready, {"a": 1})
    assert c.peek_ready("t") == (ready, {"a": 1})
    assert c.peek_delayed("t") == (delayed, "later")
    assert c.peek_buried("t") is None
    assert c.kick(10, tube="t") == 1
    assert c.stats_job(delayed)["state"] == "ready"
    assert c.delete(ready) and not c.delete(ready)
    assert c.peek(ready) is None
    assert not c.kick_job(delayed)          # ready jobs are not kicked
    assert c.stats_tube("t")["current-jobs-ready"] == 1
    assert c.stats_tube("nope") is None
    assert "t" in c.list_tubes()
    assert c.stats()["current-jobs-ready"] == 1


def test_put_many_puts_every_body_in_one_batch_in_order(local):
    c = local.client()
    ids = c.put_many([b"1", b"2", b"3"], tube="m", pri=5)
    assert ids == sorted(ids) and len(ids) == 3
    assert [c.peek(i)[1] for i in ids] == [b"1", b"2", b"3"]
    assert c.stats_job(ids[0])["pri"] == 5


def test_a_body_over_the_broker_limit_is_refused_before_it_is_sent(local):
    c = local.client()
    with pytest.raises(ZstalkError) as error:
        c.put(b"x" * 65)
    assert error.value.reply == "JOB_TOO_BIG"


def test_a_broker_out_of_memory_is_an_error_named_after_its_reply(local):
    c = local.client()
    with pytest.raises(ZstalkError) as error:
        c.put_many([b"x" * 60] * 50)
    assert error.value.reply == "OUT_OF_MEMORY"
    assert str(error.value).startswith("OUT_OF_MEMORY")


def test_an_idle_client_dropped_by_the_broker_says_hello_again(local):
    c = local.client()
    c.put(b"before", tube="idle")
    time.sleep(2.6)                 # past PEER_TIMEOUT_S: the broker fences this front
    job_id = c.put(b"after", tube="idle")
    assert c.peek(job_id) == (job_id, b"after")
    assert c.stats_tube("idle")["current-jobs-ready"] == 2


def test_each_finished_job_is_logged_with_structured_fields(local, caplog):
    w = Worker(concurrency=1)

    @w.handler("logged")
    def handle(job):
        if job.raw == b"bad":
            raise Bury()
    c = local.client()
    good, bad = c.put_many([b"good", b"bad"], tube="logged")
    with caplog.at_level(logging.INFO, logger="zstalk.workers"):
        assert local.work(w, timeout_s=5) == {"deleted": 1, "buried": 1}
    fields = {(r.job_id, r.tube, r.attempt, r.outcome) for r in caplog.records
              if hasattr(r, "job_id")}
    assert fields == {(good, "logged", 1, "delete"), (bad, "logged", 1, "bury")}
    assert all(r.duration_s >= 0 for r in caplog.records if hasattr(r, "duration_s"))


# -- auto prefetch -------------------------------------------------------------------
def _results(duration_s: float, n: int):
    from zstalk.workers.runners import Result
    job = Job(1, b"", "t", 0, 60, 1, codecs.raw, lambda _id: None)
    return [Result(job, Outcome(DELETE), duration_s, None)] * n


def _pool(**settings):
    from zstalk.workers.pool import Pool
    w = Worker(**settings)
    w.handler("t")(lambda job: None)
    return Pool(w, "inproc://unused")


def test_auto_prefetch_starts_at_the_concurrency():
    assert _pool(concurrency=4).capacity == 8


def test_auto_prefetch_holds_many_jobs_for_fast_handlers_and_few_for_slow_ones():
    from zstalk.workers.pool import AUTO_MAX
    fast, slow, medium = _pool(concurrency=2), _pool(concurrency=2), _pool(concurrency=2)
    fast._adapt(_results(0.00002, 20))
    slow._adapt(_results(1.5, 20))
    medium._adapt(_results(0.01, 50))           # 2 slots x 20 ms / 10 ms = 4 jobs
    assert fast.capacity == 2 + AUTO_MAX
    assert slow.capacity == 2 + 1
    assert medium.capacity == 2 + 4


def test_a_fixed_prefetch_is_kept():
    pool = _pool(concurrency=3, prefetch=5)
    assert pool.capacity == 8 and pool.fixed_prefetch == 5


@pytest.mark.parametrize("make", [lambda: Retry(delay_s=1.5), lambda: Retry(pri=2 ** 32),
                                  lambda: Retry(delay_s=-1), lambda: Bury(pri=-1),
                                  lambda: Bury(pri=1.0), lambda: Retry(pri=True)])
def test_retry_and_bury_refuse_what_beanstalkd_would_refuse_where_the_handler_raises_them(make):
    with pytest.raises(ValueError):
        make()


# -- jobs that waited, handlers that escape ------------------------------------------
def _job(ttr_s: int = 10, touched: list | None = None) -> Job:
    touch = (lambda job_id: touched.append(job_id)) if touched is not None else (lambda _: None)
    return Job(7, b"", "t", 0, ttr_s, 1, codecs.raw, touch)


def test_a_job_that_waited_its_whole_ttr_in_the_pool_is_not_started():
    from zstalk.workers.job import may_start
    touched: list = []
    job = _job(ttr_s=10, touched=touched)
    job.pushed_at = 100.0
    assert may_start(job, 104.0) and touched == []        # early: as it is
    assert may_start(job, 106.0) and touched == [7]       # past half: TTR restarted first
    assert not may_start(job, 110.0)                      # all of it: the broker's again


@pytest.mark.parametrize("kind", ["sync", "async", "async-exit"])
def test_a_handler_escaping_with_a_base_exception_releases_its_job_and_the_pool_goes_on(kind):
    w = Worker(concurrency=1, prefetch=1, backoff=Backoff(base_s=30))
    if kind == "async-exit":
        @w.handler("t")
        async def handle(job):
            if job.raw == b"exit":
                raise SystemExit(3)
    elif kind == "sync":
        @w.handler("t")
        def handle(job):
            if job.raw == b"exit":
                raise SystemExit(3)           # a library calling sys.exit()
    else:
        @w.handler("t")
        async def handle(job):
            if job.raw == b"exit":
                gone = asyncio.get_running_loop().create_future()
                gone.cancel()
                await gone                    # CancelledError from something it awaited
    with LocalBroker() as broker:
        broker.client().put_many([b"exit", b"a", b"b"], tube="t")
        counts = broker.work(w, timeout_s=10)
    assert counts.get("released") == 1 and counts.get("deleted") == 2


def test_a_closed_client_leaves_the_connection_count_at_once():
    with LocalBroker() as broker:
        watcher, leaving = broker.client(), broker.client()
        leaving.put(b"x")
        before = watcher.stats()["current-connections"]
        leaving.close()
        deadline = time.monotonic() + 1.0           # not the 2 s heartbeat timeout
        while watcher.stats()["current-connections"] != before - 1:
            assert time.monotonic() < deadline, "the closed client is still counted"
            time.sleep(0.02)


@pytest.mark.parametrize("tube", ["emails@prod", "my emails", "-x", "é", "x" * 201, ""])
def test_a_bad_tube_name_is_refused_before_anything_is_sent(tube):
    with LocalBroker() as broker:
        c = broker.client()
        with pytest.raises(ValueError):
            c.put(b"x", tube=tube)
        with pytest.raises(ValueError):
            c.kick(10, tube=tube)
        assert c.stats()["total-jobs"] == 0          # not put in another tube instead
    with pytest.raises(ValueError):
        Worker().handler(tube)


def test_auto_touch_keeps_a_prefetched_job_that_waits_longer_than_its_ttr():
    w = Worker(concurrency=1, auto_touch=True)

    @w.handler("t")
    def handle(job):
        time.sleep(1.6)                         # longer than the TTR of 1 s

    with LocalBroker() as broker:
        ids = broker.client().put_many([b"a", b"b"], tube="t", ttr_s=1)
        counts = broker.work(w, timeout_s=15)
    assert counts.get("deleted") == 2 and not counts.get("expired") and not counts.get("stale")
    assert len(ids) == 2


def test_the_old_path_of_local_broker_still_gives_it_for_one_release_and_warns():
    import importlib
    old = importlib.import_module("zstalk.workers.testing")
    with pytest.warns(DeprecationWarning, match="zstalk.broker.testing"):
        assert old.LocalBroker is LocalBroker
