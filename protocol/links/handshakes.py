"""What a failed ZeroMQ handshake tells each side, read from the socket's monitor.

CURVE refusals are silent by design: a client with no keys, with a key the broker does not
admit, or with the wrong broker key simply never hears back.  ZeroMQ's socket monitor
(zmq_socket_monitor, libzmq 4.3) still sees each failure, so both sides can say why:

* the client (a front's, pool's or dispatcher's link, `HandshakeWatch` on its DEALER):
  HANDSHAKE_FAILED_PROTOCOL with ZMTP_MECHANISM_MISMATCH (one side uses CURVE and the
  other not), HANDSHAKE_FAILED_AUTH (the broker's ZAP handler did not admit the key),
  HANDSHAKE_FAILED_NO_DETAIL (the broker could not decrypt: ZSTALK_CURVE_SERVER is not
  its key).  `cause` turns the last one into the sentence the waiting link logs.
* the broker (its ROUTER, `Refusals`): every connection is ACCEPTED (the event's value is
  its descriptor: the peer's address is read then), may fail its handshake, and is
  DISCONNECTED (the same descriptor).  A failure belongs to the connection that goes away
  next: the engine that failed closes at once, so its DISCONNECTED follows its failure.
  Each host is logged at most once per curve.REFUSAL_LOG_S, with the count since.

The monitor is an inproc PAIR socket; its FD signals edges like any ZeroMQ socket's, so
its owner drains it (`events()`) when the FD wakes it and once right after watching it
(the broker, which needs each connection's address before it closes), or on a timer it
has anyway (the link, when it says it is waiting).

The monitor alone cannot always tell a keyless client why: both sides read each other's
greeting at once, and when the broker reads first and closes, the client's engine may see
only the connection go.  So a link that has no certain cause when it says it is waiting
asks the endpoint itself (`probe`): it connects, sends ZMTP 3's signature and major
version, and reads the 64-byte greeting a ZeroMQ peer then sends (RFC 23, ZMTP 3.0; libzmq's
zmtp_engine sends the rest of its greeting once it has read those 11 bytes), which names
the peer's mechanism (`mechanism`), and closes before sending its own.  What the probe
found becomes the sentence (`probed_cause`): a mechanism mismatch either way, nothing
listening, no answer, a peer that closed at once (outside ZSTALK_CURVE_ACCEPT), or one
that does not speak ZeroMQ.  The broker sees a peer gone mid-handshake, which it does not
log.
"""
from __future__ import annotations

import asyncio
import os
import socket

import zmq

from ..network.curve import ENV_ACCEPT, ENV_CLIENTS, ENV_KEY, ENV_SERVER, RefusalLog

_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH


class HandshakeWatch:
    """The monitor of one socket: `events()` gives (event, value) pairs as they come."""

    def __init__(self, sock: zmq.Socket, events: int = _FAILED) -> None:
        self.mon = sock.get_monitor_socket(events)
        self.sock = sock
        self.fd = self.mon.getsockopt(zmq.FD)     # edge-signalled: drain after each wake

    def events(self) -> list[tuple[int, int]]:
        got = []
        while self.mon.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:       # (the monitored socket went away meanwhile)
                break
            event, value = int.from_bytes(frames[0][:2], "little"), int.from_bytes(
                frames[0][2:6], "little")
            got.append((event, value))
        return got

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass                    # the socket is closing already
        self.mon.close(linger=0)


