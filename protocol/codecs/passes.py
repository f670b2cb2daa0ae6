"""The waiting room's signed passes (issue 31), sans-IO: no file, no socket, no clock.

How it works.  A pass is one ASCII line of six fields joined by '.':

    zp1.<kid>.<uid>.<function>.<exp>.<mac>

    zp1       the format and its version; anything else is malformed (a new format gets a
              new prefix, so both can be accepted while passes of the old one expire)
    kid       which key signed: [A-Za-z0-9_-]{1,16}, written as is (base64url's alphabet
              holds no '.', so it needs no encoding)
    uid       the task's uniqueId, base64url without padding: a uniqueId may hold '.', the
              separator, so it is always encoded (one spelling per task, never a guess)
    function  the function's name, base64url without padding, for the same reason
    exp       when the pass expires: Unix seconds in decimal, no sign, no leading zero
    mac       HMAC-SHA256 under the key `kid` over the ASCII bytes before the last '.',
              base64url without padding (43 characters)

A pass is canonical: base64url fields must be what encoding their bytes gives (no stray
low bits in the last character), and the MAC is compared as text, in constant time
(hmac.compare_digest).  So changing any one byte of a good pass gets it refused.

`check_pass` checks in this order, and stops at the first refusal:

    malformed       not str or bytes, longer than MAX_PASS_LENGTH, not ASCII, not the
                    grammar above, or a uid or function that zstalk would not accept: a
                    syntax check that needs no key (the HTTP front answers it with 401)
    unknown_kid     no key of that id (a rotated-out key's line was removed); a kid is in
                    every pass, so naming it unknown tells nothing secret
    forged          the MAC does not match.  No field is trusted before this, so a pass
                    with an altered exp or function is `forged`, never `expired` or
                    `wrong_function`: a forger learns only that the MAC is wrong
    expired         `now` is not before `exp` (a pass is good up to, not including, its
                    exp second; a `now` that is NaN counts as expired)
    wrong_function  the caller named a function and the pass is for another; after the
                    expiry, as an expired pass is no good anywhere

Revocation (a task done or cancelled before its pass expires) is not in the pass: only
the broker knows it, and protocol/fronts/http/pass_check.py asks.  Keys are `PassKeys`, kid -> key in
the key file's order: the first signs, every one verifies, so a rotation puts the new
key first and removes the old key's line once its passes have expired.

The key file (parse_pass_keys; protocol/network/pass_keys.py reads it) holds one `kid:key` per
line; blank lines and lines starting with '#' are skipped; blanks around the kid and
the key are dropped (a CRLF file reads like an LF one).  The key is the text as written,
used as its ASCII bytes, not decoded from base64 or hex: that is how zstalk's other
secrets (the master key, the signing key) and most HMAC configuration work, so any
generator does (`openssl rand -base64 32`, `openssl rand -hex 32`), and a verifier in
another language uses the same string without guessing an encoding.  A key is printable
ASCII without blanks (what a copy and paste cannot change unseen) and at least
KEY_MIN_BYTES long.  A duplicate kid is refused.  Errors name the file and the line,
never the key.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import re
from typing import Iterable, Iterator, Mapping

from ..schema.tasks import FUNCTION_NAME, UNIQUE_ID

VERSION = "zp1"

#: the longest pass is 207 characters (16-character kid, 32-character uniqueId, 64-character
#: function, 11-digit exp); anything longer is refused before it is looked at
MAX_PASS_LENGTH = 256

KEY_MIN_BYTES = 32

#: a key's id (the task's uniqueId and function follow the task API's own rules,
#: protocol/schema/tasks.py UNIQUE_ID and FUNCTION_NAME)
KID = re.compile(r"[A-Za-z0-9_-]{1,16}")
_KEY = re.compile(r"[!-~]+")            # printable ASCII, no blanks

EXP_LIMIT = 10 ** 11                    # 11 decimal digits: the year 5138

_PASS = re.compile(
    r"zp1\.([A-Za-z0-9_-]{1,16})\.([A-Za-z0-9_-]{2,43})\.([A-Za-z0-9_-]{2,86})"
    r"\.(0|[1-9][0-9]{0,10})\.([A-Za-z0-9_-]{43})")

#: every reason check_pass refuses a pass for, in the order it checks them, with a
#: message that says no more than the reason
REASONS = {
    "malformed": "not a zstalk pass",
    "unknown_kid": "the pass is signed with a key this server does not hold",
    "forged": "the pass's signature does not match",
    "expired": "the pass has expired",
    "wrong_function": "the pass is for another function",
}


class PassError(Exception):
    """A refused pass; `reason` is one of REASONS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def message(self) -> str:
        return REASONS[self.reason]


class PassKeyError(ValueError):
    """A key file that cannot be used; the message names the file and the line."""


