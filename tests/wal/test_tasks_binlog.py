"""Cloud tasks in the binlog, under the pure broker core: real files in a temporary
directory, a fake clock, and "restarts" that open the same directory in a new Broker
(as test_binlog.py does for jobs).  Every turn writes what the actor would write."""
from __future__ import annotations

import os
import struct
import zlib

import pytest

from zstalk.broker.wal import format as wf
from zstalk.broker.wal.binlog import Binlog, Options, segment_name
from zstalk.broker.core.broker import Broker, Config
from zstalk.broker.core.tasks.store import (CALL_GRACE_S, CLAIM_S, FAILED, QUEUED, RUNNING,
                                            SUCCESS, FunctionSpec)
from zstalk.protocol.schema import Batch, Hello, Op, R, Replies, SessionState

WALL_OFFSET = 1_700_000_000.0
HTTP, D1 = b"http", b"disp-1"


class Node:
    """A broker with one HTTP front and one dispatcher, over a binlog directory."""

    def __init__(self, path, now: float = 1000.0, segment_size: int = 1 << 20,
                 functions=(FunctionSpec("f", "http://fn/f", concurrency=8),),
                 claims=None) -> None:
        """`claims`: the dispatcher re-registers its session with these calls (as after a
        restart of ours it would), instead of coming as a new dispatcher."""
        self.now, self.path, self.functions = now, str(path), functions
        self.calls: list[tuple] = []    # handed to the dispatcher, not yet looked at
        self.wal = Binlog(Options(self.path, segment_size, None))
        self.replayed = self.wal.restore(65535)
        self.broker = Broker(Config(functions=functions), now, wall_offset=WALL_OFFSET,
                             journal=self.wal, restored=self.replayed)
        self.broker.handle(HTTP, Hello(1, "http", 1, 0, []), now)
        self.send(HTTP, (Op.OPEN, 1))
        if claims is None:
            self.broker.handle(D1, Hello(2, "dispatcher", 1, 0, []), now)
            self.send(D1, (Op.OPEN, 1))
        else:
            self.broker.handle(D1, Hello(2, "dispatcher", 1, self.broker.state_id,
                                         [SessionState(1, "", [], [], claims)]), now)
            self.turn()

    def send(self, peer: bytes, *ops) -> dict[bytes, list]:
        self.broker.handle(peer, Batch(list(ops)), self.now)
        return self.turn()

    def turn(self) -> dict[bytes, list]:
        out: dict[bytes, list] = {}
        for p, msg in self.broker.flush():
            if isinstance(msg, Replies):
                out.setdefault(p, []).extend(msg.items)
        self.calls += [tuple(c[2:]) for c in out.get(D1, []) if c[1] == R.T_CALL]
        tasks, schedules = self.broker.tasks.tasks, self.broker.schedules.by_name
        self.wal.compact(self.broker.queue.jobs, tasks, schedules)
        self.wal.write(self.broker.queue.jobs, self.broker.next_id, tasks, schedules)
        return out

    def advance(self, seconds: float) -> dict[bytes, list]:
        self.now += seconds
        for peer in (HTTP, D1):
            self.broker.fronts[peer].last_seen = self.now
        self.broker.expire(self.now)
        return self.turn()

    def restart(self, later_s: float = 0.0, claims=None) -> "Node":
        self.wal.close()
        return Node(self.path, self.now + later_s, self.wal.opts.segment_size, self.functions,
                    claims)

    def enqueue(self, uid: str, options=None, params: bytes = b'{"n":1}', function="f"):
        [reply] = self.send(HTTP, (Op.T_ENQUEUE, 1, function, params, options, uid, True))[HTTP]
        return reply

    def info(self, uid: str) -> dict | None:
        [(_, code, *rest)] = self.send(HTTP, (Op.T_INFO, 1, uid, True))[HTTP]
        return rest[0] if code == R.T_TASK else None

    def subscribe(self, slots: int) -> list:
        """Give the dispatcher `slots`; the calls handed to it since the last look:
        (uid, attempt, url, params, timeout_ms)."""
        self.send(D1, (Op.T_SUBSCRIBE, 1, slots, False))
        calls, self.calls = self.calls, []
        return calls

    def report(self, uid: str, attempt: int, kind: str, code=None, result=None, error=None):
        return self.send(D1, (Op.T_OUTCOME, 1, uid, attempt, kind, code, result, error, 0))


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_a_queued_task_comes_back_after_a_restart_with_everything_it_was_given(node):
    options = {"attempts": 3, "backoff": {"type": "exponential", "delay": 500, "jitter": True},
               "delay": 60000, "deliveryMode": "atMostOnce", "keepResult": 1000,
               "priority": -(1 << 63), "timeout": 2000}
    node.enqueue("t1", options, params=b'{"big": "' + b"x" * 5000 + b'"}')
    before = node.info("t1")
    again = node.restart(later_s=10)
    # (its delay ran on while the broker was down: 10 s less to wait)
    assert again.info("t1") == {**before, "waitNum": 0, "waitTime": before["waitTime"] - 10000}
    task = again.broker.tasks.tasks["t1"]
    assert (task.priority, task.attempts, task.backoff.kind, task.backoff.jitter, task.delivery,
            task.keep_result_ms, task.timeout_ms) == (-(1 << 63), 3, "exponential", True,
                                                      "atMostOnce", 1000, 2000)
    assert task.params == b'{"big": "' + b"x" * 5000 + b'"}'
    assert again.subscribe(1) == []                 # its delay still runs: 50 s to go
    again.advance(49)
    assert again.subscribe(1) == []
    again.advance(1.5)
    assert [c[0] for c in again.subscribe(1)] == ["t1"]


