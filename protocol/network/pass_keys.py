"""Reading the pass key file (issue 31: `--pass-key-file`, ZSTALK_PASS_KEY_FILE, a mounted
Kubernetes Secret), by secret.py's rules: unreadable or empty is an error naming the
path.  The format and its checks are the codec's (protocol/codecs/passes.py,
parse_pass_keys); this module only reads bytes and decodes them.  Every problem is a
SecretError, so a command reports all its secret files alike; rotation (re-reading on
SIGHUP) is the caller's: call this again.  `as_pass_keys` is what the HTTP front and
`zstalk.workers.verify_pass` call: keys as given, or a key file's, read again only when
the file changed.
"""
from __future__ import annotations

import os
from typing import Mapping

from ..codecs.passes import PassKeyError, PassKeys, parse_pass_keys
from .secret import SecretError, read_secret_file

NAME = "--pass-key-file (ZSTALK_PASS_KEY_FILE)"
#: what `as_pass_keys` takes: keys, a mapping of kid -> key, or a key file's path
KeysLike = PassKeys | Mapping[str, bytes | str] | str | os.PathLike

_files: dict[str, tuple[tuple[int, int, int, int], PassKeys]] = {}


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


def as_pass_keys(keys: KeysLike) -> PassKeys:
    """Keys as given, or read from a key file (again only when the file changed: the HTTP
    front asks at every request, and an offline check at every call)."""
    if isinstance(keys, PassKeys):
        return keys
    if isinstance(keys, (str, os.PathLike)):
        return _key_file(os.fspath(keys))
    return PassKeys(keys)


def _key_file(path: str) -> PassKeys:
    """The keys of `path`, read again only when the file changed."""
    try:
        st = os.stat(path)
        stamp = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = None
    cached = _files.get(path)
    if stamp is not None and cached is not None and cached[0] == stamp:
        return cached[1]
    keys = read_pass_keys(path, "the pass key file")
    if stamp is not None:
        _files[path] = (stamp, keys)     # a file changed since the stat is read again next time
    return keys
