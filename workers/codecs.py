"""Codecs: how a job body turns into the object a handler sees, and back.

A codec is any object with `encode(obj) -> bytes` and `decode(bytes) -> obj`; the three
here cover the common cases.  Workers decode lazily (on the first `job.body`), in the
handler's thread, so a slow codec never holds up the pool's event loop.
"""
from __future__ import annotations

import json as _json
from typing import Any, Protocol

import msgpack as _msgpack  # type: ignore[import-untyped]


class Codec(Protocol):
    def encode(self, obj: Any) -> bytes: ...
    def decode(self, data: bytes) -> Any: ...


class RawCodec:
    """Bodies are bytes both ways (str is encoded as UTF-8 for convenience)."""

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, str):
            return obj.encode()
        return bytes(obj)

    def decode(self, data: bytes) -> bytes:
        return data


class JsonCodec:
    def encode(self, obj: Any) -> bytes:
        return _json.dumps(obj, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> Any:
        return _json.loads(data)


class MsgpackCodec:
    def encode(self, obj: Any) -> bytes:
        return _msgpack.packb(obj, use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        return _msgpack.unpackb(data, raw=False)


raw = RawCodec()
json = JsonCodec()
msgpack = MsgpackCodec()