def test_a_delay_counts_wall_clock_time_across_the_restart(node):
    node.enqueue("t1", {"delay": 60000})
    again = node.restart(later_s=61)
    assert [c[0] for c in again.subscribe(1)] == ["t1"]


def test_a_recorded_result_survives_a_restart(node):
    node.enqueue("t1")
    [(uid, attempt, *_)] = node.subscribe(1)
    node.report(uid, attempt, "success", 200, b'{"answer": 42}')
    again = node.restart(later_s=5)
    info = again.info("t1")
    assert (info["status"], info["statusCode"], info["result"], info["attempt"]) == (
        SUCCESS, 200, b'{"answer": 42}', 1)
    assert info["finishedAt"] == pytest.approx(1000 + WALL_OFFSET)
    assert again.enqueue("t1")[1:3] == (R.T_ERROR, "duplicate")     # the id stays taken


def test_a_call_nobody_claims_after_a_restart_is_retried_at_least_once(node):
    node.enqueue("t1")
    [(_, attempt, *_)] = node.subscribe(1)
    assert attempt == 1
    again = node.restart()
    assert again.info("t1")["status"] == RUNNING        # its dispatcher may claim it
    again.advance(CLAIM_S - 0.1)
    assert again.info("t1")["status"] == RUNNING
    again.advance(0.1)
    info = again.info("t1")
    assert info["status"] == QUEUED and info["attempt"] == 1
    assert "the broker stopped during the call" in info["error"]
    assert info["retryAt"] == pytest.approx(again.now + 60 + WALL_OFFSET)    # the backoff
    again.advance(60)
    assert [c[:2] for c in again.subscribe(1)] == [("t1", 2)]


def test_a_call_nobody_claims_after_a_restart_fails_at_most_once(node):
    node.enqueue("t1", {"deliveryMode": "atMostOnce"})
    node.subscribe(1)
    again = node.restart()
    again.advance(CLAIM_S)
    info = again.info("t1")
    assert info["status"] == FAILED and "atMostOnce" in info["error"]


def test_a_call_claimed_by_its_dispatcher_after_a_restart_is_reported_once(node):
    node.enqueue("t1", {"timeout": 60000})
    [(uid, attempt, *_)] = node.subscribe(1)
    again = node.restart(claims=[[uid, attempt], ["nosuch", 1], ["t1", 7], "junk"])
    again.advance(CLAIM_S + 30)                 # claimed: it waits for its own timeout
    assert again.info("t1")["status"] == RUNNING
    again.subscribe(0)                          # (a dispatcher re-subscribes on Welcome)
    again.report(uid, attempt, "success", 200, b"1")
    info = again.info("t1")
    assert (info["status"], info["attempt"], info["result"]) == (SUCCESS, 1, b"1")
    assert again.subscribe(1) == []             # never called again


def test_a_claimed_call_still_times_out_from_when_it_started(node):
    node.enqueue("t1", {"timeout": 60000})
    [(uid, attempt, *_)] = node.subscribe(1)
    node.advance(50)
    again = node.restart(claims=[[uid, attempt]])
    again.advance(10 + CALL_GRACE_S - 0.1)
    assert again.info("t1")["status"] == RUNNING
    again.advance(0.1)
    assert "no report within the timeout" in again.info("t1")["error"]


