"""Who a request is: the master key, the read-only viewer key, or nobody (issue 50's Safety).

    Authorization: Bearer <master key | viewer key>
    Cookie: zstalk_ui=<role>.<expires>.<signature>      what POST /ui/login hands out

How it works: pure functions of the headers, the keys and the clock (no aiohttp here; the
front hands in `request.headers` and `time.time()`).  `Keys.who` answers MASTER, VIEWER or
NOBODY, or the Problem of a wrong key (403).  The dashboard's cookie (`Keys.cookie`) names
its role and when it ends, signed with HMAC-SHA256 under a key derived from the master key
and the key the role logged in with (`_signing_key`): every front given the same keys
accepts a cookie any of them made, and rotating the master key (or the viewer key, for
viewers) makes every cookie made before it worthless, so rotating logs everyone out.  The
cookie is HttpOnly and SameSite=Strict, and an action (any method but GET and HEAD) that
comes with the cookie and not a bearer key also needs the header X-Zstalk-Action: 1,
which no form and no cross-site request without a CORS preflight can carry: a page
elsewhere cannot act with an operator's cookie.  A bearer key works as it always did.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from http.cookies import SimpleCookie
from typing import Mapping, NamedTuple

from .api import Problem, refuse

MASTER, VIEWER, NOBODY = "master", "viewer", "nobody"
COOKIE = "zstalk_ui"
ACTION_HEADER = "X-Zstalk-Action"
COOKIE_TTL_S = 12 * 3600
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
VIEWER_KEY_FILE_ENV = "ZSTALK_VIEWER_KEY_FILE"  # (cli.py's --viewer-key-file sets it)
WRONG_KEY = refuse(403, "wrong master key")
NO_ACTION_HEADER = refuse(403, f"an action with the dashboard's cookie also needs the "
                               f"header {ACTION_HEADER}: 1")


#: paths a keyless front answers only to a loopback peer that names no proxy (the dashboard)
KEYLESS_LOCAL = ("/ui", "/v1/dashboard")
FORWARDING = ("X-Forwarded-For", "Forwarded", "X-Real-IP")


def keyless_refusal(master: bytes | None, remote: str | None,
                    headers: Mapping[str, str]) -> Problem | None:
    """Without a master key the dashboard is this machine's: its peer must be loopback (or
    a unix socket: no address), and a request that says a proxy forwarded it is refused,
    as a proxy on this host may be forwarding anyone."""
    if master is not None:
        return None
    if any(name in headers for name in FORWARDING):
        return refuse(403, "without a master key the dashboard answers no forwarded "
                           "request (X-Forwarded-For, Forwarded)")
    if remote and not _loopback(remote):
        return refuse(403, "without a master key the dashboard answers loopback only")
    return None


def _loopback(address: str) -> bool:
    import ipaddress
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)       # (::ffff:127.0.0.1)
    return (mapped or ip).is_loopback


def viewer_from_env() -> bytes | None:
    """The viewer key from the file ZSTALK_VIEWER_KEY_FILE names (None: no such variable;
    the command that set it checked the file)."""
    path = os.environ.get(VIEWER_KEY_FILE_ENV)
    if not path:
        return None
    from ...network.secret import read_secret_file
    return read_secret_file(path, f"--viewer-key-file ({VIEWER_KEY_FILE_ENV})")


class Keys(NamedTuple):
    """The master key and the viewer key (bytes; None: not configured)."""
    master: bytes | None = None
    viewer: bytes | None = None

    def who(self, method: str, headers: Mapping[str, str], now: float) -> str | Problem:
        """MASTER, VIEWER or NOBODY for this request; a wrong bearer key: 403.  Without a
        master key everyone is MASTER (the front answers loopback only then)."""
        if self.master is None:
            return MASTER
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            shown = token.strip().encode("utf-8", "surrogatepass")
            if hmac.compare_digest(shown, self.master):
                return MASTER
            if self.viewer is not None and hmac.compare_digest(shown, self.viewer):
                return VIEWER
            return WRONG_KEY
        role = self.cookie_role(headers.get("Cookie", ""), now)
        if role == MASTER and method not in SAFE_METHODS and headers.get(ACTION_HEADER) != "1":
            return NO_ACTION_HEADER
        return role

    # -- the cookie ----------------------------------------------------------------------
    def login(self, key: str) -> str | None:
        """The role this key logs in as, or None (not one of the keys)."""
        shown = key.encode("utf-8", "surrogatepass")
        if self.master is not None and hmac.compare_digest(shown, self.master):
            return MASTER
        if self.viewer is not None and hmac.compare_digest(shown, self.viewer):
            return VIEWER
        return None

    def cookie(self, role: str, now: float) -> str:
        """The cookie's value for `role`, good for COOKIE_TTL_S from `now`."""
        body = f"{role}.{int(now) + COOKIE_TTL_S}"
        return f"{body}.{self._sign(role, body)}"

    def cookie_role(self, header: str, now: float) -> str:
        """The role a Cookie header's zstalk_ui proves (NOBODY: none, forged, old)."""
        try:
            morsel = SimpleCookie(header).get(COOKIE)
        except Exception:               # (http.cookies raises CookieError on odd headers)
            return NOBODY
        if morsel is None or self.master is None:
            return NOBODY
        role, _, rest = morsel.value.partition(".")
        expires, _, signature = rest.partition(".")
        if role not in (MASTER, VIEWER) or not (expires.isascii() and expires.isdigit()):
            return NOBODY
        if int(expires) <= now or (role == VIEWER and self.viewer is None):
            return NOBODY
        good = self._sign(role, f"{role}.{expires}")
        return role if hmac.compare_digest(good.encode(), signature.encode()) else NOBODY

    def _sign(self, role: str, body: str) -> str:
        mac = hmac.new(self._signing_key(role), body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def _signing_key(self, role: str) -> bytes:
        """HMAC(master key, label, role, SHA-256 of the role's key): a new master key or
        a new viewer key (for viewers) signs differently."""
        assert self.master is not None
        own = self.master if role == MASTER else (self.viewer or b"")
        label = b"zstalk ui cookie 1\0" + role.encode() + b"\0" + hashlib.sha256(own).digest()
        return hmac.new(self.master, label, hashlib.sha256).digest()
