"""Ports as the `zstalk` roles take them: 0 to 65535, or exit 2 with click's message
naming the flag (and, in an address, the address and its port).

Below us everything wraps a port silently: getaddrinfo takes the port as a string and
keeps its low 16 bits (`-p 99999` would listen on 34463, and the start line would say
34463), and so does ZeroMQ (`tcp://127.0.0.1:99999` binds, or connects to, 34463).  So
each port option is an IntRange, and each address or ZeroMQ endpoint that can carry a
port is checked here before anything is bound.

`zstalkd` keeps the wrap: beanstalkd has it (its -p goes to getaddrinfo as a string),
and the drop-in behaves as the server it replaces (broker/run/dropin.py).
"""
from __future__ import annotations

import click

from ...protocol.network.listen import parse_listen

PORT = click.IntRange(0, 65535)
_RANGE = "0<=x<=65535"      # (click's own wording of an IntRange)


class ListenAddress(click.ParamType):
    """HOST, HOST:PORT, [V6]:PORT or unix:/path, as listen.parse_listen reads it."""
    name = "address"

    def convert(self, value, param, ctx):
        try:
            _, _, port = parse_listen(value, 0)
        except ValueError:
            self.fail(f"{value}: the port is not a number.", param, ctx)
        if not 0 <= port <= 65535:
            self.fail(f"{value}: the port {port} is not in the range {_RANGE}.", param, ctx)
        return value


class Endpoint(click.ParamType):
    """A ZeroMQ endpoint; a tcp:// one's port (each side of a `source;remote` pair) is a
    number in range, or `*` (any free port).  `bare`: HOST:PORT means tcp://HOST:PORT
    and 'none' means no endpoint (--worker-bind)."""
    name = "endpoint"

    def __init__(self, bare: bool = False) -> None:
        self.bare = bare

    def convert(self, value, param, ctx):
        spec = value.strip()
        if self.bare and spec.lower() in ("", "none"):
            return value
        if self.bare and "://" not in spec:
            spec = f"tcp://{spec}"
        scheme, _, rest = spec.partition("://")
        if scheme != "tcp":
            return value            # ipc://, inproc://: no port (ZeroMQ checks the rest)
        for side in rest.split(";"):
            port = side.rpartition(":")[2]
            if port == "*":
                continue
            if not port.isdigit():
                self.fail(f"{value}: the port {port!r} is not a number.", param, ctx)
            if int(port) > 65535:
                self.fail(f"{value}: the port {port} is not in the range {_RANGE}.", param, ctx)
        return value


class Endpoints(Endpoint):
    """`--broker`: one endpoint, or a comma-separated list of them (the instances of one
    journal, tried in turn: protocol/links/zeromq.py); each checked as Endpoint."""
    name = "endpoints"

    def convert(self, value, param, ctx):
        parts = [part.strip() for part in value.split(",")]
        if not all(parts):
            self.fail(f"{value}: an empty endpoint in the list.", param, ctx)
        for part in parts:
            super().convert(part, param, ctx)
        return ",".join(parts)