def test_the_outcome_of_the_cut_call_is_logged_so_a_second_restart_agrees(node):
    node.enqueue("t1", {"attempts": 0})
    node.subscribe(1)
    first = node.restart()
    first.advance(CLAIM_S)
    assert first.info("t1")["status"] == FAILED
    assert first.restart(later_s=1).info("t1")["status"] == FAILED


def test_a_retry_waiting_for_its_backoff_keeps_its_error_and_retry_time(node):
    node.enqueue("t1", {"backoff": 30000})
    [(uid, attempt, *_)] = node.subscribe(1)
    node.report(uid, attempt, "failure", 500, None, "HTTP 500")
    before = node.info("t1")
    again = node.restart(later_s=10)
    assert again.info("t1") == {**before, "waitTime": before["waitTime"] - 10000}
    assert before["waitTime"] == 30000
    assert again.subscribe(1) == []
    again.advance(20)
    assert [c[:2] for c in again.subscribe(1)] == [("t1", 2)]


def test_a_cancel_survives_a_restart(node):
    node.enqueue("t1")
    [(_, code, info)] = node.send(HTTP, (Op.T_CANCEL, 1, "t1"))[HTTP]
    assert code == R.T_TASK and info["status"] == "cancelled"
    again = node.restart()
    assert again.info("t1")["status"] == "cancelled"
    assert again.subscribe(1) == []


def test_a_forgotten_task_stays_forgotten_and_its_id_is_free_again(node):
    node.enqueue("t1", {"keepResult": 1000})
    [(uid, attempt, *_)] = node.subscribe(1)
    node.report(uid, attempt, "success", 200, b"1")
    node.advance(2)
    assert node.info("t1") is None
    again = node.restart()
    assert again.info("t1") is None and again.broker.tasks.tasks == {}
    assert again.enqueue("t1")[1] == R.T_TASK


def test_a_finished_task_whose_keep_result_passed_while_down_is_forgotten_at_start(node):
    node.enqueue("t1", {"keepResult": 1000})
    [(uid, attempt, *_)] = node.subscribe(1)
    node.report(uid, attempt, "success", 200, b"1")
    again = node.restart(later_s=5)
    again.advance(0)
    assert again.info("t1") is None


def test_tasks_keep_their_queue_order_and_new_ones_go_after_them(node):
    for i in range(5):
        node.enqueue(f"t{i}", {"priority": 7})
    again = node.restart()
    again.enqueue("new", {"priority": 7})
    again.enqueue("first", {"priority": 6})
    calls = again.subscribe(8)
    assert [c[0] for c in calls] == ["first", "t0", "t1", "t2", "t3", "t4", "new"]
    [(_, _, infos, _)] = again.send(HTTP, (Op.T_LIST, 1, None, None, 100, 0))[HTTP]
    assert [i["uniqueId"] for i in infos] == ["t0", "t1", "t2", "t3", "t4", "new", "first"]


def test_a_task_of_a_function_gone_from_the_config_waits_after_a_restart(node, tmp_path):
    node.enqueue("t1")
    node.wal.close()
    again = Node(tmp_path, node.now, functions=(FunctionSpec("other", "http://fn/other"),))
    assert again.info("t1")["status"] == QUEUED and again.subscribe(1) == []


def test_compaction_carries_live_tasks_forward_and_drops_dead_segments(tmp_path):
    node = Node(tmp_path, segment_size=64 * 1024)
    node.enqueue("keep", {"delay": 3_600_000}, params=b'"' + b"k" * 1000 + b'"')
    for i in range(400):            # short-lived tasks that fill many segments
        node.enqueue(f"t{i}", {"keepResult": 0}, params=b'"' + b"p" * 1000 + b'"')
        for uid, attempt, *_ in node.subscribe(1):
            node.report(uid, attempt, "success", 200, b'"' + b"r" * 500 + b'"')
        node.advance(0.001)
    for _ in range(50):             # compaction works a bounded amount per turn
        node.advance(0.001)
    segments = [n for n in os.listdir(tmp_path) if n.endswith(".wal")]
    assert node.wal.records_migrated >= 1
    assert len(segments) <= 4, segments
    again = node.restart()
    assert list(again.broker.tasks.tasks) == ["keep"]
    assert again.broker.tasks.tasks["keep"].params == b'"' + b"k" * 1000 + b'"'


