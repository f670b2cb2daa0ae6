"""What zstalk signs and how a server checks it: call signatures, so a function host can
refuse calls that do not come from the queue and replays of old ones (issue 13,
"Dispatcher"); and, at the end, the waiting room's passes, checked where the protected
API runs.

Every call the dispatcher makes with a signing key carries

    X-Zstalk-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>,v2=<hex HMAC-SHA256>

two MACs under a secret shared by the dispatchers and the function hosts (the shape of
Stripe's webhook signatures), over

    v1  f"{t}.{task_id}.".encode() + body
    v2  f"v2\n{t}\n{task_id}\n{method}\n{path}\n{query}\n".encode() + body

where `method` is the request's, uppercase as sent; `path` its raw path exactly as on
the request line (percent-encoded, without the query); `query` its raw query string
without the `?` ("" for none).  v2 covers the request line because a task may carry its
own method, path and query (issue 28: `GET /fn/report/daily?day=2026-11-26`): under v1
alone a captured call could be sent again, within the window, to another path or with
another query or method.  Newlines separate the fields unambiguously: the broker refuses
CR and LF in paths, and a query is URL-encoded.

The timestamp is inside both MACs, so it cannot be moved; `verify` checks a MAC first and
only then trusts the timestamp, refusing one more than `window_s` away from its clock in
either direction.  So a captured call replays only within the window (5 min by
default); a function that must run once per task deduplicates on X-Zstalk-Task-Id too.

v1 stays so that hosts that check only v1 (Functions before v2, checks written by hand)
keep verifying.  `verify` checks v2 when it is given the request's method and the header
has v2 entries, else v1, so a dispatcher that signs only v1 is still accepted; which
means that until hosts refuse v1-only headers, a header with its v2 entries cut off
still passes as v1: v2 holds against a mistaken address, not yet against an attacker.
A function host behind a proxy that rewrites paths (or queries) sees a request line
other than the one signed, cannot check v2, and must verify v1 only (pass no method).

The secret never travels over the wire: each process reads its own (`signing_key`) from
ZSTALK_SIGNING_KEY or from the file ZSTALK_SIGNING_KEY_FILE names (a mounted secret).

Errors are data: `verify` answers None for a good signature, else one of the reasons
below.  A header may hold several v1 and v2 entries (one per key while keys rotate): one
match is enough; entries other than t, v1 and v2 are ignored, for later schemes.

Passes.  A waiting room's pass is checked where the protected API runs (issue 31),
offline: no call to zstalk, only the signature, the expiry and the function.  A pass of
a task that was done or cancelled still verifies here until it expires (at most the
function's `pass_ttl`); zstalk's GET /v1/passes/verify also refuses those.

`verify_pass(token, keys, function=None, now=None)` returns the task id or raises
PassError, whose `reason` is malformed, unknown_kid, forged, expired or wrong_function
(the codec, protocol/codecs/passes.py, says in which order and why).  `keys` is a
PassKeys, a mapping kid -> key (bytes or text) in signing order, or the path of the key
file the fronts read (`kid:key` lines).  A path is read again whenever the file changes
(its inode, size or mtime: a Kubernetes Secret is updated by swapping a symlink), so a
key rotation needs no restart.  A gateway in ten lines of plain Python (WSGI):

    from zstalk.workers import PassError, verify_pass

    def passes_only(app, key_file, function):
        def gateway(environ, start_response):
            token = environ.get("HTTP_X_ZSTALK_PASS", "")
            try:
                environ["zstalk.task_id"] = verify_pass(token, key_file, function)
            except PassError as refused:
                start_response("403 Forbidden", [("Content-Type", "text/plain")])
                return [refused.reason.encode()]
            return app(environ, start_response)
        return gateway
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import Mapping, NamedTuple

from ..protocol.codecs.passes import check_pass
from ..protocol.network.pass_keys import KeysLike, as_pass_keys
from ..protocol.network.secret import read_secret_file

HEADER = "X-Zstalk-Signature"
#: the call's other headers between a dispatcher and the Functions helper (cloud.py): the
#: dispatcher asks for a failure's type and message when the broker's task info is private
#: ([api] private_results), and the helper answers one there
EXPOSE_HEADER = "X-Zstalk-Expose-Errors"
ERROR_HEADER = "X-Zstalk-Error"
FUNCTION_ERROR_CHARS = 1024     # what of an exception's type and message may travel
ENV_KEY = "ZSTALK_SIGNING_KEY"
ENV_KEY_FILE = "ZSTALK_SIGNING_KEY_FILE"
WINDOW_S = 300

#: why `verify` refused a signature
MISSING = "missing signature"
MALFORMED = "malformed signature"
BAD_SIGNATURE = "bad signature"
TOO_OLD = "signature too old"
TOO_NEW = "signature too far in the future"
NO_V2 = "signature without v2"

_HEX = frozenset("0123456789abcdef")


class Signature(NamedTuple):
    """A parsed header: its timestamp and its v1 and v2 MACs (lowercase hex)."""
    t: int
    v1: list[str]
    v2: list[str] = []      # (shared default: parse always gives its own list)


def mac(secret: bytes, t: int, task_id: str, body: bytes) -> str:
    """The v1 MAC of a call made at `t` (unix seconds), as lowercase hex."""
    message = f"{t}.{task_id}.".encode() + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def mac_v2(secret: bytes, t: int, task_id: str, method: str, path: str, query: str,
           body: bytes) -> str:
    """The v2 MAC of a call made at `t`: its request line too (raw path and query)."""
    message = f"v2\n{t}\n{task_id}\n{method}\n{path}\n{query}\n".encode() + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, task_id: str, body: bytes, now: float, method: str = "POST",
         path: str = "", query: str = "") -> str:
    """The X-Zstalk-Signature value for a call of task `task_id` with `body`, at `now`,
    sent as `method path?query`.  Without a path, v1 only: a request line always has
    one, so a v2 over none could never verify."""
    t = int(now)
    header = f"t={t},v1={mac(secret, t, task_id, body)}"
    if path:
        header += f",v2={mac_v2(secret, t, task_id, method, path, query, body)}"
    return header


def verify(secret: bytes, header: str | None, task_id: str, body: bytes, now: float,
           window_s: float = WINDOW_S, method: str | None = None, path: str | None = None,
           query: str | None = None, require_v2: bool = False) -> str | None:
    """None when `header` signs this call and is within `window_s` of `now`, else why not.

    Given the request's `method` (and its raw `path` and `query`, "" when None), a header
    with v2 entries must match one of them; otherwise a v1 entry must match.  With
    `require_v2` (every dispatcher signs v2: this zstalk's do) a header without v2 is
    refused, so a captured call cannot be replayed to another path, query or method by
    stripping its v2."""
    if not header:
        return MISSING
    signature = parse(header)
    if signature is None:
        return MALFORMED
    if require_v2 and not signature.v2:
        return NO_V2
    try:
        expected, macs = _expected(secret, signature, task_id, body, method, path, query)
    except UnicodeEncodeError:  # a byte that is not UTF-8 (aiohttp: a surrogate):
        return BAD_SIGNATURE    # no signer sent that text
    if not any(hmac.compare_digest(expected, got) for got in macs):
        return BAD_SIGNATURE
    if now - signature.t > window_s:
        return TOO_OLD
    if signature.t - now > window_s:
        return TOO_NEW
    return None


def _expected(secret: bytes, signature: Signature, task_id: str, body: bytes,
              method: str | None, path: str | None, query: str | None) -> tuple[str, list[str]]:
    """The MAC the call should carry, and the header's entries of that version: v2 when
    the verifier knows the request line and the header has v2, else v1."""
    if signature.v2 and method is not None:
        return (mac_v2(secret, signature.t, task_id, method, path or "", query or "", body),
                signature.v2)
    return mac(secret, signature.t, task_id, body), signature.v1


def parse(header: str) -> Signature | None:
    """`t=<digits>` and at least one of `v1=<64 hex>`, `v2=<64 hex>` (each may repeat), or
    None when it is not that."""
    t, macs = None, {"v1": [], "v2": []}
    for part in header.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq:
            return None
        if name == "t":
            if t is not None or not (value.isascii() and value.isdigit()) or len(value) > 15:
                return None
            t = int(value)
        elif name in macs:
            value = value.lower()
            if len(value) != 64 or not _HEX.issuperset(value):
                return None
            macs[name].append(value)
    if t is None or not (macs["v1"] or macs["v2"]):
        return None
    return Signature(t, macs["v1"], macs["v2"])


def signing_key(value: str | bytes | None = None) -> bytes | None:
    """The secret: `value` if given, else $ZSTALK_SIGNING_KEY, else the contents of the file
    $ZSTALK_SIGNING_KEY_FILE names (less one trailing newline,
    protocol/network/secret.py), else None (calls go unsigned).

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


# -- the waiting room's passes ---------------------------------------------------------

def verify_pass(token: str | bytes, keys: KeysLike, function: str | None = None,
                now: float | None = None) -> str:
    """The task id of a good pass for `function` (None: any) at `now` (default: the
    clock); else PassError.  A key file that cannot be used raises ValueError."""
    return check_pass(token, as_pass_keys(keys), time.time() if now is None else now, function)
