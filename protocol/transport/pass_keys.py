"""Reading the pass key file (issue 31: `--pass-key-file`, ZSTALK_PASS_KEY_FILE, a mounted
Kubernetes Secret), by secret.py's rules: unreadable or empty is an error naming the
path.  The format and its checks are the codec's (protocol/codecs/passes.py,
parse_pass_keys); this module only reads bytes and decodes them.  Every problem is a
SecretError, so a command reports all its secret files alike; rotation (re-reading on
SIGHUP) is the caller's: call this again.
"""
from __future__ import annotations

from ..codecs.passes import PassKeyError, PassKeys, parse_pass_keys
from .secret import SecretError, read_secret_file

NAME = "--pass-key-file (ZSTALK_PASS_KEY_FILE)"


def read_pass_keys(path: str, name: str = NAME) -> PassKeys:
    """The keys in the file `path` that `name` (an option or variable) named."""
    data = read_secret_file(path, name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretError(f"{name} names {path}, which is not UTF-8 text") from None
    try:
        return parse_pass_keys(text, path)
    except PassKeyError as exc:
        raise SecretError(f"{name}: {exc}") from None