def test_jobs_and_tasks_share_the_binlog_and_both_come_back(tmp_path):
    node = Node(tmp_path)
    node.broker.handle(b"bean", Hello(9, "beanstalk", 1, 0, []), node.now)
    node.send(b"bean", (Op.OPEN, 1))
    [(_, code, job_id)] = node.send(b"bean", (Op.PUT, 1, 0, 0, 60, b"job body"))[b"bean"]
    assert code == R.INSERTED
    node.enqueue("t1")
    again = node.restart()
    assert again.broker.queue.jobs[job_id].body == b"job body"
    assert again.info("t1")["status"] == QUEUED


def test_a_format_1_segment_from_an_older_zstalk_is_still_read(tmp_path):
    """Segments written before tasks existed: format 1, job records only."""
    header = wf.HEADER.pack(wf.MAGIC, 1, 77, 5, 1)
    header += struct.pack("<I", zlib.crc32(header))
    record = wf.encode_new_job(4, b"default", 10, 0, 60, WALL_OFFSET + 900, 0.0, b"old job")
    frame = wf.encode_frame(record)
    with open(tmp_path / segment_name(1), "wb") as f:
        f.write(header + frame + b"\0" * 64)
    node = Node(tmp_path)
    assert node.broker.queue.jobs[4].body == b"old job"
    node.enqueue("t1")
    again = node.restart()
    assert again.broker.queue.jobs[4].body == b"old job" and again.info("t1") is not None


def test_a_segment_of_an_unknown_newer_format_is_refused_by_name(tmp_path):
    header = wf.HEADER.pack(wf.MAGIC, 9, 77, 5, 1)
    header += struct.pack("<I", zlib.crc32(header))
    with open(tmp_path / segment_name(1), "wb") as f:
        f.write(header + wf.encode_frame(wf.encode_task_gone("x")))
    with pytest.raises(Exception, match="format 9, this zstalk reads formats 1, 2"):
        Node(tmp_path)


def test_a_full_disk_refuses_an_enqueue_with_503_and_keeps_the_task_queue_consistent(node):
    node.enqueue("t1")
    node.wal.reserve = lambda amount: False       # as when no segment can be allocated
    node.wal.headroom = 0
    reply = node.enqueue("t2")
    assert reply[1:3] == (R.T_ERROR, "out_of_space")
    assert node.subscribe(1) == []                # no room to log a start: t1 waits
    assert node.info("t1")["status"] == QUEUED and node.info("t2") is None


def test_the_space_promised_is_exactly_what_the_tasks_still_need(node):
    """Each task keeps room for its TASK_GONE (and, running, for its call's end); nothing
    more, nothing less, however many were enqueued (seqs of every encoded length)."""
    for i in range(300):
        node.enqueue(f"t{i}", {"delay": 3_600_000})
    node.enqueue("run")
    calls = node.subscribe(1)
    wal = node.wal
    gone = sum(wal._reservation(len(wf.encode_task_gone(uid))) for uid in node.broker.tasks.tasks)
    end = wal._task_state_reservation(calls[0][0])
    assert wal.promised == gone + end


def test_queue_timeouts_leave_promised_only_the_room_their_tasks_still_need(node):
    for i in range(20):
        node.enqueue(f"t{i}", {"queueTimeout": 1000, "delay": 500})
    node.enqueue("stays", {"delay": 3_600_000})
    node.advance(1.0)
    tasks = node.broker.tasks.tasks
    assert sum(t.error == "queue timeout" for t in tasks.values()) == 20
    wal = node.wal
    assert wal.promised == sum(wal._reservation(len(wf.encode_task_gone(uid))) for uid in tasks)


def test_a_queue_timeout_on_a_full_disk_waits_for_room_and_then_fails_the_task(node):
    node.enqueue("t1", {"queueTimeout": 1000})
    node.broker.tasks.specs["f"] = None             # (so no dispatcher takes it meanwhile)
    real = node.wal.reserve
    node.wal.reserve = lambda amount: False
    node.advance(1.0)
    assert node.info("t1")["status"] == QUEUED      # no room to log the failure: not yet
    node.wal.reserve = real
    node.advance(1.0)
    assert node.info("t1")["status"] == FAILED and node.info("t1")["error"] == "queue timeout"


def test_a_claimed_call_that_ended_while_the_broker_was_down_gets_time_to_report(node):
    node.enqueue("t1", {"timeout": 10_000, "deliveryMode": "atMostOnce"})
    [(uid, attempt, *_)] = node.subscribe(1)
    again = node.restart(later_s=17, claims=[[uid, attempt]])   # past its deadline
    again.advance(0.001)
    assert again.info("t1")["status"] == RUNNING     # its report is on the way
    again.subscribe(0)
    again.report(uid, attempt, "success", 200, b"1")
    assert again.info("t1")["status"] == SUCCESS


