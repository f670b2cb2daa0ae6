"""Checking a waiting room's pass where the protected API runs (issue 31), offline: no call
to zstalk, only the signature, the expiry and the function.  A pass of a task that was
done or cancelled still verifies here until it expires (at most the function's
`pass_ttl`); zstalk's GET /v1/passes/verify also refuses those.

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

import os
import time
from typing import Mapping

from ..protocol.codecs.passes import PassError, PassKeys
from ..protocol.codecs.passes import verify_pass as _verify
from ..protocol.transport.pass_keys import read_pass_keys

__all__ = ["PassError", "PassKeys", "verify_pass"]

KeysLike = PassKeys | Mapping[str, bytes | str] | str | os.PathLike

_files: dict[str, tuple[tuple[int, int, int, int], PassKeys]] = {}


def verify_pass(token: str | bytes, keys: KeysLike, function: str | None = None,
                now: float | None = None) -> str:
    """The task id of a good pass for `function` (None: any) at `now` (default: the
    clock); else PassError.  A key file that cannot be used raises ValueError."""
    return _verify(token, as_pass_keys(keys), time.time() if now is None else now, function)


def as_pass_keys(keys: KeysLike) -> PassKeys:
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
