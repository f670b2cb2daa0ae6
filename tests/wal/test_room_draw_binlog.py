"""A room event's draw in the binlog, under the pure broker core (test_tasks_binlog.py's
Node: real files, a fake clock, restarts that open the same directory in a new Broker):
one ROOM_DRAW record at the opening, and a restart puts the pre-line back in the drawn
order without drawing again, also once compaction has copied the record forward; and
the same record folded from the JetStream journal's messages (broker/wal/fold.py)."""
from __future__ import annotations

import os

from test_tasks_binlog import WALL_OFFSET, Node
from zstalk.broker.core.shared.journal import RoomDraw
from zstalk.broker.core.tasks.components.room import place_in_draw
from zstalk.broker.core.tasks.store import ADMITTED, FunctionSpec
from zstalk.broker.wal import format as wf, records
from zstalk.broker.wal.fold import Fold
from zstalk.protocol.schema import Op, R
from zstalk.protocol.schema.task_messages import TaskEnqueue

HTTP = b"http"
START = 1000.0
OPENS = START + WALL_OFFSET + 60        # the opening, a minute after the start
ROOM = (FunctionSpec("shop", "http://fn/shop", concurrency=1, online="public",
                     opens_at=OPENS),
        FunctionSpec("f", "http://fn/f", concurrency=8))


def room(path, segment_size: int = 1 << 20) -> Node:
    return Node(path, START, segment_size, ROOM)


def join(node: Node, uid: str) -> dict:
    op = TaskEnqueue("shop", b"{}", None, uid, False, online=True,
                     client=f"10.1.{len(uid)}.{sum(map(ord, uid)) % 250}").op(1)
    [(_, code, info)] = node.send(HTTP, op)[HTTP]
    assert code == R.T_TASK, info
    return info


def line(node: Node) -> list[str]:
    """Who is admitted, then the line's order by waitNum."""
    tasks = node.broker.tasks.tasks
    admitted = [uid for uid, t in tasks.items() if t.function == "shop" and t.status == ADMITTED]
    waiting = {node.info(uid)["waitNum"]: uid for uid, t in tasks.items()
               if t.function == "shop" and t.status == "queued"}
    return admitted + [waiting[n] for n in sorted(waiting)]


def opened(node: Node, seed: int) -> None:
    node.broker.tasks.seeds = lambda: seed      # (the core takes its seed as input)
    node.advance(60)


def test_a_restart_keeps_the_draw_and_its_order_and_does_not_draw_again(tmp_path):
    node = room(tmp_path)
    uids = [f"v{n}" for n in range(8)]
    for uid in uids:
        assert join(node, uid)["phase"] == "pre-line"
    opened(node, 2026)
    assert node.broker.tasks.room.draws == {"shop": RoomDraw("shop", OPENS, 2026)}
    order = line(node)
    assert sorted(order) == uids and order != uids
    join(node, "later")
    node.broker.tasks.seeds = lambda: 1         # (a second draw would give another order)
    again = node.restart(later_s=5)
    assert again.broker.tasks.room.draws == {"shop": RoomDraw("shop", OPENS, 2026)}
    again.advance(1)
    assert line(again) == order + ["later"]
    assert again.wal.draws.fields == {"shop": ["shop", OPENS, 2026]}


def test_an_opening_that_came_while_the_broker_was_down_is_drawn_as_it_starts(tmp_path):
    node = room(tmp_path)
    uids = [f"w{n}" for n in range(6)]
    for uid in uids:
        join(node, uid)
    again = node.restart(later_s=120)           # (the opening was a minute ago)
    assert again.info("w0")["phase"] == "pre-line"
    again.broker.tasks.seeds = lambda: 31
    again.advance(0.001)
    assert again.broker.tasks.room.draws == {"shop": RoomDraw("shop", OPENS, 31)}
    assert line(again) == sorted(uids, key=lambda uid: place_in_draw(31, uid))


def test_a_draw_outlives_the_segment_it_was_written_in(tmp_path):
    """Small segments and a thousand tasks enqueued and forgotten: compaction copies the
    draw forward as it does live tasks, removes the segment it was in, and a restart
    still has it (and the pre-line's order)."""
    node = room(tmp_path, segment_size=64 * 1024)
    for uid in ("a", "b", "c", "d", "e"):
        join(node, uid)
    opened(node, 77)
    order = line(node)
    first = node.wal.draws.file["shop"]
    for n in range(1000):
        node.enqueue(f"x{n}", {"keepResult": 1})
        node.send(HTTP, (Op.T_CANCEL, 1, f"x{n}"))
        if n % 100 == 99:
            node.advance(2)                     # (their keepResult ran out: forgotten)
    assert node.wal.draws.file["shop"] > first
    assert not os.path.exists(os.path.join(node.path, f"zstalk.{first:08d}.wal"))
    assert node.wal.records_migrated > 0
    again = node.restart()
    assert again.broker.tasks.room.draws["shop"] == RoomDraw("shop", OPENS, 77)
    assert line(again) == order


def test_a_draw_folded_from_the_journals_messages_is_the_functions_latest():
    fold = Fold()
    first = wf.encode_frame(wf.encode_room_draw(records.draw_fields(RoomDraw("shop", 1e9, 5))))
    later = wf.encode_frame(wf.encode_room_draw(records.draw_fields(
        RoomDraw("shop", 2e9, (1 << 64) - 1))))
    fold.apply(1, {}, first)
    fold.apply(2, {}, later)
    draws = fold.read().replayed.draws
    assert {name: (records.draw_image(fields), seq) for name, (fields, seq) in draws.items()} \
        == {"shop": (RoomDraw("shop", 2e9, (1 << 64) - 1), 2)}