def test_a_tasks_level_and_queue_timeout_survive_a_restart(node):
    node.enqueue("vip", {"level": 3, "queueTimeout": 60000})
    node.enqueue("normal")
    again = node.restart(later_s=10)
    task = again.broker.tasks.tasks["vip"]
    assert task.level == 3 and again.info("vip")["level"] == 3
    assert task.queue_deadline == pytest.approx(again.now + 50)   # wall clock: 10 s passed
    assert again.info("vip")["waitNum"] == 0 and again.info("normal")["waitNum"] == 1
    again.advance(50)
    assert again.info("vip")["status"] == FAILED and again.info("vip")["error"] == "queue timeout"


def format_3_segment(path, records: list[bytes]) -> None:
    """A segment as zstalk wrote before format 4: TASK records without the optional map."""
    header = wf.HEADER.pack(wf.MAGIC, 3, 77, 1, 1)
    header += struct.pack("<I", zlib.crc32(header))
    with open(path / segment_name(1), "wb") as f:
        f.write(header + wf.encode_frame(b"".join(records)) + b"\0" * 64)


def task_list(uid: str, seq: int) -> list:
    """A queued task's TASK_FIELDS and its result, as format 3 logged them."""
    return [uid, "f", b"{}", 5, seq, 1, ["fixed", 1000, 5000, False], 15000, "atLeastOnce",
            300000, WALL_OFFSET + 990.0, "queued", 0, None, None, WALL_OFFSET + 990.0,
            WALL_OFFSET + 990.0, None, None, None]


def test_a_format_3_segment_with_tasks_is_still_read_with_their_defaults(tmp_path):
    format_3_segment(tmp_path, [wf.encode_task(task_list("old", 1))])
    node = Node(tmp_path)
    task = node.broker.tasks.tasks["old"]
    assert (task.level, task.queue_deadline, task.priority, task.group) == (0, 0.0, 5, "")
    assert [c[0] for c in node.subscribe(1)] == ["old"]


def test_a_tasks_group_comes_back_with_the_binlog_and_none_is_not_written(tmp_path):
    node = Node(tmp_path)
    node.enqueue("acme-1", {"group": "acme"})
    node.enqueue("plain")
    assert "group" not in node.wal.task_optional(node.broker.tasks.tasks["plain"])
    again = node.restart(later_s=1)
    assert again.broker.tasks.tasks["acme-1"].group == "acme"
    assert again.info("acme-1")["group"] == "acme"
    assert again.broker.tasks.tasks["plain"].group == "" and "group" not in again.info("plain")
    assert again.broker.tasks.ledger.groups == {"f": {"acme": [1, 0]}}     # (its stats)


def test_after_a_restart_a_groups_calls_still_running_count_against_its_group_concurrency(
        tmp_path):
    limited = (FunctionSpec("f", "http://fn/f", concurrency=8, group_concurrency=1),)
    node = Node(tmp_path, functions=limited)
    for uid, group in (("a1", "acme"), ("a2", "acme"), ("b1", "beta"), ("b2", "beta")):
        node.enqueue(uid, {"group": group})
    assert [c[0] for c in node.subscribe(8)] == ["a1", "b1"]
    again = node.restart(later_s=1)
    assert again.broker.tasks.group_limits.running == {("f", "acme"): 1, ("f", "beta"): 1}
    assert again.subscribe(8) == []                 # a1 and b1 may still be running
    assert again.info("a2")["waitNum"] == 0 and again.info("a2")["group"] == "acme"
    again.advance(CLAIM_S + 1)          # unclaimed: their outcome unknown, retried later
    assert [c[0] for c in again.subscribe(8)] == ["a2", "b2"]


def test_a_group_that_is_not_text_in_a_record_is_read_as_none(tmp_path):
    odd = [*task_list("odd", 1), {"group": 7}]
    header = wf.HEADER.pack(wf.MAGIC, wf.FORMAT, 77, 1, 1)
    header += struct.pack("<I", zlib.crc32(header))
    with open(tmp_path / segment_name(1), "wb") as f:
        f.write(header + wf.encode_frame(wf.encode_task(odd)) + b"\0" * 64)
    assert Node(tmp_path).broker.tasks.tasks["odd"].group == ""


