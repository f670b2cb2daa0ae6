"""A task's own token (issue 45): what its enqueuer is given to read, cancel or leave that
task, and that task only, without the master key.

    zt1_<43 characters of base64url: 32 random bytes, no padding>

The HTTP front makes it (its CSPRNG; the broker core has no randomness) and answers it
once, in the enqueue's 201; the broker is sent, and keeps in the TASK record, only its
SHA-256 (`digest`), so neither a binlog nor a broker's memory holds a token in clear.  A
request presents it as `Authorization: Bearer zt1_...`; the front hashes what came and
sends the digest with the op, and the broker compares digests in constant time
(`matches`).  32 random bytes make the token unguessable, so a plain hash (no salt, no
stretching) suffices: there is no dictionary to try.
"""
import base64
import hashlib
import hmac
import secrets

PREFIX = "zt1_"
TOKEN_BYTES = 32
DIGEST_BYTES = 32           # SHA-256
#: a token's length in characters: the prefix and unpadded base64url of TOKEN_BYTES
TOKEN_CHARS = len(PREFIX) + (TOKEN_BYTES * 4 + 2) // 3


def make_tokens(n: int) -> list[str]:
    """n new tokens from one read of the system's CSPRNG (an array of tasks reads once)."""
    pool = secrets.token_bytes(TOKEN_BYTES * n)
    return [PREFIX + base64.urlsafe_b64encode(pool[i:i + TOKEN_BYTES]).rstrip(b"=").decode()
            for i in range(0, TOKEN_BYTES * n, TOKEN_BYTES)]


def is_token(text: str) -> bool:
    """Whether a bearer credential is meant as a task's token (by its prefix)."""
    return text.startswith(PREFIX)


def digest(token: str) -> bytes:
    """What the broker keeps of a token, and what a request's token is compared as."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def matches(kept: bytes | None, presented: bytes) -> bool:
    """Whether a presented token's digest is the task's own (constant time); a task with
    none (enqueued before tokens, or by a schedule) matches nothing."""
    return kept is not None and hmac.compare_digest(kept, presented)
