"""The front's broker link while no broker answers: held commands are bounded and time out;
and with several brokers, how it finds the one that leads."""
from __future__ import annotations

import asyncio
import os
import time

import zmq

from zstalk.protocol.links.zeromq import BrokerLink
from zstalk.protocol.links.owner import LinkOwner
from zstalk.protocol.schema import (HEARTBEAT_S, PEER_TIMEOUT_S, Batch, Heartbeat, Hello, Holding,
                                    NotLeader, Op, R, Settings, Stopping, Welcome, decode,
                                    encode)


class Recorder(LinkOwner):
    def __init__(self) -> None:
        self.replies: list[tuple] = []
        self.awaited: list[tuple] = []      # ops sent or held, not yet answered

    def on_stopped(self) -> list[tuple]:
        return list(self.awaited)

    def on_replies(self, items: list) -> None:
        self.replies.extend(items)

    def session_states(self):
        return []


def run_with_link(tmp_path, body, owner=None, **kw):
    async def main():
        owner_ = owner or Recorder()
        link = BrokerLink(f"ipc://{tmp_path}/nobody-listens", "beanstalk", owner_, **kw)
        link.start()
        try:
            await body(link, owner_)
        finally:
            link.close()
    asyncio.run(main())


def test_past_the_held_bound_the_oldest_held_commands_are_answered_internal_error(tmp_path):
    async def body(link, owner):
        for conn in range(1, 9):
            link.submit((int(Op.LIST_TUBE_USED), conn))
        # oldest first, so every connection's replies stay in the order it asked
        assert owner.replies == [(c, R.INTERNAL_ERROR) for c in (1, 2, 3)]
        assert [op[1] for _, op in link.held] == [4, 5, 6, 7, 8]

    run_with_link(tmp_path, body, max_held=5)


def test_held_commands_are_answered_internal_error_when_the_hold_time_ends(tmp_path):
    async def body(link, owner):
        link.submit((int(Op.OPEN), 1))
        link.submit((int(Op.PEEK), 1, 7))
        await asyncio.sleep(0.2)
        assert owner.replies == []
        await asyncio.sleep(1.5)          # the link looks at held commands every 0.5 s
        assert owner.replies == [(1, R.INTERNAL_ERROR)]
        assert [op[0] for _, op in link.held] == [Op.OPEN]   # the session itself is kept

    run_with_link(tmp_path, body, hold_s=0.5)


def test_rejected_commands_counted_during_an_outage_cannot_grow_the_front(tmp_path):
    async def body(link, owner):
        for _ in range(1000):
            link.submit((int(Op.COUNT), 1, "put", False))
        assert len(link.held) == 10 and owner.replies == []

    run_with_link(tmp_path, body, max_held=10)


def test_a_connection_that_comes_and_goes_at_the_bound_is_forgotten(tmp_path):
    async def body(link, owner):
        for conn in range(1, 4):
            link.submit((int(Op.PEEK), conn, 1))
        link.submit((int(Op.OPEN), 9))
        link.submit((int(Op.CLOSE), 9))
        assert [op[:2] for _, op in link.held] == [(Op.PEEK, c) for c in (1, 2, 3)]

    run_with_link(tmp_path, body, max_held=3)


def test_settings_from_the_broker_replace_the_ones_its_welcome_gave(tmp_path):
    """A broker that read its config again sends Settings on their own (broker/core/broker.py)."""
    async def body(link, owner):
        link._handle(Welcome(7, 9, Settings(max_body_bytes=100), False))
        assert link.settings.max_body_bytes == 100
        link._handle(Settings(max_body_bytes=200, max_result_bytes=300))
        assert (link.settings.max_body_bytes, link.settings.max_result_bytes) == (200, 300)
        assert link.state == "ready" and owner.replies == []
    run_with_link(tmp_path, body)


def test_settings_travel_as_a_message_of_their_own():
    sent = Settings(65535, 200, 300)
    assert decode(encode(sent)) == sent
    assert decode(encode(Welcome(7, 9, sent, True))).settings == sent


def test_a_stopping_broker_leaves_the_link_holding_and_its_undone_ops_go_first_once(tmp_path):
    """Stopping: ops submitted meanwhile are held; after the final one, what had been sent
    and left unanswered goes ahead of them, and an op held meanwhile is not sent twice."""
    async def body(link, owner):
        link._handle(Welcome(7, 9, Settings(), True))
        waiting = (int(Op.RESERVE), 1, -1)
        link.submit(waiting)
        link.flush_now()
        owner.awaited.append(waiting)
        link._handle(Stopping(7, False))
        later = (int(Op.LIST_TUBE_USED), 1)
        link.submit(later)
        owner.awaited.append(later)
        assert link.state == "holding" and [op for _, op in link.held] == [later]
        link._handle(Stopping(7, True))
        assert link.state != "ready" and [op for _, op in link.held] == [waiting, later]
        assert owner.replies == []
    run_with_link(tmp_path, body)