def test_a_tasks_token_comes_back_as_its_digest_and_a_segment_holds_no_token(tmp_path):
    from zstalk.protocol.schema.tokens import digest, make_tokens
    [token] = make_tokens(1)
    node = Node(tmp_path)
    node.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", {"delay": 60_000}, "mine", True,
                     {"token_sha256": digest(token)}))
    node.enqueue("plain")
    assert "token_sha256" not in node.wal.task_optional(node.broker.tasks.tasks["plain"])
    again = node.restart(later_s=1)
    assert again.broker.tasks.tasks["mine"].token == digest(token)
    assert again.broker.tasks.tasks["plain"].token is None, "none: every token refused"
    [(_, code, info)] = again.send(HTTP, (Op.T_INFO, 1, "mine", False, digest(token)))[HTTP]
    assert code == R.T_TASK and info["uniqueId"] == "mine"
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert digest(token) in stored and token.encode() not in stored
    assert token[4:].encode() not in stored, "not even without its prefix"


def test_a_format_3_task_has_no_token_and_refuses_every_one(tmp_path):
    from zstalk.protocol.schema.tokens import digest
    format_3_segment(tmp_path, [wf.encode_task(task_list("old", 1))])
    node = Node(tmp_path)
    assert node.broker.tasks.tasks["old"].token is None
    [(_, code, error, _)] = node.send(HTTP, (Op.T_CANCEL, 1, "old", digest("zt1_x")))[HTTP]
    assert (code, error) == (R.T_ERROR, "forbidden")


def test_a_token_digest_that_is_not_32_bytes_in_a_record_is_read_as_none(tmp_path):
    odd = [*task_list("odd", 1), {"token_sha256": b"short"}]
    header = wf.HEADER.pack(wf.MAGIC, wf.FORMAT, 77, 1, 1)
    header += struct.pack("<I", zlib.crc32(header))
    with open(tmp_path / segment_name(1), "wb") as f:
        f.write(header + wf.encode_frame(wf.encode_task(odd)) + b"\0" * 64)
    assert Node(tmp_path).broker.tasks.tasks["odd"].token is None


def test_optional_task_fields_a_reader_does_not_know_are_kept_as_they_were(tmp_path):
    future = [*task_list("new", 1), {"level": 2, "colour": "blue", "weight": [1, 2]}]
    header = wf.HEADER.pack(wf.MAGIC, wf.FORMAT, 77, 1, 1)
    header += struct.pack("<I", zlib.crc32(header))
    with open(tmp_path / segment_name(1), "wb") as f:
        f.write(header + wf.encode_frame(wf.encode_task(future)) + b"\0" * 64)
    node = Node(tmp_path)
    task = node.broker.tasks.tasks["new"]
    assert task.level == 2
    # what a compaction writes of it again (binlog._task_record): nothing lost
    assert node.wal.task_optional(task) == {"level": 2, "colour": "blue", "weight": [1, 2]}
    task.level = 0
    assert node.wal.task_optional(task) == {"colour": "blue", "weight": [1, 2]}


def test_a_slow_rates_last_start_comes_back_with_the_binlog(tmp_path):
    slow = (FunctionSpec("f", "http://fn/f", concurrency=8, rate=1, per_s=60.0),)
    node = Node(tmp_path, functions=slow)
    node.enqueue("t1")
    node.enqueue("t2")
    assert [c[0] for c in node.subscribe(2)] == ["t1"]
    node.wal.save_gates(node.broker.tasks.durable_gates(node.now))     # (the actor's part)
    again = node.restart(later_s=20)
    assert again.replayed.gates == {"f": pytest.approx(WALL_OFFSET + 1000.0 + 60)}
    assert again.subscribe(2) == [], "40 s of the minute are left"
    again.advance(40)
    assert [c[0] for c in again.subscribe(0)] == ["t2"]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"f": "soon"}'])
def test_an_unreadable_gates_file_only_costs_the_saved_starts(tmp_path, caplog, text):
    node = Node(tmp_path)
    node.wal.close()
    (tmp_path / "zstalk.gates.json").write_text(text)
    again = Node(tmp_path)
    assert again.replayed.gates == {}
    assert "zstalk.gates.json" in caplog.text


