"""CurveZMQ on the ZeroMQ links: key files, the broker's list of admitted keys, and which
endpoints are local enough to go without.

Keys are zmq.auth certificate files: `zstalk keygen DIR NAME` writes `NAME.key` (the public
key, 0644) and `NAME.key_secret` (both keys, 0600).  Everything is configured through the
environment, so every role (broker, fronts, dispatchers, worker pools, producers) and a
Kubernetes Secret mounted as files take it the same way:

    ZSTALK_CURVE_KEY       this process's own .key_secret file
    ZSTALK_CURVE_CLIENTS   the broker: a directory of the public .key files it admits
                           (several per role: add the new key, move clients over, remove
                           the old one; SIGHUP makes the broker read the directory again)
    ZSTALK_CURVE_SERVER    a client: the broker's public .key file
    ZSTALK_INSECURE=1      allow a non-local endpoint without keys (a warning says so)
    ZSTALK_CURVE_ACCEPT    the broker: the hosts or networks (10.0.0.0/8,127.0.0.1) whose
                           TCP connections it takes at all; others are closed at accept,
                           before any handshake work (a refused CURVE handshake costs the
                           broker ~0.6 ms of CPU; a refused connection next to nothing)

The broker is the CURVE server; pyzmq's ThreadAuthenticator is its ZAP handler (RFC 27),
asking `Admitted` whether a client's public key is in the directory, which also logs the
refusals, rate-limited, with the key's fingerprint.  A client's ZeroMQ identity ends with
its key's fingerprint (`identity`), and the broker drops any message whose identity does
not match the key it came with: a peer with a valid key of its own still cannot speak as
another's front incarnation.  Without keys, `check_local` refuses every endpoint beyond
this host (ipc://, inproc:// and loopback TCP are local) unless insecure is allowed.
"""
from __future__ import annotations

import logging
import os
import time
from typing import NamedTuple

from ..ratelog import RateLog

log = logging.getLogger("zstalk.curve")

ENV_KEY, ENV_CLIENTS, ENV_SERVER, ENV_INSECURE, ENV_ACCEPT = (
    "ZSTALK_CURVE_KEY", "ZSTALK_CURVE_CLIENTS", "ZSTALK_CURVE_SERVER", "ZSTALK_INSECURE",
    "ZSTALK_CURVE_ACCEPT")
ZAP_DOMAIN = "zstalk"
FINGERPRINT_BYTES = 8
#: a refused host is logged at most this often (each line counts those not logged; at most
#: ratelog.REMEMBERED hosts are kept for that, beyond it the oldest are forgotten)
REFUSAL_LOG_S = 60.0
FROM_ENV = object()         # a `keys` argument's default: read them from the environment


class CurveError(Exception):
    """Keys that cannot be used (a missing or wrong file), or a non-local endpoint
    without keys: the message says which and what to do."""


class ServerKeys(NamedTuple):
    public: bytes
    secret: bytes
    clients: str            # the directory of admitted public keys


class ClientKeys(NamedTuple):
    public: bytes
    secret: bytes
    server: bytes           # the broker's public key


def keygen(directory: str, name: str) -> tuple[str, str]:
    """Write a key pair NAME.key (0644) and NAME.key_secret (0600) into `directory`."""
    import zmq.auth
    os.makedirs(directory, mode=0o700, exist_ok=True)
    public, secret = (os.path.join(directory, name + ext) for ext in (".key", ".key_secret"))
    for path in (public, secret):
        if os.path.exists(path):
            raise CurveError(f"{path} exists: keys are never overwritten (pick another name)")
    old = os.umask(0o077)               # the secret is never readable by others, not even
    try:                                # for the moment between writing it and chmod
        public, secret = zmq.auth.create_certificates(directory, name)
    finally:
        os.umask(old)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    return public, secret


def fingerprint(public: bytes) -> bytes:
    """A public key's short fingerprint (raw 32-byte or z85 40-byte keys alike)."""
    import hashlib
    return hashlib.sha256(_raw(public)).digest()[:FINGERPRINT_BYTES]


def identity(front_id: int, keys: ClientKeys | None) -> bytes:
    """A client's ZeroMQ identity: its incarnation, then (with keys) its key's fingerprint."""
    ident = front_id.to_bytes(8, "big")
    return ident + fingerprint(keys.public) if keys is not None else ident


def matches(peer: bytes, user_id: str | None) -> bool:
    """Whether a message's identity belongs to the key it was sent with (the ZAP User-Id:
    the z85 public key)."""
    return user_id is not None and peer[8:] == fingerprint(user_id.encode())


def _raw(key: bytes) -> bytes:
    if len(key) == 40:
        from zmq.utils import z85
        return z85.decode(key)
    return key


# -- loading ---------------------------------------------------------------------------------
def _pair(path: str) -> tuple[bytes, bytes]:
    import zmq.auth
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveError(f"{path}: not a key file ({exc}); make one with zstalk keygen") from None
    if secret is None:
        raise CurveError(f"{path} holds a public key only; give the .key_secret file")
    return public, secret


def _public(path: str) -> bytes:
    import zmq.auth
    try:
        return zmq.auth.load_certificate(path)[0]
    except (OSError, ValueError) as exc:
        raise CurveError(f"{path}: not a key file ({exc})") from None


