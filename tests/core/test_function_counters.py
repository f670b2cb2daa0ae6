"""A function's concurrency as the yrmcds counter fn:NAME, in the broker core with a fake
clock: counter clients and dispatchers share one semaphore (core/counters.py, the
tasks store's `in_use`)."""
from __future__ import annotations

from zstalk.broker.core.broker import Broker, Config
from zstalk.broker.core.counters import INVALID, NOT_ACQUIRED, RESOURCE_NOT_AVAILABLE
from zstalk.broker.core.tasks import views
from zstalk.broker.core.tasks.store import FunctionSpec
from zstalk.protocol.schema import (PEER_TIMEOUT_S, Batch, Heartbeat, Hello, Op, R, Replies,
                                    SessionState)

COUNTER, HTTP, DISPATCHER = b"counter-front", b"http-front", b"dispatcher"
WALL = 1_700_000_000.0


class Cluster:
    """A broker with function `render` (concurrency 4), a counter front, an HTTP front
    and a dispatcher with 8 slots."""

    def __init__(self, functions=(FunctionSpec("render", "http://fn/render", 4),),
                 recovering: bool = False, now: float = 1000.0) -> None:
        self.now = now
        self.broker = Broker(Config(functions=functions, stat_interval_s=10,
                                    recovering=recovering), now, wall_offset=WALL)
        self.n = 0
        self.calls: list[str] = []

    def start(self, counter_sessions=(), counter_state: int = 0) -> "Cluster":
        self.hello(COUNTER, 1, "counter", counter_state, counter_sessions)
        self.hello(HTTP, 2, "http")
        self.hello(DISPATCHER, 3, "dispatcher")
        self.send(COUNTER, (Op.OPEN, 1), (Op.OPEN, 2))
        self.send(HTTP, (Op.OPEN, 1))
        self.send(DISPATCHER, (Op.OPEN, 1), (Op.T_SUBSCRIBE, 1, 8, False))
        return self

    def hello(self, peer, front_id, kind, state=0, sessions=()):
        self.broker.handle(peer, Hello(front_id, kind, 1, state, list(sessions)), self.now)
        self.flush()

    def send(self, peer: bytes, *ops) -> list[tuple]:
        self.broker.handle(peer, Batch([tuple(op) for op in ops]), self.now)
        return self.flush().get(peer, [])

    def flush(self) -> dict[bytes, list]:
        out: dict[bytes, list] = {}
        for peer, msg in self.broker.flush():
            if isinstance(msg, Replies):
                out.setdefault(peer, []).extend(msg.items)
        self.calls += [item[2] for item in out.get(DISPATCHER, []) if item[1] == R.T_CALL]
        return out

    def counter(self, conn: int, op: int, *args) -> tuple:
        return self.send(COUNTER, (op, conn, *args))[0][1:]

    def enqueue(self, count: int) -> None:
        for _ in range(count):
            self.n += 1
            self.send(HTTP, (Op.T_ENQUEUE, 1, "render", b"{}", None, f"t{self.n}", True, None))

    def finish(self, uid: str) -> None:
        self.send(DISPATCHER, (Op.T_OUTCOME, 1, uid, 1, "success", 200, b"1", None, -1, None))

    def running(self) -> int:
        return self.broker.tasks.running.get("render", 0)


def test_a_counter_client_holding_3_of_4_slots_leaves_one_call_at_a_time():
    c = Cluster().start()
    c.enqueue(1)
    # 1 in use + 3 is over the client's maximum of 3, not over the concurrency: it holds
    assert c.counter(1, Op.C_ACQUIRE, b"fn:render", 3, 3) == (R.C_OK, 3)
    c.enqueue(2)
    assert c.calls == ["t1"] and c.running() == 1
    c.finish("t1")
    assert c.calls == ["t1", "t2"] and c.running() == 1
    assert c.counter(1, Op.C_RELEASE, b"fn:render", 3) == (R.C_OK, None)
    assert c.calls == ["t1", "t2", "t3"], "the waiting task started at the release"


