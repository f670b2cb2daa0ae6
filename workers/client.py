"""The producer: a synchronous client on one plain ZeroMQ DEALER socket (no asyncio).

It is a front of kind "client" with one beanstalk session (conn 1).  Each call sends one
`Batch` (OPEN and USE ride along when needed, so `put_many` is one round trip for any
number of jobs) and waits up to timeout_s for the replies, ignoring heartbeats.  The
broker drops a front silent for PEER_TIMEOUT_S and answers it `Fenced`: an idle client
then says Hello again under a new incarnation and resends the batch, which is safe
because the broker executed none of a fenced batch.  A timeout throws the socket away,
so a late reply can never be taken for the answer to the next call.

`broker` may list several endpoints, comma-separated (the instances of one journal,
docs/ha.md): Hello goes to one at a time, each given PEER_TIMEOUT_S to answer within the
call's timeout_s.  A standby answers NotLeader, naming the leader (go there at once) or
none yet (ask it again after NOT_LEADER_RETRY_S, for up to NOT_LEADER_STAY_S); an
endpoint that does not answer makes the client try the next.  Only the Hello is ever retried elsewhere: a call sent to a
leader that then went silent raises TimeoutError as with one broker (it may have run).
"""
from __future__ import annotations

import math
import os
import random
import time
from typing import Any, Iterable

import zmq

from ..protocol.links.zeromq import NOT_LEADER_RETRY_S, NOT_LEADER_STAY_S, endpoints_of
from ..protocol.network import curve
from ..protocol.network.curve import FROM_ENV
from ..protocol.schema import (PEER_TIMEOUT_S, SILENT_OPS, Batch, Fenced, Hello, NotLeader, Op,
                               R, Replies, SchemaError, Settings, Welcome, decode, encode)
from . import codecs
from .codecs import Codec
from .errors import ZstalkError, tube_name

DEFAULT_BROKER = "tcp://127.0.0.1:11400"
CONN = 1
_FENCED_RETRIES = 3
GOODBYE_LINGER_MS = 100