class Forgetful(Recorder):
    """An owner with no on_stopped (a pool, a dispatcher): it takes what it awaits as lost
    and fails or re-sends it itself."""
    on_stopped = None
    lost = 0

    def on_lost(self) -> None:
        self.lost += 1


def test_an_owner_that_takes_everything_as_lost_gets_no_held_op_sent_behind_its_back(tmp_path):
    async def body(link, owner):
        link._handle(Welcome(7, 9, Settings(), True))
        link._handle(Stopping(7, False))
        link.submit((int(Op.LIST_TUBE_USED), 1))     # awaited: the owner's on_lost answers it
        link.submit((int(Op.OPEN), 2))               # silent: nobody awaits it
        link._handle(Stopping(7, True))
        assert owner.lost == 1 and [op for _, op in link.held] == [(int(Op.OPEN), 2)]
    run_with_link(tmp_path, body, owner=Forgetful())


async def _receive(router, timeout_s: float = 5.0) -> tuple[bytes, object]:
    """The next message to the fake broker (a ROUTER): (peer, decoded)."""
    deadline = time.monotonic() + timeout_s
    while not router.poll(0):
        assert time.monotonic() < deadline, "nothing came from the link"
        await asyncio.sleep(0.01)
    peer, data = router.recv_multipart()
    return peer, decode(data)


def test_a_holding_link_goes_on_heartbeating_while_the_broker_waits_for_other_fronts(tmp_path):
    """The stopping broker may wait STOP_WAIT_S (5 s) for other fronts' Holding, longer than
    PEER_TIMEOUT_S: a link that answered must not fall silent meanwhile, or the broker drops
    it, stops heartbeating it, and the link in turn gives up on the broker (503s, fenced)."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/broker"
    router.bind(endpoint)

    async def main():
        link = BrokerLink(endpoint, "http", Recorder(), keys=None)
        link.start()
        try:
            peer, hello = await _receive(router)
            assert isinstance(hello, Hello)
            router.send_multipart([peer, encode(Welcome(7, 9, Settings(), True))])
            router.send_multipart([peer, encode(Stopping(7, False))])
            assert isinstance((await _receive(router))[1], Holding)
            beats, until = 0, time.monotonic() + PEER_TIMEOUT_S + 1.0
            while time.monotonic() < until:
                router.send_multipart([peer, encode(Heartbeat(7))])
                if router.poll(0):
                    assert isinstance((await _receive(router))[1], Heartbeat)
                    beats += 1
                await asyncio.sleep(HEARTBEAT_S / 5)
            assert link.state == "holding"
            assert beats >= 3, beats       # one every HEARTBEAT_S (0.5 s): about 6
        finally:
            link.close()
    try:
        asyncio.run(main())
    finally:
        router.close()


def _socket_with_no_connection_to_queue_on(tmp_path) -> zmq.Socket:
    """A real DEALER in the state a failed handshake leaves the link's in for a moment:
    no connection to queue a message on, so a non-blocking send raises zmq.Again."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.connect(f"ipc://{tmp_path}/nobody-listens-either")
    return sock


def test_a_hello_that_finds_no_connection_is_said_again_later_instead_of_crashing_the_front(
        tmp_path):
    """A CURVE broker refusing a keyless front's handshake drops the connection's queue, and
    under load the front's Hello could find none (zmq.Again killed the front)."""
    async def body(link, owner):
        real = link.sock
        link.sock = _socket_with_no_connection_to_queue_on(tmp_path)
        try:
            link._send(Hello(link.front_id, "beanstalk", 1, 0, []))
            assert link.state == "connecting" and owner.replies == []
        finally:
            link.sock.close(linger=0)
            link.sock = real
    run_with_link(tmp_path, body)


def test_a_batch_that_finds_no_connection_loses_the_broker_and_its_commands_are_answered(
        tmp_path):
    """...as if the broker had gone silent: the owner answers what it awaits (on_lost) and
    the link says Hello again on a fresh socket."""
    async def body(link, owner):
        link._handle(Welcome(7, 9, Settings(), True))
        real, link.sock = link.sock, _socket_with_no_connection_to_queue_on(tmp_path)
        real.close(linger=0)
        unusable = link.sock
        link.submit((int(Op.PEEK), 1, 3))
        link.flush_now()
        assert owner.lost == 1 and link.state == "connecting"
        assert link.sock is not unusable and unusable.closed
    run_with_link(tmp_path, body, owner=Forgetful())


# -- several brokers: a standby's NotLeader (docs/ha.md) ----------------------------------
def _router(endpoint: str) -> zmq.Socket:
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    return router