def cause(event: int, value: int, has_keys: bool) -> tuple[str, bool] | None:
    """Why the broker did not welcome a client whose handshake failed so, and what to fix;
    with whether that is certain (a mechanism mismatch, a refused key) or a likely guess
    (a handshake cut short: a broker that could not decrypt it closes at once, but so does
    one whose client was refused for another reason before the refusal arrived)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MISMATCH:
        if has_keys:
            return (f"this process has CURVE keys ({ENV_KEY}, {ENV_SERVER}) and the broker "
                    f"uses none: give the broker its keys, or this process none"), True
        return (f"the broker uses CURVE and this process has no keys: set {ENV_KEY} (this "
                f"process's .key_secret) and {ENV_SERVER} (the broker's public .key)"), True
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"the broker does not admit this process's public key: copy its .key into "
                f"the broker's {ENV_CLIENTS} directory (then SIGHUP the broker)"), True
    if event & _FAILED and has_keys:
        return (f"the CURVE handshake failed: {ENV_SERVER} is likely not the broker's "
                f"public key"), False
    return None


#: what a probe sends: ZMTP 3's signature (0xFF, 8 bytes of a ZMTP 1.0 length, 0x7F) and its
#: major version; a ZeroMQ peer answers with its whole 64-byte greeting
PROBE = b"\xff" + (1).to_bytes(8, "big") + b"\x7f\x03"
GREETING_BYTES = 64
PROBE_TIMEOUT_S = 1.0
#: what a probe can find, beside a mechanism's name ("NULL", "CURVE", ...)
REFUSED, NO_ANSWER, CLOSED, NOT_ZMTP = "refused", "no answer", "closed", "not ZeroMQ"


def mechanism(greeting: bytes) -> str | None:
    """The security mechanism a ZMTP 3 greeting names, or None for bytes that are not the
    start of one (RFC 23: signature, version, then the mechanism's name, NUL-padded to 20)."""
    if (len(greeting) < 32 or greeting[0] != 0xFF or greeting[9] != 0x7F
            or greeting[10] < 3):
        return None
    return greeting[12:32].rstrip(b"\0").decode("ascii", "replace")


async def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """What answers at a tcp:// or ipc:// endpoint: the mechanism its ZMTP greeting names,
    or REFUSED, NO_ANSWER, CLOSED or NOT_ZMTP; None for an endpoint it cannot try."""
    scheme, _, where = endpoint.partition("://")
    try:
        if scheme == "tcp":
            host, _, port = where.rpartition(":")
            opening = asyncio.open_connection(host.strip("[]"), int(port))
        elif scheme == "ipc":
            opening = asyncio.open_unix_connection(where)
        else:
            return None
        reader, writer = await asyncio.wait_for(opening, timeout_s)
    except (ConnectionRefusedError, FileNotFoundError):
        return REFUSED
    except (asyncio.TimeoutError, OSError, ValueError):
        return NO_ANSWER
    try:
        writer.write(PROBE)
        got = await asyncio.wait_for(reader.readexactly(GREETING_BYTES), timeout_s)
    except asyncio.IncompleteReadError as exc:
        got = exc.partial
        if not got:
            return CLOSED
    except asyncio.TimeoutError:
        return NO_ANSWER
    except OSError:
        return CLOSED
    finally:
        writer.close()
    return mechanism(got) or NOT_ZMTP


def probed_cause(found: str | None, has_keys: bool, guess: str | None = None) -> str | None:
    """Why a client is not welcomed, from what `probe` found: a finding that settles it
    first, then `guess` (the monitor's uncertain cause), then what the mechanism says."""
    if found == "CURVE" and not has_keys or found == "NULL" and has_keys:
        return cause(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, _MISMATCH, has_keys)[0]
    settled = {
        REFUSED: "nothing listens there (connection refused): is the broker running, and "
                 "bound to that address and port?",
        NO_ANSWER: f"no answer from there within {PROBE_TIMEOUT_S:.0f} s: the host is down or "
                   "unreachable, or a firewall drops the connection",
        CLOSED: "it closed the connection before greeting: this host is likely outside the "
                f"broker's {ENV_ACCEPT} networks",
        NOT_ZMTP: "what answers there does not speak ZeroMQ: give the broker's worker "
                  "endpoint (its --bind or --worker-bind), not a client port",
    }.get(found)
    if settled is not None or guess is not None:
        return settled or guess
    if found == "CURVE":
        return (f"the broker uses CURVE as this process does: it does not admit this process's "
                f"key ({ENV_CLIENTS}), or {ENV_SERVER} is not its public key")
    if found == "NULL":
        return ("a ZeroMQ peer without CURVE answers there but has not welcomed this process: a "
                "broker too busy to answer, one of a schema this process does not speak (its "
                "log says), or another ZeroMQ service")
    return None


def unwelcomed(endpoint: str, seconds: float, last_cause: str | None) -> str:
    """The line a link logs while no broker has welcomed it."""
    why = last_cause or (
        "the broker is not running or not reachable there; or, with CURVE, this process "
        f"has no key ({ENV_KEY}), a key the broker does not admit ({ENV_CLIENTS}), or "
        f"the wrong broker key ({ENV_SERVER})")
    return f"the broker at {endpoint} has not welcomed this process for {seconds:.0f} s: {why}"


class Refusals:
    """The broker's side: connections whose handshake failed, by host (curve.RefusalLog).
    A key the ZAP handler refused is logged there, with its fingerprint (curve.Admitted)."""

    def __init__(self, said: RefusalLog) -> None:
        self.said = said
        self.open: dict[int, str] = {}          # descriptor -> peer host
        self.failed: list[str | None] = []      # failures waiting for their DISCONNECTED

    def on_event(self, event: int, value: int) -> None:
        if event == zmq.EVENT_ACCEPTED:
            self.open[value] = _peer(value)
        elif event & _FAILED and event != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.failed.append(_reason(event, value))
        elif event == zmq.EVENT_DISCONNECTED:
            host = self.open.pop(value, None) or UNKNOWN
            text = self.failed.pop(0) if self.failed else None
            if text is not None:
                self.said.refused(host, text, text)


def _reason(event: int, value: int) -> str | None:
    """What a failure says of the peer; None for one that says nothing (a peer that went
    away mid-handshake)."""
    if event != zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return None
    if value == _MISMATCH:
        return "it has no CURVE keys (or this broker has none and it has)"
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "its CURVE handshake could not be decrypted: its broker key is not this broker's"
    return None


#: a peer whose connection closed before its address could be read (it retries, so its
#: address is usually read on a later attempt)
UNKNOWN = "an address gone before it could be read"


def _peer(fd: int) -> str | None:
    """The peer host of a descriptor the monitor just reported (None once it is gone)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return str(sock.getpeername()[0])
    except (OSError, ValueError, TypeError, IndexError):
        return None
