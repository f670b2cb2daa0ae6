"""Secrets given as a value or as a file (a mounted Kubernetes Secret, a Docker secret).

A file holds the secret as written, less one trailing newline (what `echo` and most
editors add; `\\r\\n` counts as one).  Nothing else is stripped: a secret is bytes, and
two readers of one file must get the same key.  An empty file, or one that cannot be
read, is an error naming the path: starting without a key by mistake (an unsigned
dispatcher, an HTTP API open to anyone on loopback) is worse than not starting.
Used for the master key (broker/run/cli.py) and the signing key (workers/signing.py).
"""
from __future__ import annotations


class SecretError(ValueError):
    """A secret that cannot be used; the message names where it came from."""


def read_secret_file(path: str, name: str) -> bytes:
    """The secret in the file `path` that `name` (an option or variable) named."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SecretError(f"{name} names {path}, which cannot be read: "
                          f"{exc.strerror or exc}") from None
    if data.endswith(b"\n"):
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    if not data:
        raise SecretError(f"{name} names {path}, which is empty")
    return data