def test_a_link_told_not_leader_goes_to_the_leader_it_names_at_once(tmp_path):
    standby, leader = _router(f"ipc://{tmp_path}/standby"), _router(f"ipc://{tmp_path}/leader")

    async def main():
        link = BrokerLink(f"ipc://{tmp_path}/standby", "beanstalk", Recorder(), keys=None)
        link.start()
        try:
            peer, hello = await _receive(standby)
            assert isinstance(hello, Hello)
            told = time.monotonic()
            standby.send_multipart([peer, encode(NotLeader(f"ipc://{tmp_path}/leader", 2))])
            peer, hello = await _receive(leader)
            took = time.monotonic() - told
            assert isinstance(hello, Hello) and took < PEER_TIMEOUT_S / 2, took
            leader.send_multipart([peer, encode(Welcome(7, 9, Settings(), True))])
            until = time.monotonic() + 5
            while link.state != "ready" and time.monotonic() < until:
                await asyncio.sleep(0.01)
            assert link.state == "ready" and link.endpoint == f"ipc://{tmp_path}/leader"
        finally:
            link.close()
    try:
        asyncio.run(main())
    finally:
        standby.close()
        leader.close()


def test_a_standby_that_knows_no_leader_is_asked_again_shortly_not_after_a_timeout(tmp_path):
    standby = _router(f"ipc://{tmp_path}/standby")

    async def main():
        link = BrokerLink(f"ipc://{tmp_path}/standby,ipc://{tmp_path}/other", "pool",
                          Recorder(), keys=None)
        link.start()
        try:
            for _ in range(3):
                peer, hello = await _receive(standby, timeout_s=1.0)
                assert isinstance(hello, Hello)
                standby.send_multipart([peer, encode(NotLeader("", 1))])
            assert link.state == "connecting" and link.endpoint == f"ipc://{tmp_path}/standby"
        finally:
            link.close()
    try:
        asyncio.run(main())
    finally:
        standby.close()


def test_a_link_whose_first_broker_does_not_answer_says_hello_to_the_next(tmp_path):
    broker = _router(f"ipc://{tmp_path}/second")

    async def main():
        link = BrokerLink(f"ipc://{tmp_path}/nobody,ipc://{tmp_path}/second", "http",
                          Recorder(), keys=None)
        started = time.monotonic()
        link.start()
        try:
            _, hello = await _receive(broker, timeout_s=PEER_TIMEOUT_S + 3.0)
            assert isinstance(hello, Hello)
            assert time.monotonic() - started < PEER_TIMEOUT_S + 3.0
        finally:
            link.close()
    try:
        asyncio.run(main())
    finally:
        broker.close()


# -- relink: a standby's fronts move to the broker beside them at takeover ------------------
class Moved(Recorder):
    lost = 0

    def on_lost(self) -> None:
        self.lost += 1


async def _until(predicate, timeout_s: float = 5.0) -> None:
    until = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < until, "it did not happen"
        await asyncio.sleep(0.01)


def _relink_case(tmp_path, welcomed: bool) -> Moved:
    """An owner on a link to a fake broker (welcomed or not) sends a command, is relinked
    to a real broker actor in this process, then sends another."""
    from zstalk.broker.actor import BrokerActor
    from zstalk.broker.core.broker import Config
    from zstalk.protocol.links import relink
    router = _router(f"ipc://{tmp_path}/old")
    owner = Moved()

    async def main():
        owner.link = BrokerLink(f"ipc://{tmp_path}/old", "beanstalk", owner, keys=None)
        owner.link.start()
        peer, _ = await _receive(router)
        if welcomed:
            router.send_multipart([peer, encode(Welcome(7, 9, Settings(), True))])
            await _until(lambda: owner.link.state == "ready")
        owner.link.submit((int(Op.OPEN), 1))
        owner.link.submit((int(Op.LIST_TUBE_USED), 1))
        owner.link.flush_now()
        if welcomed:
            assert isinstance((await _receive(router))[1], Batch)    # the old one has it
        actor = BrokerActor(None, Config(), keys=None)
        actor.start()
        try:
            relink(owner, actor.expose(f"relink-{os.getpid()}-{welcomed}"))
            owner.link.submit((int(Op.OPEN), 2))
            owner.link.submit((int(Op.LIST_TUBE_USED), 2))
            await _until(lambda: any(r[0] == 2 for r in owner.replies))
            await asyncio.sleep(0.05)
        finally:
            owner.link.close()
            actor.close()
    try:
        asyncio.run(main())
    finally:
        router.close()
    return owner


def test_relinked_what_the_lost_broker_had_is_the_owners_to_fail_and_nothing_is_resent(
        tmp_path):
    owner = _relink_case(tmp_path, welcomed=True)
    assert owner.lost == 1
    assert [r[:2] for r in owner.replies] == [(2, R.USING)], "conn 1's command never resent"


def test_relinked_what_was_held_goes_to_the_new_broker_once(tmp_path):
    owner = _relink_case(tmp_path, welcomed=False)
    assert owner.lost == 0
    assert [r[:2] for r in owner.replies] == [(1, R.USING), (2, R.USING)]
