"""Call signatures: a function host can refuse calls that do not come from the queue, and
replays of old ones (issue 13, "Dispatcher").

Every call the dispatcher makes with a signing key carries

    X-Zstalk-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>

where the MAC is over `f"{t}.{task_id}.".encode() + body` under a secret shared by the
dispatchers and the function hosts (the shape of Stripe's webhook signatures).  The
timestamp is inside the MAC, so it cannot be moved; `verify` checks the MAC first and
only then trusts the timestamp, refusing one more than `window_s` away from its clock
in either direction.  So a captured call replays only within the window (5 min by
default); a function that must run once per task deduplicates on X-Zstalk-Task-Id too.

The secret never travels over the wire: each process reads its own (`signing_key`) from
ZSTALK_SIGNING_KEY or from the file ZSTALK_SIGNING_KEY_FILE names (a mounted secret).

Errors are data: `verify` answers None for a good signature, else one of the reasons
below.  A header may hold several v1 entries (one per key while keys rotate): one
match is enough; entries other than t and v1 are ignored, for later schemes.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from typing import NamedTuple

from ..protocol.transport.secret import read_secret_file

HEADER = "X-Zstalk-Signature"
#: the call's other headers between a dispatcher and the Functions helper (cloud.py): the
#: dispatcher asks for a failure's type and message when the broker's task info is private
#: ([api] private_results), and the helper answers one there
EXPOSE_HEADER = "X-Zstalk-Expose-Errors"
ERROR_HEADER = "X-Zstalk-Error"
ERROR_CHARS = 1024          # what of an exception's type and message may travel
ENV_KEY = "ZSTALK_SIGNING_KEY"
ENV_KEY_FILE = "ZSTALK_SIGNING_KEY_FILE"
WINDOW_S = 300

#: why `verify` refused a signature
MISSING = "missing signature"
MALFORMED = "malformed signature"
BAD_SIGNATURE = "bad signature"
TOO_OLD = "signature too old"
TOO_NEW = "signature too far in the future"

_HEX = frozenset("0123456789abcdef")


class Signature(NamedTuple):
    """A parsed header: its timestamp and its v1 MACs (lowercase hex)."""
    t: int
    v1: list[str]


def mac(secret: bytes, t: int, task_id: str, body: bytes) -> str:
    """The v1 MAC of a call made at `t` (unix seconds), as lowercase hex."""
    message = f"{t}.{task_id}.".encode() + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, task_id: str, body: bytes, now: float) -> str:
    """The X-Zstalk-Signature value for a call of task `task_id` with `body`, at `now`."""
    t = int(now)
    return f"t={t},v1={mac(secret, t, task_id, body)}"


def verify(secret: bytes, header: str | None, task_id: str, body: bytes, now: float,
           window_s: float = WINDOW_S) -> str | None:
    """None when `header` signs this call and is within `window_s` of `now`, else why not."""
    if not header:
        return MISSING
    signature = parse(header)
    if signature is None:
        return MALFORMED
    try:
        expected = mac(secret, signature.t, task_id, body)
    except UnicodeEncodeError:  # a header byte that is not UTF-8 (aiohttp: a surrogate):
        return BAD_SIGNATURE    # no signer sent that text
    if not any(hmac.compare_digest(expected, got) for got in signature.v1):
        return BAD_SIGNATURE
    if now - signature.t > window_s:
        return TOO_OLD
    if signature.t - now > window_s:
        return TOO_NEW
    return None


def parse(header: str) -> Signature | None:
    """`t=<digits>,v1=<64 hex>[,v1=...]`, or None when it is not that."""
    t, v1 = None, []
    for part in header.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq:
            return None
        if name == "t":
            if t is not None or not (value.isascii() and value.isdigit()) or len(value) > 15:
                return None
            t = int(value)
        elif name == "v1":
            value = value.lower()
            if len(value) != 64 or not _HEX.issuperset(value):
                return None
            v1.append(value)
    return Signature(t, v1) if t is not None and v1 else None


def signing_key(value: str | bytes | None = None) -> bytes | None:
    """The secret: `value` if given, else $ZSTALK_SIGNING_KEY, else the contents of the file
    $ZSTALK_SIGNING_KEY_FILE names (less one trailing newline,
    protocol/transport/secret.py), else None (calls go unsigned).

    An empty variable counts as unset; an explicit empty value, or a key file that is
    empty or cannot be read, is an error: running unsigned by mistake is worse."""
    if value is not None:
        return _nonempty(value.encode() if isinstance(value, str) else bytes(value),
                         "the signing key")
    from_env = os.environ.get(ENV_KEY)
    if from_env:
        return from_env.encode()
    path = os.environ.get(ENV_KEY_FILE)
    if path:
        return read_secret_file(path, ENV_KEY_FILE)
    return None


def _nonempty(key: bytes, what: str) -> bytes:
    if not key:
        raise ValueError(f"{what} is empty")
    return key