def test_a_request_task_and_its_kept_headers_come_back_after_a_restart(node):
    request = {"method": "PUT", "path": "/orders/7", "query": {"v": ["1", "2"]},
               "headers": {"If-None-Match": '"x"'}, "body": {"base64": "AAEC"}}
    node.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"", None, "r1", True, {"request": request}))
    node.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"", None, "r2", True, {"request": {"path": "/x"}}))
    [first, _] = node.subscribe(2)
    node.report(*first[:2], "success", 200, b'{"base64":"AA=="}')
    node.send(D1, (Op.T_OUTCOME, 1, "r2", 1, "success", 200, b'"ok"', None, -1,
                   {"headers": {"Content-Type": "text/plain", "ETag": "e"}}))
    again = node.restart()
    task = again.broker.tasks.tasks["r1"]
    assert (task.request.method, task.request.path, task.request.query) == (
        "PUT", "/orders/7", "v=1&v=2")
    assert task.request.headers == (("If-None-Match", '"x"'),
                                    ("Content-Type", "application/octet-stream"))
    assert task.params == b"\x00\x01\x02"
    assert again.info("r2")["resultHeaders"] == {"Content-Type": "text/plain", "ETag": "e"}


def test_admissions_leave_promised_only_the_room_their_tasks_still_need(tmp_path):
    room = (FunctionSpec("f", "http://fn/f", concurrency=2, online="public"),)
    node = Node(tmp_path, functions=room)
    for i in range(30):
        node.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", {"keepResult": 0}, f"u{i}", True,
                         {"type": "online"}))
        [(_, code, info)] = node.send(HTTP, (Op.T_INFO, 1, f"u{i}", True))[HTTP]
        assert info["status"] == "admitted"
        node.send(HTTP, (Op.T_DONE, 1, f"u{i}"))
        node.advance(0.001)
    node.advance(1)
    assert node.broker.tasks.tasks == {}
    assert node.wal.promised == 0, "every admission's reservations were used or given back"
    node.send(HTTP, (Op.T_ENQUEUE, 1, "f", b"{}", None, "held", True, {"type": "online"}))
    again = node.restart()
    wal = again.wal
    assert again.broker.tasks.tasks["held"].status == "admitted"
    assert wal.promised == wal._reservation(len(wf.encode_task_gone("held"))) + \
        wal._task_state_reservation("held")


def test_a_keep_shortened_by_a_read_is_journaled_and_a_restart_keeps_it_short(tmp_path):
    """keep_result_after_read: the shorter expiry goes out as a TASK_STATE (it holds
    `expires`), so a restart does not bring back keepResult's longer keep."""
    node = Node(tmp_path, functions=(FunctionSpec("f", "http://fn/f", concurrency=2,
                                                  keep_result_after_read_ms=2000),))
    node.enqueue("read")
    node.enqueue("unread")
    for uid, attempt, *_ in node.subscribe(2):
        node.report(uid, attempt, "success", 200, b"1")
    assert node.info("read")["status"] == SUCCESS       # (by the master key: shortened)
    expires = node.broker.tasks.tasks["read"].expires
    assert expires == node.now + 2
    again = node.restart(later_s=1)
    assert again.broker.tasks.tasks["read"].expires == pytest.approx(expires)
    assert again.broker.tasks.tasks["unread"].expires == pytest.approx(node.now + 300)
    again.advance(1.5)
    assert "read" not in again.broker.tasks.tasks and "unread" in again.broker.tasks.tasks
    third = again.restart()
    third.advance(0)
    assert "read" not in third.broker.tasks.tasks, "its TASK_GONE was logged"


# -- an operator's hand: a function's pause (FUNCTION_STATE, format 5) and a task's retry ----
def pause(node, name: str, paused: bool):
    [reply] = node.send(HTTP, (Op.T_FUNCTION_PAUSE, 1, name, paused))[HTTP]
    return reply


def test_a_function_an_operator_paused_hands_nothing_out_and_stays_paused_after_a_restart(node):
    [_, code, info] = pause(node, "f", True)
    assert (code, info["name"], info["paused"]) == (R.T_FUNCTION, "f", True)
    node.enqueue("t1")
    assert node.subscribe(1) == []
    again = node.restart()
    assert again.broker.tasks.limits.stopped == {"f"}
    assert again.subscribe(1) == []
    assert pause(again, "f", False)[2]["paused"] is False
    assert [c[0] for c in again.subscribe(1)] == ["t1"]
    third = again.restart()
    assert third.broker.tasks.limits.stopped == set(), "the resume is kept too"


def test_pausing_an_unknown_function_is_refused_and_nothing_is_written(node):
    written = node.wal.records_written
    assert pause(node, "nope", True)[1:3] == (R.T_ERROR, "unknown_function")
    assert node.wal.records_written == written