def test_an_acquire_over_the_concurrency_is_refused_and_queues_nothing():
    c = Cluster().start()
    c.enqueue(2)
    assert c.counter(1, Op.C_ACQUIRE, b"fn:render", 3, 100) == (R.C_ERROR,
                                                               RESOURCE_NOT_AVAILABLE)
    assert c.counter(1, Op.C_ACQUIRE, b"fn:render", 2, 2) == (R.C_OK, 2)
    assert c.counter(2, Op.C_GET, b"fn:render") == (R.C_OK, 4)
    c.finish("t1")
    assert c.counter(2, Op.C_ACQUIRE, b"fn:render", 1, 9) == (R.C_OK, 1)
    c.enqueue(1)
    assert c.calls == ["t1", "t2"], "the slot t1 freed went to the counter client"


def test_closing_the_connection_frees_its_slots_and_the_queue_moves_at_once():
    c = Cluster().start()
    c.counter(1, Op.C_ACQUIRE, b"fn:render", 4, 4)
    c.enqueue(3)
    assert c.calls == []
    c.send(COUNTER, (Op.CLOSE, 1))
    assert c.calls == ["t1", "t2", "t3"]
    assert c.counter(2, Op.C_GET, b"fn:render") == (R.C_OK, 3)


def test_a_connection_releases_only_the_function_slots_it_holds():
    c = Cluster().start()
    c.counter(1, Op.C_ACQUIRE, b"fn:render", 2, 4)
    assert c.counter(2, Op.C_RELEASE, b"fn:render", 1) == (R.C_ERROR, NOT_ACQUIRED)
    assert c.counter(1, Op.C_RELEASE, b"fn:render", 3) == (R.C_ERROR, NOT_ACQUIRED)
    assert c.counter(1, Op.C_RELEASE, b"fn:render", 1) == (R.C_OK, None)
    assert c.counter(2, Op.C_GET, b"fn:render") == (R.C_OK, 1)


def test_dump_lists_each_function_counter_with_its_slots_and_the_intervals_most():
    c = Cluster(functions=(FunctionSpec("render", "http://fn/render", 4),
                           FunctionSpec("mail", "http://fn/mail", 2))).start()
    c.counter(1, Op.C_ACQUIRE, b"user", 5, 10)
    c.counter(1, Op.C_ACQUIRE, b"fn:render", 1, 4)
    c.enqueue(3)
    c.finish("t1")
    c.finish("t2")
    [(_, code, records)] = c.send(COUNTER, (Op.C_DUMP, 1))
    assert code == R.C_DUMP
    assert sorted(records) == [(b"fn:mail", 0, 0), (b"fn:render", 2, 4), (b"user", 5, 5)]


def test_fn_names_are_reserved_only_while_functions_are_configured():
    c = Cluster().start()
    for op in ((Op.C_ACQUIRE, b"fn:nosuch", 1, 5), (Op.C_GET, b"fn:nosuch"),
               (Op.C_RELEASE, b"fn:nosuch", 1), (Op.C_ACQUIRE, b"fn:\xff", 1, 5)):
        assert c.counter(1, *op) == (R.C_ERROR, INVALID), op
    plain = Cluster(functions=()).start()
    assert plain.counter(1, Op.C_ACQUIRE, b"fn:render", 2, 5) == (R.C_OK, 2)
    assert plain.counter(1, Op.C_GET, b"fn:render") == (R.C_OK, 2)
    [(_, _, records)] = plain.send(COUNTER, (Op.C_DUMP, 1))
    assert records == [(b"fn:render", 2, 2)], "an ordinary counter, as yrmcds has it"


def test_slots_held_by_counters_show_in_the_functions_stats_and_its_wait_time():
    c = Cluster().start()
    c.counter(1, Op.C_ACQUIRE, b"fn:render", 3, 4)
    store = c.broker.tasks
    for i in range(12):                 # a minute of 2 s calls, one at a time
        c.enqueue(1)
        c.now += 2
        c.finish(f"t{i + 1}")
    c.enqueue(3)                        # t13 runs, t14 and t15 wait
    stats = views.function_stats(store, "render", c.now)
    assert (stats["running"], stats["heldByCounters"], stats["due"]) == (1, 3, 2)
    # nothing free: t15, with one ahead of it, starts after two rounds of one slot's call
    t15 = views.info(store, "t15", c.now)
    assert (t15["waitNum"], t15["waitTime"]) == (1, 4000)