class PassKeys(Mapping[str, bytes]):
    """kid -> key, in order: the first signs, every one verifies.  Its repr names the
    kids and never a key."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]) -> None:
        items = list(keys.items() if isinstance(keys, Mapping) else keys)
        self._keys: dict[str, bytes] = {}
        for kid, key in items:
            key = key.encode() if isinstance(key, str) else key
            problem = kid_problem(kid) or key_problem(key)
            if problem is None and kid in self._keys:
                problem = f"kid {kid!r} is given twice"
            if problem:
                raise ValueError(problem)
            self._keys[kid] = bytes(key)
        if not self._keys:
            raise ValueError("no pass keys: at least one is needed to sign")

    def __getitem__(self, kid: str) -> bytes:
        return self._keys[kid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def signing_kid(self) -> str:
        return next(iter(self._keys))

    def __repr__(self) -> str:
        return f"PassKeys(kids={list(self._keys)!r})"


def kid_problem(kid: object) -> str | None:
    if isinstance(kid, str) and KID.fullmatch(kid):
        return None
    return f"kid {kid!r} is not 1-16 of A-Z a-z 0-9 _ -"


def key_problem(key: bytes) -> str | None:
    """What is wrong with a key, without quoting it."""
    if not isinstance(key, (bytes, bytearray)) or not _KEY.fullmatch(key.decode("latin-1")):
        return "the key must be printable ASCII without blanks"
    if len(key) < KEY_MIN_BYTES:
        return (f"the key is {len(key)} bytes, and at least {KEY_MIN_BYTES} are needed "
                f"(`openssl rand -base64 32` makes one)")
    return None


# -- signing and verifying -------------------------------------------------------------

def sign_pass(keys: PassKeys, uid: str, function: str, exp: int) -> str:
    """The pass of task `uid` of `function`, good until `exp` (Unix seconds), signed with
    the first key.  Values zstalk would not accept are a ValueError (a caller's bug)."""
    if not isinstance(uid, str) or not UNIQUE_ID.fullmatch(uid):
        raise ValueError(f"not a uniqueId: {uid!r}")
    if not isinstance(function, str) or not FUNCTION_NAME.fullmatch(function):
        raise ValueError(f"not a function name: {function!r}")
    if isinstance(exp, bool) or not isinstance(exp, int) or not 0 <= exp < EXP_LIMIT:
        raise ValueError(f"exp must be an int of Unix seconds from 0 to {EXP_LIMIT - 1}, not {exp!r}")
    kid = keys.signing_kid
    signed = f"{VERSION}.{kid}.{_b64(uid.encode())}.{_b64(function.encode())}.{exp}"
    return f"{signed}.{_mac(keys[kid], signed)}"


def check_pass(token: object, keys: PassKeys, now: float, function: str | None = None) -> str:
    """The task id a good pass is for; else PassError, checked in the module's order.
    (The clock is the caller's: `zstalk.workers.verify_pass` is this with keys from a file
    and the time now.)"""
    kid, uid, signed_function, exp, signed, mac = _parse(token)
    key = keys.get(kid)
    if key is None:
        raise PassError("unknown_kid")
    if not hmac.compare_digest(_mac(key, signed), mac):
        raise PassError("forged")
    if not now < exp:
        raise PassError("expired")
    if function is not None and function != signed_function:
        raise PassError("wrong_function")
    return uid


def _parse(token: object) -> tuple[str, str, str, int, str, str]:
    """(kid, uid, function, exp, signed text, mac) of a pass that has the grammar."""
    if isinstance(token, (bytes, bytearray)):
        if len(token) > MAX_PASS_LENGTH or not token.isascii():
            raise PassError("malformed")
        token = token.decode("ascii")
    if not isinstance(token, str) or len(token) > MAX_PASS_LENGTH:
        raise PassError("malformed")
    match = _PASS.fullmatch(token)
    if match is None:
        raise PassError("malformed")
    kid, uid, function, exp, mac = match.groups()
    uid, function = _unb64(uid), _unb64(function)
    if not UNIQUE_ID.fullmatch(uid) or not FUNCTION_NAME.fullmatch(function):
        raise PassError("malformed")
    return kid, uid, function, int(exp), token[:match.start(5) - 1], mac


def _mac(key: bytes, signed: str) -> str:
    return _b64(hmac.digest(key, signed.encode("ascii"), "sha256"))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> str:
    """The ASCII text `text` encodes, which must be its one canonical base64url form."""
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        raise PassError("malformed") from None
    if _b64(data) != text or not data.isascii():
        raise PassError("malformed")
    return data.decode("ascii")


# -- the key file ----------------------------------------------------------------------

def parse_pass_keys(text: str, where: str) -> PassKeys:
    """The keys of a key file's `text`; `where` (its path) names it in errors."""
    keys: list[tuple[str, bytes]] = []
    lines: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        kid, colon, key = line.partition(":")
        kid, key = kid.strip(" \t"), key.strip(" \t")
        problem = ("expected kid:key" if not colon else kid_problem(kid)
                   or (key_problem(key.encode("utf-8", "replace")) if key else "the key is empty"))
        if problem is None and kid in lines:
            problem = f"kid {kid!r} is already on line {lines[kid]}"
        if problem:
            raise PassKeyError(f"{where}, line {number}: {problem}")
        lines[kid] = number
        keys.append((kid, key.encode("ascii")))
    if not keys:
        raise PassKeyError(f"{where} holds no keys (one `kid:key` per line)")
    return PassKeys(keys)
