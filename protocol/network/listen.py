"""Listening sockets for fronts: TCP, unix paths, systemd socket activation, and TLS.

The supervisor binds the client-facing socket itself and hands the descriptor to every
front process it starts, so `--fronts N` share one accept queue, a second server on the
same port fails with "Address already in use" as beanstalkd does (no SO_REUSEPORT
sharing with strangers), and systemd's LISTEN_FDS sockets slot into the same path.
"""
import os
import socket
import stat
from typing import NamedTuple

SD_LISTEN_FDS_START = 3
BACKLOG = 1024


def parse_listen(spec: str, default_port: int) -> tuple[str, str | None, int]:
    """'unix:/path' -> ('unix', path, 0); 'HOST:PORT' or 'HOST' -> ('tcp', host, port)."""
    if spec.startswith("unix:"):
        return ("unix", spec[len("unix:"):], 0)
    host, port = spec, default_port
    if spec.count(":") == 1:
        host, _, p = spec.partition(":")
        port = int(p)
    elif spec.startswith("[") and "]:" in spec:
        host, _, p = spec[1:].partition("]:")
        port = int(p)
    return ("tcp", host.strip("[]") or None, port)


def describe_listen(spec: str, default_port: int) -> str:
    """Where `spec` listens, with its port: '127.0.0.1:11300', '[::1]:11300', 'unix:/p'."""
    kind, host, port = parse_listen(spec, default_port)
    if kind == "unix":
        return spec
    host = host or "0.0.0.0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_tcp(host: str | None, port: int, listen: bool = True) -> socket.socket:
    """A TCP socket bound to HOST:PORT, listening unless told not to (a standby's client
    ports: bound, so a busy port fails at start, but connections are refused until it
    leads; asyncio's create_server listens then)."""
    if host is not None and host.isascii():
        host = host.encode()    # (a str host costs an import of the idna codec at start-up)
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                               socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        if listen:
            sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def bind_unix(path: str, listen: bool = True) -> socket.socket:
    """Bind a unix socket, removing a stale socket file left by a dead server."""
    try:
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        if listen:
            sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def bind_listen(spec: str, default_port: int, listen: bool = True) -> socket.socket:
    kind, where, port = parse_listen(spec, default_port)
    return bind_unix(where, listen) if kind == "unix" else bind_tcp(where, port, listen)


def systemd_sockets() -> list[socket.socket]:
    """Sockets passed by systemd socket activation (sd_listen_fds), if any are for us."""
    try:
        if int(os.environ.get("LISTEN_PID", "0")) != os.getpid():
            return []
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)
    return [socket.socket(fileno=fd) for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count)]


def is_loopback(sock: socket.socket) -> bool:
    """A unix socket, or a TCP socket bound to a loopback address (127.0.0.0/8, ::1)."""
    import ipaddress
    if sock.family == socket.AF_UNIX:
        return True
    return ipaddress.ip_address(sock.getsockname()[0]).is_loopback


class HttpLimits(NamedTuple):
    """What the HTTP front allows a client (protocol/fronts/http/site.py enforces it)."""
    header_timeout_s: float = 10.0  # a request's headers, from connect or the last response
    body_timeout_s: float = 30.0    # its body, from the end of its headers
    max_connections: int = 1000     # 0: no limit; event streams are apart (max_streams)
    max_streams: int = 10_000       # event streams (protocol/fronts/http/streams.py); 0: as
                                    # many as the open files allow


class HealthOptions(NamedTuple):
    """--health-port, --health-listen, --health-stall-s (protocol/network/health.py; port
    0: none), and what its /metrics needs: the bearer token of --metrics-token-file (None:
    open) and --metrics-top (how many tube and function names may be labels)."""
    port: int = 0
    host: str = "0.0.0.0"
    stall_s: float = 60.0
    metrics_token: str | None = None
    metrics_top: int = 100
    metrics_token_file: str | None = None   # (where the token came from: passed to children)


class TlsError(Exception):
    """A --tls-cert / --tls-key that cannot be used; the message names the file."""


def tls_context(cert: str, key: str):
    """A server ssl.SSLContext (TLS 1.2 and later) with the chain in `cert` (PEM, the
    server's certificate first) and its private key in `key` (PEM, unencrypted: a front
    started by a supervisor has nobody to ask for a passphrase).  Raises TlsError."""
    import ssl
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise TlsError(f"{flag} {path}: {exc.strerror}") from None
    try:        # a file with no certificate in it is the cert's fault, not the key's
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except ssl.SSLError:
        raise TlsError(f"--tls-cert {cert}: no PEM certificate in it") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2

    def no_passphrase():
        raise TlsError(f"--tls-key {key} is encrypted; give it unencrypted")
    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"--tls-key {key} is not the key of the certificate in "
                           f"{cert}") from None
        raise TlsError(f"--tls-key {key}: no PEM private key in it") from None
    return context
