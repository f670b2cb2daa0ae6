"""The vocabulary every zstalk actor speaks, at the bottom of the house: it imports nothing
of zstalk, and everything else may import it.

    ops.py       the ops a session asks of the broker and the reply codes (Op, R), what
                 each family's ops carry, the limits of a connection in flight
    messages.py  the messages between actors (Hello, Batch, Replies, ...) and the one
                 place they are encoded and decoded (msgpack, schema versions)
    tasks.py     the task API's names, patterns, ranges, statuses and error codes, which
                 the broker core checks and the HTTP front and its OpenAPI document show
    task_messages.py  the task family's messages as named types (an enqueue, a call's
                 ext), each read once where it comes in; the wire keeps ops.py's arrays
    outcome.py   a call's outcome, for the dispatcher that reports it and the core
    task_info.py a task's info: one table of its fields, which the core fills
                 (TaskInfo), the HTTP front shows and the OpenAPI document describes
    tokens.py    a task's own token: its form, how the front makes it, and the SHA-256
                 the broker keeps and compares in constant time
    version.py   zstalk's version

`zstalk.protocol.schema` gives every name of ops and messages, as the module of that name
did before it became this package.
"""
from .messages import (FUNCTION_SEARCH_SINCE, HEARTBEAT_S, OLDEST_PEER_VERSION,
                       OPERATOR_SINCE, PEEK_SINCE,
                       PEER_TIMEOUT_S, PEERS_SINCE, POSITIONS_SINCE, ROOMS_SINCE,
                       SCHEMA_VERSION, V1_ERROR_STATUS, Batch,
                       Fenced, Heartbeat, Hello, Holding, Message,
                       NotLeader, Replies, SchemaError, SessionState, Settings, Stopping, Welcome,
                       decode, decode_peer, encodable, encode)
from .ops import (MAX_POSITIONS, SESSION_BYTES_MAX, SESSION_OPS_MAX, SILENT_OPS,
                  WORKER_VERSIONS, Codes, Op, R)
from .version import VERSION

__all__ = ["Batch", "Codes", "FUNCTION_SEARCH_SINCE", "Fenced", "HEARTBEAT_S", "Heartbeat", "Hello", "Holding",
           "MAX_POSITIONS", "Message", "NotLeader", "OLDEST_PEER_VERSION", "OPERATOR_SINCE",
           "Op", "PEEK_SINCE", "PEER_TIMEOUT_S", "PEERS_SINCE", "POSITIONS_SINCE", "R",
           "ROOMS_SINCE", "Replies",
           "SCHEMA_VERSION", "SESSION_BYTES_MAX", "SESSION_OPS_MAX", "SILENT_OPS",
           "SchemaError", "SessionState", "Settings", "Stopping", "V1_ERROR_STATUS",
           "VERSION", "WORKER_VERSIONS", "Welcome", "decode", "decode_peer", "encodable",
           "encode"]