def test_a_pause_still_in_force_is_carried_forward_when_its_segment_is_compacted(tmp_path):
    node = Node(tmp_path, segment_size=64 * 1024)
    pause(node, "f", True)
    first = node.wal.function_file["f"]
    for i in range(400):            # short-lived jobs that fill many segments
        node.send(HTTP)             # (a turn)
        node.broker.handle(b"bs", Hello(9, "beanstalk", 1, 0, []), node.now)
        node.send(b"bs", (Op.OPEN, 1), (Op.PUT, 1, 0, 0, 60, b"x" * 1000))
        node.send(b"bs", (Op.DELETE, 1, i + 1))
    for _ in range(50):
        node.advance(0.001)
    assert node.wal.function_file["f"] > first and node.wal.records_migrated >= 1
    assert not os.path.exists(tmp_path / segment_name(first))
    assert node.restart().broker.tasks.limits.stopped == {"f"}


def test_a_failed_task_retried_runs_again_from_its_first_attempt_and_a_restart_keeps_that(node):
    node.enqueue("t1", {"attempts": 0})
    [(uid, attempt, *_)] = node.subscribe(1)
    node.report(uid, attempt, "failure", 500, b"no", "HTTP 500")
    assert node.info("t1")["status"] == FAILED
    node.subscribe(0)               # (else the retried task is handed out at once)
    [(_, code, info)] = node.send(HTTP, (Op.T_RETRY, 1, "t1"))[HTTP]
    assert code == R.T_TASK and (info["status"], info["attempt"]) == (QUEUED, 0)
    assert info.get("error") is None and info.get("result") is None
    again = node.restart()
    info = again.info("t1")
    assert (info["status"], info["attempt"], info.get("error")) == (QUEUED, 0, None)
    assert [c[:2] for c in again.subscribe(1)] == [("t1", 1)]


def test_only_a_failed_or_cancelled_task_is_retried(node):
    node.enqueue("t1")
    node.subscribe(0)
    [(_, code, *why)] = node.send(HTTP, (Op.T_RETRY, 1, "t1"))[HTTP]
    assert (code, why[0]) == (R.T_ERROR, "not_retryable")
    [(_, code, *why)] = node.send(HTTP, (Op.T_RETRY, 1, "t9"))[HTTP]
    assert (code, why[0]) == (R.T_ERROR, "not_found")
    node.send(HTTP, (Op.T_CANCEL, 1, "t1"))
    [(_, code, info)] = node.send(HTTP, (Op.T_RETRY, 1, "t1"))[HTTP]
    assert code == R.T_TASK and info["status"] == QUEUED
    assert [c[:2] for c in node.subscribe(1)] == [("t1", 1)]


def test_an_operators_op_from_a_front_older_than_schema_8_is_refused(node):
    node.broker.old_peers[HTTP] = 7
    assert pause(node, "f", True)[1:3] == (R.T_ERROR, "bad_request")
    assert node.broker.tasks.limits.stopped == set()


def test_a_retry_leaves_promised_only_the_room_its_task_still_needs(node):
    node.enqueue("t1", {"attempts": 0}, params=b'"' + b"p" * 3000 + b'"')
    [(uid, attempt, *_)] = node.subscribe(1)
    node.report(uid, attempt, "failure", 500, b"r" * 2000, "x" * 500)
    node.subscribe(0)
    [(_, code, _)] = node.send(HTTP, (Op.T_RETRY, 1, "t1"))[HTTP]
    assert code == R.T_TASK and node.wal.whole_room == {}
    wal = node.wal
    assert wal.promised == wal._reservation(len(wf.encode_task_gone("t1")))


def test_a_cancelled_tasks_aborted_call_that_may_have_run_says_so_after_a_restart(node):
    node.enqueue("t1", {"deliveryMode": "atMostOnce"})
    [(uid, attempt, *_)] = node.subscribe(1)
    [(_, code, info)] = node.send(HTTP, (Op.T_CANCEL, 1, uid))[HTTP]
    assert code == R.T_TASK and info["status"] == "cancelled"
    node.report(uid, attempt, "unknown", error="the connection was cut after the request")
    assert node.info(uid)["possiblyExecuted"] is True
    again = node.restart()
    info = again.info(uid)
    assert info["status"] == "cancelled" and info["possiblyExecuted"] is True
    assert again.restart().info(uid)["possiblyExecuted"] is True, "and after a compaction's copy"