class Client:
    """Not thread-safe: one Client per thread (they are cheap: one socket each)."""

    def __init__(self, broker: str = DEFAULT_BROKER, codec: Codec = codecs.raw,
                 timeout_s: float = 5.0, ctx: zmq.Context | None = None, keys=FROM_ENV) -> None:
        """`keys`: CURVE keys for a broker beyond this host (protocol/network/curve.py ClientKeys;
        by default from ZSTALK_CURVE_KEY / ZSTALK_CURVE_SERVER).  `timeout_s` is above 0
        and finite (else ValueError: 0 or less gave up on every call before asking)."""
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a number of seconds above 0, not {timeout_s!r}")
        self.keys = curve.given_or_env(keys)
        self.endpoints = endpoints_of(broker)
        for endpoint in self.endpoints:
            curve.check_local(endpoint, self.keys, "client")
        self.broker = broker
        self.listed = 0         # the endpoint of the list that answered (or is tried) last
        self.codec = codec
        self.timeout_s = timeout_s
        self.ctx = ctx or zmq.Context.instance()
        self.sock: zmq.Socket | None = None
        self.settings = Settings()
        self.opened = False
        self.using = "default"

    # -- producing ---------------------------------------------------------------------
    def put(self, body: Any, tube: str = "default", pri: int = 1024, delay_s: int = 0,
            ttr_s: int = 60) -> int:
        return self.put_many([body], tube, pri, delay_s, ttr_s)[0]

    def put_many(self, bodies: Iterable[Any], tube: str = "default", pri: int = 1024,
                 delay_s: int = 0, ttr_s: int = 60) -> list[int]:
        """Put every body in one round trip; ids in the order of the bodies."""
        self._connected()
        ops = [(Op.PUT, CONN, pri, delay_s, ttr_s, self._encode(b)) for b in bodies]
        replies = self._request(ops, tube)
        ids = [r[2] if r[1] == R.INSERTED else None for r in replies]
        for r in replies:
            if r[1] != R.INSERTED:
                error = ZstalkError(_name(r), f"{len(ids) - ids.count(None)} of {len(ids)} inserted")
                error.ids = ids       # type: ignore[attr-defined]
                raise error
        return ids      # type: ignore[return-value]

    def _encode(self, body: Any) -> bytes:
        raw = self.codec.encode(body)
        if len(raw) > self.settings.max_job_size:
            raise ZstalkError("JOB_TOO_BIG", f"{len(raw)} bytes, the broker takes "
                                             f"{self.settings.max_job_size}")
        return raw

    # -- looking -----------------------------------------------------------------------
    def peek(self, job_id: int) -> tuple[int, Any] | None:
        return self._found(self._one((Op.PEEK, CONN, job_id)))

    def peek_ready(self, tube: str = "default") -> tuple[int, Any] | None:
        return self._found(self._one((Op.PEEK_READY, CONN), tube))

    def peek_delayed(self, tube: str = "default") -> tuple[int, Any] | None:
        return self._found(self._one((Op.PEEK_DELAYED, CONN), tube))

    def peek_buried(self, tube: str = "default") -> tuple[int, Any] | None:
        return self._found(self._one((Op.PEEK_BURIED, CONN), tube))

    def _found(self, reply: tuple) -> tuple[int, Any] | None:
        if reply[1] == R.NOT_FOUND:
            return None
        _expect(reply, R.FOUND)
        return reply[2], self.codec.decode(reply[3])

    # -- changing ----------------------------------------------------------------------
    def delete(self, job_id: int) -> bool:
        return _found_or_not(self._one((Op.DELETE, CONN, job_id)), R.DELETED)

    def kick(self, bound: int, tube: str = "default") -> int:
        reply = self._one((Op.KICK, CONN, bound), tube)
        _expect(reply, R.KICKED)
        return reply[2]

    def kick_job(self, job_id: int) -> bool:
        return _found_or_not(self._one((Op.KICK_JOB, CONN, job_id)), R.KICKED_JOB)

    # -- stats -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        reply = self._one((Op.STATS, CONN))
        _expect(reply, R.STATS)
        return dict(reply[2])

    def stats_tube(self, name: str) -> dict[str, Any] | None:
        return self._stats_or_none(self._one((Op.STATS_TUBE, CONN, name)))

    def stats_job(self, job_id: int) -> dict[str, Any] | None:
        return self._stats_or_none(self._one((Op.STATS_JOB, CONN, job_id)))

    def _stats_or_none(self, reply: tuple) -> dict[str, Any] | None:
        if reply[1] == R.NOT_FOUND:
            return None
        _expect(reply, R.STATS)
        return dict(reply[2])

    def list_tubes(self) -> list[str]:
        reply = self._one((Op.LIST_TUBES, CONN))
        _expect(reply, R.LIST)
        return list(reply[2])

    # -- connection --------------------------------------------------------------------
    def close(self) -> None:
        """Say goodbye (the broker closes our session now, not after the heartbeat
        timeout) and drop the socket."""
        if self.sock is not None:
            if self.opened:
                try:
                    self.sock.send(encode(Batch([(Op.CLOSE, CONN)])), zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            self.sock.close(linger=GOODBYE_LINGER_MS)
            self.sock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _one(self, op: tuple, tube: str | None = None) -> tuple:
        return self._request([op], tube)[0]

    def _request(self, ops: list[tuple], tube: str | None = None) -> list[tuple]:
        """Send ops as one Batch (after OPEN / USE if needed); their replies, in order."""
        if tube is not None:
            tube_name(tube)
        for _ in range(_FENCED_RETRIES):
            self._connected()
            prefix: list[tuple] = [] if self.opened else [(Op.OPEN, CONN)]
            use = tube is not None and tube != self.using
            if use:
                prefix.append((Op.USE, CONN, tube))
            batch = prefix + ops
            self._send(Batch(batch))
            replies = self._receive(sum(op[0] not in SILENT_OPS for op in batch))
            if replies is None:           # fenced: nothing ran; start over and resend
                self._reset()
                continue
            self.opened = True
            if use:
                _expect(replies[0], R.USING)
                self.using, replies = tube, replies[1:]        # type: ignore[assignment]
            return replies
        raise ZstalkError("FENCED", "the broker keeps refusing this client")

    def _connected(self) -> None:
        """Say Hello until a broker welcomes us (module comment), within timeout_s."""
        if self.sock is not None:
            return
        deadline = time.monotonic() + self.timeout_s
        endpoint, several = self.endpoints[self.listed], len(self.endpoints) > 1
        asked_at = time.monotonic()         # (when `endpoint` was first asked)
        while True:
            wait = min(deadline, time.monotonic() + PEER_TIMEOUT_S) if several else deadline
            try:
                told = self._hello(endpoint, wait)
            except TimeoutError:
                if not several or time.monotonic() >= deadline:
                    raise
                told = None
            else:
                if told is None:
                    return
            if told is not None and told.leader and told.leader != endpoint:
                curve.check_local(told.leader, self.keys, "client")
                endpoint, asked_at = told.leader, time.monotonic()
                continue
            if time.monotonic() + NOT_LEADER_RETRY_S >= deadline:
                raise TimeoutError(f"no leader among the brokers at {self.broker} within "
                                   f"{self.timeout_s} s")
            # silent, or a standby that has known no leader for long: the next endpoint
            if told is None or several and time.monotonic() - asked_at > NOT_LEADER_STAY_S:
                self.listed = (self.listed + 1) % len(self.endpoints)
                endpoint, asked_at = self.endpoints[self.listed], time.monotonic()
            else:
                time.sleep(NOT_LEADER_RETRY_S)  # (a standby that knows no leader yet)

    def _hello(self, endpoint: str, deadline: float) -> NotLeader | None:
        """Hello to `endpoint`: None once welcomed (the socket kept), or a standby's
        NotLeader (the socket dropped); TimeoutError past `deadline`."""
        s = self.ctx.socket(zmq.DEALER)
        front_id = random.getrandbits(64) or 1
        s.setsockopt(zmq.IDENTITY, curve.identity(front_id, self.keys))
        if self.keys is not None:
            curve.secure_client(s, self.keys)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout_s * 1000)))
        s.connect(endpoint)
        self.sock, self.opened, self.using = s, False, "default"
        self._send(Hello(front_id, "client", os.getpid(), 0, []))
        while True:
            msg = self._next(deadline)
            if isinstance(msg, Welcome):
                self.settings = msg.settings
                return None
            if isinstance(msg, NotLeader):
                self._reset()
                return msg

    def _send(self, msg: Any) -> None:
        """Send, waiting up to timeout_s for a connection to queue on (ZeroMQ has none for
        a while after a failed handshake: a CURVE mismatch, a refused key)."""
        assert self.sock is not None
        try:
            self.sock.send(encode(msg))
        except zmq.Again:
            self._reset()
            raise TimeoutError(f"cannot send to the broker at {self.broker}: no connection "
                               f"within {self.timeout_s} s") from None

    def _receive(self, expected: int) -> list[tuple] | None:
        deadline = time.monotonic() + self.timeout_s
        items: list[tuple] = []
        while len(items) < expected:
            msg = self._next(deadline)
            if isinstance(msg, Replies):
                items.extend(msg.items)
            elif isinstance(msg, Fenced):
                return None
        return items

    def _next(self, deadline: float) -> Any:
        """The next schema message, or TimeoutError (the socket is then dropped)."""
        sock = self.sock
        assert sock is not None
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not sock.poll(remaining_ms):
                self._reset()
                raise TimeoutError(f"no answer from the broker at {self.broker} "
                                   f"within {self.timeout_s} s")
            try:
                return decode(sock.recv())
            except SchemaError:
                continue

    def _reset(self) -> None:
        self.close()
        self.opened = False


def _name(reply: tuple) -> str:
    try:
        return R.name(reply[1])
    except ValueError:
        return f"REPLY_{reply[1]}"


def _expect(reply: tuple, code: R) -> None:
    if reply[1] != code:
        raise ZstalkError(_name(reply))


def _found_or_not(reply: tuple, code: R) -> bool:
    if reply[1] == R.NOT_FOUND:
        return False
    _expect(reply, code)
    return True
