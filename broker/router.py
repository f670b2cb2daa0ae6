"""The ROUTER socket peers reach a broker on, made in one place for the broker actor
(actor.py) and a standby's door (standby.py), whose socket the actor adopts at takeover.

Its options are the actor's contract with the links (protocol/schema/messages.py):
ROUTER_MANDATORY, so a reply to a peer that has gone raises instead of vanishing;
unlimited high-water marks (credit bounds the queues); no linger; with CURVE no
ROUTER_HANDOVER (a peer with a valid key of its own must not take over another's
identity), the ZAP handler admitting ZSTALK_CURVE_CLIENTS' keys, and TCP taken only from
ZSTALK_CURVE_ACCEPT's networks.  zmq is imported only when one is made.
"""
from __future__ import annotations

import logging
import os
from typing import NamedTuple

from ..protocol.network import curve

log = logging.getLogger("zstalk.broker")


class BindError(Exception):
    """An endpoint the broker cannot bind (in use, bad address): exit 111."""


class Router(NamedTuple):
    """The broker's ROUTER socket, and with CURVE its admitted keys and ZAP handler."""
    sock: object
    admitted: curve.Admitted | None
    auth: object


def open_router(ctx, keys) -> Router:
    """The ROUTER peers reach a broker on (or a standby's door, standby.py, which the
    broker adopts at takeover): ROUTER_MANDATORY (messages.py: no silent drops),
    unlimited HWMs, ZSTALK_CURVE_ACCEPT's networks, CURVE with `keys`."""
    import zmq
    sock = ctx.socket(zmq.ROUTER)
    handover = 0 if keys is not None else 1
    for opt, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.ROUTER_HANDOVER, handover),
                       (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0)):
        sock.setsockopt(opt, value)
    networks = curve.accepted_networks()
    if networks:
        curve.accept_only(sock, networks)
        log.info("TCP connections taken from %s only", ", ".join(networks))
    admitted = auth = None
    if keys is not None:
        admitted = curve.Admitted(keys.clients, curve.RefusalLog())
        auth = curve.start_authenticator(ctx, admitted)
        curve.secure_server(sock, keys)
        log.info("CURVE on: %d client keys admitted from %s", len(admitted.keys),
                 keys.clients)
    return Router(sock, admitted, auth)


def bind_router(sock, endpoint: str, keys) -> str:
    """Bind one more endpoint: the address bound (a port 0 chosen), or BindError."""
    import zmq
    curve.check_local(endpoint, keys, "broker")
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise BindError(f"{endpoint}: {os.strerror(exc.errno)}") from exc
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