def test_a_restart_keeps_the_holds_its_counter_fronts_re_register():
    c = Cluster(recovering=True).start(
        counter_sessions=[SessionState(1, "", [], [], [(b"fn:render", 3)])], counter_state=7)
    assert c.counter(1, Op.C_GET, b"fn:render") == (R.C_OK, 3)
    c.enqueue(2)
    assert c.calls == ["t1"], "the re-registered hold counts at once"
    assert c.counter(1, Op.C_ACQUIRE, b"fn:render", 1, 4) == (R.C_ERROR, RESOURCE_NOT_AVAILABLE)
    c.now += PEER_TIMEOUT_S + 1.1       # the grace for fronts to come back is over
    for peer, front_id in ((COUNTER, 1), (HTTP, 2), (DISPATCHER, 3)):
        c.broker.handle(peer, Heartbeat(front_id), c.now)
    c.send(COUNTER, (Op.CLOSE, 1))
    assert c.calls == ["t1", "t2"]


def test_holds_re_registered_in_the_wires_shape_are_counted_once_and_freed_on_close():
    from zstalk.protocol.schema import Hello, decode_peer, encode
    sent = Hello(1, "counter", 1, 7, [SessionState(1, "", [], [], [(b"fn:render", 3),
                                                                     (b"mine", 2)])])
    _, hello = decode_peer(encode(sent))          # (lists, as msgpack delivers them)
    c = Cluster(recovering=True).start(counter_sessions=hello.sessions, counter_state=7)
    [(_, _, records)] = c.send(COUNTER, (Op.C_DUMP, 1))
    assert sorted(records) == [(b"fn:render", 3, 3), (b"mine", 2, 2)]
    c.send(COUNTER, (Op.CLOSE, 1))
    assert c.counter(2, Op.C_GET, b"fn:render") == (R.C_OK, 0)
    c.enqueue(4)
    assert len(c.calls) == 4, "every slot is free again"


def test_a_front_saying_hello_again_keeps_its_slots_held_throughout():
    c = Cluster().start()
    c.counter(1, Op.C_ACQUIRE, b"fn:render", 3, 4)
    c.enqueue(4)
    assert c.calls == ["t1"]
    c.hello(COUNTER, 1, "counter", c.broker.state_id,
            [SessionState(1, "", [], [], [[b"fn:render", 3]]), SessionState(2, "", [], [], [])])
    assert c.calls == ["t1"] and c.running() == 1, "no task took a slot the client kept"
    c.hello(COUNTER, 1, "counter", c.broker.state_id,
            [SessionState(1, "", [], [], [[b"fn:render", 1]]), SessionState(2, "", [], [], [])])
    assert c.calls == ["t1", "t2", "t3"], "the two it no longer holds went to the queue"


def test_slots_of_a_function_dropped_by_a_reload_are_still_released_and_freed_on_close():
    c = Cluster().start()
    c.counter(1, Op.C_ACQUIRE, b"fn:render", 2, 4)
    c.counter(2, Op.C_ACQUIRE, b"fn:render", 1, 4)
    c.broker.tasking.configure({}, None, c.broker.tasking.api, c.now)     # functions gone
    assert c.counter(1, Op.C_RELEASE, b"fn:render", 1) == (R.C_OK, None)
    assert c.counter(1, Op.C_ACQUIRE, b"fn:render", 1, 1) == (R.C_OK, 1)  # (now a counter)
    c.send(COUNTER, (Op.CLOSE, 1), (Op.CLOSE, 2))
    assert c.broker.tasks.held == {}
    c.send(COUNTER, (Op.OPEN, 3))
    [(_, code, records)] = c.send(COUNTER, (Op.C_DUMP, 3))
    assert code == R.C_DUMP and records == [(b"fn:render", 0, 1)], "the counter, released"


def test_holds_a_front_could_not_have_sent_are_skipped_not_raised():
    c = Cluster().start(counter_sessions=[SessionState(1, "", [], [], [
        ["not bytes", 1], [b"fn:render", "x"], [b"ok", 1], [7, 7], [b"fn:render", 1]])])
    assert c.counter(1, Op.C_GET, b"ok") == (R.C_OK, 1)
    assert c.counter(1, Op.C_GET, b"fn:render") == (R.C_OK, 1)