def _both(env, other: str, whose: str, what: str) -> tuple[str, str] | None:
    """ZSTALK_CURVE_KEY and `other` from the environment: both, or neither (None)."""
    key, value = env.get(ENV_KEY), env.get(other)
    if not key and not value:
        return None
    if not (key and value):
        raise CurveError(f"CURVE needs both {ENV_KEY} ({whose} .key_secret) and {other} "
                         f"({what})")
    return key, value


def server_keys(env=os.environ) -> ServerKeys | None:
    """The broker's keys from the environment (None: no CURVE)."""
    found = _both(env, ENV_CLIENTS, "the broker's", "a directory of admitted public keys")
    if found is None:
        return None
    key, clients = found
    if not os.path.isdir(clients):
        raise CurveError(f"{ENV_CLIENTS}={clients} is not a directory")
    return ServerKeys(*_pair(key), clients)


def client_keys(env=os.environ) -> ClientKeys | None:
    """A client's keys from the environment (None: no CURVE)."""
    found = _both(env, ENV_SERVER, "this process's", "the broker's public .key")
    return None if found is None else ClientKeys(*_pair(found[0]), _public(found[1]))


def given_or_env(keys) -> ClientKeys | None:
    """A client's `keys` argument: the keys given (None: none), or FROM_ENV's."""
    return client_keys() if keys is FROM_ENV else keys


def accepted_networks(env=os.environ) -> tuple[str, ...]:
    """ZSTALK_CURVE_ACCEPT's hosts and networks, checked (CurveError names a bad one)."""
    import ipaddress
    out = []
    for entry in filter(None, (e.strip() for e in env.get(ENV_ACCEPT, "").split(","))):
        try:
            out.append(str(ipaddress.ip_network(entry, strict=False)))
        except ValueError:
            raise CurveError(f"{ENV_ACCEPT}: {entry!r} is not an IP address or network "
                             "(10.0.0.0/8, 127.0.0.1)") from None
    return tuple(out)


def accept_only(sock, networks: tuple[str, ...]) -> None:
    """TCP connections from other hosts are closed when accepted (ZMQ_TCP_ACCEPT_FILTER)."""
    import zmq
    for network in networks:
        sock.setsockopt(zmq.TCP_ACCEPT_FILTER, network.encode())


def insecure(env=os.environ) -> bool:
    return env.get(ENV_INSECURE, "") not in ("", "0")


# -- sockets ---------------------------------------------------------------------------------
def secure_server(sock, keys: ServerKeys) -> None:
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.zap_domain = ZAP_DOMAIN.encode()
    sock.curve_server = True


def secure_client(sock, keys: ClientKeys) -> None:
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server


class RefusalLog(RateLog):
    """Refused peers, logged once per host and reason per REFUSAL_LOG_S with the count of
    refusals since (a misconfigured peer reconnects every few hundred ms)."""

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__(log, REFUSAL_LOG_S, "refused")
        self.clock = clock

    def refused(self, host: str, text: str, why: str = "") -> None:
        self.say((host, why or text), self.clock(), "refused a peer from %s: %s", host, text)


class Admitted:
    """The ZAP handler's question: is this public key in the directory?  Refusals are
    logged with the key's fingerprint, once per host per REFUSAL_LOG_S."""

    def __init__(self, directory: str, refusals: RefusalLog | None = None) -> None:
        self.directory = directory
        self.keys: frozenset[bytes] = frozenset()
        self.refusals = refusals or RefusalLog()
        self.address = "?"              # the peer of the handshake being checked
        self.reload()

    def reload(self) -> int:
        """Read the directory again (SIGHUP): the number of keys admitted now."""
        import zmq.auth
        self.keys = frozenset(zmq.auth.load_certificates(self.directory))
        return len(self.keys)

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        self.refusals.refused(self.address, f"its CURVE key {fingerprint(key).hex()} is not "
                                            f"admitted (not in {self.directory})", "auth")
        return False


def start_authenticator(ctx, admitted: Admitted):
    """pyzmq's ZAP handler on its own thread, asking `admitted` (stop() it when done)."""
    from zmq.auth.thread import ThreadAuthenticator

    class Authenticator(ThreadAuthenticator):
        async def handle_zap_message(self, msg: list[bytes]) -> None:
            if len(msg) > 3:            # (requests are handled one at a time, in order)
                admitted.address = msg[3].decode("utf-8", "replace") or "?"
            await super().handle_zap_message(msg)

    auth = Authenticator(ctx, log=logging.getLogger("zstalk.zap"))
    auth.start()
    auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=admitted)
    return auth


# -- local or not ----------------------------------------------------------------------------
def is_local(endpoint: str) -> bool:
    """ipc://, inproc://, local: and loopback TCP stay on this host."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    import ipaddress
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False                    # a name or an interface (eth0, *): not loopback


def check_local(endpoint: str, keys, role: str, env=os.environ) -> None:
    """Refuse a non-local endpoint without keys unless insecure is allowed (then warn)."""
    if keys is not None or is_local(endpoint):
        return
    if insecure(env):
        log.warning("%s: %s without CURVE keys (%s=1): anyone who can reach it can speak "
                    "for any front", role, endpoint, ENV_INSECURE)
        return
    raise CurveError(
        f"{role}: {endpoint} is beyond this host and no CURVE keys are set: set "
        f"{ENV_KEY} and {'ZSTALK_CURVE_CLIENTS' if role == 'broker' else ENV_SERVER} "
        f"(zstalk keygen makes keys), or {ENV_INSECURE}=1 (--insecure) to go without")
